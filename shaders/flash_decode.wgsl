// Split-K decode attention (FlashDecoding), for few query rows against many keys:
// appended to attention_common.wgsl, whose masking and online-softmax rules it calls.
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
const DEC_TILE: u32 = 64u;
const DEC_MAX_VEC4: u32 = 64u; // head dims up to 256
const DEC_MAX_COLS: u32 = 4u; // Dv up to 256 = 4 x 64 lanes

var<workgroup> q_tile: array<vec4<f32>, DEC_ROWS * DEC_MAX_VEC4>; // pre-scaled Q rows
const DEC_QUADS: u32 = DEC_ROWS / 4u;
// Per quad, per tile key: the quad's four scores, then probabilities.
var<workgroup> s_tile: array<vec4<f32>, DEC_QUADS * DEC_TILE>;
var<workgroup> quad_alpha: array<vec4<f32>, DEC_QUADS>;
var<workgroup> quad_inv: array<vec4<f32>, DEC_QUADS>;
// Offset of each tile key's V row, found once by the key's own lane (a paged cache
// reads it through the block table) and read by all lanes in the values step.
var<workgroup> v_rows: array<u32, DEC_TILE>;

// Keys per split for `splits` splits of `keys` keys: whole tiles (the host's
// kernels::decode::split_keys is the same formula).
fn split_keys_for(keys: u32, splits: u32) -> u32 {
    return ((keys + splits - 1u) / splits + DEC_TILE - 1u) / DEC_TILE * DEC_TILE;
}

struct DecodeRow {
    valid: bool,
    h: u32,
    i: u32,
    start: u32,
    end: u32,
}

// Row r of row block `block` of (b, kv head hk): query head and index, and its visible
// keys start .. end (none for a row past the block's end).
fn decode_row(b: u32, hk: u32, block: u32, r: u32) -> DecodeRow {
    let group = p.heads_q / p.heads_kv;
    let n = group * p.len_q;
    let x = block * DEC_ROWS + r;
    let xc = min(x, n - 1u);
    let h = hk * group + xc / p.len_q;
    let i = xc % p.len_q;
    return DecodeRow(x < n, h, i, key_start(b, i), select(0u, key_end(b, i), x < n));
}

// Quad `qd`'s four scaled scores `raw` for key j, masked: rows past the block, keys
// outside a row's visible range or this split, and every mask rule.
fn mask_quad(b: u32, hk: u32, block: u32, qd: u32, j: u32, split_stop: u32, raw: vec4<f32>) -> vec4<f32> {
    var in_range = vec4<bool>(false);
    var words = vec4<u32>(1u);
    var heads = vec4<u32>(0u);
    var rows = vec4<u32>(0u);
    let jc = min(j, p.len_k - 1u);
    for (var c = 0u; c < 4u; c++) {
        let row = decode_row(b, hk, block, qd * 4u + c);
        in_range[c] = j >= row.start && j < min(row.end, split_stop);
        words[c] = mask_word(b, row.h, row.i, jc);
        heads[c] = row.h;
        rows[c] = row.i;
    }
    return apply_masks(raw, b, heads, rows, vec4<u32>(j), in_range, words);
}

// Row r's Q elements t*4 .. t*4+3 from the workgroup tile, as a dot product with kv.
fn q_dot(r: u32, t: u32, kv: vec4<f32>) -> f32 {
    return dot(q_tile[r * DEC_MAX_VEC4 + t], kv);
}

