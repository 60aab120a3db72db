// Merging partial attentions by their log-sum-exp (docs/design.md, "Merging partial
// attentions"): attention over keys split into partitions, each partition's output O_n
// (normalised over its own keys) and lse_n, gives the attention over all keys as
//   lse = log Σ_n exp(lse_n),   O = Σ_n exp(lse_n - lse) O_n,
// which is what xformers' merge_attentions and flash-attn's combine compute.
//
// The host folds the partials in one at a time into an f32 running state (`acc`,
// [rows, Dv] dense, and `acc_lse`, [rows]), then writes the result in the output's
// dtype and layout; a row is one (batch, head, query row). One invocation per row walks
// its Dv elements. A partition with no visible key (lse_n = -inf) adds nothing; a row
// that no partition saw keeps lse = -inf and output 0, never NaN.
//
//   merge_fold: state := merge(state, partial) (p.first: state := partial).
//   merge_store: output := state, in the output's strides and dtype.

struct MergeParams {
    rows: u32, // B · Hq · Lq
    heads: u32, // Hq
    len_q: u32,
    dv: u32,
    // Strides (elements) of the partial being folded in, or of the output stored.
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    first: u32,
}

@group(0) @binding(0) var<uniform> m: MergeParams;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read_write> acc_lse: array<f32>;
@group(0) @binding(3) var<storage, read> part: array<elem>;
@group(0) @binding(4) var<storage, read> part_lse: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<elem>;

const NEG_INF_BITS: u32 = 0xff800000u;

fn is_neg_inf(x: f32) -> bool {
    return bitcast<u32>(x) == NEG_INF_BITS;
}

// Offset of row r's first element in a tensor with the parameters' strides.
fn row_offset(r: u32) -> u32 {
    let i = r % m.len_q;
    let bh = r / m.len_q;
    return (bh / m.heads) * m.stride_b + (bh % m.heads) * m.stride_h + i * m.stride_s;
}

@compute @workgroup_size(64, 1, 1)
fn merge_fold(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if r >= m.rows {
        return;
    }
    let src = row_offset(r);
    let dst = r * m.dv;
    let lse_n = part_lse[r];
    if m.first != 0u {
        acc_lse[r] = lse_n;
        for (var c = 0u; c < m.dv; c++) {
            // A partition that saw no key adds zeros, whatever its output row holds.
            acc[dst + c] = select(f32(part[src + c]), 0.0, is_neg_inf(lse_n));
        }
        return;
    }
    let lse_a = acc_lse[r];
    if is_neg_inf(lse_n) {
        return;
    }
    if is_neg_inf(lse_a) {
        acc_lse[r] = lse_n;
        for (var c = 0u; c < m.dv; c++) {
            acc[dst + c] = f32(part[src + c]);
        }
        return;
    }
    // Both finite: weights relative to the larger, so neither exp overflows.
    let top = max(lse_a, lse_n);
    let wa = exp(lse_a - top);
    let wn = exp(lse_n - top);
    let total = wa + wn;
    let ka = wa / total;
    let kn = wn / total;
    acc_lse[r] = top + log(total);
    for (var c = 0u; c < m.dv; c++) {
        acc[dst + c] = ka * acc[dst + c] + kn * f32(part[src + c]);
    }
}

@compute @workgroup_size(64, 1, 1)
fn merge_store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if r >= m.rows {
        return;
    }
    let dst = row_offset(r);
    let src = r * m.dv;
    for (var c = 0u; c < m.dv; c++) {
        out[dst + c] = elem(acc[src + c]);
    }
}
