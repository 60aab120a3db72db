// The backward pass of fused attention, FlashAttention-2's algorithm at its simplest
// tiling (one row or one key per invocation, K/V and Q straight from storage, no
// workgroup memory: it runs on every adapter), appended to attention_common.wgsl,
// backward_common.wgsl and row_lanes.wgsl. On GPUs each row (key) is owned by
// ROW_LANES invocations holding a constant 8 vec4s of each of its arrays, so that they
// live in registers (kernels::backward::rows_for); the lanes' partial dot products are
// summed by row_sum_lanes.
// Scores are recomputed with the forward's rules (apply_masks) and P = exp(s - lse)
// from the forward's log-sum-exp; the score matrix is never stored (docs/design.md,
// "Backward"). With s = softcap(x) + bias, x = scale·q·k, P = softmax(s), dO given:
//   D_i = dO_i·O_i;  dP_ij = dO_i·v_j;  dS_ij = P_ij (dP_ij - D_i);
//   dX_ij = dS_ij (1 - (softcap(x_ij)/cap)²) with a soft cap, else dS_ij;
//   dQ_i = scale Σ_j dX_ij k_j;  dK_j = scale Σ_i dX_ij q_i;  dV_j = Σ_i P_ij dO_i,
// dK and dV summed over the query heads of a key/value head (GQA). No atomics: each
// gradient row is one invocation's sum, in a fixed order, so results repeat bit for bit.
//
//   bwd_delta: one invocation per query row: D_i into `scores` ([B·Hq·Lq] f32).
//   bwd_dkdv: one invocation (ROW_LANES) per key of one (batch, kv head): walks the query rows
//     of p.key_begin .. p.key_stop (rows, in this pass) that can see any of its
//     workgroup's keys (causal, window, key lengths), of each query head sharing it,
//     in blocks of 4 rows, and writes dK_j and dV_j (adding what an earlier dispatch over
//     earlier rows left, when p.key_begin > 0: llvmpipe's loop cap splits long ranges).
//   bwd_dq: one invocation (ROW_LANES) per query row: walks keys p.key_begin .. p.key_stop in
//     blocks of 4 and writes dQ_i (resuming likewise).
// Gradients are written in the inputs' layout (the strides of q, k and v) and dtype,
// accumulated in f32.

// Each lane's share of its row's (key's) arrays (row_lanes.wgsl).
var<private> row_a: array<vec4<f32>, ROW_VEC4>; // a Q or K row, by pass
var<private> row_b: array<vec4<f32>, ROW_VEC4>; // a dO or V row
var<private> acc_a: array<vec4<f32>, ROW_VEC4>; // dQ or dK
var<private> acc_b: array<vec4<f32>, ROW_VEC4>; // dV

@compute @workgroup_size(64, 1, 1)
fn bwd_delta(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    if i >= p.len_q {
        return;
    }
    let hd = head_of(p.bh_start + wid.y);
    let o = do_base(hd, i);
    var sum = 0.0;
    for (var c = 0u; c < p.head_dim_v; c++) {
        sum += f32(d_out[o + c]) * f32(o_in[o + c]);
    }
    scores[(hd.b * p.heads_q + hd.h) * p.len_q + i] = sum;
}

