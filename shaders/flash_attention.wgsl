// Fused attention in the FlashAttention style: one pass over K and V with an online
// softmax (flash_common.wgsl), never storing the score matrix. Memory beyond Q, K, V and
// the output is one log-sum-exp per row.
//
// Tiling: a workgroup of ROWS invocations owns ROWS / ROW_LANES consecutive query rows
// of one (batch, head); each row is owned by ROW_LANES invocations (one, but for the
// GPU classes past D 64; flash_common.wgsl). Two entry points differ only in where K and V come from:
//
//   flash_registers: straight from storage. All invocations of a workgroup walk the
//     same keys in lockstep, so K/V addresses are uniform across the workgroup. No
//     barriers. The portable CPU-adapter path (flash_subgroup.wgsl is faster where
//     subgroups exist).
//   flash_shared: a tile of keys of K and V is staged in workgroup memory (16 KiB) by
//     the whole workgroup between barriers. For GPUs, in head-dim classes
//     (kernels::flash::shared_for): at D <= 64 the row loops run to a constant and
//     the row's state stays in registers; at 128 and 256 each row is split over 2
//     and 4 lanes (ROW_LANES, flash_common.wgsl), each holding the same 16 vec4s of Q
//     and of the accumulator, its partial scores summed by subgroup shuffles. The
//     run-time head-dim kernel (CPU adapters, and GPUs without subgroups) keeps a
//     GPU's row state in scratch memory (docs/isa.md).
//
// Masks: the key loop runs from the first key the workgroup's first row can see
// (window) to the last key its last row can see (causal, window, key lengths), so
// tiles wholly outside are never loaded; within the loop each position is masked
// individually (mask4). The loop covers the keys
// p.key_begin .. p.key_stop of this dispatch (all of them unless split, see
// flash_common.wgsl).

@compute @workgroup_size(ROWS, 1, 1)
fn flash_registers(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = setup_row(lid.x, wid);
    let d4 = row_vec4s(p.head_dim);
    let dv4 = row_vec4s(p.head_dim_v);
    let keys = block_keys(wid);
    for (var j0 = keys.x; j0 < keys.y; j0 += 4u) {
        let kr = row_offsets(true, s.hd.b, s.k_base, j0);
        var raw = vec4<f32>(0.0);
        for (var t = 0u; t < d4; t++) {
            let qt = q_row[t];
            raw += vec4<f32>(
                dot(qt, load4(true, kr.x, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.y, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.z, row_vec4(t), p.head_dim)),
                dot(qt, load4(true, kr.w, row_vec4(t), p.head_dim)),
            );
        }
        let pr = online_step(mask4(row_sum_lanes(raw), s, j0));
        let vr = row_offsets(false, s.hd.b, s.v_base, j0);
        for (var t = 0u; t < dv4; t++) {
            acc[t] += pr.x * load4(false, vr.x, row_vec4(t), p.head_dim_v) + pr.y * load4(false, vr.y, row_vec4(t), p.head_dim_v)
                + pr.z * load4(false, vr.z, row_vec4(t), p.head_dim_v) + pr.w * load4(false, vr.w, row_vec4(t), p.head_dim_v);
        }
    }
    finish_row(s);
}

// 16 KiB of workgroup memory, shared by the K tile and the V tile and, on GPUs without
// subgroups, the row lanes' sums (LANE_SLOTS, row_lanes.wgsl).
const TILE_VEC4: u32 = 1024u - LANE_SLOTS;
var<workgroup> kv_tile: array<vec4<f32>, TILE_VEC4>;

@compute @workgroup_size(ROWS, 1, 1)
fn flash_shared(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = setup_row(lid.x, wid);
    // A staged key's K row and V row: every lane's share, vec4 by vec4 (row_vec4).
    let d4 = row_vec4s(p.head_dim) * ROW_LANES;
    let dv4 = row_vec4s(p.head_dim_v) * ROW_LANES;
    // Keys per tile: as many as fit, a multiple of 4 (at least 4 since d4 + dv4 <= 128
    // and TILE_VEC4 >= 768).
    let tile_keys = (TILE_VEC4 / (d4 + dv4)) / 4u * 4u;
    let v_off = tile_keys * d4; // V rows follow the K rows in kv_tile
    let last_k = last_read_key(s.hd.b); // keys past it are masked; their rows may hold anything
    let keys = block_keys(wid);
    for (var tile0 = keys.x; tile0 < keys.y; tile0 += tile_keys) {
        // Cooperative load: K rows then V rows of keys tile0 .. tile0 + tile_keys.
        for (var x = lid.x; x < tile_keys * (d4 + dv4); x += ROWS) {
            if x < v_off {
                let key = min(tile0 + x / d4, last_k);
                kv_tile[x] = load4(true, s.k_base + kv_offset(true, s.hd.b, key), x % d4, p.head_dim);
            } else {
                let y = x - v_off;
                let key = min(tile0 + y / dv4, last_k);
                kv_tile[x] = load4(false, s.v_base + kv_offset(false, s.hd.b, key), y % dv4, p.head_dim_v);
            }
        }
        workgroupBarrier();
        let tile_end = min(tile_keys, keys.y - tile0);
        for (var jj = 0u; jj < tile_end; jj += 4u) {
            var raw = vec4<f32>(0.0);
            for (var t = 0u; t < row_vec4s(p.head_dim); t++) {
                let qt = q_row[t];
                let x = row_vec4(t);
                raw += vec4<f32>(
                    dot(qt, kv_tile[jj * d4 + x]),
                    dot(qt, kv_tile[(jj + 1u) * d4 + x]),
                    dot(qt, kv_tile[(jj + 2u) * d4 + x]),
                    dot(qt, kv_tile[(jj + 3u) * d4 + x]),
                );
            }
            let pr = online_step(mask4(row_sum_lanes(raw), s, tile0 + jj));
            for (var t = 0u; t < row_vec4s(p.head_dim_v); t++) {
                let x = v_off + row_vec4(t);
                acc[t] += pr.x * kv_tile[x + jj * dv4] + pr.y * kv_tile[x + (jj + 1u) * dv4]
                    + pr.z * kv_tile[x + (jj + 2u) * dv4] + pr.w * kv_tile[x + (jj + 3u) * dv4];
            }
        }
        workgroupBarrier();
    }
    finish_row(s);
}
