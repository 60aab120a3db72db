// An int8 KV cache's K or V as the attention's element type (src/quantized_kv.rs), for
// the paths that do not read codes themselves: element e of the output is code e times
// the scale of its row, scales[e / dim] (codes four to a 32-bit word, byte c of word i
// being element 4i + c; output and codes share shape and layout, rows whole and
// contiguous).
//
// Tiling: workgroups of 64 invocations over a 2D grid, invocation (x, y) of a grid
// groups.x * 64 wide taking word y * width + x: its four elements.

struct DequantizeParams {
    words: u32,
    dim: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> dp: DequantizeParams;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<f32>;
@group(0) @binding(3) var<storage, read_write> values: array<elem>;

@compute @workgroup_size(64, 1, 1)
fn kv_dequantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = gid.y * groups.x * 64u + gid.x;
    if w >= dp.words {
        return;
    }
    let word = codes[w];
    let scale = scales[4u * w / dp.dim];
    for (var c = 0u; c < 4u; c++) {
        let code = bitcast<i32>(word << (24u - 8u * c)) >> 24u;
        values[4u * w + c] = elem(f32(code) * scale);
    }
}
