// Attention weights averaged over heads (PyTorch's `average_attn_weights=True`), one
// chunk of per-head weights at a time: the chunk holds heads bh_start ..
// bh_start + bh_count of the flattened (batch, head) axis, each an Lq x Lk plane.
// averaged[b, i] = (Σ_h w[b, h, i]) / heads, summed in head order across chunks: a
// batch element's first head starts the sum (from 0), every head adds to it in order,
// its last head divides it, so the result has the bits of one pass over all heads.
//
// Tiling: one invocation per plane element, 64 per workgroup along the plane (grid
// stride when the plane has more elements than one dispatch row), one workgroup row
// per batch element the chunk touches.

struct MeanParams {
    heads: u32,
    plane: u32,
    bh_start: u32,
    bh_count: u32,
}

@group(0) @binding(0) var<uniform> mp: MeanParams;
@group(0) @binding(1) var<storage, read> chunk: array<f32>;
@group(0) @binding(2) var<storage, read_write> averaged: array<f32>;

@compute @workgroup_size(64, 1, 1)
fn accumulate_heads(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let b = mp.bh_start / mp.heads + gid.y;
    let b_first = b * mp.heads;
    let first = max(mp.bh_start, b_first);
    let end = min(mp.bh_start + mp.bh_count, b_first + mp.heads);
    if first >= end {
        return;
    }
    for (var i = gid.x; i < mp.plane; i += groups.x * 64u) {
        var sum = select(averaged[b * mp.plane + i], 0.0, first == b_first);
        for (var bh = first; bh < end; bh++) {
            sum += chunk[(bh - mp.bh_start) * mp.plane + i];
        }
        if end == b_first + mp.heads {
            sum = sum / f32(mp.heads);
        }
        averaged[b * mp.plane + i] = sum;
    }
}
