// Shared by the split-K decode kernels (flash_decode.wgsl, flash_decode_subgroup.wgsl,
// flash_decode_lanes.wgsl):
// how the key range is cut into splits, which query rows a row block holds, and the
// masking of a quad of rows. Appended to attention_common.wgsl after a line defining
// DEC_ROWS (4 or 8 rows per block).

// Splits are whole tiles of this many keys (kernels::decode::TILE).
const DEC_TILE: u32 = 64u;
// Rows go in quads, four rows as the components of a vec4.
const DEC_QUADS: u32 = DEC_ROWS / 4u;

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

// What workgroup (x, y) of a split pass works on: split x of p.splits, and row block
// y of (batch element b, kv head hk, row block). Its key loop walks begin .. stop.
struct DecodeBlock {
    b: u32,
    hk: u32,
    block: u32,
    split: u32,
    begin: u32,
    stop: u32,
    // Keys open_begin .. open_end are visible to every row of the block and in the
    // split: only_key_ranges() then leaves nothing to mask there.
    open_begin: u32,
    open_end: u32,
}

fn decode_block(wid: vec3<u32>) -> DecodeBlock {
    let group = p.heads_q / p.heads_kv;
    let blocks = (group * p.len_q + DEC_ROWS - 1u) / DEC_ROWS;
    let block = wid.y % blocks;
    let hk = (wid.y / blocks) % p.heads_kv;
    let b = wid.y / (blocks * p.heads_kv);
    let split = wid.x;
    // The block's visible keys bound every row's (key_start and key_end are monotone in
    // i, but rows of different heads interleave, so take the extremes).
    var block_start = p.len_k;
    var block_end = 0u;
    var open_begin = 0u;
    var open_end = p.len_k;
    for (var r = 0u; r < DEC_ROWS; r++) {
        let row = decode_row(b, hk, block, r);
        if row.valid {
            block_start = min(block_start, row.start);
            block_end = max(block_end, row.end);
            open_begin = max(open_begin, row.start);
            open_end = min(open_end, row.end);
        }
    }
    // Splits cover keys 0 .. key_stop: no key length reaches past it.
    let per_split = split_keys_for(p.key_stop, p.splits);
    let stop = min(split * per_split + per_split, block_end);
    // Keys left of every row's window are skipped, from a multiple of 4.
    let begin = max(split * per_split, block_start / 4u * 4u);
    return DecodeBlock(b, hk, block, split, begin, stop, open_begin, min(open_end, stop));
}

// Row r's scaled Q elements 4t .. 4t + 3: zero past the head dim and for rows past
// the block's end.
fn decode_q4(blk: DecodeBlock, r: u32, t: u32) -> vec4<f32> {
    let row = decode_row(blk.b, blk.hk, blk.block, r);
    if !row.valid || t * 4u >= p.head_dim {
        return vec4<f32>(0.0);
    }
    let base = blk.b * p.q_stride_b + row.h * p.q_stride_h + row.i * p.q_stride_s;
    return qload4(base, t) * p.scale;
}

// Row r's partial results for the block's split, in `scores`: its output row,
// normalised, at (split * rows + g) * Dv + column, then the lse of every row at
// splits * rows * Dv + split * rows + g, where g indexes the B * Hq * Lq rows. Rows past
// the block's end write nothing.
fn decode_partial_index(blk: DecodeBlock, r: u32) -> u32 {
    let row = decode_row(blk.b, blk.hk, blk.block, r);
    return (blk.b * p.heads_q + row.h) * p.len_q + row.i;
}

fn store_partial_lse(blk: DecodeBlock, r: u32, max: f32, sum: f32) {
    if decode_row(blk.b, blk.hk, blk.block, r).valid {
        let n_rows = p.batch * p.heads_q * p.len_q;
        scores[p.splits * n_rows * p.head_dim_v + blk.split * n_rows + decode_partial_index(blk, r)] = row_lse(max, sum);
    }
}

fn store_partial(blk: DecodeBlock, r: u32, col: u32, value: f32) {
    if decode_row(blk.b, blk.hk, blk.block, r).valid {
        let n_rows = p.batch * p.heads_q * p.len_q;
        scores[(blk.split * n_rows + decode_partial_index(blk, r)) * p.head_dim_v + col] = value;
    }
}
