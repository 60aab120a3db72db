enable f16;
enable wgpu_cooperative_matrix;

// The linear layer on tensor cores (cooperative matrices), appended to matmul.wgsl
// (parameters, bias, outputs, split-epilogue `store`). f16 products with f32
// accumulation: with f16 storage that is the f16 GEMM; with f32 storage it is
// Precision::Medium (operands rounded to f16 as they are staged).
//
// The design is the one measured fastest on an H100 (a WGSL reference GEMM outside this
// repository, 89-95 TFLOP/s there), adapted to Y = X · Wᵀ, ragged shapes, f32 storage
// and the bias/split epilogue. On an NVIDIA H200: right, 45.6 TFLOP/s at 8192^3 f16
// (2026-11-28; the reference 89.1 there).
//
// Tiling. A workgroup is 4 subgroups of SG invocations. SG must be the adapter's fixed
// subgroup size (subgroup_min_size == subgroup_max_size), so that subgroup_id runs 0..3;
// the host checks this, and the 16x16x16 f16->f32 configuration, before dispatching
// (Capabilities::coop_subgroup_size). The workgroup owns a 128 x 128 block of Y;
// subgroup q owns the 64 x 64 quadrant (q / 2, q % 2) as 4 x 4 f32 accumulator tiles of
// 16 x 16 (acc00 .. acc33, named: naga has no arrays of cooperative matrices).
//
// Main loop, per slab of 32 along K: every invocation stages its share of X[128 x 32]
// and W[128 x 32] (W's rows are Y's columns) as f16 into workgroup memory, rows padded
// from 32 to 40 halves (80 bytes: consecutive rows start 16 bytes apart in the banks,
// so the 8-row phases of a 16 x 16 fragment load hit distinct banks). Staging reads 16
// bytes at a time through x4/w4, the same buffers as x/w bound as vec4<u32> words (8
// f16 or 4 f32 each; split with unpack2x16float, as naga 30 mis-types
// bitcast<vec2<f16>>(u32)), X's and W's words interleaved in one loop: 512 words of
// each per slab for f16 (4 per invocation at SG = 32), 1024 for f32. Blocks wholly
// inside M (for X) or N (for W) and slabs wholly inside K load without any check;
// edge blocks check each word (one compare per 16 bytes) and stage zeros past M, N or
// K. When the words do not line up with rows (K or X's row stride not a multiple of
// the elements per word), every slab is staged element by element instead, with
// checks. Then a barrier, and each subgroup does 2 steps of 16 along the slab (written
// out, not a loop): 4 A fragments (X rows, row-major) and 4 B fragments (Wᵀ, read
// column-major from W's rows), 16 multiply-adds. Barrier, next slab.
//
// Epilogue: the accumulators' element-to-lane layout is opaque and the output needs
// the bias, the split into up to three buffers and (for f16 storage) a conversion a
// cooperative store cannot do, so each tile goes through a 16 x 16 f32 slot of
// workgroup memory private to its subgroup (two slots per subgroup, used in turn, so
// one barrier per tile suffices: a slot is rewritten only after the next tile's
// barrier, which every lane reaches after reading it), and each lane then stores
// 256 / SG of its elements with `store` (bias, segment, bounds).
//
// Workgroup memory: 2 x 128 x 40 halves of staging (20 KiB) + 4 x 2 x 256 floats of
// output slots (8 KiB) = 28 KiB (matmul::coop_workgroup_bytes).
//
// Generator parameter: TILES, the accumulator tiles per subgroup each way (4 here, the
// measured design). src/kernels/matmul.rs (`coop_source`) derives the variant for
// TILES = 2 (64 x 64 blocks, 32 x 32 quadrants, 14 KiB) by setting the constant and
// dropping every line that names a fragment or accumulator past TILES - 1 (hence one
// line per tile in the epilogue). The coop emulation on lavapipe runs that variant:
// emulated, 16 accumulators and 8 fragments per subgroup take llvmpipe minutes to
// compile; the staging, the edge handling and the epilogue are the same code.
//
// naga 30.0.1 trap: an index written inside coopLoad/coopStore's pointer argument makes
// its SPIR-V writer panic; every such index is named with `let` first.

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;
// X and W again as 16-byte words (the host binds a placeholder where a buffer is
// shorter than one word; the kernel then never reads it: see `words` below).
@group(0) @binding(7) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> w4: array<vec4<u32>>;