@compute @workgroup_size(64)
fn decode_split(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let group = p.heads_q / p.heads_kv;
    let blocks = (group * p.len_q + DEC_ROWS - 1u) / DEC_ROWS;
    let block = wid.y % blocks;
    let hk = (wid.y / blocks) % p.heads_kv;
    let b = wid.y / (blocks * p.heads_kv);
    let split = wid.x;
    let splits = p.splits;
    let n_rows = p.batch * p.heads_q * p.len_q;
    let d4 = (p.head_dim + 3u) / 4u;

    // Q rows, scaled, zero past the head dim and for rows past the block's end.
    for (var x = lid; x < DEC_ROWS * DEC_MAX_VEC4; x += DEC_LANES) {
        let r = x / DEC_MAX_VEC4;
        let t = x % DEC_MAX_VEC4;
        let row = decode_row(b, hk, block, r);
        var qv = vec4<f32>(0.0);
        if row.valid && t < d4 {
            let base = b * p.q_stride_b + row.h * p.q_stride_h + row.i * p.q_stride_s;
            qv = qload4(base, t) * p.scale;
        }
        q_tile[x] = qv;
    }
    // The block's visible keys bound every row's (key_start and key_end are monotone in
    // i, but rows of different heads interleave, so take the extremes).
    var block_start = p.len_k;
    var block_end = 0u;
    for (var r = 0u; r < DEC_ROWS; r++) {
        let row = decode_row(b, hk, block, r);
        if row.valid {
            block_start = min(block_start, row.start);
            block_end = max(block_end, row.end);
        }
    }
    // Splits cover keys 0 .. key_stop: no key length reaches past it.
    let per_split = split_keys_for(p.key_stop, splits);
    let split_stop = min(split * per_split + per_split, block_end);
    // Tiles left of every row's window are skipped.
    let split_begin = max(split * per_split, block_start / 4u * 4u);
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
    let last_k = p.len_k - 1u;

    for (var tile0 = split_begin; tile0 < split_stop; tile0 += DEC_TILE) {
        // 1. Scores of key tile0 + lid against the block's rows, a quad at a time.
        let j = tile0 + lid;
        let k_row = k_base + kv_offset(true, b, min(j, last_k));
        v_rows[lid] = v_base + kv_offset(false, b, min(j, last_k));
        var raw0 = vec4<f32>(0.0);
        var raw1 = vec4<f32>(0.0);
        for (var t = 0u; t < d4; t++) {
            let kv = load4(true, k_row, t, p.head_dim);
            raw0 += vec4<f32>(q_dot(0u, t, kv), q_dot(1u, t, kv), q_dot(2u, t, kv), q_dot(3u, t, kv));
            if DEC_QUADS > 1u {
                raw1 += vec4<f32>(q_dot(4u, t, kv), q_dot(5u, t, kv), q_dot(6u, t, kv), q_dot(7u, t, kv));
            }
        }
        s_tile[lid] = mask_quad(b, hk, block, 0u, j, split_stop, raw0);
        if DEC_QUADS > 1u {
            s_tile[DEC_TILE + lid] = mask_quad(b, hk, block, 1u, j, split_stop, raw1);
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
    let lse_base = splits * n_rows * p.head_dim_v;
    if lid < DEC_QUADS {
        let sums = quad_sum;
        quad_inv[lid] = vec4<f32>(row_inv_sum(sums.x), row_inv_sum(sums.y), row_inv_sum(sums.z), row_inv_sum(sums.w));
        for (var c = 0u; c < 4u; c++) {
            let row = decode_row(b, hk, block, lid * 4u + c);
            if row.valid {
                let g = (b * p.heads_q + row.h) * p.len_q + row.i;
                scores[lse_base + split * n_rows + g] = row_lse(quad_max[c], quad_sum[c]);
            }
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
                let row = decode_row(b, hk, block, qd * 4u + r);
                if row.valid {
                    let g = (b * p.heads_q + row.h) * p.len_q + row.i;
                    scores[(split * n_rows + g) * p.head_dim_v + col] = o[r];
                }
            }
        }
    }
}

// Merges the splits of one output row: invocation x of workgroup (row, column block)
// takes column 64 * wid.x + x of row wid.y + 65535 * wid.z. With each split's lse_s
// and normalised row o_s: lse = log Σ exp(lse_s), out = Σ exp(lse_s − lse) o_s. Rows
// no split saw are zeros with lse -inf.
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
    for (var s = 0u; s < splits; s++) {
        m = max(m, scores[lse_base + s * n_rows + g]);
    }
    var total = 0.0;
    for (var s = 0u; s < splits; s++) {
        total += softmax_probs(vec4<f32>(scores[lse_base + s * n_rows + g]), vec4<f32>(m)).x;
    }
    let lse_g = row_lse(m, total);
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
        output[b * p.o_stride_b + h * p.o_stride_h + i * p.o_stride_s + col] = elem(o);
    }
    if col == 0u {
        lse[g] = lse_g;
    }
}
