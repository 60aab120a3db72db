// Split-K decode for CPU adapters with subgroups of at least 8 lanes (lavapipe): the
// same splits, row blocks and partial results as flash_decode.wgsl (decode_combine
// there merges them), arranged for a SIMD CPU. Appended to attention_common.wgsl,
// decode_common.wgsl, decode_scores.wgsl and one of decode_kv_buffers.wgsl (K and V from their buffers)
// and decode_kv_texels.wgsl (from a KV cache's texel mirror), which define kv_words.
//
// Why a separate kernel: flash_decode.wgsl's workgroup of 64 invocations needs three
// barriers per tile of 64 keys, and one invocation per quad of rows runs the softmax
// while the others wait. On a CPU driver a workgroup runs as SIMD batches of 8
// invocations, and a barrier switches between them. Here a workgroup is one subgroup
// of 8 invocations, one SIMD batch: no barrier in the key loop, and the softmax is a
// subgroup reduction every lane takes part in.
//
// Tiling. Workgroup (x, y) takes split x and row block y: DEC_ROWS (4 or 8) query
// rows that share one kv head, in quads (four rows as a vec4's components). Keys go
// in blocks of 16, keys j0 + l and j0 + 8 + l to invocation l:
//   1. scores: invocation l computes its two keys' dot products with the block's Q
//      rows (decode_scores: scaled, in workgroup memory, read at the same address by
//      every lane, once for both keys; handing Q round by subgroupBroadcast instead
//      was 1.6x slower on lavapipe) and masks them;
//   2. softmax: subgroupMax and subgroupAdd give every lane the block's maxima and
//      sums, so all lanes keep the same running maxima and sums;
//   3. values: subgroupBroadcast hands every lane the 16 keys' probabilities and V
//      row offsets; invocation l owns the output columns of V loads 8c + l (4 each,
//      8 for f16 read whole), one vec4 per quad and column in its own slots of
//      workgroup memory (llvmpipe compiles a dynamically indexed private array into
//      a ladder of branches), rescales them and adds the 16 probabilities times V,
//      in key order.
// K and V are read 16 bytes to a load (4 f32 or 8 f16 elements, through kv_words)
// where KV_WIDE is set (head dims, so row strides, multiples of that; the host
// checks): llvmpipe loads storage lane by lane, so such a load costs about what one
// element does. Four f32 a load made the kernel 1.4-1.5x faster on Mesa 22.3's
// lavapipe and 1.13x on 25.0's; eight f16 instead of four, 1.24x and 1.06x.
// f16 head dims that are multiples of 4 but not 8 (KV_WIDE 2) read 4 elements, one
// half of a 16-byte word, a load. Otherwise a load of 4 elements reads the two 16-byte
// words they can span and picks them out with selects (kv_quad): against four single-element reads, 1.6-1.85x
// faster on Mesa 22.3 and 1.4-1.6x on 25.0 at head dims 99 and 100, and half the cold
// compile on 25.0.
// The block's keys past the split or the row's visible range are masked; their
// probabilities are 0 and their V rows (clamped to the last key) are read but add
// nothing.

const DS_LANES: u32 = 8u;
// Keys a block: two per lane, so each read of Q serves two keys.
const DS_BLOCK: u32 = 2u * DS_LANES;
const DS_SLOTS: u32 = 32u; // a lane's columns: Dv up to 256 over 8 lanes

// 1 where K and V are read 16 bytes at a time through kv_words; 2 where f16 rows are
// read 8 bytes (4 elements, half a word) at a time (set by the host, kernels::decode).
override KV_WIDE: u32 = 0u;

// Vec4s a load of K or V gives: 2 for f16 read 16 bytes at a time, else 1.
fn kv_vec4s() -> u32 {
    return select(1u, ELEMS_PER_WORD, KV_WIDE == 1u);
}

// Whether the key loop is one loop whose blocks each choose the masked or the plain
// body (set by the host, kernels::decode::one_key_loop): a third to a half of the
// cold compile on Mesa 25.0's lavapipe (the body inlined once, not twice) at the same
// speed, but 1.04-1.19x slower on Mesa 22.3's, where a masked loop and a plain one
// are kept.
override ONE_KEY_LOOP: bool = true;