@compute @workgroup_size(ROWS, 1, 1)
fn bwd_dq(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = head_of(p.bh_start + wid.y);
    let row = wid.x * block_rows() + enter_row(lid.x);
    let i = min(row, p.len_q - 1u);
    let d4 = row_vec4s(p.head_dim);
    let dv4 = row_vec4s(p.head_dim_v);
    let qb = q_base(hd, i);
    for (var t = 0u; t < d4; t++) {
        row_a[t] = qrow4(qb, row_vec4(t));
        acc_a[t] = vec4<f32>(0.0);
    }
    let ob = do_base(hd, i);
    for (var t = 0u; t < dv4; t++) {
        row_b[t] = doload4(ob, row_vec4(t));
    }
    let lse4 = vec4<f32>(lse_at(hd, i));
    let delta = delta_at(hd, i);
    let start = vec4<u32>(key_start(hd.b, i));
    let end = vec4<u32>(min(key_end(hd.b, i), p.key_stop));
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    // The workgroup's rows walk the same keys: from its first row's first key to the
    // last key its last row sees (uniform bounds, as the forward's).
    let row0 = wid.x * block_rows();
    let first = block_key_begin(hd.b, min(row0, p.len_q - 1u));
    let last = min(key_end(hd.b, min(row0 + block_rows() - 1u, p.len_q - 1u)), p.key_stop);
    for (var j0 = first; j0 < last; j0 += 4u) {
        let kr = row_offsets(true, hd.b, k_base, j0);
        var x = vec4<f32>(0.0);
        for (var t = 0u; t < d4; t++) {
            let qt = row_a[t];
            x += vec4<f32>(
                dot(qt, load4(true, kr.x, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.y, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.z, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.w, row_vec4(t), p.head_dim)),
            );
        }
        x = row_sum_lanes(x) * p.scale;
        let keys = keys4(j0);
        let s = apply_masks(x, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_key_range(keys, start, end), mask_words_of_keys(hd.b, hd.h, i, j0));
        let pr = probs_of(s, lse4);
        let vr = row_offsets(false, hd.b, v_base, j0);
        var dp = vec4<f32>(0.0);
        for (var t = 0u; t < dv4; t++) {
            let dot_t = row_b[t];
            dp += vec4<f32>(
                dot(dot_t, load4(false, vr.x, row_vec4(t), p.head_dim_v)),
                dot(dot_t, load4(false, vr.y, row_vec4(t), p.head_dim_v)),
                dot(dot_t, load4(false, vr.z, row_vec4(t), p.head_dim_v)),
                dot(dot_t, load4(false, vr.w, row_vec4(t), p.head_dim_v)),
            );
        }
        dp = row_sum_lanes(dp);
        // Masked keys add nothing, whatever their K and V rows hold (a key past a key
        // length may hold anything, NaN included: 0 x NaN would spread it).
        let dx = select(pr * (dp - vec4<f32>(delta)) * cap_slope(x) * p.scale, vec4<f32>(0.0), pr == vec4<f32>(0.0));
        for (var t = 0u; t < d4; t++) {
            // `== 0.0`, never `!= 0.0`: naga compiles a float `!=` to an ordered compare,
            // false for NaN, which would drop a NaN dX (issue 64).
            acc_a[t] += select(dx.x * load4(true, kr.x, row_vec4(t), p.head_dim), vec4<f32>(0.0), dx.x == 0.0)
                + select(dx.y * load4(true, kr.y, row_vec4(t), p.head_dim), vec4<f32>(0.0), dx.y == 0.0)
                + select(dx.z * load4(true, kr.z, row_vec4(t), p.head_dim), vec4<f32>(0.0), dx.z == 0.0)
                + select(dx.w * load4(true, kr.w, row_vec4(t), p.head_dim), vec4<f32>(0.0), dx.w == 0.0);
        }
    }
    if row >= p.len_q {
        return;
    }
    for (var t = 0u; t < d4; t++) {
        for (var c = 0u; c < 4u; c++) {
            let d = row_vec4(t) * 4u + c;
            if d < p.head_dim {
                store_dq_element(qb + d, acc_a[t][c]);
            }
        }
    }
}

