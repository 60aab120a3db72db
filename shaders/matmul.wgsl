// Linear layer as a GEMM: Y = X · Wᵀ (+ bias), the layout of PyTorch's nn.Linear.
// X is [M, K] (row stride x_stride), W is [N, K], bias [N], both starting at row
// w_row0 of their buffers (one packed [3E, E] Q/K/V weight serves three projections);
// all row-major `elem`
// (f32 or f16), accumulated in f32. Used for the attention projections and as the
// benchmark's roofline probe.
//
// Split epilogue: output columns [0, seg1) go to out0, [seg1, seg2) to out1 and
// [seg2, N) to out2, each a dense row-major [M, width] matrix. A fused Q/K/V projection
// thus writes Q, K and V straight into three head-split BSHD tensors ([B, S, H, D] is
// [B*S, H*D] row-major). With seg1 = seg2 = N everything goes to out0.
//
// Two tilings, chosen by the host like the attention kernels' (see src/kernels/matmul.rs):
// linear_tiled here (GPUs, and CPU adapters without subgroups) and linear_subgroup in
// matmul_subgroup.wgsl, which is appended to this file.
//
// linear_tiled: a 16 x 16 workgroup owns a 64 x 64 block of Y, each invocation a 4 x 4
// block; X and W tiles of 64 x 16 are staged in workgroup memory (8 KiB) per step of 16
// along K, so each loaded element feeds 64 multiply-adds.

struct LinearParams {
    m: u32,
    n: u32,
    k: u32,
    x_stride: u32,
    has_bias: u32,
    seg1: u32,
    seg2: u32,
    w_row0: u32,
}

@group(0) @binding(0) var<uniform> lp: LinearParams;
@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;
@group(0) @binding(3) var<storage, read> bias: array<elem>;
@group(0) @binding(4) var<storage, read_write> out0: array<elem>;
@group(0) @binding(5) var<storage, read_write> out1: array<elem>;
@group(0) @binding(6) var<storage, read_write> out2: array<elem>;

// X[row][col], zero past K (row already clamped into range).
fn x_at(row: u32, col: u32) -> f32 {
    return select(0.0, f32(x[row * lp.x_stride + min(col, lp.k - 1u)]), col < lp.k);
}

fn w_at(row: u32, col: u32) -> f32 {
    return select(0.0, f32(w[(lp.w_row0 + row) * lp.k + min(col, lp.k - 1u)]), col < lp.k);
}

// Adds the bias and stores Y[row][col] into its output segment; ignores positions past M or N.
fn store(row: u32, col: u32, value: f32) {
    if row >= lp.m || col >= lp.n {
        return;
    }
    var y = value;
    if lp.has_bias != 0u {
        y += f32(bias[lp.w_row0 + col]);
    }
    if col < lp.seg1 {
        out0[row * lp.seg1 + col] = elem(y);
    } else if col < lp.seg2 {
        out1[row * (lp.seg2 - lp.seg1) + col - lp.seg1] = elem(y);
    } else {
        out2[row * (lp.n - lp.seg2) + col - lp.seg2] = elem(y);
    }
}

// linear_tiled

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
