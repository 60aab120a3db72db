// The linear layer's GPU tiling, appended to matmul.wgsl (parameters, bias, outputs,
// split-epilogue `store`): the classic register-blocked SGEMM, software-pipelined.
//
// Tiling: a 16 x 16 workgroup owns a 128 x 128 block of Y; invocation (ty, tx) owns an
// 8 x 8 micro-tile of it: rows 4 ty + i and 64 + 4 ty + i, columns 4 tx + j and
// 64 + 4 tx + j (i, j < 4), so the vec4 reads of a row of the staged tiles by
// neighbouring invocations touch neighbouring addresses. K goes in slabs of 16: X[128 x 16]
// and W[128 x 16] (W's rows are Y's columns) staged transposed (K-major, as vec4 of 4 rows
// or columns), in two buffers of 16 KiB used in turn. Per slab each invocation
//   1. loads its 4 x 4 block of the next slab (4 rows of X, invocations 0..127, or of W,
//      128..255, 4 consecutive K values each) from storage into registers: one 16-byte
//      load per row where X (W) rows are whole 16-byte words (override GEMM_WORDS, set
//      by the host from K, X's row stride and the buffers), else element by element;
//   2. computes from this slab's buffer: per K value 4 vec4 reads and 64 multiply-adds
//      (16 FMAs per workgroup-memory load, f32 accumulation in 16 vec4 registers);
//   3. writes the registers of 1 transposed into the other buffer (4 whole vec4, one per
//      K value: every vec4 of workgroup memory has exactly one writer);
//   -- one barrier --
// A buffer is rewritten only in the slab after the one that read it, behind that slab's
// barrier, so one barrier per slab suffices. Stored columns are swizzled (row group g of
// K value k at g ^ 2 (k / 4)): the 8 invocations of a 16-byte store phase write 4 K values
// of 2 row groups, which would otherwise share banks; reads stay conflict-free (one
// address, or 8 consecutive groups permuted).
//
// Rows past M and columns past N are clamped for loading and not stored; K past its
// end reads as zero.
//
// Every register is a named value (the 16 accumulator vec4s, the 4 staged rows), never
// an array indexed by a loop counter: a driver that does not unroll such a loop keeps
// the array in local memory, and each multiply-add becomes a load and a store (the
// arrayed form ran at 2.27 TFLOP/s at 8192^3 on an H200, 3% of its f32 rate).

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;
// X and W again as 16-byte words (the host binds a placeholder where a buffer is
// shorter than one word; the kernel then never reads it).
@group(0) @binding(7) var<storage, read> x4: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> w4: array<vec4<u32>>;

// Bit 0: X's rows are read as 16-byte words; bit 1: W's (K, X's row stride and W's rows
// multiples of 4 elements, buffers of whole words).
override GEMM_WORDS: u32 = 0u;

const BLOCK: u32 = 128u;
const STEP_K: u32 = 16u;
const BLOCK4: u32 = BLOCK / 4u; // vec4s across a block
const SLAB: u32 = STEP_K * BLOCK4; // vec4s of one staged slab of X (or W)

// xs[s * SLAB + at(k, g)] holds X rows 4 g .. 4 g + 3 of the block at column k0 + k of
// the slab staged in buffer s.
var<workgroup> xs: array<vec4<f32>, 2u * SLAB>;
var<workgroup> ws: array<vec4<f32>, 2u * SLAB>;

// Where row group g of K value k of a slab is stored (swizzled, see above).
fn at(k: u32, g: u32) -> u32 {
    return k * BLOCK4 + (g ^ ((k / 4u) * 2u));
}

// The four elements e .. e + 3 (e a multiple of 4) out of the 16-byte word holding them.
fn quad_of_word(word: vec4<u32>, e: u32) -> vec4<f32> {
    if ELEMS_PER_WORD == 1u {
        return bitcast<vec4<f32>>(word);
    }
    let h = select(word.xy, word.zw, (e / 4u) % 2u == 1u);
    return vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
}

// Four consecutive K values of one X row (row clamped into range), zero past K.
fn x4_at(row: u32, col: u32) -> vec4<f32> {
    let base = row * lp.x_stride;
    if (GEMM_WORDS & 1u) != 0u {
        // K is a multiple of 4: the quad lies wholly inside or wholly past K.
        if col < lp.k {
            let e = base + col;
            return quad_of_word(x4[e / (4u * ELEMS_PER_WORD)], e);
        }
        return vec4<f32>(0.0);
    }
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if col + c < lp.k {
            r[c] = f32(x[base + col + c]);
        }
    }
    return r;
}

fn w4_at(row: u32, col: u32) -> vec4<f32> {
    let base = (lp.w_row0 + row) * lp.k;
    if (GEMM_WORDS & 2u) != 0u {
        if col < lp.k {
            let e = base + col;
            return quad_of_word(w4[e / (4u * ELEMS_PER_WORD)], e);
        }
        return vec4<f32>(0.0);
    }
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if col + c < lp.k {
            r[c] = f32(w[base + col + c]);
        }
    }
    return r;
}

