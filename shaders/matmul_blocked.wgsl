// The linear layer's GPU tiling, appended to matmul.wgsl (parameters, bias, outputs,
// split-epilogue `store`): the classic register-blocked SGEMM.
//
// Tiling: a 16 x 16 workgroup owns a 128 x 128 block of Y; invocation (ty, tx) owns an
// 8 x 8 micro-tile of it: rows 4 ty + i and 64 + 4 ty + i, columns 4 tx + j and
// 64 + 4 tx + j (i, j < 4), so the vec4 reads of a row of the staged tiles by
// neighbouring invocations touch neighbouring addresses. Per step of 16 along K the
// workgroup stages X[128 x 16] and W[128 x 16] transposed (K-major, as vec4 of 4 rows
// or columns) in 16 KiB of workgroup memory; each invocation then reads 4 vec4 per k
// and does 64 multiply-adds: 16 FMAs per workgroup-memory load, f32 accumulation in 16
// vec4 registers. Rows past M and columns past N are clamped for loading and not
// stored; K past its end reads as zero.

@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> w: array<elem>;

const BLOCK: u32 = 128u;
const STEP_K: u32 = 16u;
const BLOCK4: u32 = BLOCK / 4u; // vec4s across a block

// xs[k * BLOCK4 + r4] holds X rows 4 r4 .. 4 r4 + 3 of the block at column k0 + k.
var<workgroup> xs: array<vec4<f32>, STEP_K * BLOCK4>;
var<workgroup> ws: array<vec4<f32>, STEP_K * BLOCK4>;

// Four consecutive K values of one X row (row clamped into range), zero past K.
fn x4(row: u32, col: u32) -> vec4<f32> {
    let base = row * lp.x_stride;
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if col + c < lp.k {
            r[c] = f32(x[base + col + c]);
        }
    }
    return r;
}

fn w4(row: u32, col: u32) -> vec4<f32> {
    let base = (lp.w_row0 + row) * lp.k;
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
    // Staging: each matrix tile is 32 groups of 4 rows x 4 groups of 4 K values, 128
    // blocks of 4 x 4; invocation `flat` loads block flat % 128 of X (flat < 128) or
    // of W, and writes it transposed as 4 whole vec4 (one per K value): every vec4 of
    // workgroup memory has exactly one writer (writing single components from several
    // invocations would be a data race under WGSL's memory model).
    let blk = flat % 128u;
    let group = blk / 4u; // rows 4 group .. 4 group + 3
    let kq = (blk % 4u) * 4u; // K values kq .. kq + 3 of the step
    let stage_x = flat < 128u;
    var acc: array<vec4<f32>, 16>; // acc[2 i + h]: row (i < 4: 4 ty + i; else 64 + 4 ty + i - 4), columns h * 64 + 4 tx ..
    for (var k0 = 0u; k0 < lp.k; k0 += STEP_K) {
        var rows: array<vec4<f32>, 4>; // rows[i]: 4 K values of row 4 group + i
        for (var i = 0u; i < 4u; i++) {
            let r = 4u * group + i;
            if stage_x {
                rows[i] = x4(min(m0 + r, lp.m - 1u), k0 + kq);
            } else {
                rows[i] = w4(min(n0 + r, lp.n - 1u), k0 + kq);
            }
        }
        for (var c = 0u; c < 4u; c++) {
            let at = (kq + c) * BLOCK4 + group;
            let column = vec4<f32>(rows[0][c], rows[1][c], rows[2][c], rows[3][c]);
            if stage_x {
                xs[at] = column;
            } else {
                ws[at] = column;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < STEP_K; kk++) {
            let a0 = xs[kk * BLOCK4 + lid.y];
            let a1 = xs[kk * BLOCK4 + 16u + lid.y];
            let b0 = ws[kk * BLOCK4 + lid.x];
            let b1 = ws[kk * BLOCK4 + 16u + lid.x];
            for (var i = 0u; i < 4u; i++) {
                acc[2u * i] += a0[i] * b0;
                acc[2u * i + 1u] += a0[i] * b1;
                acc[8u + 2u * i] += a1[i] * b0;
                acc[8u + 2u * i + 1u] += a1[i] * b1;
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
