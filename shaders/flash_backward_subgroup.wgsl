// The backward pass for CPU adapters with subgroups of at least 8 lanes (lavapipe):
// flash_backward.wgsl's algorithm and arithmetic (see its header for the formulas),
// arranged as flash_subgroup.wgsl arranges the forward. Appended to
// attention_common.wgsl, backward_common.wgsl and subgroup_quads.wgsl.
//
// Each invocation owns 4 rows (the components of a vec4): query rows in the dQ pass,
// keys in the dK/dV pass. The rows it walks (keys, or query rows) go in blocks of 16,
// as 4 quads; for each group of 8 head-dim elements of a walked row, lane l loads
// element 8t + l once and subgroupBroadcast hands it to the other lanes, so every
// load feeds 4 multiply-adds (`vec4 += vec4 * scalar`). A workgroup is 8 invocations,
// 32 owned rows of one (batch, head) (dQ) or (batch, kv head) (dK/dV).
//
//   bwd_dq_subgroup: per block of 16 keys, the scores (Q·K) and dP (dO·V), the masks,
//     dX = P (dP - D) · softcap' with P = exp(s - lse), then dQ += dX·K. Keys
//     p.key_begin .. p.key_stop, adding to dq when p.key_begin > 0 (loop cap).
//   bwd_dkdv_subgroup: per block of 16 query rows of each query head sharing the kv
//     head, among the rows of p.key_begin .. p.key_stop that see any of the
//     workgroup's keys: the transposed scores (K·Q) and dP (V·dO), the masks, P and
//     dX as above, then dV += P·dO and dK += dX·Q (Q carries the scale). Adds to dk
//     and dv when p.key_begin > 0.
//
// Each invocation's rows live in workgroup memory (`bw`), in its own slot of each of
// ARRAYS arrays of MAX_DIM vec4s (a prelude sets both): arrays 0 and 1 are the
// accumulators (dQ; dK and dV), arrays 2 and 3 the owned input rows (Q and dO; K and
// V) where they fit (MAX_DIM 64: ARRAYS 4, 32 KiB), else those are read from their
// buffers at every block (MAX_DIM 128: ARRAYS 2). Workgroup memory rather than private
// arrays because llvmpipe compiles a dynamically indexed private array into a ladder of
// branches. No barriers: each invocation touches only its own slot. Lanes 0..7 of each
// subgroup must be active (the block loops are uniform across the workgroup).

const LANES: u32 = 8u;
const SLOTS: u32 = 8u; // invocations per workgroup
override ROWS: u32 = 32u; // owned rows per workgroup: 4 per invocation
const BLOCK: u32 = 16u; // walked rows per block: 4 quads
const SHARED_ROWS: bool = ARRAYS == 4u;
const ACC_A: u32 = 0u; // dQ, or dK
const ACC_B: u32 = 1u; // dV
const IN_A: u32 = 2u; // Q, or K
const IN_B: u32 = 3u; // dO, or V

var<workgroup> bw: array<vec4<f32>, ARRAYS * SLOTS * MAX_DIM>;
var<private> slot: u32; // this invocation's first element in each array of bw
var<private> in_a_rows: vec4<u32>; // where its 4 Q (K) rows start in their buffer
var<private> in_b_rows: vec4<u32>; // where its 4 dO (V) rows start

fn octet(a: u32, t: u32) -> array<vec4<f32>, 8> {
    let b = a * (SLOTS * MAX_DIM) + slot + t * 8u;
    return array<vec4<f32>, 8>(bw[b], bw[b + 1u], bw[b + 2u], bw[b + 3u], bw[b + 4u], bw[b + 5u], bw[b + 6u], bw[b + 7u]);
}

fn set_octet(a: u32, t: u32, o: array<vec4<f32>, 8>) {
    let b = a * (SLOTS * MAX_DIM) + slot + t * 8u;
    bw[b] = o[0];
    bw[b + 1u] = o[1];
    bw[b + 2u] = o[2];
    bw[b + 3u] = o[3];
    bw[b + 4u] = o[4];
    bw[b + 5u] = o[5];
    bw[b + 6u] = o[6];
    bw[b + 7u] = o[7];
}

