// Copies rows of a row-major `elem` matrix into an rgba32float 2D-array texture, four
// consecutive columns per texel, so that the texture GEMM (matmul_texture.wgsl) can
// fetch operands as texels. Row r of the matrix becomes texel row r % layer_rows of
// layer r / layer_rows (one layer unless the rows exceed the texture height limit);
// columns past `cols` are zero, so the GEMM needs no K remainder. f16 values widen to
// f32 exactly.
//
// Tiling: one invocation per texel, an 8 x 8 workgroup covering 8 texels of 8 rows.

struct PackParams {
    rows: u32,
    cols: u32,
    // Elements from one source row to the next, and the first source row.
    stride: u32,
    row0: u32,
    layer_rows: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> pp: PackParams;
@group(0) @binding(1) var<storage, read> src: array<elem>;
@group(0) @binding(2) var dst: texture_storage_2d_array<rgba32float, write>;

fn source_at(row: u32, col: u32) -> f32 {
    return select(0.0, f32(src[(pp.row0 + row) * pp.stride + min(col, pp.cols - 1u)]), col < pp.cols);
}

@compute @workgroup_size(8, 8, 1)
fn pack_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let texel = gid.x;
    let row = gid.y;
    if row >= pp.rows || 4u * texel >= pp.cols {
        return;
    }
    let col = 4u * texel;
    let value = vec4<f32>(source_at(row, col), source_at(row, col + 1u), source_at(row, col + 2u), source_at(row, col + 3u));
    textureStore(dst, vec2<u32>(texel, row % pp.layer_rows), row / pp.layer_rows, value);
}
