// The linear layer's tiling for CPU adapters with >= 8-lane subgroups (lavapipe),
// appended to matmul.wgsl (parameters, bias, outputs, split-epilogue `store`).
//
// Why textures: llvmpipe loads a storage-buffer element one SIMD lane at a time (a loop
// with a bounds-check branch per lane), which made the buffer GEMM load-bound at about
// 2.5 GFLOP/s; a texel fetch is a gather of 16-byte texels. pack_rows.wgsl packs X and W
// into rgba32float 2D-array textures (four consecutive K values per texel, zero past K).
//
// One 8-lane workgroup owns an 8 x 32 block of Y: lane l owns columns n0 + l, + 8, + 16,
// + 24 for all 8 rows, the rows being the components of a lo and a hi vec4. Per texel
// step along K, lane l fetches four K values of X row m0 + l (shared with the other
// lanes by subgroupBroadcast) and of its four W rows: 128 multiply-adds per lane per
// five fetches, eight vec4 accumulators, no workgroup memory, no barriers.

@group(0) @binding(1) var x: texture_2d_array<f32>;
@group(0) @binding(2) var w: texture_2d_array<f32>;

const LANES: u32 = 8u;

// acc_<column set><row half>: column set j is n0 + 8 j + lane; component r is row r
// (lo) or 4 + r (hi).
var<private> acc_a_lo: vec4<f32>;
var<private> acc_a_hi: vec4<f32>;
var<private> acc_b_lo: vec4<f32>;
var<private> acc_b_hi: vec4<f32>;
var<private> acc_c_lo: vec4<f32>;
var<private> acc_c_hi: vec4<f32>;
var<private> acc_d_lo: vec4<f32>;
var<private> acc_d_hi: vec4<f32>;

// Where row `row` of a packed matrix with `layer_rows` rows per layer lies: (texel row, layer).
fn texture_row(layer_rows: u32, row: u32) -> vec2<u32> {
    return vec2<u32>(row % layer_rows, row / layer_rows);
}

// Texel `q` of the row at `at`.
fn fetch(t: texture_2d_array<f32>, at: vec2<u32>, q: u32) -> vec4<f32> {
    return textureLoad(t, vec2<u32>(q, at.x), at.y, 0);
}

// X[m0 + 0..4][k] (lo) or X[m0 + 4..8][k] (hi), gathered from the lanes that fetched them.
fn rows_lo(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u));
}

fn rows_hi(v: f32) -> vec4<f32> {
    return vec4<f32>(subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}

// One step along K: x is this lane's X value at k; wa..wd its four W values at k.
fn accumulate(x: f32, wa: f32, wb: f32, wc: f32, wd: f32) {
    let lo = rows_lo(x);
    let hi = rows_hi(x);
    acc_a_lo += lo * wa;
    acc_a_hi += hi * wa;
    acc_b_lo += lo * wb;
    acc_b_hi += hi * wb;
    acc_c_lo += lo * wc;
    acc_c_hi += hi * wc;
    acc_d_lo += lo * wd;
    acc_d_hi += hi * wd;
}

fn store_column(row0: u32, col: u32, lo: vec4<f32>, hi: vec4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        store(row0 + r, col, lo[r]);
        store(row0 + 4u + r, col, hi[r]);
    }
}

@compute @workgroup_size(8, 1, 1)
fn linear_texture(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let lane = sg_lane % LANES;
    let m0 = wid.y * 8u;
    let n0 = wid.x * 32u + lane;
    let x_at = texture_row(lp.x_layer_rows, min(m0 + lane, lp.m - 1u));
    // Texture rows of this lane's four W rows (clamped columns are computed, not stored).
    let w_rows = vec4<u32>(lp.w_texture_row0) + min(vec4<u32>(n0) + vec4<u32>(0u, 8u, 16u, 24u), vec4<u32>(lp.n - 1u));
    let wa_at = texture_row(lp.w_layer_rows, w_rows.x);
    let wb_at = texture_row(lp.w_layer_rows, w_rows.y);
    let wc_at = texture_row(lp.w_layer_rows, w_rows.z);
    let wd_at = texture_row(lp.w_layer_rows, w_rows.w);
    acc_a_lo = vec4<f32>(0.0);
    acc_a_hi = vec4<f32>(0.0);
    acc_b_lo = vec4<f32>(0.0);
    acc_b_hi = vec4<f32>(0.0);
    acc_c_lo = vec4<f32>(0.0);
    acc_c_hi = vec4<f32>(0.0);
    acc_d_lo = vec4<f32>(0.0);
    acc_d_hi = vec4<f32>(0.0);
    let texels = (lp.k + 3u) / 4u;
    for (var q = 0u; q < texels; q++) {
        let xs = fetch(x, x_at, q);
        let wa = fetch(w, wa_at, q);
        let wb = fetch(w, wb_at, q);
        let wc = fetch(w, wc_at, q);
        let wd = fetch(w, wd_at, q);
        accumulate(xs.x, wa.x, wb.x, wc.x, wd.x);
        accumulate(xs.y, wa.y, wb.y, wc.y, wd.y);
        accumulate(xs.z, wa.z, wb.z, wc.z, wd.z);
        accumulate(xs.w, wa.w, wb.w, wc.w, wd.w);
    }
    store_column(m0, n0, acc_a_lo, acc_a_hi);
    store_column(m0, n0 + 8u, acc_b_lo, acc_b_hi);
    store_column(m0, n0 + 16u, acc_c_lo, acc_c_hi);
    store_column(m0, n0 + 24u, acc_d_lo, acc_d_hi);
}