fn element(a: u32, d: u32) -> vec4<f32> {
    return bw[a * (SLOTS * MAX_DIM) + slot + d];
}

fn zero_octets(a: u32, n: u32) {
    for (var t = 0u; t < n; t++) {
        set_octet(a, t, array<vec4<f32>, 8>());
    }
}

// Element d of four dO rows (zero past Dv).
fn do_column(rows: vec4<u32>, d: u32) -> vec4<f32> {
    if d >= p.head_dim_v {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(f32(d_out[rows.x + d]), f32(d_out[rows.y + d]), f32(d_out[rows.z + d]), f32(d_out[rows.w + d]));
}

// Octet t of the owned rows, from their buffer: `which` picks Q (scaled), dO, K or V.
const FROM_Q: u32 = 0u;
const FROM_DO: u32 = 1u;
const FROM_K: u32 = 2u;
const FROM_V: u32 = 3u;
fn column_of(which: u32, rows: vec4<u32>, d: u32) -> vec4<f32> {
    switch which {
        case 0u: {
            return q_element(rows, d);
        }
        case 1u: {
            return do_column(rows, d);
        }
        case 2u: {
            return k_column(rows, d);
        }
        default: {
            return v_column(rows, d);
        }
    }
}

fn octet_of(which: u32, rows: vec4<u32>, t: u32) -> array<vec4<f32>, 8> {
    let d = t * 8u;
    return array<vec4<f32>, 8>(
        column_of(which, rows, d),
        column_of(which, rows, d + 1u),
        column_of(which, rows, d + 2u),
        column_of(which, rows, d + 3u),
        column_of(which, rows, d + 4u),
        column_of(which, rows, d + 5u),
        column_of(which, rows, d + 6u),
        column_of(which, rows, d + 7u),
    );
}

// Octet t of the owned input rows A (Q or K) and B (dO or V), `which_*` naming the
// buffer they come from where workgroup memory does not hold them.
fn in_a(which: u32, t: u32) -> array<vec4<f32>, 8> {
    if SHARED_ROWS {
        return octet(IN_A, t);
    }
    return octet_of(which, in_a_rows, t);
}

fn in_b(which: u32, t: u32) -> array<vec4<f32>, 8> {
    if SHARED_ROWS {
        return octet(IN_B, t);
    }
    return octet_of(which, in_b_rows, t);
}

fn load_inputs(which_a: u32, which_b: u32, d8: u32, dv8: u32) {
    if SHARED_ROWS {
        for (var t = 0u; t < d8; t++) {
            set_octet(IN_A, t, octet_of(which_a, in_a_rows, t));
        }
        for (var t = 0u; t < dv8; t++) {
            set_octet(IN_B, t, octet_of(which_b, in_b_rows, t));
        }
    }
}

// The soft cap's slope at a quad's raw scaled scores (all 1 without a cap).
fn quad_slopes(x: Quad) -> Quad {
    return Quad(cap_slope(x[0]), cap_slope(x[1]), cap_slope(x[2]), cap_slope(x[3]));
}

// Element d of the K rows of keys j0..j0+3, 0 for keys at or past `limit`.
fn k_column_below(rows: vec4<u32>, d: u32, j0: u32, limit: u32) -> vec4<f32> {
    return select(vec4<f32>(0.0), k_column(rows, d), keys4(j0) < vec4<u32>(limit));
}

@compute @workgroup_size(ROWS / 4u, 1, 1)
fn bwd_dq_subgroup(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let hd = head_of(p.bh_start + wid.y);
    let lane = sg_lane % LANES;
    let row0 = wid.x * ROWS;
    let rows = vec4<u32>(row0 + lid.x) + vec4<u32>(0u, 1u, 2u, 3u) * (ROWS / 4u);
    let last_q = p.len_q - 1u;
    let clamped = min(rows, vec4<u32>(last_q));
    let starts = key_starts(hd.b, clamped);
    let ends = min(key_ends(hd.b, clamped), vec4<u32>(p.key_stop));
    // Uniform across the workgroup, as the forward's.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + ROWS - 1u, last_q)), p.key_stop);

    slot = lid.x * MAX_DIM;
    let d8 = (p.head_dim + 7u) / 8u;
    let dv8 = (p.head_dim_v + 7u) / 8u;
    in_a_rows = vec4<u32>(hd.b * p.q_stride_b + hd.h * p.q_stride_h) + clamped * p.q_stride_s;
    in_b_rows = vec4<u32>(hd.b * p.o_stride_b + hd.h * p.o_stride_h) + clamped * p.o_stride_s;
    load_inputs(FROM_Q, FROM_DO, d8, dv8);
    zero_octets(ACC_A, d8);
    let lse4 = vec4<f32>(lse_at(hd, clamped.x), lse_at(hd, clamped.y), lse_at(hd, clamped.z), lse_at(hd, clamped.w));
    let delta4 = vec4<f32>(delta_at(hd, clamped.x), delta_at(hd, clamped.y), delta_at(hd, clamped.z), delta_at(hd, clamped.w));
    let limit = key_limit(hd.b);

    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    for (var j0 = block_begin; j0 < block_end; j0 += BLOCK) {
        let kr0 = row_offsets(true, hd.b, k_base, j0);
        let kr1 = row_offsets(true, hd.b, k_base, j0 + 4u);
        let kr2 = row_offsets(true, hd.b, k_base, j0 + 8u);
        let kr3 = row_offsets(true, hd.b, k_base, j0 + 12u);
        var s0 = Quad();
        var s1 = Quad();
        var s2 = Quad();
        var s3 = Quad();
        for (var t = 0u; t < d8; t++) {
            let d = t * LANES + lane;
            let qo = in_a(FROM_Q, t);
            s0 = add_scores(s0, qo, k_column(kr0, d));
            s1 = add_scores(s1, qo, k_column(kr1, d));
            s2 = add_scores(s2, qo, k_column(kr2, d));
            s3 = add_scores(s3, qo, k_column(kr3, d));
        }
        let vr0 = row_offsets(false, hd.b, v_base, j0);
        let vr1 = row_offsets(false, hd.b, v_base, j0 + 4u);
        let vr2 = row_offsets(false, hd.b, v_base, j0 + 8u);
        let vr3 = row_offsets(false, hd.b, v_base, j0 + 12u);
        var dp0 = Quad();
        var dp1 = Quad();
        var dp2 = Quad();
        var dp3 = Quad();
        for (var t = 0u; t < dv8; t++) {
            let d = t * LANES + lane;
            let oo = in_b(FROM_DO, t);
            dp0 = add_scores(dp0, oo, v_column(vr0, d));
            dp1 = add_scores(dp1, oo, v_column(vr1, d));
            dp2 = add_scores(dp2, oo, v_column(vr2, d));
            dp3 = add_scores(dp3, oo, v_column(vr3, d));
        }
        var g0 = Quad();
        var g1 = Quad();
        var g2 = Quad();
        var g3 = Quad();
        if p.softcap != 0.0 {
            g0 = quad_slopes(s0);
            g1 = quad_slopes(s1);
            g2 = quad_slopes(s2);
            g3 = quad_slopes(s3);
        }
        // Masks, as the forward applies them (skipped where only key ranges apply and
        // every row sees the whole block), in a loop so that their code is compiled once.
        if !(only_key_ranges() && all(starts <= vec4<u32>(j0)) && all(vec4<u32>(j0 + BLOCK) <= ends)) {
            var quads = array<Quad, 4>(s0, s1, s2, s3);
            for (var c = 0u; c < 4u; c++) {
                quads[c] = mask_quad(hd, clamped, starts, ends, j0 + 4u * c, quads[c]);
            }
            s0 = quads[0];
            s1 = quads[1];
            s2 = quads[2];
            s3 = quads[3];
        }
        let x0 = dq_quad(s0, dp0, g0, lse4, delta4);
        let x1 = dq_quad(s1, dp1, g1, lse4, delta4);
        let x2 = dq_quad(s2, dp2, g2, lse4, delta4);
        let x3 = dq_quad(s3, dp3, g3, lse4, delta4);
        for (var t = 0u; t < d8; t++) {
            let d = t * LANES + lane;
            var a = octet(ACC_A, t);
            a = add_values(a, x0, k_column_below(kr0, d, j0, limit));
            a = add_values(a, x1, k_column_below(kr1, d, j0 + 4u, limit));
            a = add_values(a, x2, k_column_below(kr2, d, j0 + 8u, limit));
            a = add_values(a, x3, k_column_below(kr3, d, j0 + 12u, limit));
            set_octet(ACC_A, t, a);
        }
    }

    // dQ = scale · Σ dX k (Q carried the scale into the scores only).
    for (var r = 0u; r < 4u; r++) {
        let row = rows[r];
        if row >= p.len_q {
            continue;
        }
        let base = q_base(hd, row);
        for (var d = 0u; d < p.head_dim; d++) {
            store_dq_element(base + d, element(ACC_A, d)[r] * p.scale);
        }
    }
}

// dX of a quad of keys for the 4 owned rows (lse and D per row: the components); g
// holds the soft cap's slopes (unused without a cap). Written out rather than looped:
// Mesa 22's llvmpipe counts a constant-trip loop's trips against its loop cap.
fn dq_quad(s: Quad, dp: Quad, g: Quad, lse4: vec4<f32>, delta4: vec4<f32>) -> Quad {
    var slopes = Quad(vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0));
    if p.softcap != 0.0 {
        slopes = g;
    }
    return Quad(
        dx_of(probs_of(s[0], lse4), dp[0], delta4, slopes[0]),
        dx_of(probs_of(s[1], lse4), dp[1], delta4, slopes[1]),
        dx_of(probs_of(s[2], lse4), dp[2], delta4, slopes[2]),
        dx_of(probs_of(s[3], lse4), dp[3], delta4, slopes[3]),
    );
}

