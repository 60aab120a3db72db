enable f16;
enable wgpu_cooperative_matrix;

// The linear layer on tensor cores with no operand staging (the `direct` design),
// appended to matmul.wgsl (parameters, bias, outputs, split-epilogue `store`): f16
// storage only. Every A fragment is a row-major cooperative load straight from X's rows
// and every B fragment a column-major one from W's rows (B = Wᵀ), L1 and L2 serving the
// re-reads, as the WGSL reference GEMM that reached 75-80 TFLOP/s on an H100 loads both
// operands (docs/design.md, "Tensor cores"). matmul_coop.wgsl stages them through
// workgroup memory instead; which is faster here is the GPU's to say (`bench --probe`
// with WGPU_ATTENTION_COOP_GEMM=direct beside the default).
//
// Tiling. A workgroup is 4 subgroups of SG invocations (the adapter's fixed subgroup
// size) and owns a BLOCK x BLOCK block of Y; subgroup q owns the QUAD x QUAD quadrant
// (q / 2, q % 2) as TILES x TILES f32 accumulator tiles of 16 x 16 (acc00 .., named).
// Per step of 16 along K it loads TILES A and TILES B fragments and does TILES²
// multiply-adds: no barrier, no workgroup memory in the main loop.
//
// Edges without checks: a cooperative load cannot mask rows, so each fragment's first
// row (column) is clamped to M - 16 (N - 16), and every fragment lies inside X and W.
// A clamped tile computes rows that an earlier tile owns, or rows past M; its
// epilogue stores only the rows and columns from its own unclamped start, so every
// element of Y is written once, by the tile that owns it. The host runs this kernel
// only where that holds together (kernels::matmul, `direct_serves`): M, N >= 16, K a
// multiple of 16 (whole fragments along K), X's row stride a multiple of 8 (16-byte
// aligned fragments; the kernel writes the strides `8u * (s / 8u)` so the 16-byte rule's
// analysis sees them whole), f16 storage; elsewhere matmul_coop.wgsl runs.
//
// Epilogue: as matmul_coop.wgsl's, each tile through a 16 x 16 f32 slot of workgroup
// memory private to its subgroup (two per subgroup, used in turn), each lane storing
// 256 / SG elements with `store` (bias, segment, bounds). 8 KiB of workgroup memory.
//
// Generator parameter: TILES (4 on tensor cores; 2 under the emulation, written by
// kernels::matmul's line dropping as for matmul_coop.wgsl).
//
// naga 30.0.1 trap: an index written inside coopLoad/coopStore's pointer argument makes
// its SPIR-V writer panic; every such index is named with `let` first.

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;

override SG: u32 = 32u; // invocations per subgroup (the host sets the adapter's)

const TILES: u32 = 4u; // 16 x 16 tiles per subgroup, each way (generator parameter)
const QUAD: u32 = 16u * TILES; // rows and columns of Y per subgroup
const BLOCK: u32 = 2u * QUAD; // rows and columns of Y per workgroup
const TILE: u32 = 256u; // floats in one 16 x 16 output slot

var<workgroup> cs: array<f32, 8u * TILE>;

// Stores the 16 x 16 tile in output slot `slot`, computed at Y[row0.., col0..], from
// row `own_row` and column `own_col` on (a clamped tile's own part): 256 / SG elements
// per lane, each through `store` (bias, segment, bounds).
fn emit_own(slot: u32, row0: u32, col0: u32, own_row: u32, own_col: u32, lane: u32) {
    for (var t = 0u; t < TILE / SG; t++) {
        let e = t * SG + lane;
        let row = row0 + e / 16u;
        let col = col0 + e % 16u;
        if row >= own_row && col >= own_col {
            store(row, col, cs[slot + e]);
        }
    }
}

