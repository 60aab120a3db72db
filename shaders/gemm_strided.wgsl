// Strided GEMM for the backward pass of the linear layers: C = A · B (+ C), where
//   A(i, t) = a[a_offset + i · a_row + t · a_col],  B(t, j) = b[b_offset + t · b_row + j · b_col],
// so either operand is read transposed, or broadcast (a stride of 0), without a copy:
// dX = dY · W, dW = dYᵀ · X, and db = 1ᵀ · dY (A a single 1 with both strides 0).
// C is a dense row-major [M, N] matrix of `out_t` (f32 for gradients; `elem` for the
// one that feeds the attention backward, which takes the layer's dtype). Operands are
// `elem` (f32 or f16), products and sums f32. `out_t` comes from a one-line prelude.
//
// Tiling, the portable one of matmul_tiled.wgsl: a 16 x 16 workgroup owns a 64 x 64
// block of C, each invocation a 4 x 4 block of it. Per step of 16 along the contraction
// the workgroup stages a 64 x 16 tile of A and of Bᵀ in workgroup memory (8 KiB), 4
// elements of each per invocation, so every loaded element feeds 64 multiply-adds; two
// barriers per step. No subgroups and no f16 arithmetic: it runs on every adapter.
//
// The contraction covers [t_begin, t_end). With `accumulate` set, C's previous value
// is added (in f32): how a long contraction is split across dispatches under
// llvmpipe's loop cap, and how an input's gradient sums its paths.

struct GemmParams {
    m: u32,
    n: u32,
    t_begin: u32,
    t_end: u32,
    a_offset: u32,
    a_row: u32,
    a_col: u32,
    accumulate: u32,
    b_offset: u32,
    b_row: u32,
    b_col: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> gp: GemmParams;
@group(0) @binding(1) var<storage, read> a: array<elem>;
@group(0) @binding(2) var<storage, read> b: array<elem>;
@group(0) @binding(3) var<storage, read_write> c: array<out_t>;

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;

// a_tile[i][t] = A(m0 + i, t0 + t); b_tile[j][t] = B(t0 + t, n0 + j).
var<workgroup> a_tile: array<array<f32, TILE_K>, TILE>;
var<workgroup> b_tile: array<array<f32, TILE_K>, TILE>;

@compute @workgroup_size(16, 16, 1)
fn gemm_strided(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    let flat = lid.y * 16u + lid.x;
    var acc: array<vec4<f32>, 4>; // acc[i][j]: row m0 + 4 lid.y + i, column n0 + 4 lid.x + j
    for (var t0 = gp.t_begin; t0 < gp.t_end; t0 += TILE_K) {
        // 256 invocations stage 64 x 16 elements of each operand: 4 each. Rows past M
        // (columns past N) read the last one and are never stored; steps past t_end
        // read zeros.
        for (var e = flat; e < TILE * TILE_K; e += 256u) {
            let r = e / TILE_K;
            let s = e % TILE_K;
            let t = t0 + s;
            let tc = min(t, gp.t_end - 1u);
            let i = min(m0 + r, gp.m - 1u);
            let j = min(n0 + r, gp.n - 1u);
            let av = f32(a[gp.a_offset + i * gp.a_row + tc * gp.a_col]);
            let bv = f32(b[gp.b_offset + tc * gp.b_row + j * gp.b_col]);
            a_tile[r][s] = select(0.0, av, t < gp.t_end);
            b_tile[r][s] = select(0.0, bv, t < gp.t_end);
        }
        workgroupBarrier();
        for (var s = 0u; s < TILE_K; s++) {
            let as4 = vec4<f32>(a_tile[4u * lid.y][s], a_tile[4u * lid.y + 1u][s], a_tile[4u * lid.y + 2u][s], a_tile[4u * lid.y + 3u][s]);
            let bs4 = vec4<f32>(b_tile[4u * lid.x][s], b_tile[4u * lid.x + 1u][s], b_tile[4u * lid.x + 2u][s], b_tile[4u * lid.x + 3u][s]);
            acc[0] += as4.x * bs4;
            acc[1] += as4.y * bs4;
            acc[2] += as4.z * bs4;
            acc[3] += as4.w * bs4;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + 4u * lid.y + i;
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + 4u * lid.x + j;
            if row < gp.m && col < gp.n {
                let at = row * gp.n + col;
                var y = acc[i][j];
                if gp.accumulate != 0u {
                    y += f32(c[at]);
                }
                c[at] = out_t(y);
            }
        }
    }
}