// The transposed masks of the dK/dV pass: quad entry c is query row i0 + c (one row,
// the 4 owned keys as components); rows at or past `rows_end` are masked whole.
fn mask_quad_rows(hd: Head, keys: vec4<u32>, i0: u32, rows_end: u32, s: Quad) -> Quad {
    return Quad(
        mask_row(hd, keys, i0, rows_end, s[0]),
        mask_row(hd, keys, i0 + 1u, rows_end, s[1]),
        mask_row(hd, keys, i0 + 2u, rows_end, s[2]),
        mask_row(hd, keys, i0 + 3u, rows_end, s[3]),
    );
}

fn mask_row(hd: Head, keys: vec4<u32>, i: u32, rows_end: u32, s: vec4<f32>) -> vec4<f32> {
    let row = min(i, p.len_q - 1u);
    let start = vec4<u32>(key_start(hd.b, row));
    let end = vec4<u32>(key_end(hd.b, row));
    let in_range = in_key_range(keys, start, end) & vec4<bool>(i < rows_end);
    let kc = min(keys, vec4<u32>(p.len_k - 1u));
    var words = vec4<u32>(1u);
    if p.mask_kind != MASK_NONE {
        words = vec4<u32>(mask_word(hd.b, hd.h, row, kc.x), mask_word(hd.b, hd.h, row, kc.y), mask_word(hd.b, hd.h, row, kc.z), mask_word(hd.b, hd.h, row, kc.w));
    }
    return apply_masks(s, hd.b, vec4<u32>(hd.h), vec4<u32>(row), keys, in_range, words);
}