override SG: u32 = 32u; // invocations per subgroup (the host sets the adapter's)

const TILES: u32 = 4u; // 16 x 16 tiles per subgroup, each way (generator parameter)
const QUAD: u32 = 16u * TILES; // rows and columns of Y per subgroup
const BLOCK: u32 = 2u * QUAD; // rows and columns of Y per workgroup
const SLAB: u32 = 32u; // K per staging step
const LD: u32 = SLAB + 8u; // halves per staged row
const VE: u32 = 4u * ELEMS_PER_WORD; // elements per 16-byte word
const WORDS_PER_ROW: u32 = SLAB / VE;
const TILE: u32 = 256u; // floats in one 16 x 16 output slot

var<workgroup> xs: array<f16, BLOCK * LD>;
var<workgroup> ws: array<f16, BLOCK * LD>;
var<workgroup> cs: array<f32, 8u * TILE>;

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

// Element i of a word: a half of one of its u32 (f16 storage) or one of them (f32).
fn put_x(at: u32, v: vec4<u32>) {
    if ELEMS_PER_WORD == 2u {
        let h0 = vec2<f16>(unpack2x16float(v.x));
        let h1 = vec2<f16>(unpack2x16float(v.y));
        let h2 = vec2<f16>(unpack2x16float(v.z));
        let h3 = vec2<f16>(unpack2x16float(v.w));
        xs[at] = h0.x;
        xs[at + 1u] = h0.y;
        xs[at + 2u] = h1.x;
        xs[at + 3u] = h1.y;
        xs[at + 4u] = h2.x;
        xs[at + 5u] = h2.y;
        xs[at + 6u] = h3.x;
        xs[at + 7u] = h3.y;
    } else {
        xs[at] = f16(bitcast<f32>(v.x));
        xs[at + 1u] = f16(bitcast<f32>(v.y));
        xs[at + 2u] = f16(bitcast<f32>(v.z));
        xs[at + 3u] = f16(bitcast<f32>(v.w));
    }
}

fn put_w(at: u32, v: vec4<u32>) {
    if ELEMS_PER_WORD == 2u {
        let h0 = vec2<f16>(unpack2x16float(v.x));
        let h1 = vec2<f16>(unpack2x16float(v.y));
        let h2 = vec2<f16>(unpack2x16float(v.z));
        let h3 = vec2<f16>(unpack2x16float(v.w));
        ws[at] = h0.x;
        ws[at + 1u] = h0.y;
        ws[at + 2u] = h1.x;
        ws[at + 3u] = h1.y;
        ws[at + 4u] = h2.x;
        ws[at + 5u] = h2.y;
        ws[at + 6u] = h3.x;
        ws[at + 7u] = h3.y;
    } else {
        ws[at] = f16(bitcast<f32>(v.x));
        ws[at + 1u] = f16(bitcast<f32>(v.y));
        ws[at + 2u] = f16(bitcast<f32>(v.z));
        ws[at + 3u] = f16(bitcast<f32>(v.w));
    }
}

// Stages the slab at k0 of an interior block: no checks at all.
fn stage_interior(m0: u32, n0: u32, k0: u32, tid: u32) {
    for (var t = 0u; t < BLOCK * WORDS_PER_ROW / (4u * SG); t++) {
        let e = t * 4u * SG + tid;
        let r = e / WORDS_PER_ROW;
        let o = e % WORDS_PER_ROW;
        let col = k0 + o * VE;
        let gx = ((m0 + r) * lp.x_stride + col) / VE;
        let gw = ((lp.w_row0 + n0 + r) * lp.k + col) / VE;
        let vx = x4[gx];
        let vw = w4[gw];
        let at = r * LD + o * VE;
        put_x(at, vx);
        put_w(at, vw);
    }
}

