// Attention weights averaged over heads: out[b, i] = mean over h of w[b, h, i], where i
// runs over the Lq x Lk plane (PyTorch's `average_attn_weights=True`).
//
// Tiling: one invocation per output element, 64 per workgroup along the plane and one
// workgroup row per batch element; each invocation sums its heads in order (f32, the
// weights' dtype).

struct MeanParams {
    heads: u32,
    plane: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> mp: MeanParams;
@group(0) @binding(1) var<storage, read> per_head: array<f32>;
@group(0) @binding(2) var<storage, read_write> averaged: array<f32>;

@compute @workgroup_size(64, 1, 1)
fn mean_heads(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let b = gid.y;
    // Grid-stride over the plane: it may hold more elements than one dispatch row.
    for (var i = gid.x; i < mp.plane; i += groups.x * 64u) {
        var sum = 0.0;
        for (var h = 0u; h < mp.heads; h++) {
            sum += per_head[(b * mp.heads + h) * mp.plane + i];
        }
        averaged[b * mp.plane + i] = sum / f32(mp.heads);
    }
}
