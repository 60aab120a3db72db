// The linear layer's tiling for CPU adapters with >= 8-lane subgroups (lavapipe),
// appended to matmul.wgsl (bindings, helpers, split-epilogue `store`).
//
// One 8-lane workgroup owns an 8 x 16 block of Y; lane l owns columns n0 + l and
// n0 + 8 + l for all 8 rows, the rows being the components of two vec4s. K is consumed
// 8 at a time: lane l loads element k0 + l of the 8 X rows once and subgroupBroadcast
// shares it (CPU drivers load storage lane by lane, so shared loads are the expensive
// part); W values are the lane's own. 128 multiply-adds per lane per 8 steps of K, no
// workgroup memory, no barriers.

const LANES: u32 = 8u;

// acc_<column set><row half>: component r is row r (lo) or 4 + r (hi).
var<private> acc_a_lo: vec4<f32>;
var<private> acc_a_hi: vec4<f32>;
var<private> acc_b_lo: vec4<f32>;
var<private> acc_b_hi: vec4<f32>;

// One step along K: x_lo/x_hi hold X[rows][k], broadcast from the lane that loaded them.
fn accumulate(wa_row: u32, wb_row: u32, k: u32, x_lo: vec4<f32>, x_hi: vec4<f32>) {
    let wa = w_at(wa_row, k);
    let wb = w_at(wb_row, k);
    acc_a_lo += x_lo * wa;
    acc_a_hi += x_hi * wa;
    acc_b_lo += x_lo * wb;
    acc_b_hi += x_hi * wb;
}

@compute @workgroup_size(8, 1, 1)
fn linear_subgroup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let lane = sg_lane % LANES;
    let m0 = wid.y * 8u;
    let n0 = wid.x * 16u;
    let last_m = lp.m - 1u;
    let rows_lo = min(vec4<u32>(m0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_m));
    let rows_hi = min(vec4<u32>(m0) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last_m));
    let col_a = n0 + lane;
    let col_b = n0 + LANES + lane;
    let wa_row = min(col_a, lp.n - 1u);
    let wb_row = min(col_b, lp.n - 1u);
    acc_a_lo = vec4<f32>(0.0);
    acc_a_hi = vec4<f32>(0.0);
    acc_b_lo = vec4<f32>(0.0);
    acc_b_hi = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < lp.k; k0 += LANES) {
        let kl = k0 + lane;
        let lo = vec4<f32>(x_at(rows_lo.x, kl), x_at(rows_lo.y, kl), x_at(rows_lo.z, kl), x_at(rows_lo.w, kl));
        let hi = vec4<f32>(x_at(rows_hi.x, kl), x_at(rows_hi.y, kl), x_at(rows_hi.z, kl), x_at(rows_hi.w, kl));
        accumulate(wa_row, wb_row, k0, subgroupBroadcast(lo, 0u), subgroupBroadcast(hi, 0u));
        accumulate(wa_row, wb_row, k0 + 1u, subgroupBroadcast(lo, 1u), subgroupBroadcast(hi, 1u));
        accumulate(wa_row, wb_row, k0 + 2u, subgroupBroadcast(lo, 2u), subgroupBroadcast(hi, 2u));
        accumulate(wa_row, wb_row, k0 + 3u, subgroupBroadcast(lo, 3u), subgroupBroadcast(hi, 3u));
        accumulate(wa_row, wb_row, k0 + 4u, subgroupBroadcast(lo, 4u), subgroupBroadcast(hi, 4u));
        accumulate(wa_row, wb_row, k0 + 5u, subgroupBroadcast(lo, 5u), subgroupBroadcast(hi, 5u));
        accumulate(wa_row, wb_row, k0 + 6u, subgroupBroadcast(lo, 6u), subgroupBroadcast(hi, 6u));
        accumulate(wa_row, wb_row, k0 + 7u, subgroupBroadcast(lo, 7u), subgroupBroadcast(hi, 7u));
    }
    for (var r = 0u; r < 4u; r++) {
        store(m0 + r, col_a, acc_a_lo[r]);
        store(m0 + 4u + r, col_a, acc_a_hi[r]);
        store(m0 + r, col_b, acc_b_lo[r]);
        store(m0 + 4u + r, col_b, acc_b_hi[r]);
    }
}
