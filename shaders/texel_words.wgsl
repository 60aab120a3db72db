// Texel mirrors (kernels::kv_texels): the 16-byte words of two buffers in two
// rgba32uint 2D-array textures, fetched a word at a time, and the words' elements as
// f32. For the generated texel kernel (flash_texel.wgsl: K and V), whose host code
// writes its entry points. llvmpipe gathers texel fetches where it
// walks storage loads lane by lane.

@group(0) @binding(11) var k_texels: texture_2d_array<u32>;
@group(0) @binding(12) var v_texels: texture_2d_array<u32>;

// log2 of the texels per texture row, and the rows per layer (set by the host,
// kernels::kv_texels::TexelGrid).
override KV_TEXEL_SHIFT: u32 = 12u;
override KV_TEXEL_ROWS: u32 = 1024u;

// Where word w of a mirror lies: (x, y, layer).
fn texel_of(w: u32) -> vec3<u32> {
    let row = w >> KV_TEXEL_SHIFT;
    return vec3<u32>(w & ((1u << KV_TEXEL_SHIFT) - 1u), row % KV_TEXEL_ROWS, row / KV_TEXEL_ROWS);
}

// The fetches take i32 coordinates (they are below 2^31): naga 30 writes invalid SPIR-V
// for u32 ones under its `Restrict` bounds-check policy (docs/design.md, "naga 30 and
// spirv-val").
fn k_word(w: u32) -> vec4<u32> {
    let at = texel_of(w);
    return textureLoad(k_texels, vec2<i32>(at.xy), at.z, 0);
}

fn v_word(w: u32) -> vec4<u32> {
    let at = texel_of(w);
    return textureLoad(v_texels, vec2<i32>(at.xy), at.z, 0);
}

// A word's elements as f32, four at a time: f32 words hold elements 0..3 (`word_f32`),
// f16 words 0..3 (`word_lo`) and 4..7 (`word_hi`). `keep` false gives zeros (words past
// the head dim: they belong to the next row, which may hold anything).
fn word_f32(x: vec4<u32>, keep: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), bitcast<vec4<f32>>(x), keep);
}

fn word_lo(x: vec4<u32>, keep: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)), keep);
}

fn word_hi(x: vec4<u32>, keep: bool) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)), keep);
}

// Element d of the Q rows `rows` (offsets of their first elements), scaled; zero past
// the head dim. Without a branch: each one costs compile time on Mesa 25.
fn q_quad(rows: vec4<u32>, d: u32) -> vec4<f32> {
    let dc = min(d, p.head_dim - 1u);
    let x = vec4<f32>(f32(q[rows.x + dc]), f32(q[rows.y + dc]), f32(q[rows.z + dc]), f32(q[rows.w + dc])) * p.scale;
    return select(vec4<f32>(0.0), x, d < p.head_dim);
}
