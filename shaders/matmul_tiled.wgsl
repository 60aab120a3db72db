// The linear layer's portable tiling (GPUs, and CPU adapters without subgroups),
// appended to matmul.wgsl (parameters, bias, outputs, split-epilogue `store`).
//
// A 16 x 16 workgroup owns a 64 x 64 block of Y, each invocation a 4 x 4 block; X and W
// tiles of 64 x 16 are staged in workgroup memory (8 KiB) per step of 16 along K, so
// each loaded element feeds 64 multiply-adds. X rows are lp.x_stride elements apart.

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;

// X[row][col], zero past K (row already clamped into range).
fn x_at(row: u32, col: u32) -> f32 {
    return select(0.0, f32(x[row * lp.x_stride + min(col, lp.k - 1u)]), col < lp.k);
}

fn w_at(row: u32, col: u32) -> f32 {
    return select(0.0, f32(w[(lp.w_row0 + row) * lp.k + min(col, lp.k - 1u)]), col < lp.k);
}

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

var<workgroup> x_tile: array<array<f32, TILE_K>, TILE>;
var<workgroup> w_tile: array<array<f32, TILE_K>, TILE>;

@compute @workgroup_size(16, 16, 1)
fn linear_tiled(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    let flat = lid.y * 16u + lid.x;
    var acc: array<vec4<f32>, 4>; // acc[i][j]: row m0 + 4 lid.y + i, column n0 + 4 lid.x + j
    for (var k0 = 0u; k0 < lp.k; k0 += TILE_K) {
        // 256 invocations stage 64 x 16 elements of each matrix: 4 each.
        for (var e = flat; e < TILE * TILE_K; e += 256u) {
            let r = e / TILE_K;
            let c = e % TILE_K;
            x_tile[r][c] = x_at(min(m0 + r, lp.m - 1u), k0 + c);
            w_tile[r][c] = w_at(min(n0 + r, lp.n - 1u), k0 + c);
        }
        workgroupBarrier();
        for (var c = 0u; c < TILE_K; c++) {
            let xs = vec4<f32>(x_tile[4u * lid.y][c], x_tile[4u * lid.y + 1u][c], x_tile[4u * lid.y + 2u][c], x_tile[4u * lid.y + 3u][c]);
            let ws = vec4<f32>(w_tile[4u * lid.x][c], w_tile[4u * lid.x + 1u][c], w_tile[4u * lid.x + 2u][c], w_tile[4u * lid.x + 3u][c]);
            acc[0] += xs.x * ws;
            acc[1] += xs.y * ws;
            acc[2] += xs.z * ws;
            acc[3] += xs.w * ws;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            store(m0 + 4u * lid.y + i, n0 + 4u * lid.x + j, acc[i][j]);
        }
    }
}
