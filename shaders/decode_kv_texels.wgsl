// How flash_decode_subgroup.wgsl reads K and V from a KV cache's texel mirror
// (src/kernels/kv_texels.rs): each buffer's 16-byte words copied in order into an
// rgba32uint 2D-array texture, word w at texel (w % width, (w / width) %
// KV_TEXEL_ROWS) of layer w / (width * KV_TEXEL_ROWS), width = 1 << KV_TEXEL_SHIFT.
// A texel fetch is a gather on llvmpipe, where a storage load goes lane by lane: on
// Mesa 22.3's lavapipe the split pass ran 1.3-1.55x faster so (docs/design.md,
// "KV cache"). The other form of this file is decode_kv_buffers.wgsl.

@group(0) @binding(11) var k_texels: texture_2d_array<u32>;
@group(0) @binding(12) var v_texels: texture_2d_array<u32>;

// log2 of the texels per texture row, and the rows per layer (set by the host,
// kernels::kv_texels::TexelGrid).
override KV_TEXEL_SHIFT: u32 = 12u;
override KV_TEXEL_ROWS: u32 = 1024u;

// The 16 bytes of K or V holding element e. The texel coordinates are i32 (they are
// below 2^31): naga 30 writes invalid SPIR-V for u32 ones under its `Restrict`
// bounds-check policy (docs/design.md, "naga 30 and spirv-val").
fn kv_words(is_k: bool, e: u32) -> vec4<u32> {
    let w = e / (4u * ELEMS_PER_WORD);
    let row = w >> KV_TEXEL_SHIFT;
    let at = vec2<i32>(vec2<u32>(w & ((1u << KV_TEXEL_SHIFT) - 1u), row % KV_TEXEL_ROWS));
    let layer = row / KV_TEXEL_ROWS;
    if is_k {
        return textureLoad(k_texels, at, layer, 0);
    }
    return textureLoad(v_texels, at, layer, 0);
}
