// How flash_decode_lanes.wgsl reads an int8 KV cache (src/quantized_kv.rs,
// docs/design.md "int8 KV cache"): K and V rows of signed 8-bit codes, 16 to a 16-byte
// word (byte c of 32-bit word i is element 4i + c), and one f32 scale per row (per
// token and kv head), element x = code * scale. The scale of the row whose first
// element is element e of K is k_scales[e / head_dim] (the codes' rows are whole and
// contiguous in either layout, so the row order of the scales is the codes'). The
// kernel multiplies a key's score by its K scale once, after the dot product of codes,
// and its probabilities by the V scale once, before P·V. The other form of this file is
// decode_lanes_float.wgsl.

@group(0) @binding(24) var<storage, read> k_scales: array<f32>;
@group(0) @binding(25) var<storage, read> v_scales: array<f32>;

// Elements of a 16-byte word.
const EW: u32 = 16u;

alias WordElements = array<vec4<f32>, 4>;

// The four signed bytes of a 32-bit word as f32: shift each to the top, then
// arithmetic-shift it back down (sign-extending).
fn signed_bytes(x: u32) -> vec4<f32> {
    let top = bitcast<vec4<i32>>(vec4<u32>(x) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(top >> vec4<u32>(24u));
}

fn word_elements(w: vec4<u32>) -> WordElements {
    return WordElements(signed_bytes(w.x), signed_bytes(w.y), signed_bytes(w.z), signed_bytes(w.w));
}

// The scales of the K and V rows starting at 16-byte words k_at and v_at (head dims
// are whole words here: kernels::decode::lanes_fit).
fn row_scales(k_at: u32, v_at: u32) -> vec2<f32> {
    return vec2<f32>(k_scales[k_at / (p.head_dim / EW)], v_scales[v_at / (p.head_dim_v / EW)]);
}
