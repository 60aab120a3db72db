enable f16;
enable wgpu_cooperative_matrix;

// The backward pass of fused attention on tensor cores (cooperative matrices):
// FlashAttention-2's dQ and dK/dV passes (flash_backward.wgsl says what each computes)
// with every product a 16 x 16 x 16 f16 multiply-add into f32 accumulators, appended to
// attention_common.wgsl and backward_common.wgsl. The operands are rounded to f16 as
// they are staged (f16 inputs stay exact), and so are P and dX, the products' other
// operand; recomputing the scores, the masks, exp, dP - D and every sum stay f32. It is
// the tensor-core forward's layout (flash_coop.wgsl; docs/design.md, "Tensor cores")
// without its pipelining. On an NVIDIA H200: right, 23.9 TFLOP/s at (4,16,4096,128) f16
// (2026-11-28).
//
// Generator parameters (a one-line prelude per variant, kernels::backward_coop): DMAX
// (head dims up to it), BR (query rows or keys per workgroup, one 16-row band per two
// subgroups), BC (rows or keys per walked tile), SG (the adapter's fixed subgroup size),
// LPR / RPL (lanes per band row and band rows per lane of the element-wise step: SG/16
// and 1 on 32-lane subgroups, 1 and 16/SG on narrower ones). The source goes through
// kernels::unroll, as the forward's: the owned rows' fragments (`own`) and the
// gradient tiles (`acc`) are arrays indexed by loop counters, or (the `named` form) one
// named value each, every loop over them unrolled; the band's products are macros for
// that reason. The generator also gives DH = D16/2 and NGH, NG's count for DH tiles.
//
// Per workgroup: BR query rows (dQ) or BR keys (dK/dV) of one (batch, head) or (batch,
// kv head). Subgroups 2g and 2g+1 (halves 0 and 1) own rows 16g .. 16g+15 of them (their
// band). Half 0 keeps in registers the band's Q (or K) as DMAX/16 A fragments, half 1
// its dO (or V) (loaded once, 16 columns at a time through `tiles`); as gradients, half
// 0 keeps dQ's first DMAX/32 f32 accumulator tiles (or all of dK's DMAX/16), half 1
// dQ's last DMAX/32 (or dV's). One subgroup holding both operands and both gradients
// took 256 VGPRs at DMAX 128 on RDNA3 (an A fragment is 8 of them there, as an f32
// tile) and spilled. Every subgroup runs the same code, its half choosing addresses
// only: cooperative operations need workgroup-uniform control flow. Per
// walked tile of BC keys (dQ) or query rows (dK/dV, for each query head of the group):
//   1. stage: both walked operands (K and V, or Q and dO) into `tiles` as f16, rows
//      padded to DMAX + 8 halves, 16 bytes per load with both operands' loads before
//      their stores where every operand's rows are whole words (WORDS, set by the host:
//      the staging of the GEMM measured fast on an H100), else element by element;
//      zeros past the head dims, past the key length (so that 0 x whatever a KV buffer
//      holds there cannot reach dQ) and past Lq;
//   -- barrier --
//   2. products: the band's 16 x BC scores (Q·Kᵀ, or K·Qᵀ; half 0) and dP (dO·Vᵀ, or
//      V·dOᵀ; half 1), B read column-major from the staged rows, to its rows of `sx`
//      (f32);
//   -- barrier --
//   3. element-wise, every lane of the band: LPR lanes per row, each on BC/LPR of its
//      columns (the two halves on alternate column quads): the forward's masks
//      (apply_masks), P = exp(s - lse) and
//      dX = P (dP - D) · cap slope · scale, written to `px` as f16: dX (dQ), or P and
//      dX (dK/dV);
//   -- barrier --
//   4. products: dQ += dX·K (each half its DMAX/32 column tiles), or dK += dXᵀ·Q (half
//      0) and dV += Pᵀ·dO (half 1) (A from the band's rows of `px`, B row-major from the
//      staged tiles), each A fragment loaded once for all of the half's accumulator
//      tiles;
//   -- barrier -- (before the next tile's stage)
// The gradients then go out through the band's rows of `sx` (half 1: of its dP rows),
// BC columns at a time, as
// the forward's output does, adding what an earlier dispatch left (p.key_begin > 0: a
// loop cap splits the walks). The walks skip what the masks hide (dQ: the keys of the
// workgroup's rows' ranges, as the forward; dK/dV: rows_seeing) and honour
// p.key_begin .. p.key_stop (keys in the dQ pass, query rows in the dK/dV pass). No
// atomics: each gradient element is one accumulator's sum over the walk in a fixed
// order, so results repeat bit for bit. Every cooperative operation sits in
// workgroup-uniform control flow, as naga requires; every index inside a
// coopLoad/coopStore pointer is a named `let` (naga 30's SPIR-V writer panics
// otherwise).

