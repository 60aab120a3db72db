// Materialized path, step 1: scores S = scale * Q Kᵀ + bias, with every mask applied
// (masked positions are written as -inf).
//
// Tiling: a workgroup of 8x8 invocations covers 32 queries x 32 keys of one
// (batch, head); each invocation computes a 4x4 block (4 query rows x 4 keys) in four
// vec4 register accumulators, looping over the head dimension. No workgroup memory and
// no barriers: register blocking is what runs fast on CPU adapters, and on GPUs the
// reused K and Q rows come from cache. Rows and keys past the end are clamped for
// loading and not stored.
//
// The fused path runs this kernel and softmax_rows.wgsl too when the caller asks for
// the attention weights: normalising scores against a maximum taken over the very
// same f32 scores is what keeps weights exact at any logit scale (exp(s - lse) with a
// recomputed s and an f32 lse of magnitude 1e3 is off by 1e-3; docs/design.md).

fn store_scores(acc: vec4<f32>, hd: Head, bh_local: u32, i: u32, j0: u32) {
    if i >= p.len_q {
        return;
    }
    let keys = keys4(j0);
    let in_range = in_key_range(keys, vec4<u32>(key_start(hd.b, i)), vec4<u32>(key_end(hd.b, i)));
    let s = apply_masks(acc * p.scale, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_range, mask_words_of_keys(hd.b, hd.h, i, j0));
    let row = bh_local * p.len_q + i;
    for (var c = 0u; c < 4u; c++) {
        if j0 + c < p.len_k {
            scores[row * p.len_k + j0 + c] = s[c];
        }
    }
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let bh_local = wid.z;
    let hd = head_of(p.bh_start + bh_local);
    let i0 = gid.y * 4u;
    let j0 = gid.x * 4u;
    if i0 >= p.len_q || j0 >= p.len_k {
        return;
    }
    // A block wholly outside its rows' visible ranges (window, causal, key lengths) is
    // all -inf.
    let skip = j0 >= key_end(hd.b, min(i0 + 3u, p.len_q - 1u)) || j0 + 4u <= key_start(hd.b, i0);

    let q_base = hd.b * p.q_stride_b + hd.h * p.q_stride_h;
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let last_q = p.len_q - 1u;
    let last_k = p.len_k - 1u;
    let q0 = q_base + min(i0, last_q) * p.q_stride_s;
    let q1 = q_base + min(i0 + 1u, last_q) * p.q_stride_s;
    let q2 = q_base + min(i0 + 2u, last_q) * p.q_stride_s;
    let q3 = q_base + min(i0 + 3u, last_q) * p.q_stride_s;
    let k0 = k_base + kv_offset(true, hd.b, min(j0, last_k));
    let k1 = k_base + kv_offset(true, hd.b, min(j0 + 1u, last_k));
    let k2 = k_base + kv_offset(true, hd.b, min(j0 + 2u, last_k));
    let k3 = k_base + kv_offset(true, hd.b, min(j0 + 3u, last_k));

    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    if !skip {
        for (var t = 0u; t < p.head_dim; t++) {
            let kt = vec4<f32>(f32(k[k0 + t]), f32(k[k1 + t]), f32(k[k2 + t]), f32(k[k3 + t]));
            a0 += f32(q[q0 + t]) * kt;
            a1 += f32(q[q1 + t]) * kt;
            a2 += f32(q[q2 + t]) * kt;
            a3 += f32(q[q3 + t]) * kt;
        }
    }
    store_scores(a0, hd, bh_local, i0, j0);
    store_scores(a1, hd, bh_local, i0 + 1u, j0);
    store_scores(a2, hd, bh_local, i0 + 2u, j0);
    store_scores(a3, hd, bh_local, i0 + 3u, j0);
}