// Quad qd's accumulator for slot c of invocation l, at (qd * DS_SLOTS + c) * 8 + l.
// Lane l owns the columns of loads 8c' + l, each kv_vec4s() slots of 4 columns.
var<workgroup> ds_acc: array<vec4<f32>, DEC_QUADS * DS_SLOTS * DS_LANES>;

fn slot_column(c: u32, lid: u32) -> u32 {
    let per = kv_vec4s();
    let unit = c / 4u;
    return ((unit / per * DS_LANES + lid) * per + unit % per) * 4u + c % 4u;
}

// Elements e .. e + 3 of K or V, those from index n on as 0: read from the two 16-byte
// words they can span (the second may lie past the buffer, where WGSL's bounds checks
// keep the read inside it; its elements are then past n) and picked out by selects.
// Four element reads, each a load, an index ladder and a branch, made Mesa 25's cold
// compile of this path 13-22 s.
fn kv_quad(is_k: bool, e: u32, n: u32) -> vec4<f32> {
    let per_word = 4u * ELEMS_PER_WORD;
    let w0 = kv_words(is_k, e);
    let w1 = kv_words(is_k, e + per_word);
    let o = e % per_word;
    var r: vec4<f32>;
    if ELEMS_PER_WORD == 1u {
        let a = bitcast<vec4<f32>>(w0);
        let b = bitcast<vec4<f32>>(w1);
        r = a;
        r = select(r, vec4<f32>(a.yzw, b.x), o == 1u);
        r = select(r, vec4<f32>(a.zw, b.xy), o == 2u);
        r = select(r, vec4<f32>(a.w, b.xyz), o == 3u);
    } else {
        // Halves o .. o + 3: the u32 words o / 2 .. o / 2 + 2, shifted by a half where o
        // is odd.
        let i = o / 2u;
        var t = w0.xyz;
        t = select(t, w0.yzw, i == 1u);
        t = select(t, vec3<u32>(w0.zw, w1.x), i == 2u);
        t = select(t, vec3<u32>(w0.w, w1.xy), i == 3u);
        let odd = o % 2u == 1u;
        let lo = select(t.x, (t.x >> 16u) | (t.y << 16u), odd);
        let hi = select(t.y, (t.y >> 16u) | (t.z << 16u), odd);
        r = vec4<f32>(unpack2x16float(lo), unpack2x16float(hi));
    }
    return select(r, vec4<f32>(0.0), vec4<u32>(0u, 1u, 2u, 3u) >= vec4<u32>(n));
}

// Load u of the K or V row at `row` (elements from u * 4 * kv_vec4s(), zero past the
// head dim where not read 16 bytes at a time).
fn kv_load(is_k: bool, row: u32, u: u32) -> KvLoad {
    if KV_WIDE == 2u {
        let e = row + u * 4u;
        let w = kv_words(is_k, e);
        let h = select(w.xy, w.zw, e % 8u != 0u);
        return KvLoad(vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y)), vec4<f32>(0.0));
    }
    if KV_WIDE == 1u {
        let w = kv_words(is_k, row + u * 4u * ELEMS_PER_WORD);
        if ELEMS_PER_WORD == 2u {
            return KvLoad(
                vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
                vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
            );
        }
        return KvLoad(bitcast<vec4<f32>>(w), vec4<f32>(0.0));
    }
    let len = select(p.head_dim_v, p.head_dim, is_k);
    let first = u * 4u;
    return KvLoad(kv_quad(is_k, row + first, len - min(len, first)), vec4<f32>(0.0));
}

// For decode_scores.
fn decode_k_load(k_row: u32, u: u32) -> KvLoad {
    return kv_load(true, k_row, u);
}

alias Octet = array<vec4<f32>, 8>;
alias OctetU = array<u32, 8>;

// Every lane's x, lane i's as element i (the lane index must be a constant).
fn broadcast_octet(x: vec4<f32>) -> Octet {
    return Octet(
        subgroupBroadcast(x, 0u),
        subgroupBroadcast(x, 1u),
        subgroupBroadcast(x, 2u),
        subgroupBroadcast(x, 3u),
        subgroupBroadcast(x, 4u),
        subgroupBroadcast(x, 5u),
        subgroupBroadcast(x, 6u),
        subgroupBroadcast(x, 7u),
    );
}