const NSG: u32 = 2u * BR / 16u; // subgroups, two per 16-row band
const NT: u32 = NSG * SG; // invocations
const D16: u32 = DMAX / 16u; // 16-wide chunks of the head dims
const WC: u32 = BC / 16u; // 16-wide chunks of a walked tile
const NG: u32 = (D16 + WC - 1u) / WC; // groups of WC gradient tiles that go out through `sx` at once
const DH: u32 = D16 / 2u; // dQ tiles per half (D16 is even)
const NGH: u32 = (DH + WC - 1u) / WC; // NG for DH tiles
const LDT: u32 = DMAX + 8u; // halves per staged row
const B_AT: u32 = BC * LDT; // where the second walked operand starts in `tiles`
const LDS: u32 = BC + 4u; // floats per row of `sx`
const LDP: u32 = BC + 8u; // halves per row of `px`
const QPL: u32 = BC / (4u * LPR); // column quads per lane and row, element-wise
const ROW_STEP: u32 = SG / LPR; // band rows between one lane's rows

const SD_AT: u32 = BR * LDS; // where dP starts in `sx`
const PD_AT: u32 = BR * LDP; // where dX starts in `px` (dK/dV)

// The walked operands (or the owned rows, once, before the walk).
var<workgroup> tiles: array<f16, 2u * BC * LDT>;
// Each band's scores (rows 0 .. BR) and dP (rows BR .. 2 BR), f32.
var<workgroup> sx: array<f32, 2u * BR * LDS>;
// Each band's P (dK/dV) and dX (dQ: at 0; dK/dV: at PD_AT), f16. One array each for
// both, so that no cooperative operation sits in a branch.
var<workgroup> px: array<f16, 2u * BR * LDP>;

// Q, dO, K and V again, as 16-byte words (read only with WORDS).
@group(0) @binding(22) var<storage, read> q4: array<vec4<u32>>;
@group(0) @binding(23) var<storage, read> do4: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> v4: array<vec4<u32>>;

override WORDS: bool = false; // every operand's rows whole words at word offsets (host)

const WPR: u32 = DMAX / VE; // words per staged row

// The operands a pass stages, by code.
const OP_Q: u32 = 0u;
const OP_DO: u32 = 1u;
const OP_K: u32 = 2u;
const OP_V: u32 = 3u;

// Where row `row` of operand `op` of head hd starts in its buffer (elements).
fn operand_row(op: u32, hd: Head, row: u32) -> u32 {
    switch op {
        case 0u: {
            return q_base(hd, row);
        }
        case 1u: {
            return do_base(hd, row);
        }
        case 2u: {
            return hd.b * p.k_stride_b + hd.hk * p.k_stride_h + kv_offset(true, hd.b, row);
        }
        default: {
            return hd.b * p.v_stride_b + hd.hk * p.v_stride_h + kv_offset(false, hd.b, row);
        }
    }
}

// The head dims of an operand's rows.
fn operand_len(op: u32) -> u32 {
    return select(p.head_dim_v, p.head_dim, op == OP_Q || op == OP_K);
}

// The 16-byte word of operand op holding element `at` (a word's first).
fn operand_word(op: u32, at: u32) -> vec4<u32> {
    let w = at / VE;
    switch op {
        case 0u: {
            return q4[w];
        }
        case 1u: {
            return do4[w];
        }
        case 2u: {
            return k4[w];
        }
        default: {
            return v4[w];
        }
    }
}

