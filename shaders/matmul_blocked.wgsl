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
    var acc: array<vec4<f32>, 16>; // acc[2 i + h]: row (i < 4: 4 ty + i; else 64 + 4 ty + i - 4), columns h * 64 + 4 tx ..
    var rows: array<vec4<f32>, 4>; // rows[i]: 4 K values of row 4 group + i

    // The first slab, into buffer 0.
    for (var i = 0u; i < 4u; i++) {
        let r = 4u * group + i;
        if stage_x {
            rows[i] = x4_at(min(m0 + r, lp.m - 1u), kq);
        } else {
            rows[i] = w4_at(min(n0 + r, lp.n - 1u), kq);
        }
    }
    for (var c = 0u; c < 4u; c++) {
        let column = vec4<f32>(rows[0][c], rows[1][c], rows[2][c], rows[3][c]);
        let to = at(kq + c, group);
        if stage_x {
            xs[to] = column;
        } else {
            ws[to] = column;
        }
    }
    workgroupBarrier();

    for (var s = 0u; s < slabs; s++) {
        let this_slab = (s % 2u) * SLAB;
        let next_slab = SLAB - this_slab;
        let has_next = s + 1u < slabs; // uniform
        // 1. The next slab's block, into registers.
        if has_next {
            let k1 = (s + 1u) * STEP_K + kq;
            for (var i = 0u; i < 4u; i++) {
                let r = 4u * group + i;
                if stage_x {
                    rows[i] = x4_at(min(m0 + r, lp.m - 1u), k1);
                } else {
                    rows[i] = w4_at(min(n0 + r, lp.n - 1u), k1);
                }
            }
        }
        // 2. This slab.
        for (var kk = 0u; kk < STEP_K; kk++) {
            let a0 = xs[this_slab + at(kk, lid.y)];
            let a1 = xs[this_slab + at(kk, 16u + lid.y)];
            let b0 = ws[this_slab + at(kk, lid.x)];
            let b1 = ws[this_slab + at(kk, 16u + lid.x)];
            for (var i = 0u; i < 4u; i++) {
                acc[2u * i] += a0[i] * b0;
                acc[2u * i + 1u] += a0[i] * b1;
                acc[8u + 2u * i] += a1[i] * b0;
                acc[8u + 2u * i + 1u] += a1[i] * b1;
            }
        }
        // 3. The next slab, transposed into the other buffer.
        if has_next {
            for (var c = 0u; c < 4u; c++) {
                let column = vec4<f32>(rows[0][c], rows[1][c], rows[2][c], rows[3][c]);
                let to = next_slab + at(kq + c, group);
                if stage_x {
                    xs[to] = column;
                } else {
                    ws[to] = column;
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 8u; i++) {
        let row = m0 + (i / 4u) * 64u + 4u * lid.y + i % 4u;
        for (var h = 0u; h < 2u; h++) {
            let v = acc[2u * i + h];
            let col = n0 + h * 64u + 4u * lid.x;
            store(row, col, v.x);
            store(row, col + 1u, v.y);
            store(row, col + 2u, v.z);
            store(row, col + 3u, v.w);
        }
    }
}