fn broadcast_octet_u(x: u32) -> OctetU {
    return OctetU(
        subgroupBroadcast(x, 0u),
        subgroupBroadcast(x, 1u),
        subgroupBroadcast(x, 2u),
        subgroupBroadcast(x, 3u),
        subgroupBroadcast(x, 4u),
        subgroupBroadcast(x, 5u),
        subgroupBroadcast(x, 6u),
        subgroupBroadcast(x, 7u),
    );
}

alias LoadOctet = array<KvLoad, 8>;

// Load w of the 8 V rows starting at `rows`.
fn v_octet(rows: OctetU, w: u32) -> LoadOctet {
    return LoadOctet(
        kv_load(false, rows[0], w),
        kv_load(false, rows[1], w),
        kv_load(false, rows[2], w),
        kv_load(false, rows[3], w),
        kv_load(false, rows[4], w),
        kv_load(false, rows[5], w),
        kv_load(false, rows[6], w),
        kv_load(false, rows[7], w),
    );
}

// Vec4 h of each of the 8 loads.
fn octet_part(x: LoadOctet, h: u32) -> Octet {
    return Octet(x[0][h], x[1][h], x[2][h], x[3][h], x[4][h], x[5][h], x[6][h], x[7][h]);
}

// o + Σ_i pr[i] * vals[i][e], in key order: column e of the 8 rows' vec4s.
fn add_pv(o: vec4<f32>, pr: Octet, vals: Octet, e: u32) -> vec4<f32> {
    var r = o;
    r += pr[0] * vals[0][e];
    r += pr[1] * vals[1][e];
    r += pr[2] * vals[2][e];
    r += pr[3] * vals[3][e];
    r += pr[4] * vals[4][e];
    r += pr[5] * vals[5][e];
    r += pr[6] * vals[6][e];
    r += pr[7] * vals[7][e];
    return r;
}

// A quad's four column slots from slot index a: rescaled by alpha, plus the 16 keys'
// probabilities (pa for keys j0 .. j0 + 7, pb for the rest) times their V values
// (written out, not looped: each loop counts toward the driver's iteration cap).
fn accumulate(a: u32, alpha: vec4<f32>, pa: Octet, pb: Octet, va: Octet, vb: Octet) {
    accumulate_column(a, alpha, pa, pb, va, vb, 0u);
    accumulate_column(a + DS_LANES, alpha, pa, pb, va, vb, 1u);
    accumulate_column(a + 2u * DS_LANES, alpha, pa, pb, va, vb, 2u);
    accumulate_column(a + 3u * DS_LANES, alpha, pa, pb, va, vb, 3u);
}

fn accumulate_column(a: u32, alpha: vec4<f32>, pa: Octet, pb: Octet, va: Octet, vb: Octet, e: u32) {
    ds_acc[a] = add_pv(add_pv(ds_acc[a] * alpha, pa, va, e), pb, vb, e);
}

// One online-softmax step of a quad over the block's 16 keys, the same in every lane:
// the new running maxima, the factor that rescales the old state, the probabilities
// of this lane's two keys and the new running sums.
struct QuadStep {
    max: vec4<f32>,
    alpha: vec4<f32>,
    probs_a: vec4<f32>,
    probs_b: vec4<f32>,
    sum: vec4<f32>,
}

fn quad_step(old_max: vec4<f32>, old_sum: vec4<f32>, sa: vec4<f32>, sb: vec4<f32>) -> QuadStep {
    let new_max = max(old_max, subgroupMax(max(sa, sb)));
    let alpha = softmax_rescale(old_max, new_max);
    let pa = softmax_probs(sa, new_max);
    let pb = softmax_probs(sb, new_max);
    return QuadStep(new_max, alpha, pa, pb, old_sum * alpha + subgroupAdd(pa + pb));
}

// Each quad's running maxima and sums (the same in every lane).
struct RunState {
    max0: vec4<f32>,
    sum0: vec4<f32>,
    max1: vec4<f32>,
    sum1: vec4<f32>,
}