// Element `at` of operand op, as f16.
fn operand_element(op: u32, at: u32) -> f16 {
    switch op {
        case 0u: {
            return f16(q[at]);
        }
        case 1u: {
            return f16(d_out[at]);
        }
        case 2u: {
            return f16(k[at]);
        }
        default: {
            return f16(v[at]);
        }
    }
}

// Word w of row `row` of operand op: zeros at or past `stop` rows and past its head dims.
fn fetch_word(op: u32, hd: Head, row: u32, w: u32, stop: u32) -> vec4<u32> {
    if row < stop && w * VE < operand_len(op) {
        return operand_word(op, operand_row(op, hd, row) + w * VE);
    }
    return vec4<u32>(0u);
}

// Stages rows first .. first + rows of operand ops.x at tiles[0 ..] and, with `both`, of
// ops.y at tiles[B_AT ..], as f16: zeros at or past `stop` rows and past the operand's
// head dims. With WORDS 16 bytes per load, both operands' loads before their stores
// (the measured GEMM's interleaved staging, docs/design.md "Tensor cores"); else
// element by element.
fn stage(ops: vec2<u32>, both: bool, hd: Head, first: u32, rows: u32, stop: u32, tid: u32) {
    if WORDS {
        for (var x = tid; x < rows * WPR; x += NT) {
            let r = x / WPR;
            let w = x % WPR;
            let a = fetch_word(ops.x, hd, first + r, w, stop);
            var b = vec4<u32>(0u);
            if both {
                b = fetch_word(ops.y, hd, first + r, w, stop);
            }
            put_word(r * LDT + w * VE, a);
            if both {
                put_word(B_AT + r * LDT + w * VE, b);
            }
        }
    } else {
        for (var x = tid; x < rows * DMAX; x += NT) {
            let r = x / DMAX;
            let d = x % DMAX;
            let row = first + r;
            var a = f16(0.0);
            var b = f16(0.0);
            if row < stop && d < operand_len(ops.x) {
                a = operand_element(ops.x, operand_row(ops.x, hd, row) + d);
            }
            if both && row < stop && d < operand_len(ops.y) {
                b = operand_element(ops.y, operand_row(ops.y, hd, row) + d);
            }
            tiles[r * LDT + d] = a;
            if both {
                tiles[B_AT + r * LDT + d] = b;
            }
        }
    }
}

// Stages columns c0 .. c0 + 15 of rows first .. first + BR of operand ops.x at tiles[0 ..]
// and of ops.y at tiles[16 BR ..], rows of 16 halves, element by element: zeros at or
// past `stop` rows and past the operand's head dims. For the owned rows' fragments
// (once per workgroup): both operands' rows fit `tiles` at every BR <= 2 BC.
fn stage_columns(ops: vec2<u32>, hd: Head, first: u32, c0: u32, stop: u32, tid: u32) {
    for (var x = tid; x < 2u * BR * 16u; x += NT) {
        let op = select(ops.x, ops.y, x >= BR * 16u);
        let row = first + x / 16u % BR;
        let d = c0 + x % 16u;
        var value = f16(0.0);
        if row < stop && d < operand_len(op) {
            value = operand_element(op, operand_row(op, hd, row) + d);
        }
        tiles[x] = value;
    }
}

// The band's 16 x BC products of its A fragments `own` with the walked operand staged
// at `tiles[at ..]` (read column-major as B), to its rows of `sx` from `out`. Macros,
// written out where they run: the fragments may be named values (the `named` form),
// which no function can take as one argument.
//@macro BAND_PRODUCTS(own, at, out)
    for (var wc = 0u; wc < WC; wc++) {
        var s = coop_mat16x16<f32, C>();
        //@each dc < D16
        let ib = $at + wc * 16u * LDT + dc * 16u;
        let b = coopLoad<coop_mat16x16<f16, B>>(&tiles[ib], LDT);
        s = coopMultiplyAdd($own@{dc}, b, s);
        //@end
        let is = $out + band * LDS + wc * 16u;
        coopStoreT(s, &sx[is], LDS);
    }
