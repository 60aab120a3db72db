// Rows split over lanes, shared by the kernels that own one row per invocation on
// CPU adapters and one row per ROW_LANES invocations on GPUs (flash_common.wgsl's
// fused rows, flash_backward.wgsl's dQ rows and dK/dV keys). The prelude before it
// gives:
//   ROW_VEC4   the entries of each lane's row arrays;
//   FIXED_ROW  whether the row loops run to ROW_VEC4, a constant (a head-dim class: the
//              compiler unrolls them and keeps the arrays in registers), or to the
//              run-time head dims (ROW_VEC4 then bounds them; a GPU keeps such arrays
//              in scratch memory: docs/isa.md);
//   ROW_LANES  consecutive invocations per row (1, or a power of two no larger than
//              the subgroup: then FIXED_ROW);
//   row_sum_lanes(x)  the sum of x over the row's lanes, the same on every lane
//              (subgroup shuffles, or workgroup memory on GPUs without subgroups);
//   LANE_SLOTS the vec4s of workgroup memory row_sum_lanes takes (0 but without subgroups).
// Lane `l` of a row holds the row's vec4s l, l + ROW_LANES, l + 2 ROW_LANES, ...; past
// the head dims the loads give zeros, so the extra products add nothing and nothing
// past them is stored.

override ROWS: u32 = 32u; // invocations per workgroup: ROWS / ROW_LANES rows

var<private> lane: u32; // this invocation's lane of its row
var<private> lane_slot: u32; // its index in the workgroup (row_sum_lanes' slot)

// Sets `lane` for invocation `lid` and returns its row's index within the workgroup.
fn enter_row(lid: u32) -> u32 {
    lane = lid % ROW_LANES;
    lane_slot = lid;
    return lid / ROW_LANES;
}

// The entries a row loop walks for a head dim `dim` (each lane's share).
fn row_vec4s(dim: u32) -> u32 {
    return select((dim + 3u) / 4u, ROW_VEC4, FIXED_ROW);
}

// The row's vec4 that this lane's entry `t` holds.
fn row_vec4(t: u32) -> u32 {
    return t * ROW_LANES + lane;
}

// Rows (or keys) per workgroup.
fn block_rows() -> u32 {
    return ROWS / ROW_LANES;
}