// The same for an edge block or the last slab: each word inside M (N) and K is read,
// the others staged as zeros. `x_full` / `w_full`: the block's X (W) rows and the slab
// lie inside the matrix.
fn stage_edge(m0: u32, n0: u32, k0: u32, tid: u32, x_full: bool, w_full: bool) {
    for (var t = 0u; t < BLOCK * WORDS_PER_ROW / (4u * SG); t++) {
        let e = t * 4u * SG + tid;
        let r = e / WORDS_PER_ROW;
        let o = e % WORDS_PER_ROW;
        let col = k0 + o * VE;
        var vx = vec4<u32>(0u);
        if x_full || (m0 + r < lp.m && col < lp.k) {
            let gx = ((m0 + r) * lp.x_stride + col) / VE;
            vx = x4[gx];
        }
        var vw = vec4<u32>(0u);
        if w_full || (n0 + r < lp.n && col < lp.k) {
            let gw = ((lp.w_row0 + n0 + r) * lp.k + col) / VE;
            vw = w4[gw];
        }
        let at = r * LD + o * VE;
        put_x(at, vx);
        put_w(at, vw);
    }
}

// The slab element by element, for operands whose rows do not start on a word.
fn stage_elements(m0: u32, n0: u32, k0: u32, tid: u32) {
    for (var t = 0u; t < BLOCK * SLAB / (4u * SG); t++) {
        let e = t * 4u * SG + tid;
        let r = e / SLAB;
        let c = e % SLAB;
        xs[r * LD + c] = x_h(m0 + r, k0 + c);
        ws[r * LD + c] = w_h(n0 + r, k0 + c);
    }
}

// Stores the 16 x 16 tile in output slot `slot` at Y[row0.., col0..]: 256 / SG
// elements per lane, each through `store` (bias, segment, bounds).
fn emit(slot: u32, row0: u32, col0: u32, lane: u32) {
    for (var t = 0u; t < TILE / SG; t++) {
        let e = t * SG + lane;
        store(row0 + e / 16u, col0 + e % 16u, cs[slot + e]);
    }
}