@compute @workgroup_size(4 * SG, 1, 1)
fn linear_coop_direct(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    // This subgroup's quadrant of Y.
    let y0 = wid.y * BLOCK + (sg / 2u) * QUAD;
    let x0 = wid.x * BLOCK + (sg % 2u) * QUAD;
    // Strides in elements (16-byte multiples, host), and each tile's clamped first row
    // (X) and column (W row).
    let xs = 8u * (lp.x_stride / 8u);
    let ks = 8u * (lp.k / 8u);
    let ra0 = min(y0 + 0u, lp.m - 16u);
    let ra1 = min(y0 + 16u, lp.m - 16u);
    let ra2 = min(y0 + 32u, lp.m - 16u);
    let ra3 = min(y0 + 48u, lp.m - 16u);
    let cb0 = min(x0 + 0u, lp.n - 16u);
    let cb1 = min(x0 + 16u, lp.n - 16u);
    let cb2 = min(x0 + 32u, lp.n - 16u);
    let cb3 = min(x0 + 48u, lp.n - 16u);
    var acc00 = coop_mat16x16<f32, C>();
    var acc01 = coop_mat16x16<f32, C>();
    var acc02 = coop_mat16x16<f32, C>();
    var acc03 = coop_mat16x16<f32, C>();
    var acc10 = coop_mat16x16<f32, C>();
    var acc11 = coop_mat16x16<f32, C>();
    var acc12 = coop_mat16x16<f32, C>();
    var acc13 = coop_mat16x16<f32, C>();
    var acc20 = coop_mat16x16<f32, C>();
    var acc21 = coop_mat16x16<f32, C>();
    var acc22 = coop_mat16x16<f32, C>();
    var acc23 = coop_mat16x16<f32, C>();
    var acc30 = coop_mat16x16<f32, C>();
    var acc31 = coop_mat16x16<f32, C>();
    var acc32 = coop_mat16x16<f32, C>();
    var acc33 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < ks; k0 += 16u) {
        // The B fragments first, then each A fragment just before its row of
        // multiply-adds: 4 B and 1 A live at a time, not all 8 (with all 8 loaded
        // first, RDNA3 spilled a register at 256 VGPRs; docs/isa.md).
        let ib0 = (lp.w_row0 + cb0) * ks + k0;
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&w[ib0], ks);
        let ib1 = (lp.w_row0 + cb1) * ks + k0;
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&w[ib1], ks);
        let ib2 = (lp.w_row0 + cb2) * ks + k0;
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&w[ib2], ks);
        let ib3 = (lp.w_row0 + cb3) * ks + k0;
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&w[ib3], ks);
        let ia0 = ra0 * xs + k0;
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&x[ia0], xs);
        acc00 = coopMultiplyAdd(a0, b0, acc00);
        acc01 = coopMultiplyAdd(a0, b1, acc01);
        acc02 = coopMultiplyAdd(a0, b2, acc02);
        acc03 = coopMultiplyAdd(a0, b3, acc03);
        let ia1 = ra1 * xs + k0;
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&x[ia1], xs);
        acc10 = coopMultiplyAdd(a1, b0, acc10);
        acc11 = coopMultiplyAdd(a1, b1, acc11);
        acc12 = coopMultiplyAdd(a1, b2, acc12);
        acc13 = coopMultiplyAdd(a1, b3, acc13);
        let ia2 = ra2 * xs + k0;
        let a2 = coopLoadT<coop_mat16x16<f16, A>>(&x[ia2], xs);
        acc20 = coopMultiplyAdd(a2, b0, acc20);
        acc21 = coopMultiplyAdd(a2, b1, acc21);
        acc22 = coopMultiplyAdd(a2, b2, acc22);
        acc23 = coopMultiplyAdd(a2, b3, acc23);
        let ia3 = ra3 * xs + k0;
        let a3 = coopLoadT<coop_mat16x16<f16, A>>(&x[ia3], xs);
        acc30 = coopMultiplyAdd(a3, b0, acc30);
        acc31 = coopMultiplyAdd(a3, b1, acc31);
        acc32 = coopMultiplyAdd(a3, b2, acc32);
        acc33 = coopMultiplyAdd(a3, b3, acc33);
    }
    // Epilogue: tile by tile through this subgroup's two slots, s0 and s1 in turn; a
    // slot is rewritten only after the next tile's barrier, which every lane reaches
    // after reading it.
    let s0 = sg * 2u * TILE;
    let s1 = s0 + TILE;
    coopStoreT(acc00, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra0, cb0, y0, x0, lane);
    coopStoreT(acc01, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra0, cb1, y0, x0 + 16u, lane);
    coopStoreT(acc02, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra0, cb2, y0, x0 + 32u, lane);
    coopStoreT(acc03, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra0, cb3, y0, x0 + 48u, lane);
    coopStoreT(acc10, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra1, cb0, y0 + 16u, x0, lane);
    coopStoreT(acc11, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra1, cb1, y0 + 16u, x0 + 16u, lane);
    coopStoreT(acc12, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra1, cb2, y0 + 16u, x0 + 32u, lane);
    coopStoreT(acc13, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra1, cb3, y0 + 16u, x0 + 48u, lane);
    coopStoreT(acc20, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra2, cb0, y0 + 32u, x0, lane);
    coopStoreT(acc21, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra2, cb1, y0 + 32u, x0 + 16u, lane);
    coopStoreT(acc22, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra2, cb2, y0 + 32u, x0 + 32u, lane);
    coopStoreT(acc23, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra2, cb3, y0 + 32u, x0 + 48u, lane);
    coopStoreT(acc30, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra3, cb0, y0 + 48u, x0, lane);
    coopStoreT(acc31, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra3, cb1, y0 + 48u, x0 + 16u, lane);
    coopStoreT(acc32, &cs[s0], 16u); workgroupBarrier(); emit_own(s0, ra3, cb2, y0 + 48u, x0 + 32u, lane);
    coopStoreT(acc33, &cs[s1], 16u); workgroupBarrier(); emit_own(s1, ra3, cb3, y0 + 48u, x0 + 48u, lane);
}
