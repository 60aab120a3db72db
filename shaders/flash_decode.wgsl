// Split-K decode attention (FlashDecoding), for few query rows against many keys:
// appended to attention_common.wgsl (whose masking and online-softmax rules it calls),
// decode_common.wgsl and decode_scores.wgsl.
//
// Tiling. A workgroup of 64 invocations owns DEC_ROWS query rows (4 or 8, a constant
// the host prepends: kernels::decode::SPLIT_VARIANTS) that share one kv head (GQA: the
// Hq / Hkv query heads of a kv head times Lq rows each, so K and V are read once for
// all of them) and one split of the key range: workgroup (x, y) takes split x of
// p.splits, and row block y of (batch, kv head, row block). Rows go in quads, four
// rows as the components of a vec4 (DEC_QUADS = DEC_ROWS / 4), so no loop indexes a
// private array by row (llvmpipe compiles such indexing into branch ladders). Keys go
// in tiles of 64:
//   1. scores: invocation t takes key tile0 + t and computes its dot products with the
//      DEC_ROWS Q rows (in workgroup memory, read at the same address by every lane),
//      masks them and stores each quad's four scores in `s_tile`, and the key's V row
//      offset in `v_rows`;
//   2. softmax: invocation q < DEC_QUADS raises quad q's running maxima over the tile,
//      turns its 64 score quads into probabilities and rescales its running sums;
//   3. values: invocation t owns output columns t, t + 64, t + 128, t + 192 of every
//      row, as one vec4 per quad; per column it rescales them and adds the tile's
//      probabilities times V (lanes read consecutive V elements).
// Each split writes its rows normalised, with their log-sum-exp, to `scores` (as
// partials: [splits][B*Hq*Lq][Dv], then [splits][B*Hq*Lq]); `decode_combine` merges the
// splits into the output and the lse. Splits outside a row block's visible keys
// (window, causal, key lengths) end early; a split with nothing visible writes zeros
// and lse -inf.

const DEC_LANES: u32 = 64u;
const DEC_MAX_COLS: u32 = 4u; // Dv up to 256 = 4 x 64 lanes

// Per quad, per tile key: the quad's four scores, then probabilities.
var<workgroup> s_tile: array<vec4<f32>, DEC_QUADS * DEC_TILE>;
var<workgroup> quad_alpha: array<vec4<f32>, DEC_QUADS>;
var<workgroup> quad_inv: array<vec4<f32>, DEC_QUADS>;
// Offset of each tile key's V row, found once by the key's own lane (a paged cache
// reads it through the block table) and read by all lanes in the values step.
var<workgroup> v_rows: array<u32, DEC_TILE>;

// For decode_scores: K is read 4 elements a load, element by element (any head dim).
fn kv_vec4s() -> u32 {
    return 1u;
}

fn decode_k_load(k_row: u32, t: u32) -> KvLoad {
    return KvLoad(load4(true, k_row, t, p.head_dim), vec4<f32>(0.0));
}

