// How flash_decode_lanes.wgsl reads K and V held in the attention's own dtype (f32 or
// f16, ELEMS_PER_WORD to a 32-bit word): a 16-byte word is 4 or 8 elements, and rows
// need no scale. The other form of this file is decode_lanes_int8.wgsl.

// Elements of a 16-byte word.
const EW: u32 = 4u * ELEMS_PER_WORD;

// A word's elements as f32, in vec4s (the second is zero for f32).
alias WordElements = array<vec4<f32>, 2>;

fn word_elements(w: vec4<u32>) -> WordElements {
    if ELEMS_PER_WORD == 1u {
        return WordElements(bitcast<vec4<f32>>(w), vec4<f32>(0.0));
    }
    return WordElements(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}

// The scales of the K and V rows starting at 16-byte words k_at and v_at: none.
fn row_scales(k_at: u32, v_at: u32) -> vec2<f32> {
    return vec2<f32>(1.0);
}
