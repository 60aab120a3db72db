// Shared by every attention kernel: the uniform block, the bindings, the masking and
// online-softmax rules of docs/design.md ("Masks", "Softmax") as the one definition
// each kernel calls, and row loads. Each kernel file is appended to this one; a short
// generated header before it defines `elem` (f32, or f16 with `enable f16;`).
//
// Masking rules, with p(i) = i + pos_offset query i's aligned position (a position is
// masked if any rule says so, and then never contributes, whatever its score;
// key_start, key_end and apply_masks below):
//   causal:       key j is masked when j > p(i)  (folded into the right edge)
//   window:       key j is masked when j < p(i) - left or j > p(i) + right
//   key lengths:  key j is masked when j >= key lengths[b]
//   bool mask:    masked where the mask word is 0
//   additive:     masked where the word is -inf; otherwise its value is added
// and the score of a visible position is softcap(scaled) - slope[h] * |p(i) - j| + additive.

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
    // Keys j > p(i) + right are masked when has_right (causal: right = 0, folded with
    // the window's right edge by the host); p(i) = i + pos_offset.
    has_right: u32,
    k_stride_b: u32,
    k_stride_h: u32,
    k_stride_s: u32,
    pos_offset: i32,
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
    // key_stop = len_k); split-K decode cuts 0 .. key_stop into its splits (the longest
    // key length, when less than len_k). With key_begin > 0 a dispatch resumes from the output rows and
    // log-sum-exps the previous key range left (llvmpipe caps loop iterations per
    // invocation, so long key ranges are split across dispatches).
    key_begin: u32,
    key_stop: u32,
    // Split-K decode (flash_decode.wgsl): how many splits the key range is cut into,
    // each written as a partial result to `scores`; 1 for every other kernel.
    splits: u32,
    right: u32,
    // Keys j < p(i) - left are masked when has_left (sliding window).
    has_left: u32,
    left: u32,
    // Scaled scores s become softcap * tanh(s / softcap); 0 for none.
    softcap: f32,
    // ALiBi: -slope[h] * |p(i) - j| is added; the slopes follow the key lengths in
    // side_words.
    has_alibi: u32,
    // Positions measured from each batch element's key length (query_pos).
    align_to_lengths: u32,
    // Paged K and V (kv_offset): with page_size > 0, key j of batch element b is row
    // j % page_size of page side_words[table_offset + b * table_stride + j / page_size],
    // pages k_page_stride (v_page_stride) elements apart; 0 for contiguous K and V.
    page_size: u32,
    table_offset: u32,
    table_stride: u32,
    k_page_stride: u32,
    v_page_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<elem>;
@group(0) @binding(2) var<storage, read> k: array<elem>;
@group(0) @binding(3) var<storage, read> v: array<elem>;
@group(0) @binding(4) var<storage, read_write> output: array<elem>;
@group(0) @binding(5) var<storage, read> mask_words: array<u32>;
// Key lengths [B] (when has_key_lengths), then ALiBi slopes [Hq] as f32 bits (when
// has_alibi), then a paged cache's block table [B, table_stride] (when page_size > 0):
// one binding, as WebGPU's default limit is 8 storage buffers per stage.
@group(0) @binding(6) var<storage, read> side_words: array<u32>;
// Scores or probabilities of the dispatched (batch, head) pairs: [bh_count, Lq, Lk].
@group(0) @binding(7) var<storage, read_write> scores: array<f32>;
// Log-sum-exp per row over all (batch, head) pairs: [B * Hq, Lq].
@group(0) @binding(8) var<storage, read_write> lse: array<f32>;

const MASK_NONE: u32 = 0u;
const MASK_BOOL: u32 = 1u;
const MASK_ADDITIVE: u32 = 2u;
const NEG_INF_BITS: u32 = 0xff800000u;

// -inf, made at run time: WGSL forbids a constant expression whose value is infinite,
// and Tint (Chrome's WGSL compiler) rejects `bitcast<f32>(NEG_INF_BITS)` (naga allows
// it). `p.len_q & 0u` is zero but not a constant expression.
fn neg_inf() -> f32 {
    return bitcast<f32>(NEG_INF_BITS | (p.len_q & 0u));
}

// True for -inf, the value that marks a masked score.
fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == NEG_INF_BITS;
}

