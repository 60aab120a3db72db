// Materialized path, step 2: turns each row of scores into probabilities in place, and
// writes the row's log-sum-exp.
//
// Tiling: one invocation per row (64 rows per workgroup), three passes over the row:
// max, sum of exp(s - max), normalise. No barriers, which suits CPU adapters. Scores
// of -inf are masked positions and become exactly 0; a row with no visible key (fully
// masked) becomes all zeros with lse = -inf, never NaN; a row with a NaN score
// becomes NaN throughout, lse included, as in the reference. Subtracting the max keeps
// exp() finite for logits of any magnitude. Keys past key_end (causal, key lengths)
// are known to be masked and are zeroed without being read.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // 2-D grid so that more than 65535 workgroups of rows can be dispatched.
    let row = gid.x + gid.y * nwg.x * 64u;
    if row >= p.bh_count * p.len_q {
        return;
    }
    let bh_local = row / p.len_q;
    let i = row % p.len_q;
    let hd = head_of(p.bh_start + bh_local);
    let end = key_end(hd.b, i);
    let base = row * p.len_k;

    var m = neg_inf();
    for (var j = 0u; j < end; j++) {
        let s = scores[base + j];
        if !is_neg_inf(s) {
            m = max_or_nan(m, s); // a NaN score makes the row NaN
        }
    }
    // The shared softmax rules (attention_common.wgsl): 0 at masked scores, and a row
    // with no visible key has sum 0, inverse 0 and lse -inf.
    var sum = 0.0;
    if !is_neg_inf(m) {
        for (var j = 0u; j < end; j++) {
            sum += softmax_probs(vec4<f32>(scores[base + j]), vec4<f32>(m)).x;
        }
    }
    let inv = row_inv_sum(sum);
    for (var j = 0u; j < p.len_k; j++) {
        var prob = 0.0;
        if j < end {
            prob = softmax_probs(vec4<f32>(scores[base + j]), vec4<f32>(m)).x * inv;
        }
        scores[base + j] = prob;
    }
    lse[(p.bh_start + bh_local) * p.len_q + i] = row_lse(m, sum);
}