// Row offsets of query rows i0..i0+3 (clamped to the last) of head hd in Q and in dO.
fn q_rows_at(hd: Head, i0: u32) -> vec4<u32> {
    let i = min(vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.len_q - 1u));
    return vec4<u32>(hd.b * p.q_stride_b + hd.h * p.q_stride_h) + i * p.q_stride_s;
}

fn do_rows_at(hd: Head, i0: u32) -> vec4<u32> {
    let i = min(vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.len_q - 1u));
    return vec4<u32>(hd.b * p.o_stride_b + hd.h * p.o_stride_h) + i * p.o_stride_s;
}

// P and dX of a quad of query rows i0..i0+3 for the 4 owned keys (lse and D per row:
// the quad's entries).
struct RowQuad {
    pr: Quad,
    dx: Quad,
}

fn dkdv_quad(hd: Head, i0: u32, s: Quad, dp: Quad, g: Quad) -> RowQuad {
    let rows = min(vec4<u32>(i0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.len_q - 1u));
    let lses = vec4<f32>(lse_at(hd, rows.x), lse_at(hd, rows.y), lse_at(hd, rows.z), lse_at(hd, rows.w));
    let deltas = vec4<f32>(delta_at(hd, rows.x), delta_at(hd, rows.y), delta_at(hd, rows.z), delta_at(hd, rows.w));
    let pr = Quad(
        probs_of(s[0], vec4<f32>(lses.x)),
        probs_of(s[1], vec4<f32>(lses.y)),
        probs_of(s[2], vec4<f32>(lses.z)),
        probs_of(s[3], vec4<f32>(lses.w)),
    );
    var slopes = Quad(vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0), vec4<f32>(1.0));
    if p.softcap != 0.0 {
        slopes = g;
    }
    let dx = Quad(
        dx_of(pr[0], dp[0], vec4<f32>(deltas.x), slopes[0]),
        dx_of(pr[1], dp[1], vec4<f32>(deltas.y), slopes[1]),
        dx_of(pr[2], dp[2], vec4<f32>(deltas.z), slopes[2]),
        dx_of(pr[3], dp[3], vec4<f32>(deltas.w), slopes[3]),
    );
    return RowQuad(pr, dx);
}

