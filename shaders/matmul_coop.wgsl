enable f16;
enable wgpu_cooperative_matrix;

// The linear layer on tensor cores (cooperative matrices), appended to matmul.wgsl
// (parameters, bias, outputs, split-epilogue `store`). f16 products with f32
// accumulation: with f16 storage that is the f16 GEMM; with f32 storage it is
// Precision::Medium (operands rounded to f16 as they are staged).
//
// Tiling: a workgroup of 4 subgroups of SG invocations. SG must be the adapter's
// fixed subgroup size (subgroup_min_size == subgroup_max_size), so that subgroup_id
// runs 0..3; the host checks this, and the 16x16x16 f16->f32 configuration, before
// dispatching (Capabilities::coop_subgroup_size). The workgroup owns a 64 x 64 block
// of Y; subgroup q owns the 32 x 32 quadrant q as four 16 x 16 f32 accumulator tiles.
// Per step of 32 along K, all invocations stage X[64 x 32]
// and W[64 x 32] as f16 in workgroup memory, rows padded by 8 halves, zeros past M, N
// and K: every cooperative load reads a whole 16 x 16 tile from workgroup memory, never
// past a buffer. Each subgroup then does 2 x 4 multiply-adds (A from X row-major, B =
// Wᵀ read column-major from W's rows). At the end the tiles go through an f32 staging
// tile, from which each invocation stores its elements with the bias and the split.
//
// naga 30.0.1 trap: an index written inside coopLoad/coopStore's pointer argument makes
// its SPIR-V writer panic; every such index is named with `let` first.

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;

override SG: u32 = 32u; // invocations per subgroup (the host sets the adapter's)

const BLOCK: u32 = 64u;
const STEP_K: u32 = 32u;
const LD: u32 = STEP_K + 8u; // halves per staged row
const LDC: u32 = BLOCK + 4u; // floats per row of the output staging tile

var<workgroup> xs: array<f16, BLOCK * LD>;
var<workgroup> ws: array<f16, BLOCK * LD>;
var<workgroup> cs: array<f32, BLOCK * LDC>;

// X[row][col] as f16, zero past M or K.
fn x_h(row: u32, col: u32) -> f16 {
    if row >= lp.m || col >= lp.k {
        return f16(0.0);
    }
    return f16(x[row * lp.x_stride + col]);
}

fn w_h(row: u32, col: u32) -> f16 {
    if row >= lp.n || col >= lp.k {
        return f16(0.0);
    }
    return f16(w[(lp.w_row0 + row) * lp.k + col]);
}

@compute @workgroup_size(4 * SG, 1, 1)
fn linear_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
) {
    let m0 = wid.y * BLOCK;
    let n0 = wid.x * BLOCK;
    let threads = 4u * SG;
    // This subgroup's quadrant.
    let r0 = (sg / 2u) * 32u;
    let c0 = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < lp.k; k0 += STEP_K) {
        for (var e = tid; e < BLOCK * STEP_K; e += threads) {
            let r = e / STEP_K;
            let c = e % STEP_K;
            xs[r * LD + c] = x_h(m0 + r, k0 + c);
            ws[r * LD + c] = w_h(n0 + r, k0 + c);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < STEP_K; kk += 16u) {
            let ia0 = r0 * LD + kk;
            let ia1 = (r0 + 16u) * LD + kk;
            let ib0 = c0 * LD + kk;
            let ib1 = (c0 + 16u) * LD + kk;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia0], LD);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia1], LD);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib0], LD);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib1], LD);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    let i00 = r0 * LDC + c0;
    let i01 = r0 * LDC + c0 + 16u;
    let i10 = (r0 + 16u) * LDC + c0;
    let i11 = (r0 + 16u) * LDC + c0 + 16u;
    coopStoreT(c00, &cs[i00], LDC);
    coopStoreT(c01, &cs[i01], LDC);
    coopStoreT(c10, &cs[i10], LDC);
    coopStoreT(c11, &cs[i11], LDC);
    workgroupBarrier();
    for (var e = tid; e < BLOCK * BLOCK; e += threads) {
        let r = e / BLOCK;
        let c = e % BLOCK;
        store(m0 + r, n0 + c, cs[r * LDC + c]);
    }
}
