// How flash_decode_subgroup.wgsl reads K and V when they are only in their buffers:
// 16 bytes to a load (4 f32 or 8 f16 elements, ELEMS_PER_WORD to a word). llvmpipe
// loads storage lane by lane, or a gather per component, so one such load costs about
// what one element does. Bound to the same buffers as k and v. Buffers are whole
// 16-byte units (Context::check_buffer_size). The other form of this file is
// decode_kv_texels.wgsl.

@group(0) @binding(9) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> v4: array<vec4<u32>>;

// The 16 bytes of K or V holding element e.
fn kv_words(is_k: bool, e: u32) -> vec4<u32> {
    let at = e / (4u * ELEMS_PER_WORD);
    if is_k {
        return k4[at];
    }
    return v4[at];
}