// Whether x is NaN, read from its bits (a compiler may fold `x != x` away).
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// max(a, b), NaN where either is NaN (a + b is then NaN): WGSL's max may return the
// other operand, and a row whose scores are all NaN would pass for one that saw no key.
fn max_or_nan(a: f32, b: f32) -> f32 {
    return select(max(a, b), a + b, is_nan(a) || is_nan(b));
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

// Query i's aligned position p(i) in batch element b, the causal boundary and the
// origin of the window and of ALiBi distances: i + pos_offset, or with
// align_to_lengths (a KV cache) i + key lengths[b] - Lq. i32 is enough: the host
// refuses Lq + Lk above 2^30 with a window or ALiBi, and clamps left and right to
// Lq + Lk.
// Written for four rows at once (the rules' one definition); the scalar forms below
// take one row.
fn query_positions(b: u32, i: vec4<u32>) -> vec4<i32> {
    if p.align_to_lengths != 0u {
        return vec4<i32>(i) + vec4<i32>(i32(side_words[b]) - i32(p.len_q));
    }
    return vec4<i32>(i) + vec4<i32>(p.pos_offset);
}

fn query_pos(b: u32, i: u32) -> i32 {
    return query_positions(b, vec4<u32>(i)).x;
}

// Keys before this index are masked for query i (the window's left edge). Non-decreasing
// in i, so a block of rows can start its loop at its first row's (block_key_begin).
fn key_starts(b: u32, i: vec4<u32>) -> vec4<u32> {
    if p.has_left == 0u {
        return vec4<u32>(0u);
    }
    return vec4<u32>(clamp(query_positions(b, i) - vec4<i32>(i32(p.left)), vec4<i32>(0), vec4<i32>(i32(p.len_k))));
}

fn key_start(b: u32, i: u32) -> u32 {
    return key_starts(b, vec4<u32>(i)).x;
}

// Keys at or past this index are masked for query i by key lengths, causality or the
// window's right edge. Non-decreasing in i, so a block of rows can bound its loop by
// its last row.
fn key_ends(b: u32, i: vec4<u32>) -> vec4<u32> {
    var end = p.len_k;
    if p.has_key_lengths != 0u {
        end = min(end, side_words[b]);
    }
    if p.has_right != 0u {
        return vec4<u32>(clamp(query_positions(b, i) + vec4<i32>(i32(p.right) + 1), vec4<i32>(0), vec4<i32>(i32(end))));
    }
    return vec4<u32>(end);
}

fn key_end(b: u32, i: u32) -> u32 {
    return key_ends(b, vec4<u32>(i)).x;
}

// The first key of batch element b whose K and V rows may hold anything: past its key
// length, a KV buffer's unused rows (NaN included). Such keys weigh exactly 0, but
// 0 x NaN would spread into whatever multiplies their rows.
fn key_limit(b: u32) -> u32 {
    if p.has_key_lengths != 0u {
        return min(p.len_k, side_words[b]);
    }
    return p.len_k;
}

// The last key whose rows a kernel reads for batch element b: loops that run past
// key_limit (to the end of a block) read this key's K and V rows instead, so the
// masked keys' zero weights multiply finite values (docs/design.md, "Semantics").
fn last_read_key(b: u32) -> u32 {
    return max(key_limit(b), 1u) - 1u;
}

// Whether keys j lie in the visible ranges start .. end (key_start, key_end).
fn in_key_range(j: vec4<u32>, start: vec4<u32>, end: vec4<u32>) -> vec4<bool> {
    return (j >= start) & (j < end);
}

// Where a block of rows starting at `first_row` begins its key loop in this dispatch:
// tiles wholly left of its first row's window are skipped, not masked. A multiple of 4
// (keys go in fours) when p.key_begin is.
fn block_key_begin(b: u32, first_row: u32) -> u32 {
    return max(p.key_begin, key_start(b, first_row) / 4u * 4u);
}

// The explicit-mask word for (b, h, i, j); broadcast axes have stride 0.
fn mask_word(b: u32, h: u32, i: u32, j: u32) -> u32 {
    if p.mask_kind == MASK_NONE {
        return 1u;
    }
    return mask_words[b * p.m_stride_b + h * p.m_stride_h + i * p.m_stride_q + j * p.m_stride_k];
}

// The mask words of keys j0..j0+3 for query i (keys past the end are clamped: their
// words are read but never used, as key_end masks them).
fn mask_words_of_keys(b: u32, h: u32, i: u32, j0: u32) -> vec4<u32> {
    if p.mask_kind == MASK_NONE {
        return vec4<u32>(1u);
    }
    let last = p.len_k - 1u;
    return vec4<u32>(
        mask_word(b, h, i, min(j0, last)),
        mask_word(b, h, i, min(j0 + 1u, last)),
        mask_word(b, h, i, min(j0 + 2u, last)),
        mask_word(b, h, i, min(j0 + 3u, last)),
    );
}

// The mask words of key j for query rows `rows` (clamped as above).
fn mask_words_of_rows(b: u32, h: u32, rows: vec4<u32>, j: u32) -> vec4<u32> {
    if p.mask_kind == MASK_NONE {
        return vec4<u32>(1u);
    }
    let jc = min(j, p.len_k - 1u);
    return vec4<u32>(
        mask_word(b, h, rows.x, jc),
        mask_word(b, h, rows.y, jc),
        mask_word(b, h, rows.z, jc),
        mask_word(b, h, rows.w, jc),
    );
}

// Keys j0..j0+3.
fn keys4(j0: u32) -> vec4<u32> {
    return vec4<u32>(j0) + vec4<u32>(0u, 1u, 2u, 3u);
}

// Gemma 2's soft cap, cap * tanh(s / cap), with tanh written out so that every driver
// rounds it alike; exp's argument is never positive, so nothing overflows, and infinite
// scores cap to +-cap.
fn soft_cap(s: vec4<f32>) -> vec4<f32> {
    let x = s / p.softcap;
    let e = exp(-2.0 * abs(x));
    return p.softcap * sign(x) * ((1.0 - e) / (1.0 + e));
}

// The ALiBi bias of query heads h, rows i and keys j of batch element b:
// -slope[h] * |p(i) - j|.
fn alibi_bias(b: u32, h: vec4<u32>, i: vec4<u32>, j: vec4<u32>) -> vec4<f32> {
    let slopes = bitcast<vec4<f32>>(vec4<u32>(
        side_words[p.batch + h.x],
        side_words[p.batch + h.y],
        side_words[p.batch + h.z],
        side_words[p.batch + h.w],
    ));
    let pos = query_positions(b, i);
    let distance = abs(pos - vec4<i32>(j));
    return -slopes * vec4<f32>(distance);
}

// Whether visible ranges (key_start .. key_end) are the only rule: no explicit mask,
// soft cap or ALiBi. A kernel may then skip apply_masks for keys every row of a block
// sees.
fn only_key_ranges() -> bool {
    return p.mask_kind == MASK_NONE && p.softcap == 0.0 && p.has_alibi == 0u;
}

// THE masking rule, the one place every attention kernel applies it (docs/design.md,
// "Masks"), for four positions (batch element b, query heads h, rows i, keys j): the scaled scores,
// whether each key lies in its row's visible range (key_start .. key_end: window,
// causal, key lengths) and its explicit-mask word give the score the softmax sees:
// -inf where any rule masks, else the soft-capped score plus the ALiBi and additive
// biases. A masked position's own score never reaches the result, so NaN or inf there
// is harmless.
fn apply_masks(scaled: vec4<f32>, b: u32, h: vec4<u32>, i: vec4<u32>, j: vec4<u32>, in_range: vec4<bool>, w: vec4<u32>) -> vec4<f32> {
    var s = scaled;
    if p.softcap != 0.0 {
        s = soft_cap(s);
    }
    if p.has_alibi != 0u {
        s += alibi_bias(b, h, i, j);
    }
    let allows = select(w != vec4<u32>(NEG_INF_BITS), w != vec4<u32>(0u), p.mask_kind == MASK_BOOL);
    let bias = select(vec4<f32>(0.0), bitcast<vec4<f32>>(w), p.mask_kind == MASK_ADDITIVE);
    return select(vec4<f32>(neg_inf()), s + bias, in_range & allows);
}

// Online-softmax rules, shared by every kernel that normalises scores (docs/design.md,
// "Softmax"). Scores are -inf exactly where masked.
//
// The factor that rescales an accumulator and sum kept against `old_max` to `new_max`:
// 0 where nothing was seen yet (old_max = -inf; the accumulator and sum are 0 then,
// and exp(-inf - -inf) would be NaN).
fn softmax_rescale(old_max: vec4<f32>, new_max: vec4<f32>) -> vec4<f32> {
    let unseen = bitcast<vec4<u32>>(old_max) == vec4<u32>(NEG_INF_BITS);
    return select(exp(old_max - new_max), vec4<f32>(0.0), unseen);
}

// Unnormalised probabilities exp(s - max): exactly 0 at masked scores, whatever max is.
fn softmax_probs(s: vec4<f32>, max: vec4<f32>) -> vec4<f32> {
    let masked = bitcast<vec4<u32>>(s) == vec4<u32>(NEG_INF_BITS);
    return select(exp(s - max), vec4<f32>(0.0), masked);
}

// The running maximum a dispatch starts from for query row i of (b, h): -inf for the
// first key range; otherwise the log-sum-exp the previous range stored, which with a
// sum of 1 and the stored normalised output row as accumulator is an equivalent
// online-softmax state, so the softmax continues as if it had never stopped.
fn resumed_max(hd: Head, i: u32) -> f32 {
    if p.key_begin == 0u {
        return neg_inf();
    }
    return lse[(hd.b * p.heads_q + hd.h) * p.len_q + i];
}

// The running sum that goes with resumed_max.
fn resumed_sum(max: f32) -> f32 {
    return select(1.0, 0.0, is_neg_inf(max));
}

// A row's log-sum-exp from its final maximum and sum: -inf for a row that saw no key.
fn row_lse(max: f32, sum: f32) -> f32 {
    return select(max + log(sum), neg_inf(), sum == 0.0);
}

// What multiplies the accumulator to normalise it: 0 for a row that saw no key, whose
// output is then zeros, never NaN.
fn row_inv_sum(sum: f32) -> f32 {
    return select(1.0 / sum, 0.0, sum == 0.0);
}

// Offset of key j's row from its head's base in K (src_is_k) or V: j rows on, or
// through the block table of a paged cache (page_size > 0; the host then leaves the
// batch element out of the base). The branch is uniform.
fn kv_offset(src_is_k: bool, b: u32, j: u32) -> u32 {
    let row_stride = select(p.v_stride_s, p.k_stride_s, src_is_k);
    if p.page_size == 0u {
        return j * row_stride;
    }
    let page = side_words[p.table_offset + b * p.table_stride + j / p.page_size];
    return page * select(p.v_page_stride, p.k_page_stride, src_is_k) + (j % p.page_size) * row_stride;
}

// The first key after j whose row does not follow j's in memory: the end of j's page,
// or len_k for contiguous K and V. Loops over consecutive keys step a row offset by
// the row stride up to here, rather than asking kv_offset for every key.
fn kv_run_end(j: u32) -> u32 {
    if p.page_size == 0u {
        return p.len_k;
    }
    return (j / p.page_size + 1u) * p.page_size;
}

// Offsets of the rows of keys j0..j0+3 of batch element b in K or V (clamped to
// last_read_key: rows past it are never read, their keys always masked).
fn row_offsets(src_is_k: bool, b: u32, base: u32, j0: u32) -> vec4<u32> {
    let j = min(vec4<u32>(j0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_read_key(b)));
    if p.page_size == 0u {
        // The common case in one vector multiply (the subgroup kernel ran 4% slower on
        // lavapipe with four kv_offset calls here).
        return vec4<u32>(base) + j * select(p.v_stride_s, p.k_stride_s, src_is_k);
    }
    return vec4<u32>(base) + vec4<u32>(
        kv_offset(src_is_k, b, j.x),
        kv_offset(src_is_k, b, j.y),
        kv_offset(src_is_k, b, j.z),
        kv_offset(src_is_k, b, j.w),
    );
}

// Four consecutive elements of a row, zero past `len`.
fn load4(src_is_k: bool, base: u32, t4: u32, len: u32) -> vec4<f32> {
    let d = t4 * 4u;
    if d + 3u < len {
        if src_is_k {
            return vec4<f32>(f32(k[base + d]), f32(k[base + d + 1u]), f32(k[base + d + 2u]), f32(k[base + d + 3u]));
        }
        return vec4<f32>(f32(v[base + d]), f32(v[base + d + 1u]), f32(v[base + d + 2u]), f32(v[base + d + 3u]));
    }
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if d + c < len {
            if src_is_k {
                r[c] = f32(k[base + d + c]);
            } else {
                r[c] = f32(v[base + d + c]);
            }
        }
    }
    return r;
}

// Four consecutive elements of a Q row, zero past the head dim.
fn qload4(base: u32, t4: u32) -> vec4<f32> {
    let d = t4 * 4u;
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if d + c < p.head_dim {
            r[c] = f32(q[base + d + c]);
        }
    }
    return r;
}