@compute @workgroup_size(ROWS / 4u, 1, 1)
fn bwd_dkdv_subgroup(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    // p.bh_start + wid.y counts (batch, kv head) pairs in this pass.
    let pair = p.bh_start + wid.y;
    let b = pair / p.heads_kv;
    let hk = pair % p.heads_kv;
    let lane = sg_lane % LANES;
    let key0 = wid.x * ROWS;
    let keys = vec4<u32>(key0 + lid.x) + vec4<u32>(0u, 1u, 2u, 3u) * (ROWS / 4u);
    let kc = min(keys, vec4<u32>(p.len_k - 1u));

    slot = lid.x * MAX_DIM;
    let d8 = (p.head_dim + 7u) / 8u;
    let dv8 = (p.head_dim_v + 7u) / 8u;
    in_a_rows = vec4<u32>(b * p.k_stride_b + hk * p.k_stride_h)
        + vec4<u32>(kv_offset(true, b, kc.x), kv_offset(true, b, kc.y), kv_offset(true, b, kc.z), kv_offset(true, b, kc.w));
    in_b_rows = vec4<u32>(b * p.v_stride_b + hk * p.v_stride_h)
        + vec4<u32>(kv_offset(false, b, kc.x), kv_offset(false, b, kc.y), kv_offset(false, b, kc.z), kv_offset(false, b, kc.w));
    load_inputs(FROM_K, FROM_V, d8, dv8);
    zero_octets(ACC_A, d8);
    zero_octets(ACC_B, dv8);

    let group = p.heads_q / p.heads_kv;
    // The rows any key of this workgroup is visible to (uniform: from the workgroup
    // id alone).
    let range = rows_seeing(b, key0, min(key0 + ROWS, p.len_k) - 1u);
    // Blocks of rows that see all 4 keys of this invocation skip the masks when only
    // key ranges apply: key_start and key_end grow with the row.
    let unmasked = only_key_ranges();
    for (var gh = 0u; gh < group; gh++) {
        let hd = Head(b, hk * group + gh, hk);
        for (var i0 = range.x; i0 < range.y; i0 += BLOCK) {
            let qr0 = q_rows_at(hd, i0);
            let qr1 = q_rows_at(hd, i0 + 4u);
            let qr2 = q_rows_at(hd, i0 + 8u);
            let qr3 = q_rows_at(hd, i0 + 12u);
            var s0 = Quad();
            var s1 = Quad();
            var s2 = Quad();
            var s3 = Quad();
            for (var t = 0u; t < d8; t++) {
                let d = t * LANES + lane;
                let ko = in_a(FROM_K, t);
                s0 = add_scores(s0, ko, q_element(qr0, d));
                s1 = add_scores(s1, ko, q_element(qr1, d));
                s2 = add_scores(s2, ko, q_element(qr2, d));
                s3 = add_scores(s3, ko, q_element(qr3, d));
            }
            let or0 = do_rows_at(hd, i0);
            let or1 = do_rows_at(hd, i0 + 4u);
            let or2 = do_rows_at(hd, i0 + 8u);
            let or3 = do_rows_at(hd, i0 + 12u);
            var dp0 = Quad();
            var dp1 = Quad();
            var dp2 = Quad();
            var dp3 = Quad();
            for (var t = 0u; t < dv8; t++) {
                let d = t * LANES + lane;
                let vo = in_b(FROM_V, t);
                dp0 = add_scores(dp0, vo, do_column(or0, d));
                dp1 = add_scores(dp1, vo, do_column(or1, d));
                dp2 = add_scores(dp2, vo, do_column(or2, d));
                dp3 = add_scores(dp3, vo, do_column(or3, d));
            }
            var g0 = Quad();
            var g1 = Quad();
            var g2 = Quad();
            var g3 = Quad();
            if p.softcap != 0.0 {
                g0 = quad_slopes(s0);
                g1 = quad_slopes(s1);
                g2 = quad_slopes(s2);
                g3 = quad_slopes(s3);
            }
            let last_row = min(i0 + BLOCK - 1u, p.len_q - 1u);
            let seen_whole = i0 + BLOCK <= range.y && key_start(b, last_row) <= keys.x && keys.w < key_end(b, i0);
            if !(unmasked && seen_whole) {
                var quads = array<Quad, 4>(s0, s1, s2, s3);
                for (var c = 0u; c < 4u; c++) {
                    quads[c] = mask_quad_rows(hd, keys, i0 + 4u * c, range.y, quads[c]);
                }
                s0 = quads[0];
                s1 = quads[1];
                s2 = quads[2];
                s3 = quads[3];
            }
            let q0 = dkdv_quad(hd, i0, s0, dp0, g0);
            let q1 = dkdv_quad(hd, i0 + 4u, s1, dp1, g1);
            let q2 = dkdv_quad(hd, i0 + 8u, s2, dp2, g2);
            let q3 = dkdv_quad(hd, i0 + 12u, s3, dp3, g3);
            for (var t = 0u; t < dv8; t++) {
                let d = t * LANES + lane;
                var a = octet(ACC_B, t);
                a = add_values(a, q0.pr, do_column(or0, d));
                a = add_values(a, q1.pr, do_column(or1, d));
                a = add_values(a, q2.pr, do_column(or2, d));
                a = add_values(a, q3.pr, do_column(or3, d));
                set_octet(ACC_B, t, a);
            }
            for (var t = 0u; t < d8; t++) {
                let d = t * LANES + lane;
                var a = octet(ACC_A, t);
                a = add_values(a, q0.dx, q_element(qr0, d));
                a = add_values(a, q1.dx, q_element(qr1, d));
                a = add_values(a, q2.dx, q_element(qr2, d));
                a = add_values(a, q3.dx, q_element(qr3, d));
                set_octet(ACC_A, t, a);
            }
        }
    }

    // dK = Σ dX (scale q) (the scale rode on Q); dV = Σ P dO.
    for (var r = 0u; r < 4u; r++) {
        let key = keys[r];
        if key >= p.len_k {
            continue;
        }
        let seen = key < key_limit(b); // else 0 (backward_common.wgsl, key_limit)
        let kb = in_a_rows[r];
        for (var d = 0u; d < p.head_dim; d++) {
            store_dk_element(kb + d, select(0.0, element(ACC_A, d)[r], seen));
        }
        let vb = in_b_rows[r];
        for (var d = 0u; d < p.head_dim_v; d++) {
            store_dv_element(vb + d, select(0.0, element(ACC_B, d)[r], seen));
        }
    }
}