@compute @workgroup_size(ROWS, 1, 1)
fn bwd_dkdv(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // p.bh_start + wid.y counts (batch, kv head) pairs in this pass.
    let pair = p.bh_start + wid.y;
    let b = pair / p.heads_kv;
    let hk = pair % p.heads_kv;
    let key = wid.x * block_rows() + enter_row(lid.x);
    let j = min(key, p.len_k - 1u);
    let d4 = row_vec4s(p.head_dim);
    let dv4 = row_vec4s(p.head_dim_v);
    let kb = b * p.k_stride_b + hk * p.k_stride_h + kv_offset(true, b, j);
    let vb = b * p.v_stride_b + hk * p.v_stride_h + kv_offset(false, b, j);
    for (var t = 0u; t < d4; t++) {
        row_a[t] = load4(true, kb, row_vec4(t), p.head_dim);
        acc_a[t] = vec4<f32>(0.0);
    }
    for (var t = 0u; t < dv4; t++) {
        row_b[t] = load4(false, vb, row_vec4(t), p.head_dim_v);
        acc_b[t] = vec4<f32>(0.0);
    }
    let group = p.heads_q / p.heads_kv;
    let keys = vec4<u32>(j);
    let last = p.len_q - 1u;
    // The rows any key of this workgroup is visible to (uniform bounds: from the
    // workgroup id alone).
    let first_key = wid.x * block_rows();
    let rows = rows_seeing(b, first_key, min(first_key + block_rows(), p.len_k) - 1u);
    for (var g = 0u; g < group; g++) {
        let hd = Head(b, hk * group + g, hk);
        for (var i0 = rows.x; i0 < rows.y; i0 += 4u) {
            let r4 = min(vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
            let real = vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(rows.y);
            let q0 = q_base(hd, r4.x);
            let q1 = q_base(hd, r4.y);
            let q2 = q_base(hd, r4.z);
            let q3 = q_base(hd, r4.w);
            var x = vec4<f32>(0.0);
            for (var t = 0u; t < d4; t++) {
                let kt = row_a[t];
                let at = row_vec4(t);
                x += vec4<f32>(dot(qrow4(q0, at), kt), dot(qrow4(q1, at), kt), dot(qrow4(q2, at), kt), dot(qrow4(q3, at), kt));
            }
            x = row_sum_lanes(x) * p.scale;
            let in_range = in_key_range(keys, key_starts(b, r4), key_ends(b, r4)) & real;
            let s = apply_masks(x, b, vec4<u32>(hd.h), r4, keys, in_range, mask_words_of_rows(b, hd.h, r4, j));
            let lse4 = vec4<f32>(lse_at(hd, r4.x), lse_at(hd, r4.y), lse_at(hd, r4.z), lse_at(hd, r4.w));
            let pr = probs_of(s, lse4);
            let o0 = do_base(hd, r4.x);
            let o1 = do_base(hd, r4.y);
            let o2 = do_base(hd, r4.z);
            let o3 = do_base(hd, r4.w);
            var dp = vec4<f32>(0.0);
            for (var t = 0u; t < dv4; t++) {
                let at = row_vec4(t);
                let a = doload4(o0, at);
                let bb = doload4(o1, at);
                let c = doload4(o2, at);
                let e = doload4(o3, at);
                let vt = row_b[t];
                dp += vec4<f32>(dot(a, vt), dot(bb, vt), dot(c, vt), dot(e, vt));
                acc_b[t] += pr.x * a + pr.y * bb + pr.z * c + pr.w * e;
            }
            dp = row_sum_lanes(dp);
            let delta4 = vec4<f32>(delta_at(hd, r4.x), delta_at(hd, r4.y), delta_at(hd, r4.z), delta_at(hd, r4.w));
            // This key masked for a row: nothing from it, whatever its rows hold.
            let dx = select(pr * (dp - delta4) * cap_slope(x) * p.scale, vec4<f32>(0.0), pr == vec4<f32>(0.0));
            for (var t = 0u; t < d4; t++) {
                let at = row_vec4(t);
                acc_a[t] += dx.x * qrow4(q0, at) + dx.y * qrow4(q1, at) + dx.z * qrow4(q2, at) + dx.w * qrow4(q3, at);
            }
        }
    }
    if key >= p.len_k {
        return;
    }
    let seen = key < key_limit(b); // else 0 (backward_common.wgsl, key_limit)
    for (var t = 0u; t < d4; t++) {
        for (var c = 0u; c < 4u; c++) {
            let d = row_vec4(t) * 4u + c;
            if d < p.head_dim {
                store_dk_element(kb + d, select(0.0, acc_a[t][c], seen));
            }
        }
    }
    for (var t = 0u; t < dv4; t++) {
        for (var c = 0u; c < 4u; c++) {
            let d = row_vec4(t) * 4u + c;
            if d < p.head_dim_v {
                store_dv_element(vb + d, select(0.0, acc_b[t][c], seen));
            }
        }
    }
}