//@endmacro

// acc += X·W for the band: X its 16 x BC rows of `px` from `x_at`, W the n 16-column
// tiles of the walked operand staged at `tiles[at ..]` (row-major), each X fragment
// loaded once for all n accumulator tiles.
//@macro ACCUMULATE(acc, n, x_at, at)
    for (var wc = 0u; wc < WC; wc++) {
        let ia = $x_at + band * LDP + wc * 16u;
        let a = coopLoadT<coop_mat16x16<f16, A>>(&px[ia], LDP);
        //@each c < $n
        let ib = $at + wc * 16u * LDT + c * 16u;
        let b = coopLoadT<coop_mat16x16<f16, B>>(&tiles[ib], LDT);
        $acc@{c} = coopMultiplyAdd(a, b, $acc@{c});
        //@end
    }
//@endmacro

// The half's A fragments `own` of rows first .. first + BR of operand ops.x (half 0) or
// ops.y (half 1), `stop` as stage_columns', 16 columns per round.
//@macro OWN_FRAGMENTS(ops, hd, first, stop)
    //@array own D16 coop_mat16x16<f16, A>
    //@each dc < D16
    workgroupBarrier();
    stage_columns($ops, $hd, $first, dc * 16u, $stop, tid);
    workgroupBarrier();
    let ia = (half * BR + band) * 16u;
    own@{dc} = coopLoadT<coop_mat16x16<f16, A>>(&tiles[ia], 16u);
    //@end
//@endmacro

// Puts the half's gradient tiles g WC .. g WC + WC - 1 (of 16 columns each, n in all)
// in its band's rows of `sx` from `s_at`, on the way out: a lane's elements are then
// at element_at's places. Inside `//@each g < ..`, so that no tile's index is known
// only at run time.
//@macro SPILL(acc, n)
    //@each u < WC while g * WC + u < $n
    let is = s_at + band * LDS + u * 16u;
    coopStoreT($acc@{g * WC + u}, &sx[is], LDS);
    //@end
//@endmacro

// Element n (< RPL · QPL · 4) of a lane's share of its band's spilled tiles: (band row,
// column from the chunk's first).
fn element_at(lane: u32, n: u32) -> vec2<u32> {
    let rr = n / (QPL * 4u);
    let u = n / 4u % QPL;
    return vec2<u32>(lane / LPR + rr * ROW_STEP, 4u * (lane % LPR + LPR * u) + n % 4u);
}