@compute @workgroup_size(4 * SG, 1, 1)
fn linear_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let m0 = wid.y * BLOCK;
    let n0 = wid.x * BLOCK;
    // This subgroup's quadrant, within the block.
    let qr = (sg / 2u) * QUAD;
    let qc = (sg % 2u) * QUAD;
    // Words line up with rows: every slab starts a word in each row of X and W (W's
    // rows are k apart, X's x_stride; k0 is a multiple of 32). The host binds real
    // buffers to x4/w4 whenever they hold a word, which this implies.
    let words = lp.k % VE == 0u && lp.x_stride % VE == 0u;
    let rows_in = m0 + BLOCK <= lp.m;
    let cols_in = n0 + BLOCK <= lp.n;
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
    for (var k0 = 0u; k0 < lp.k; k0 += SLAB) {
        let k_in = k0 + SLAB <= lp.k;
        if !words {
            stage_elements(m0, n0, k0, tid);
        } else if rows_in && cols_in && k_in {
            stage_interior(m0, n0, k0, tid);
        } else {
            stage_edge(m0, n0, k0, tid, rows_in && k_in, cols_in && k_in);
        }
        workgroupBarrier();
        // The slab's two steps of 16, written out: wgpu's loop counter keeps a loop
        // over them rolled, and then RDNA3 spilled 19 VGPRs (isa --radv-null navi31).
        {
            let ia0 = (qr + 0u) * LD;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia0], LD);
            let ia1 = (qr + 16u) * LD;
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia1], LD);
            let ia2 = (qr + 32u) * LD;
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia2], LD);
            let ia3 = (qr + 48u) * LD;
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia3], LD);
            let ib0 = (qc + 0u) * LD;
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib0], LD);
            let ib1 = (qc + 16u) * LD;
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib1], LD);
            let ib2 = (qc + 32u) * LD;
            let b2 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib2], LD);
            let ib3 = (qc + 48u) * LD;
            let b3 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib3], LD);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc02 = coopMultiplyAdd(a0, b2, acc02);
            acc03 = coopMultiplyAdd(a0, b3, acc03);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
            acc12 = coopMultiplyAdd(a1, b2, acc12);
            acc13 = coopMultiplyAdd(a1, b3, acc13);
            acc20 = coopMultiplyAdd(a2, b0, acc20);
            acc21 = coopMultiplyAdd(a2, b1, acc21);
            acc22 = coopMultiplyAdd(a2, b2, acc22);
            acc23 = coopMultiplyAdd(a2, b3, acc23);
            acc30 = coopMultiplyAdd(a3, b0, acc30);
            acc31 = coopMultiplyAdd(a3, b1, acc31);
            acc32 = coopMultiplyAdd(a3, b2, acc32);
            acc33 = coopMultiplyAdd(a3, b3, acc33);
        }
        {
            let ia0 = (qr + 0u) * LD + 16u;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia0], LD);
            let ia1 = (qr + 16u) * LD + 16u;
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia1], LD);
            let ia2 = (qr + 32u) * LD + 16u;
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia2], LD);
            let ia3 = (qr + 48u) * LD + 16u;
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&xs[ia3], LD);
            let ib0 = (qc + 0u) * LD + 16u;
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib0], LD);
            let ib1 = (qc + 16u) * LD + 16u;
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib1], LD);
            let ib2 = (qc + 32u) * LD + 16u;
            let b2 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib2], LD);
            let ib3 = (qc + 48u) * LD + 16u;
            let b3 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib3], LD);
            acc00 = coopMultiplyAdd(a0, b0, acc00);
            acc01 = coopMultiplyAdd(a0, b1, acc01);
            acc02 = coopMultiplyAdd(a0, b2, acc02);
            acc03 = coopMultiplyAdd(a0, b3, acc03);
            acc10 = coopMultiplyAdd(a1, b0, acc10);
            acc11 = coopMultiplyAdd(a1, b1, acc11);
            acc12 = coopMultiplyAdd(a1, b2, acc12);
            acc13 = coopMultiplyAdd(a1, b3, acc13);
            acc20 = coopMultiplyAdd(a2, b0, acc20);
            acc21 = coopMultiplyAdd(a2, b1, acc21);
            acc22 = coopMultiplyAdd(a2, b2, acc22);
            acc23 = coopMultiplyAdd(a2, b3, acc23);
            acc30 = coopMultiplyAdd(a3, b0, acc30);
            acc31 = coopMultiplyAdd(a3, b1, acc31);
            acc32 = coopMultiplyAdd(a3, b2, acc32);
            acc33 = coopMultiplyAdd(a3, b3, acc33);
        }
        workgroupBarrier();
    }
    // Epilogue: tile by tile through this subgroup's two slots, s0 and s1 in turn.
    let s0 = sg * 2u * TILE;
    let s1 = s0 + TILE;
    let y0 = m0 + qr;
    let x0 = n0 + qc;
    coopStoreT(acc00, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0, x0, lane);
    coopStoreT(acc01, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0, x0 + 16u, lane);
    coopStoreT(acc02, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0, x0 + 32u, lane);
    coopStoreT(acc03, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0, x0 + 48u, lane);
    coopStoreT(acc10, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 16u, x0, lane);
    coopStoreT(acc11, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 16u, x0 + 16u, lane);
    coopStoreT(acc12, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 16u, x0 + 32u, lane);
    coopStoreT(acc13, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 16u, x0 + 48u, lane);
    coopStoreT(acc20, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 32u, x0, lane);
    coopStoreT(acc21, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 32u, x0 + 16u, lane);
    coopStoreT(acc22, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 32u, x0 + 32u, lane);
    coopStoreT(acc23, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 32u, x0 + 48u, lane);
    coopStoreT(acc30, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 48u, x0, lane);
    coopStoreT(acc31, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 48u, x0 + 16u, lane);
    coopStoreT(acc32, &cs[s0], 16u); workgroupBarrier(); emit(s0, y0 + 48u, x0 + 32u, lane);
    coopStoreT(acc33, &cs[s1], 16u); workgroupBarrier(); emit(s1, y0 + 48u, x0 + 48u, lane);
}