// Where the rows of key j start in K (x) and V (y): clamped to last_read_key (keys
// past it are masked, and their rows may hold anything).
fn key_rows(blk: DecodeBlock, j: u32) -> vec2<u32> {
    let jc = min(j, last_read_key(blk.b));
    return vec2<u32>(
        blk.b * p.k_stride_b + blk.hk * p.k_stride_h + kv_offset(true, blk.b, jc),
        blk.b * p.v_stride_b + blk.hk * p.v_stride_h + kv_offset(false, blk.b, jc),
    );
}

// This lane's scores, masked: raw[2k + qd] is quad qd's scores of key k of its two
// (ja, ja + 8). One loop over the (key, quad) pairs, so the rules' code is compiled
// once, not once per pair (inlined per pair it was half the 8-row kernel's cold
// compile on Mesa 25); it runs only in the blocks at the edges of the visible range.
fn mask_scores(blk: DecodeBlock, ja: u32, raw: array<vec4<f32>, 4>) -> array<vec4<f32>, 4> {
    var s = raw;
    for (var i = 0u; i < 2u * DEC_QUADS; i++) {
        let qd = i % DEC_QUADS;
        let key = i / DEC_QUADS;
        s[2u * key + qd] = mask_quad(blk.b, blk.hk, blk.block, qd, ja + key * DS_LANES, blk.stop, s[2u * key + qd]);
    }
    return s;
}

// Keys j0 .. j0 + 15 of the block `blk`, keys j0 + lid and j0 + 8 + lid to this lane:
// scores, masked unless `masked` is false (the caller knows no rule applies), the
// softmax step, and P·V into this lane's accumulator slots. Without ONE_KEY_LOOP it is
// called with a constant `masked`, so the driver compiles the plain loop without the
// rules' code.
fn block_step(st: RunState, blk: DecodeBlock, lid: u32, j0: u32, masked: bool) -> RunState {
    let d4 = (p.head_dim + 3u) / 4u;
    let per = kv_vec4s();
    let v_loads = (p.head_dim_v + 4u * per - 1u) / (4u * per);
    let chunks = (v_loads + DS_LANES - 1u) / DS_LANES;
    // 1. This lane's two keys against the block's rows.
    let ja = j0 + lid;
    let rows_a = key_rows(blk, ja);
    let rows_b = key_rows(blk, ja + DS_LANES);
    var raw = decode_scores(vec2<u32>(rows_a.x, rows_b.x), d4, true);
    if masked {
        raw = mask_scores(blk, ja, raw);
    }
    let v_rows_a = broadcast_octet_u(rows_a.y);
    let v_rows_b = broadcast_octet_u(rows_b.y);
    // 2. The softmax step, quad by quad.
    let step0 = quad_step(st.max0, st.sum0, raw[0], raw[2]);
    let pa0 = broadcast_octet(step0.probs_a);
    let pb0 = broadcast_octet(step0.probs_b);
    var step1 = QuadStep(st.max1, vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), st.sum1);
    var pa1: Octet;
    var pb1: Octet;
    if DEC_QUADS > 1u {
        step1 = quad_step(st.max1, st.sum1, raw[1], raw[3]);
        pa1 = broadcast_octet(step1.probs_a);
        pb1 = broadcast_octet(step1.probs_b);
    }
    // 3. The columns of V load 8c + lid: rescale, add the block's probabilities times
    // V. Lanes past Dv read the last load and their slots are never stored.
    for (var c = 0u; c < chunks; c++) {
        let w = min(c * DS_LANES + lid, v_loads - 1u);
        let va = v_octet(v_rows_a, w);
        let vb = v_octet(v_rows_b, w);
        // Each vec4 of the loads (constant indices: a loop would index them dynamically).
        let slot = 4u * c * per;
        accumulate(slot * DS_LANES + lid, step0.alpha, pa0, pb0, octet_part(va, 0u), octet_part(vb, 0u));
        if DEC_QUADS > 1u {
            accumulate((DS_SLOTS + slot) * DS_LANES + lid, step1.alpha, pa1, pb1, octet_part(va, 0u), octet_part(vb, 0u));
        }
        if per > 1u {
            accumulate((slot + 4u) * DS_LANES + lid, step0.alpha, pa0, pb0, octet_part(va, 1u), octet_part(vb, 1u));
            if DEC_QUADS > 1u {
                accumulate((DS_SLOTS + slot + 4u) * DS_LANES + lid, step1.alpha, pa1, pb1, octet_part(va, 1u), octet_part(vb, 1u));
            }
        }
    }
    return RunState(step0.max, step0.sum, step1.max, step1.sum);
}

