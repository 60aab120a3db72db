// The linear layer's tiling for CPU adapters with >= 8-lane subgroups (lavapipe),
// appended to matmul.wgsl (parameters, bias, outputs, split-epilogue `store`).
//
// Why textures: llvmpipe loads a storage-buffer element one SIMD lane at a time (a loop
// with a bounds-check branch per lane), which made the buffer GEMM load-bound at about
// 2.5 GFLOP/s; a texel fetch is a gather of 16-byte texels. pack_rows.wgsl packs X and W
// into rgba32float 2D-array textures (four consecutive K values per texel, zero past K).
//
// One 8-lane workgroup owns a block of ROW_GROUPS x 8 rows and 32 columns of Y: lane l
// owns columns n0 + l, + 8, + 16, + 24 of every row; each group of 8 rows is the
// components of a lo and a hi vec4 (`Acc`). Per texel step along K, lane l fetches four
// K values of its four W rows and, for each row group, of X row m0 + 8g + l (shared
// with the other lanes by subgroupBroadcast): with two row groups, 256 multiply-adds
// per lane per six fetches. The accumulators are values of the entry point (no
// workgroup memory, no barriers, no dynamically indexed array).
//
// Two row groups ran 1.2-1.3x faster than one at 1024^3 f32 on lavapipe (Mesa 22.3 and
// 25, Zen 5): the texel fetches, not the multiply-adds, bound this kernel, and a second
// row group reuses the W fetches. Larger blocks ran faster still (32 x 64: 1.5x) but
// compiled cold for 20-115 s more on Mesa 25 (docs/design.md, "Kernel paths and tilings").
// A problem of at most 8 rows (a decode step's projections) gets one row group.

@group(0) @binding(1) var x: texture_2d_array<f32>;
@group(0) @binding(2) var w: texture_2d_array<f32>;

const LANES: u32 = 8u;

// Groups of 8 rows a workgroup owns: 1 or 2 (set by the host, kernels::matmul).
override ROW_GROUPS: u32 = 2u;

// One row group's accumulators: column set j (n0 + 8j + lane) as `<j>_lo` (rows 0..3 of
// the group) and `<j>_hi` (rows 4..7).
struct Acc {
    a_lo: vec4<f32>,
    a_hi: vec4<f32>,
    b_lo: vec4<f32>,
    b_hi: vec4<f32>,
    c_lo: vec4<f32>,
    c_hi: vec4<f32>,
    d_lo: vec4<f32>,
    d_hi: vec4<f32>,
}

// Where row `row` of a packed matrix with `layer_rows` rows per layer lies: (texel row, layer).
fn texture_row(layer_rows: u32, row: u32) -> vec2<u32> {
    return vec2<u32>(row % layer_rows, row / layer_rows);
}

// Texel `q` of the row at `at`. The coordinates are i32 (they are below 2^31): naga 30
// writes invalid SPIR-V for u32 ones under its `Restrict` bounds-check policy
// (docs/design.md, "naga 30 and spirv-val").
fn fetch(t: texture_2d_array<f32>, at: vec2<u32>, q: u32) -> vec4<f32> {
    return textureLoad(t, vec2<i32>(vec2<u32>(q, at.x)), at.y, 0);
}

// X[m + 0..4][k] (lo) or X[m + 4..8][k] (hi) of the group's rows m, gathered from the
// lanes that fetched them.
fn rows_lo(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u));
}

fn rows_hi(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}

// One value of K: x is this lane's X value of the group, ws its four W values.
fn accumulate(acc: Acc, x: f32, ws: vec4<f32>) -> Acc {
    let lo = rows_lo(x);
    let hi = rows_hi(x);
    return Acc(
        acc.a_lo + lo * ws.x,
        acc.a_hi + hi * ws.x,
        acc.b_lo + lo * ws.y,
        acc.b_hi + hi * ws.y,
        acc.c_lo + lo * ws.z,
        acc.c_hi + hi * ws.z,
        acc.d_lo + lo * ws.w,
        acc.d_hi + hi * ws.w,
    );
}

// One texel step along K: xs is this lane's X texel of the group, wa..wd its W texels.
fn step(acc: Acc, xs: vec4<f32>, wa: vec4<f32>, wb: vec4<f32>, wc: vec4<f32>, wd: vec4<f32>) -> Acc {
    var r = accumulate(acc, xs.x, vec4<f32>(wa.x, wb.x, wc.x, wd.x));
    r = accumulate(r, xs.y, vec4<f32>(wa.y, wb.y, wc.y, wd.y));
    r = accumulate(r, xs.z, vec4<f32>(wa.z, wb.z, wc.z, wd.z));
    return accumulate(r, xs.w, vec4<f32>(wa.w, wb.w, wc.w, wd.w));
}

fn store_column(row0: u32, col: u32, lo: vec4<f32>, hi: vec4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        store(row0 + r, col, lo[r]);
        store(row0 + 4u + r, col, hi[r]);
    }
}

fn store_group(row0: u32, n0: u32, acc: Acc) {
    store_column(row0, n0, acc.a_lo, acc.a_hi);
    store_column(row0, n0 + 8u, acc.b_lo, acc.b_hi);
    store_column(row0, n0 + 16u, acc.c_lo, acc.c_hi);
    store_column(row0, n0 + 24u, acc.d_lo, acc.d_hi);
}

@compute @workgroup_size(8, 1, 1)
fn linear_texture(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let lane = sg_lane % LANES;
    let m0 = wid.y * 8u * ROW_GROUPS;
    let n0 = wid.x * 32u + lane;
    // Rows past M are fetched clamped and never stored.
    let x0_at = texture_row(lp.x_layer_rows, min(m0 + lane, lp.m - 1u));
    let x1_at = texture_row(lp.x_layer_rows, min(m0 + 8u + lane, lp.m - 1u));
    // Texture rows of this lane's four W rows (clamped columns are computed, not stored).
    let w_rows = vec4<u32>(lp.w_texture_row0) + min(vec4<u32>(n0) + vec4<u32>(0u, 8u, 16u, 24u), vec4<u32>(lp.n - 1u));
    let wa_at = texture_row(lp.w_layer_rows, w_rows.x);
    let wb_at = texture_row(lp.w_layer_rows, w_rows.y);
    let wc_at = texture_row(lp.w_layer_rows, w_rows.z);
    let wd_at = texture_row(lp.w_layer_rows, w_rows.w);
    let zero = vec4<f32>(0.0);
    var g0 = Acc(zero, zero, zero, zero, zero, zero, zero, zero);
    var g1 = g0;
    let texels = (lp.k + 3u) / 4u;
    for (var q = 0u; q < texels; q++) {
        let wa = fetch(w, wa_at, q);
        let wb = fetch(w, wb_at, q);
        let wc = fetch(w, wc_at, q);
        let wd = fetch(w, wd_at, q);
        g0 = step(g0, fetch(x, x0_at, q), wa, wb, wc, wd);
        if ROW_GROUPS > 1u {
            g1 = step(g1, fetch(x, x1_at, q), wa, wb, wc, wd);
        }
    }
    store_group(m0, n0, g0);
    if ROW_GROUPS > 1u {
        store_group(m0 + 8u, n0, g1);
    }
}
