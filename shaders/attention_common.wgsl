// Shared by every attention kernel: the uniform block, the bindings, and the masking
// rules of DESIGN.md. Each kernel file is appended to this one; a short generated header
// before it defines `elem` (f32, or f16 with `enable f16;`).
//
// Masking rules (a position is masked if any rule says so, and then never contributes,
// whatever its score):
//   causal:       key j is masked for query i when j > i + causal_offset
//   key lengths:  key j is masked when j >= key_lengths[b]
//   bool mask:    masked where the mask word is 0
//   additive:     masked where the word is -inf; otherwise its value is added to the score

struct Params {
    batch: u32,
    heads_q: u32,
    heads_kv: u32,
    len_q: u32,
    len_k: u32,
    head_dim: u32,
    head_dim_v: u32,
    scale: f32,
    q_stride_b: u32,
    q_stride_h: u32,
    q_stride_s: u32,
    causal: u32,
    k_stride_b: u32,
    k_stride_h: u32,
    k_stride_s: u32,
    causal_offset: i32,
    v_stride_b: u32,
    v_stride_h: u32,
    v_stride_s: u32,
    has_key_lengths: u32,
    o_stride_b: u32,
    o_stride_h: u32,
    o_stride_s: u32,
    mask_kind: u32,
    m_stride_b: u32,
    m_stride_h: u32,
    m_stride_q: u32,
    m_stride_k: u32,
    // This dispatch covers (batch, head) pairs bh_start .. bh_start + bh_count, where
    // bh = b * heads_q + h. Work too large for one binding is split this way.
    bh_start: u32,
    bh_count: u32,
    // The fused kernels walk keys key_begin .. key_stop only (both multiples of 4, or
    // key_stop = len_k). With key_begin > 0 a dispatch resumes from the output rows and
    // log-sum-exps the previous key range left (llvmpipe caps loop iterations per
    // invocation, so long key ranges are split across dispatches).
    key_begin: u32,
    key_stop: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<elem>;
@group(0) @binding(2) var<storage, read> k: array<elem>;
@group(0) @binding(3) var<storage, read> v: array<elem>;
@group(0) @binding(4) var<storage, read_write> output: array<elem>;
@group(0) @binding(5) var<storage, read> mask_words: array<u32>;
@group(0) @binding(6) var<storage, read> key_lengths: array<u32>;
// Scores or probabilities of the dispatched (batch, head) pairs: [bh_count, Lq, Lk].
@group(0) @binding(7) var<storage, read_write> scores: array<f32>;
// Log-sum-exp per row over all (batch, head) pairs: [B * Hq, Lq].
@group(0) @binding(8) var<storage, read_write> lse: array<f32>;

const MASK_NONE: u32 = 0u;
const MASK_BOOL: u32 = 1u;
const MASK_ADDITIVE: u32 = 2u;
const NEG_INF_BITS: u32 = 0xff800000u;

fn neg_inf() -> f32 {
    return bitcast<f32>(NEG_INF_BITS);
}

// True for -inf, the value that marks a masked score.
fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == NEG_INF_BITS;
}

struct Head {
    b: u32,
    h: u32,
    hk: u32,
}

// Batch, query head and key/value head (GQA: consecutive query heads share one kv head).
fn head_of(bh: u32) -> Head {
    let b = bh / p.heads_q;
    let h = bh % p.heads_q;
    return Head(b, h, h / (p.heads_q / p.heads_kv));
}

// Keys at or past this index are masked for query i by key lengths or causality.
// Non-decreasing in i, so a block of rows can bound its loop by its last row.
fn key_end(b: u32, i: u32) -> u32 {
    var end = p.len_k;
    if p.has_key_lengths != 0u {
        end = min(end, key_lengths[b]);
    }
    if p.causal != 0u {
        end = u32(clamp(i32(i) + p.causal_offset + 1, 0, i32(end)));
    }
    return end;
}

// The explicit-mask word for (b, h, i, j); broadcast axes have stride 0.
fn mask_word(b: u32, h: u32, i: u32, j: u32) -> u32 {
    if p.mask_kind == MASK_NONE {
        return 1u;
    }
    return mask_words[b * p.m_stride_b + h * p.m_stride_h + i * p.m_stride_q + j * p.m_stride_k];
}

fn word_allows(w: u32) -> bool {
    if p.mask_kind == MASK_BOOL {
        return w != 0u;
    }
    return p.mask_kind == MASK_NONE || w != NEG_INF_BITS;
}

fn word_bias(w: u32) -> f32 {
    if p.mask_kind == MASK_ADDITIVE {
        return bitcast<f32>(w);
    }
    return 0.0;
}

// The scaled, biased score of a visible position, or -inf if (b, h, i, j) is masked.
// `end` is key_end(b, i), hoisted by the caller.
fn masked_score(raw: f32, end: u32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    if j >= end {
        return neg_inf();
    }
    let w = mask_word(b, h, i, j);
    return select(neg_inf(), raw * p.scale + word_bias(w), word_allows(w));
}

// Offsets of the rows of keys j0..j0+3 in K or V (clamped to the last key: rows past
// the end are loaded but always masked).
fn row_offsets(base: u32, stride: u32, j0: u32) -> vec4<u32> {
    let last = p.len_k - 1u;
    return vec4<u32>(base) + min(vec4<u32>(j0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * stride;
}
