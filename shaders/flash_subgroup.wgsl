// Fused attention for CPU adapters with subgroups of at least 8 lanes (lavapipe).
// Same online softmax and masking as flash_attention.wgsl (see flash_common.wgsl).
//
// Why a separate kernel: CPU drivers run 8 invocations as one SIMD batch and perform a
// storage load lane by lane, even when every lane reads the same address, as all lanes
// do for K and V here. So instead, for each group of 8 head-dim elements of a K or V row,
// lane l loads element 8t + l once, and subgroupBroadcast hands each element to the
// other lanes (a register shuffle): 8x fewer loads for the same multiply-adds.
//
// Tiling: a workgroup owns ROWS query rows of one (batch, head); each invocation owns
// one row; keys in blocks of 4; no workgroup memory, no barriers. Lanes 0..7 of each
// subgroup must be active (the key loop is uniform across the workgroup).

fn bcast4(x: f32, hi: bool) -> vec4<f32> {
    if hi {
        return vec4<f32>(subgroupBroadcast(x, 4u), subgroupBroadcast(x, 5u), subgroupBroadcast(x, 6u), subgroupBroadcast(x, 7u));
    }
    return vec4<f32>(subgroupBroadcast(x, 0u), subgroupBroadcast(x, 1u), subgroupBroadcast(x, 2u), subgroupBroadcast(x, 3u));
}

fn kload(base: u32, d: u32) -> f32 {
    return select(0.0, f32(k[base + min(d, p.head_dim - 1u)]), d < p.head_dim);
}

fn vload(base: u32, d: u32) -> f32 {
    return select(0.0, f32(v[base + min(d, p.head_dim_v - 1u)]), d < p.head_dim_v);
}

@compute @workgroup_size(ROWS, 1, 1)
fn flash_subgroup(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let s = setup_row(lid.x, wid);
    let lane = sg_lane % 8u;
    let d8 = (p.head_dim + 7u) / 8u;
    let dv8 = (p.head_dim_v + 7u) / 8u;
    for (var j0 = 0u; j0 < s.block_end; j0 += 4u) {
        let kr = row_offsets(s.k_base, p.k_stride_s, j0);
        var raw = vec4<f32>(0.0);
        for (var t = 0u; t < d8; t++) {
            let d = t * 8u + lane;
            let x0 = kload(kr.x, d);
            let x1 = kload(kr.y, d);
            let x2 = kload(kr.z, d);
            let x3 = kload(kr.w, d);
            let qa = q_row[2u * t];
            let qb = q_row[2u * t + 1u];
            raw += vec4<f32>(
                dot(qa, bcast4(x0, false)) + dot(qb, bcast4(x0, true)),
                dot(qa, bcast4(x1, false)) + dot(qb, bcast4(x1, true)),
                dot(qa, bcast4(x2, false)) + dot(qb, bcast4(x2, true)),
                dot(qa, bcast4(x3, false)) + dot(qb, bcast4(x3, true)),
            );
        }
        let pr = online_step(mask4(raw, s, j0));
        let vr = row_offsets(s.v_base, p.v_stride_s, j0);
        for (var t = 0u; t < dv8; t++) {
            let d = t * 8u + lane;
            let y0 = vload(vr.x, d);
            let y1 = vload(vr.y, d);
            let y2 = vload(vr.z, d);
            let y3 = vload(vr.w, d);
            acc[2u * t] += pr.x * bcast4(y0, false) + pr.y * bcast4(y1, false) + pr.z * bcast4(y2, false) + pr.w * bcast4(y3, false);
            acc[2u * t + 1u] += pr.x * bcast4(y0, true) + pr.y * bcast4(y1, true) + pr.z * bcast4(y2, true) + pr.w * bcast4(y3, true);
        }
    }
    finish_row(s, wid.x * ROWS + lid.x);
}