@compute @workgroup_size(8)
fn decode_split_subgroup(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let blk = decode_block(wid);
    let d4 = (p.head_dim + 3u) / 4u;

    // Q rows, scaled.
    for (var x = lid; x < DEC_ROWS * d4; x += DS_LANES) {
        let r = x / d4;
        let t = x % d4;
        dec_q[r * DEC_MAX_VEC4 + t] = decode_q4(blk, r, t);
    }
    for (var x = lid; x < DEC_QUADS * DS_SLOTS * DS_LANES; x += DS_LANES) {
        ds_acc[x] = vec4<f32>(0.0);
    }
    workgroupBarrier();

    var st = RunState(vec4<f32>(neg_inf()), vec4<f32>(0.0), vec4<f32>(neg_inf()), vec4<f32>(0.0));
    // Blocks of 16 from blk.begin: those wholly inside blk.open_begin .. open_end need no
    // masking when visible ranges are the only rule (the edges of a window, causal
    // boundary or split go through the rules).
    var open_lo = blk.stop;
    var open_hi = blk.stop;
    if only_key_ranges() && blk.open_end >= blk.begin + DS_BLOCK {
        let first = blk.begin + (max(blk.open_begin, blk.begin) - blk.begin + DS_BLOCK - 1u) / DS_BLOCK * DS_BLOCK;
        let last = blk.begin + (blk.open_end - blk.begin) / DS_BLOCK * DS_BLOCK;
        if first < last {
            open_lo = first;
            open_hi = last;
        }
    }
    if ONE_KEY_LOOP {
        // Each block chooses the masked or the plain body: block_step is inlined once.
        for (var j0 = blk.begin; j0 < blk.stop; j0 += DS_BLOCK) {
            st = block_step(st, blk, lid, j0, j0 < open_lo || j0 >= open_hi);
        }
    } else {
        // Masked blocks up to open_lo, plain ones up to open_hi, masked ones to the
        // stop: the second pass of the outer loop reuses the first masked loop, so each
        // of the two bodies is inlined once (a third loop made Mesa 25's cold compile
        // 2.5x longer).
        var j0 = blk.begin;
        var masked_end = open_lo;
        loop {
            for (; j0 < masked_end; j0 += DS_BLOCK) {
                st = block_step(st, blk, lid, j0, true);
            }
            if j0 >= blk.stop {
                break;
            }
            for (; j0 < open_hi; j0 += DS_BLOCK) {
                st = block_step(st, blk, lid, j0, false);
            }
            masked_end = blk.stop;
        }
    }
    let max0 = st.max0;
    let sum0 = st.sum0;
    let max1 = st.max1;
    let sum1 = st.sum1;
    let per = kv_vec4s();
    let slots = (p.head_dim_v + 4u * per * DS_LANES - 1u) / (4u * per * DS_LANES) * 4u * per;

    // Partials: rows normalised, with their log-sum-exp over this split's keys (every
    // lane holds the same maxima and sums; lane r < 4 stores row r of each quad).
    if lid < 4u {
        store_partial_lse(blk, lid, max0[lid], sum0[lid]);
        if DEC_QUADS > 1u {
            store_partial_lse(blk, 4u + lid, max1[lid], sum1[lid]);
        }
    }
    let inv0 = vec4<f32>(row_inv_sum(sum0.x), row_inv_sum(sum0.y), row_inv_sum(sum0.z), row_inv_sum(sum0.w));
    let inv1 = vec4<f32>(row_inv_sum(sum1.x), row_inv_sum(sum1.y), row_inv_sum(sum1.z), row_inv_sum(sum1.w));
    for (var c = 0u; c < slots; c++) {
        let col = slot_column(c, lid);
        if col >= p.head_dim_v {
            continue;
        }
        for (var qd = 0u; qd < DEC_QUADS; qd++) {
            let o = ds_acc[(qd * DS_SLOTS + c) * DS_LANES + lid] * select(inv0, inv1, qd == 1u);
            for (var r = 0u; r < 4u; r++) {
                store_partial(blk, qd * 4u + r, col, o[r]);
            }
        }
    }
}