@compute @workgroup_size(NT, 1, 1)
fn bwd_dq_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let hd = head_of(p.bh_start + wid.y);
    let row0 = wid.x * BR;
    let last_q = p.len_q - 1u;
    let band = sg / 2u * 16u;
    let half = sg % 2u;
    let quad0 = lane % LPR;
    let limit = key_limit(hd.b);
    // Where the half's walked operand starts in `tiles` (K, or V), its products go in
    // `sx` (scores, or dP) and its dQ tiles' columns start.
    let b_at = half * B_AT;
    let s_at = half * SD_AT;
    let c_at = half * DH * 16u;

    // The owned rows' fragments: Q (half 0) or dO (half 1).
    let own_ops = vec2<u32>(OP_Q, OP_DO);
    //@expand OWN_FRAGMENTS(own_ops, hd, row0, p.len_q)

    // This lane's rows: their log-sum-exp and D.
    var row_lse: array<f32, RPL>;
    var row_delta: array<f32, RPL>;
    for (var rr = 0u; rr < RPL; rr++) {
        let i = min(row0 + band + lane / LPR + rr * ROW_STEP, last_q);
        row_lse[rr] = lse_at(hd, i);
        row_delta[rr] = delta_at(hd, i);
    }
    // The half's dQ tiles.
    //@array acc DH coop_mat16x16<f32, C>
    //@each c < DH
    acc@{c} = coop_mat16x16<f32, C>();
    //@end

    let first = block_key_begin(hd.b, min(row0, last_q));
    let last = min(key_end(hd.b, min(row0 + BR - 1u, last_q)), p.key_stop);
    for (var j0 = first; j0 < last; j0 += BC) {
        workgroupBarrier();
        // 1. K (zeros past the key length) and V of keys j0 .. j0 + BC.
        stage(vec2<u32>(OP_K, OP_V), true, hd, j0, BC, limit, tid);
        workgroupBarrier();
        // 2. Scores (half 0) and dP (half 1) of the band.
        //@expand BAND_PRODUCTS(own, b_at, s_at)
        workgroupBarrier();
        // 3. dX of this lane's rows and column quads (the half's), as f16.
        for (var rr = 0u; rr < RPL; rr++) {
            let r = lane / LPR + rr * ROW_STEP;
            let i = min(row0 + band + r, last_q);
            let start = vec4<u32>(key_start(hd.b, i));
            let end = vec4<u32>(min(key_end(hd.b, i), p.key_stop));
            for (var u = half; u < QPL; u += 2u) {
                let j = 4u * (quad0 + LPR * u);
                let at = (band + r) * LDS + j;
                let x = vec4<f32>(sx[at], sx[at + 1u], sx[at + 2u], sx[at + 3u]) * p.scale;
                let dp = vec4<f32>(sx[SD_AT + at], sx[SD_AT + at + 1u], sx[SD_AT + at + 2u], sx[SD_AT + at + 3u]);
                let keys = keys4(j0 + j);
                let in_range = in_key_range(keys, start, end);
                let s = apply_masks(x, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_range, mask_words_of_keys(hd.b, hd.h, i, j0 + j));
                let pr = probs_of(s, vec4<f32>(row_lse[rr]));
                let dx = vec4<f16>(dx_of(pr, dp, vec4<f32>(row_delta[rr]), cap_slope(x)) * p.scale);
                let pa = (band + r) * LDP + j;
                px[pa] = dx.x;
                px[pa + 1u] = dx.y;
                px[pa + 2u] = dx.z;
                px[pa + 3u] = dx.w;
            }
        }
        workgroupBarrier();
        // 4. dQ += dX·K, the half's columns.
        //@expand ACCUMULATE(acc, DH, 0u, c_at)
    }
    // The half's dQ columns of the owned rows, BC columns at a time through `sx`.
    //@each g < NGH
        workgroupBarrier();
        //@expand SPILL(acc, DH)
        workgroupBarrier();
        for (var n = 0u; n < RPL * QPL * 4u; n++) {
            let at = element_at(lane, n);
            let row = row0 + band + at.x;
            let col = c_at + g * WC * 16u + at.y;
            if row < p.len_q && at.y < (DH - g * WC) * 16u && col < p.head_dim {
                store_dq_element(q_base(hd, row) + col, sx[s_at + (band + at.x) * LDS + at.y]);
            }
        }
    //@end
}

