// What the tensor-core kernels (flash_coop.wgsl, flash_backward_coop.wgsl) share to
// stage operands 16 bytes at a time (docs/design.md, "Tensor cores"): the elements of
// a word and the write of a word's elements, as f16, into the kernel's `tiles`
// (declared by each kernel: `var<workgroup> tiles: array<f16, N>`).

const VE: u32 = 4u * ELEMS_PER_WORD; // elements per 16-byte word

// Writes a word's elements as f16 at tiles[at ..]: halves of its u32s (f16 storage) or
// its u32s as f32 bits (split with unpack2x16float, as naga 30 mis-types
// bitcast<vec2<f16>>(u32)).
fn put_word(at: u32, v: vec4<u32>) {
    if ELEMS_PER_WORD == 2u {
        let h0 = vec2<f16>(unpack2x16float(v.x));
        let h1 = vec2<f16>(unpack2x16float(v.y));
        let h2 = vec2<f16>(unpack2x16float(v.z));
        let h3 = vec2<f16>(unpack2x16float(v.w));
        tiles[at] = h0.x;
        tiles[at + 1u] = h0.y;
        tiles[at + 2u] = h1.x;
        tiles[at + 3u] = h1.y;
        tiles[at + 4u] = h2.x;
        tiles[at + 5u] = h2.y;
        tiles[at + 6u] = h3.x;
        tiles[at + 7u] = h3.y;
    } else {
        tiles[at] = f16(bitcast<f32>(v.x));
        tiles[at + 1u] = f16(bitcast<f32>(v.y));
        tiles[at + 2u] = f16(bitcast<f32>(v.z));
        tiles[at + 3u] = f16(bitcast<f32>(v.w));
    }
}
