// The materialized backward pass: the gradients from the score matrices, for small
// problems and as a cross-check of the fused passes (docs/design.md, "Backward").
// Appended to attention_common.wgsl and backward_common.wgsl. The probabilities P come
// from the forward's materialized weights path (qk_scores, softmax_rows), not from the
// log-sum-exp, so the two backward paths share only D = rowsum(dO * O) and the
// formulas (flash_backward.wgsl's header).
//
//   bwd_mat_ds: one invocation per (query row, key) of one (batch, query head): dP =
//     dO_i·v_j, dX_ij = P_ij (dP - D_i) · softcap'(x_ij), stored in `d_scores`
//     ([B·Hq, Lq, Lk] f32; 0 where P is, whatever K and V hold there).
//   bwd_mat_dq: one invocation per query row: dQ_i = scale Σ_j dX_ij k_j.
//   bwd_mat_dkdv: one invocation per key of one (batch, kv head): dK_j = scale Σ dX_ij
//     q_i and dV_j = Σ P_ij dO_i over the rows i of every query head sharing it.
// No tiling: each invocation walks its row or column of the matrices from storage.
// Heads go in chunks from p.bh_start, as everywhere ((batch, kv head) pairs for dK/dV).

@group(0) @binding(18) var<storage, read> probs: array<f32>;
@group(0) @binding(19) var<storage, read_write> d_scores: array<f32>;

// Index of (row i, key j) of (batch, query head) pair bh in the score matrices.
fn score_index(bh: u32, i: u32, j: u32) -> u32 {
    return (bh * p.len_q + i) * p.len_k + j;
}

@compute @workgroup_size(64, 1, 1)
fn bwd_mat_ds(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x / p.len_k;
    let j = gid.x % p.len_k;
    if i >= p.len_q {
        return;
    }
    let bh = p.bh_start + wid.y;
    let hd = head_of(bh);
    let at = score_index(bh, i, j);
    let pr = probs[at];
    if pr == 0.0 {
        d_scores[at] = 0.0;
        return;
    }
    let o = do_base(hd, i);
    let vb = hd.b * p.v_stride_b + hd.hk * p.v_stride_h + kv_offset(false, hd.b, j);
    var dp = 0.0;
    for (var c = 0u; c < p.head_dim_v; c++) {
        dp += f32(d_out[o + c]) * f32(v[vb + c]);
    }
    var slope = 1.0;
    if p.softcap != 0.0 {
        let qb = q_base(hd, i);
        let kb = hd.b * p.k_stride_b + hd.hk * p.k_stride_h + kv_offset(true, hd.b, j);
        var x = 0.0;
        for (var c = 0u; c < p.head_dim; c++) {
            x += f32(q[qb + c]) * f32(k[kb + c]);
        }
        slope = cap_slope(vec4<f32>(x * p.scale)).x;
    }
    d_scores[at] = pr * (dp - delta_at(hd, i)) * slope;
}

@compute @workgroup_size(64, 1, 1)
fn bwd_mat_dq(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    if i >= p.len_q {
        return;
    }
    let bh = p.bh_start + wid.y;
    let hd = head_of(bh);
    let qb = q_base(hd, i);
    let k_head = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    for (var c = 0u; c < p.head_dim; c++) {
        var sum = 0.0;
        for (var j = 0u; j < p.len_k; j++) {
            let ds = d_scores[score_index(bh, i, j)];
            // Masked: nothing from its K row, whatever it holds. `== 0.0`, never
            // `!= 0.0`: naga compiles a float `!=` to an ordered compare, false for
            // NaN, which would drop a NaN dX (issue 64).
            if ds == 0.0 {
                continue;
            }
            sum += ds * f32(k[k_head + kv_offset(true, hd.b, j) + c]);
        }
        dq[qb + c] = elem(sum * p.scale);
    }
}

@compute @workgroup_size(64, 1, 1)
fn bwd_mat_dkdv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = gid.x;
    if j >= p.len_k {
        return;
    }
    let pair = p.bh_start + wid.y;
    let b = pair / p.heads_kv;
    let hk = pair % p.heads_kv;
    let group = p.heads_q / p.heads_kv;
    let kb = b * p.k_stride_b + hk * p.k_stride_h + kv_offset(true, b, j);
    let vb = b * p.v_stride_b + hk * p.v_stride_h + kv_offset(false, b, j);
    for (var c = 0u; c < max(p.head_dim, p.head_dim_v); c++) {
        var dk_sum = 0.0;
        var dv_sum = 0.0;
        for (var g = 0u; g < group; g++) {
            let hd = Head(b, hk * group + g, hk);
            let bh = b * p.heads_q + hd.h;
            for (var i = 0u; i < p.len_q; i++) {
                let at = score_index(bh, i, j);
                // A pair of weight 0 (masked) adds nothing, whatever the row's Q and dO
                // hold (0 x NaN), as dX is 0 there (bwd_mat_ds).
                if probs[at] == 0.0 {
                    continue;
                }
                if c < p.head_dim {
                    dk_sum += d_scores[at] * f32(q[q_base(hd, i) + c]);
                }
                if c < p.head_dim_v {
                    dv_sum += probs[at] * f32(d_out[do_base(hd, i) + c]);
                }
            }
        }
        if c < p.head_dim {
            dk[kb + c] = elem(dk_sum * p.scale);
        }
        if c < p.head_dim_v {
            dv[vb + c] = elem(dv_sum);
        }
    }
}