@compute @workgroup_size(64)
fn decode_split(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let blk = decode_block(wid);
    let b = blk.b;
    let hk = blk.hk;
    let block = blk.block;
    let split_begin = blk.begin;
    let split_stop = blk.stop;
    let d4 = (p.head_dim + 3u) / 4u;

    // Q rows, scaled, zero past the head dim and for rows past the block's end.
    for (var x = lid; x < DEC_ROWS * DEC_MAX_VEC4; x += DEC_LANES) {
        dec_q[x] = decode_q4(blk, x / DEC_MAX_VEC4, x % DEC_MAX_VEC4);
    }
    workgroupBarrier();

    // Invocation q < DEC_QUADS keeps quad q's running maxima and sums; every invocation
    // its columns' accumulators, quad 0 in acc0 and quad 1 (8-row blocks) in acc1.
    var quad_max = vec4<f32>(neg_inf());
    var quad_sum = vec4<f32>(0.0);
    var acc0: array<vec4<f32>, DEC_MAX_COLS>;
    var acc1: array<vec4<f32>, DEC_MAX_COLS>;
    for (var c = 0u; c < DEC_MAX_COLS; c++) {
        acc0[c] = vec4<f32>(0.0);
        acc1[c] = vec4<f32>(0.0);
    }
    let k_base = b * p.k_stride_b + hk * p.k_stride_h;
    let v_base = b * p.v_stride_b + hk * p.v_stride_h;
    let last_k = last_read_key(b); // keys past it are masked; their rows may hold anything

    for (var tile0 = split_begin; tile0 < split_stop; tile0 += DEC_TILE) {
        // 1. Scores of key tile0 + lid against the block's rows, a quad at a time.
        let j = tile0 + lid;
        let k_row = k_base + kv_offset(true, b, min(j, last_k));
        v_rows[lid] = v_base + kv_offset(false, b, min(j, last_k));
        let raw = decode_scores(vec2<u32>(k_row), d4, false);
        s_tile[lid] = mask_quad(b, hk, block, 0u, j, split_stop, raw[0]);
        if DEC_QUADS > 1u {
            s_tile[DEC_TILE + lid] = mask_quad(b, hk, block, 1u, j, split_stop, raw[1]);
        }
        workgroupBarrier();

        // 2. Quad lid's online-softmax step over the tile, four rows at once.
        if lid < DEC_QUADS {
            let base = lid * DEC_TILE;
            var tile_max = vec4<f32>(neg_inf());
            for (var x = 0u; x < DEC_TILE; x++) {
                tile_max = max(tile_max, s_tile[base + x]);
            }
            let new_max = max(quad_max, tile_max);
            let alpha = softmax_rescale(quad_max, new_max);
            var sum4 = vec4<f32>(0.0);
            for (var x = 0u; x < DEC_TILE; x++) {
                let pr = softmax_probs(s_tile[base + x], new_max);
                s_tile[base + x] = pr;
                sum4 += pr;
            }
            quad_sum = quad_sum * alpha + sum4;
            quad_max = new_max;
            quad_alpha[lid] = alpha;
        }
        workgroupBarrier();

        // 3. Columns lid + 64 c of every row: rescale, then add P V over the tile.
        let tile_len = min(DEC_TILE, split_stop - tile0);
        let alpha0 = quad_alpha[0];
        let alpha1 = quad_alpha[DEC_QUADS - 1u];
        for (var c = 0u; c < DEC_MAX_COLS; c++) {
            let col = lid + c * DEC_LANES;
            if col >= p.head_dim_v {
                break;
            }
            var o0 = acc0[c] * alpha0;
            var o1 = acc1[c] * alpha1;
            for (var jj = 0u; jj < tile_len; jj++) {
                let vv = f32(v[v_rows[jj] + col]);
                o0 += s_tile[jj] * vv;
                if DEC_QUADS > 1u {
                    o1 += s_tile[DEC_TILE + jj] * vv;
                }
            }
            acc0[c] = o0;
            acc1[c] = o1;
        }
        workgroupBarrier();
    }

    // Partials: rows normalised, with their log-sum-exp over this split's keys.
    if lid < DEC_QUADS {
        let sums = quad_sum;
        quad_inv[lid] = vec4<f32>(row_inv_sum(sums.x), row_inv_sum(sums.y), row_inv_sum(sums.z), row_inv_sum(sums.w));
        for (var c = 0u; c < 4u; c++) {
            store_partial_lse(blk, lid * 4u + c, quad_max[c], quad_sum[c]);
        }
    }
    workgroupBarrier();
    for (var qd = 0u; qd < DEC_QUADS; qd++) {
        let inv = quad_inv[qd];
        for (var c = 0u; c < DEC_MAX_COLS; c++) {
            let col = lid + c * DEC_LANES;
            if col >= p.head_dim_v {
                break;
            }
            let o = select(acc0[c], acc1[c], qd == 1u) * inv;
            for (var r = 0u; r < 4u; r++) {
                store_partial(blk, qd * 4u + r, col, o[r]);
            }
        }
    }
}

// True for any NaN, by its bits: `max` may drop a NaN operand and `!=` on floats is
// ordered (naga writes FOrdNotEqual), so neither can tell a NaN from a number.
fn is_nan_bits(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// Merges the splits of one output row: invocation x of workgroup (row, column block)
// takes column 64 * wid.x + x of row wid.y + 65535 * wid.z. With each split's lse_s
// and normalised row o_s: lse = log Σ exp(lse_s), out = Σ exp(lse_s − lse) o_s. Rows
// no split saw are zeros with lse -inf. A split whose lse is NaN (it saw a NaN score:
// a NaN in a visible key) makes the whole row NaN, lse included, as the reference
// gives it; the running maximum alone would drop it (max(m, NaN) may be m) and the
// row would pass for one no split saw (issue 64).
@compute @workgroup_size(64)
fn decode_combine(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n_rows = p.batch * p.heads_q * p.len_q;
    let g = wid.y + wid.z * 65535u;
    if g >= n_rows {
        return;
    }
    let splits = p.splits;
    let lse_base = splits * n_rows * p.head_dim_v;
    var m = neg_inf();
    var nan_seen = false;
    for (var s = 0u; s < splits; s++) {
        let lse_s = scores[lse_base + s * n_rows + g];
        m = max(m, lse_s);
        nan_seen = nan_seen || is_nan_bits(lse_s);
    }
    var total = 0.0;
    for (var s = 0u; s < splits; s++) {
        total += softmax_probs(vec4<f32>(scores[lse_base + s * n_rows + g]), vec4<f32>(m)).x;
    }
    // A quiet NaN made at run time (WGSL forbids non-finite constant expressions).
    let nan = bitcast<f32>(0x7fc00000u | (p.len_q & 0u));
    let lse_g = select(row_lse(m, total), nan, nan_seen);
    let col = wid.x * DEC_LANES + lid;
    let bh = g / p.len_q;
    let i = g % p.len_q;
    let b = bh / p.heads_q;
    let h = bh % p.heads_q;
    if col < p.head_dim_v {
        var o = 0.0;
        if total != 0.0 {
            for (var s = 0u; s < splits; s++) {
                let w = softmax_probs(vec4<f32>(scores[lse_base + s * n_rows + g]), vec4<f32>(lse_g)).x;
                o += w * scores[(s * n_rows + g) * p.head_dim_v + col];
            }
        }
        output[b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_s + col] = elem(select(o, nan, nan_seen));
    }
    if col == 0u {
        lse[g] = lse_g;
    }
}