@compute @workgroup_size(16, 16, 1)
fn linear_blocked(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * BLOCK;
    let n0 = wid.x * BLOCK;
    let flat = lid.y * 16u + lid.x;
    // Staging: each matrix slab is 32 groups of 4 rows x 4 groups of 4 K values, 128
    // blocks of 4 x 4; invocation `flat` loads block flat % 128 of X (flat < 128) or of
    // W: the 4 invocations of a row group read its 16 K values, 64 contiguous bytes a row.
    let blk = flat % 128u;
    let group = blk / 4u; // rows 4 group .. 4 group + 3
    let kq = (blk % 4u) * 4u; // K values kq .. kq + 3 of the slab
    let stage_x = flat < 128u;
    let slabs = (lp.k + STEP_K - 1u) / STEP_K;
    // c{i}{h}: row (i < 4: 4 ty + i; else 64 + 4 ty + i - 4), columns h * 64 + 4 tx ..
    var c00 = vec4<f32>(0.0);
    var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0);
    var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0);
    var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0);
    var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0);
    var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0);
    var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0);
    var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0);
    var c71 = vec4<f32>(0.0);

    // The first slab, into buffer 0.
    var staged = stage_block(stage_x, m0, n0, group, kq);
    put_block(stage_x, 0u, group, kq, staged);
    workgroupBarrier();

    for (var s = 0u; s < slabs; s++) {
        let this_slab = (s % 2u) * SLAB;
        let next_slab = SLAB - this_slab;
        let has_next = s + 1u < slabs; // uniform
        // 1. The next slab's block, into registers.
        if has_next {
            staged = stage_block(stage_x, m0, n0, group, (s + 1u) * STEP_K + kq);
        }
        // 2. This slab.
        for (var kk = 0u; kk < STEP_K; kk++) {
            let a0 = xs[this_slab + at(kk, lid.y)];
            let a1 = xs[this_slab + at(kk, 16u + lid.y)];
            let b0 = ws[this_slab + at(kk, lid.x)];
            let b1 = ws[this_slab + at(kk, 16u + lid.x)];
            c00 += a0.x * b0;
            c01 += a0.x * b1;
            c10 += a0.y * b0;
            c11 += a0.y * b1;
            c20 += a0.z * b0;
            c21 += a0.z * b1;
            c30 += a0.w * b0;
            c31 += a0.w * b1;
            c40 += a1.x * b0;
            c41 += a1.x * b1;
            c50 += a1.y * b0;
            c51 += a1.y * b1;
            c60 += a1.z * b0;
            c61 += a1.z * b1;
            c70 += a1.w * b0;
            c71 += a1.w * b1;
        }
        // 3. The next slab, transposed into the other buffer.
        if has_next {
            put_block(stage_x, next_slab, group, kq, staged);
        }
        workgroupBarrier();
    }
    let r0 = m0 + 4u * lid.y;
    let r4 = r0 + 64u;
    let col0 = n0 + 4u * lid.x;
    let col1 = col0 + 64u;
    store4(r0, col0, c00);
    store4(r0, col1, c01);
    store4(r0 + 1u, col0, c10);
    store4(r0 + 1u, col1, c11);
    store4(r0 + 2u, col0, c20);
    store4(r0 + 2u, col1, c21);
    store4(r0 + 3u, col0, c30);
    store4(r0 + 3u, col1, c31);
    store4(r4, col0, c40);
    store4(r4, col1, c41);
    store4(r4 + 1u, col0, c50);
    store4(r4 + 1u, col1, c51);
    store4(r4 + 2u, col0, c60);
    store4(r4 + 2u, col1, c61);
    store4(r4 + 3u, col0, c70);
    store4(r4 + 3u, col1, c71);
}

// Four K values of 4 rows of X (rows 4 group .. + 3 of the block at m0) or of W (at
// n0), from K value k on; rows clamped into range.
struct Staged {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

fn stage_block(stage_x: bool, m0: u32, n0: u32, group: u32, k: u32) -> Staged {
    let r = 4u * group;
    if stage_x {
        let last = lp.m - 1u;
        return Staged(
            x4_at(min(m0 + r, last), k),
            x4_at(min(m0 + r + 1u, last), k),
            x4_at(min(m0 + r + 2u, last), k),
            x4_at(min(m0 + r + 3u, last), k),
        );
    }
    let last = lp.n - 1u;
    return Staged(
        w4_at(min(n0 + r, last), k),
        w4_at(min(n0 + r + 1u, last), k),
        w4_at(min(n0 + r + 2u, last), k),
        w4_at(min(n0 + r + 3u, last), k),
    );
}

// The staged block, transposed: K value kq + c of the 4 rows as one vec4, into slab
// buffer `slab`.
fn put_block(stage_x: bool, slab: u32, group: u32, kq: u32, b: Staged) {
    let k0 = vec4<f32>(b.r0.x, b.r1.x, b.r2.x, b.r3.x);
    let k1 = vec4<f32>(b.r0.y, b.r1.y, b.r2.y, b.r3.y);
    let k2 = vec4<f32>(b.r0.z, b.r1.z, b.r2.z, b.r3.z);
    let k3 = vec4<f32>(b.r0.w, b.r1.w, b.r2.w, b.r3.w);
    if stage_x {
        xs[slab + at(kq, group)] = k0;
        xs[slab + at(kq + 1u, group)] = k1;
        xs[slab + at(kq + 2u, group)] = k2;
        xs[slab + at(kq + 3u, group)] = k3;
    } else {
        ws[slab + at(kq, group)] = k0;
        ws[slab + at(kq + 1u, group)] = k1;
        ws[slab + at(kq + 2u, group)] = k2;
        ws[slab + at(kq + 3u, group)] = k3;
    }
}

// Columns col .. col + 3 of row `row`.
fn store4(row: u32, col: u32, v: vec4<f32>) {
    store(row, col, v.x);
    store(row, col + 1u, v.y);
    store(row, col + 2u, v.z);
    store(row, col + 3u, v.w);
}