@compute @workgroup_size(NT, 1, 1)
fn bwd_dkdv_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    // p.bh_start + wid.y counts (batch, kv head) pairs; p.key_begin .. p.key_stop are
    // query rows in this pass.
    let pair = p.bh_start + wid.y;
    let b = pair / p.heads_kv;
    let hk = pair % p.heads_kv;
    let key0 = wid.x * BR;
    let band = sg / 2u * 16u;
    let half = sg % 2u;
    let quad0 = lane % LPR;
    let limit = key_limit(b);
    // Where the half's walked operand starts in `tiles` (Q, or dO) and its products go
    // in `sx` (scores, or dP); where its X of step 4 starts in `px` (dX, or P).
    let b_at = half * B_AT;
    let s_at = half * SD_AT;
    let x_at = (1u - half) * PD_AT;

    // The owned keys' fragments: K (half 0) or V (half 1) (zeros past the key length:
    // their gradients are 0, and their rows may hold anything).
    let owner = Head(b, hk * (p.heads_q / p.heads_kv), hk);
    let own_ops = vec2<u32>(OP_K, OP_V);
    //@expand OWN_FRAGMENTS(own_ops, owner, key0, limit)

    // dK (half 0) or dV (half 1).
    //@array acc D16 coop_mat16x16<f32, C>
    //@each c < D16
    acc@{c} = coop_mat16x16<f32, C>();
    //@end
    let group = p.heads_q / p.heads_kv;
    let rows = rows_seeing(b, key0, min(key0 + BR, p.len_k) - 1u);
    let last_q = p.len_q - 1u;
    for (var g = 0u; g < group; g++) {
        let hd = Head(b, hk * group + g, hk);
        for (var i0 = rows.x; i0 < rows.y; i0 += BC) {
            workgroupBarrier();
            // 1. Q and dO of rows i0 .. i0 + BC.
            stage(vec2<u32>(OP_Q, OP_DO), true, hd, i0, BC, p.len_q, tid);
            workgroupBarrier();
            // 2. Scores (half 0) and dP (half 1) of the band's keys (transposed: keys x
            // rows).
            //@expand BAND_PRODUCTS(own, b_at, s_at)
            workgroupBarrier();
            // 3. P and dX of this lane's keys and row quads (the half's), as f16.
            for (var rr = 0u; rr < RPL; rr++) {
                let r = lane / LPR + rr * ROW_STEP;
                let j = key0 + band + r;
                for (var u = half; u < QPL; u += 2u) {
                    let c = 4u * (quad0 + LPR * u);
                    let at = (band + r) * LDS + c;
                    let x = vec4<f32>(sx[at], sx[at + 1u], sx[at + 2u], sx[at + 3u]) * p.scale;
                    let dp = vec4<f32>(sx[SD_AT + at], sx[SD_AT + at + 1u], sx[SD_AT + at + 2u], sx[SD_AT + at + 3u]);
                    let rows4 = keys4(i0 + c);
                    let r4 = min(rows4, vec4<u32>(last_q));
                    let in_range = in_key_range(vec4<u32>(j), key_starts(b, r4), key_ends(b, r4)) & (rows4 < vec4<u32>(rows.y));
                    let s = apply_masks(x, b, vec4<u32>(hd.h), r4, vec4<u32>(j), in_range, mask_words_of_rows(b, hd.h, r4, j));
                    let lse4 = vec4<f32>(lse_at(hd, r4.x), lse_at(hd, r4.y), lse_at(hd, r4.z), lse_at(hd, r4.w));
                    let delta4 = vec4<f32>(delta_at(hd, r4.x), delta_at(hd, r4.y), delta_at(hd, r4.z), delta_at(hd, r4.w));
                    let pr = probs_of(s, lse4);
                    let p16 = vec4<f16>(pr);
                    let dx = vec4<f16>(dx_of(pr, dp, delta4, cap_slope(x)) * p.scale);
                    let pa = (band + r) * LDP + c;
                    px[pa] = p16.x;
                    px[pa + 1u] = p16.y;
                    px[pa + 2u] = p16.z;
                    px[pa + 3u] = p16.w;
                    px[PD_AT + pa] = dx.x;
                    px[PD_AT + pa + 1u] = dx.y;
                    px[PD_AT + pa + 2u] = dx.z;
                    px[PD_AT + pa + 3u] = dx.w;
                }
            }
            workgroupBarrier();
            // 4. dK += dXᵀ·Q (half 0), dV += Pᵀ·dO (half 1).
            //@expand ACCUMULATE(acc, D16, x_at, b_at)
        }
    }
    // dK (half 0) or dV (half 1) of the owned keys, BC columns at a time through `sx`.
    let is_k = half == 0u;
    let op = select(OP_V, OP_K, is_k);
    //@each g < NG
        workgroupBarrier();
        //@expand SPILL(acc, D16)
        workgroupBarrier();
        for (var n = 0u; n < RPL * QPL * 4u; n++) {
            let at = element_at(lane, n);
            let j = key0 + band + at.x;
            let col = g * WC * 16u + at.y;
            if j < p.len_k && col < operand_len(op) {
                // 0 past the key length (backward_common.wgsl, key_limit).
                let value = select(0.0, sx[s_at + (band + at.x) * LDS + at.y], j < key_limit(b));
                if is_k {
                    store_dk_element(operand_row(op, owner, j) + col, value);
                } else {
                    store_dv_element(operand_row(op, owner, j) + col, value);
                }
            }
        }
    //@end
}
