// Fused attention for GPUs, in the FlashAttention-2 shape: a workgroup owns BR query
// rows of one (batch, head) and streams the keys through workgroup memory in tiles of
// BC, with the online softmax of attention_common.wgsl; the score matrix is never
// stored beyond one BR x BC tile.
//
// Tiling. 128 invocations. Two mappings of them, fixed per variant (the prelude sets
// DMAX, BR, BC, SPLIT, MRS, MRO, PS, PMS; src/kernels/flash/variants.rs):
//   - scores and softmax: invocation (trs, tcs) = (tid / TCS, tid % TCS), tid < NS,
//     owns rows trs * MRS + r (r < MRS) and the 4 consecutive keys 4 tcs .. 4 tcs + 3
//     of the tile (a vec4 per row): TCS = BC / 4 invocations share a row;
//   - output: invocation (tro, tco) = (tid / 8, tid % 8), tid < NO, owns rows
//     tro * MRO + r (r < MRO) and value vec4 columns tco + 8 u (u < OC).
// The variants for 48 KiB keep all 128 busy in both (NS = NO = 128; at D 256 the tile
// has 32 quads of keys to score); those for 32 KiB, whose tiles are smaller, give
// fewer invocations larger register tiles (MRS, MRO up to 4), which read workgroup
// memory less per multiply-add: what CPU adapters (llvmpipe GL's pick) are bound by,
// and the tile's loads come down with them on a GPU too.
// Per key tile:
//   1. S: each score invocation reads its rows of the Q tile and its 4 K rows (vec4
//      dot products over the head dim), masks the scores (apply_masks), keeps them in
//      registers and writes each row's maximum over its 4 keys to `pmax`. Meanwhile
//      every invocation loads its share of the next tiles (K of the next tile, V of
//      this one) from storage into registers: 16-byte loads where the host found K and
//      V rows to be whole 16-byte words (the `words` twin of each variant), else
//      element by element (load4);
//   -- barrier --
//   2. softmax: each score invocation takes its rows' tile maximum from the TCS
//      partial ones, turns its 4 scores into exp(s - max) in registers, rescales its
//      share of the running sum and writes the 4 probabilities to `probs` as one
//      16-byte store, and (tcs = 0) the row's rescale factor to `row_alpha`. Every
//      invocation stores the registers it loaded in 1 into the tiles;
//   -- barrier --
//   3. output: each output invocation rescales its MRO x OC vec4 accumulators by
//      row_alpha and adds probs x V, 4 keys at a time (one 16-byte read of probs per
//      row, 4 of V per column).
// Two barriers per tile where K and V have tiles of their own (SPLIT): K of tile t + 1
// is stored in 2 while tile t's scores are done with K, and V of tile t while tile t - 1's
// output is done with V. Where they share one (head dims of 256, and of 128 in 32 KiB),
// V is stored over K in 2, and the next K over V after 3 behind a third barrier, with a
// fourth before the next tile's scores. The running maximum of a row is kept by each
// of its TCS score invocations (they compute the same one), its running sum spread over
// them (a share each, summed through `pmax` at the end), so that the softmax needs no
// row owner and no pass over `probs`. Q stays in workgroup memory (pre-scaled) for the
// whole dispatch.
//
// Bank conflicts (32 banks of 4 bytes; 16-byte accesses served 8 invocations at a
// time), checked by a unit test in src/kernels/flash/mod.rs: K rows are stored in the
// order 4 c + tcs -> c * TCS + tcs, so that score invocations reading key 4 tcs + c read
// consecutive rows, padded to an odd count of vec4s (KS); Q rows are padded alike (QS),
// as 8 invocations read up to 4 different Q rows at once where TCS < 8; `probs` rows
// are written 16 bytes per invocation and read as broadcasts (the 8 invocations of an
// output row share them), padded (PS vec4s a row) where one write phase spans rows;
// `pmax` rows are padded (PMS) so that the 32 invocations of a warp write distinct
// banks.
//
// Every per-invocation array has a compile-time size and every inner loop a constant
// trip count; the host picks the smallest DMAX that holds D and Dv and the first
// variant of that class that fits the adapter's workgroup memory (kernels::flash).
//
// The key loop ends at the last key the block's last row can see (causal, key
// lengths), so tiles wholly above the causal diagonal are never loaded, and starts at
// p.key_begin: a dispatch may resume from an earlier one's output rows and
// log-sum-exps (attention_common.wgsl's resumed_max).

const NT: u32 = 128u; // invocations
const D4: u32 = DMAX / 4u; // vec4s per row
const QS: u32 = D4 + 1u; // vec4s per Q row in `q_tile`, odd
const KS: u32 = D4 + 1u; // vec4s per K row in `ks`, odd
const VS: u32 = select(KS, D4, SPLIT); // vec4s per V row (in `vs`, or in `ks`)
const TCS: u32 = BC / 4u; // score invocations per row
const TRS: u32 = BR / MRS; // score invocations per key quad
const NS: u32 = TRS * TCS; // score invocations, at most NT
const TCO: u32 = 8u; // output invocations per row
const TRO: u32 = BR / MRO; // output invocations per value column
const NO: u32 = TRO * TCO; // output invocations, at most NT
const OC: u32 = D4 / TCO; // value vec4s per output invocation and row
const ITEMS: u32 = BC * D4 / NT; // vec4s of a K or V tile each invocation stages

var<workgroup> q_tile: array<vec4<f32>, BR * QS>;
var<workgroup> ks: array<vec4<f32>, BC * KS>;
var<workgroup> vs: array<vec4<f32>, select(1u, BC * D4, SPLIT)>;
var<workgroup> probs: array<vec4<f32>, BR * PS>;
var<workgroup> pmax: array<f32, BR * PMS>;
var<workgroup> row_alpha: array<f32, BR>;

var<private> acc: array<vec4<f32>, MRO * OC>;

// Quad x % D4 of key tile0 + x / D4 of K (is_k) or V: zeros past `stop` keys
// (key_limit: rows past it may hold anything) and the head dim (d4 quads of `len`
// elements).
fn fetch_quad(is_k: bool, b: u32, base: u32, tile0: u32, x: u32, d4: u32, len: u32, stop: u32) -> vec4<f32> {
    let j = x / D4;
    let t = x % D4;
    if t < d4 && tile0 + j < stop {
        return kv_quad(is_k, base + kv_offset(is_k, b, tile0 + j), t, len);
    }
    return vec4<f32>(0.0);
}

// Stores quad x of a K tile: key j = x / D4 at row (j % 4) * TCS + j / 4.
fn put_k(x: u32, value: vec4<f32>) {
    let j = x / D4;
    ks[((j % 4u) * TCS + j / 4u) * KS + x % D4] = value;
}

// Stores quad x of a V tile, rows in key order.
fn put_v(x: u32, value: vec4<f32>) {
    let at = (x / D4) * VS + x % D4;
    if SPLIT {
        vs[at] = value;
    } else {
        ks[at] = value;
    }
}

// Value vec4 c of key j of the staged V tile.
fn v_at(j: u32, c: u32) -> vec4<f32> {
    if SPLIT {
        return vs[j * VS + c];
    }
    return ks[j * VS + c];
}

@compute @workgroup_size(128, 1, 1)
fn flash_blocked(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = head_of(p.bh_start + wid.y);
    let row0 = wid.x * BR;
    let last_q = p.len_q - 1u;
    let d4 = (p.head_dim + 3u) / 4u;
    let dv4 = (p.head_dim_v + 3u) / 4u;
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;
    let kv_stop = key_limit(hd.b);
    // Score mapping.
    let scorer = tid < NS;
    let trs = tid / TCS;
    let tcs = tid % TCS;
    // Output mapping.
    let outputter = tid < NO;
    let tro = tid / TCO;
    let tco = tid % TCO;

    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + BR - 1u, last_q)), p.key_stop);

    // Q tile, pre-scaled; rows past the end repeat the last row (never stored).
    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;
    for (var x = tid; x < BR * D4; x += NT) {
        let r = x / D4;
        let t = x % D4;
        var value = vec4<f32>(0.0);
        if t < d4 {
            value = qload4(q_head + min(row0 + r, last_q) * p.q_stride_s, t) * p.scale;
        }
        q_tile[r * QS + t] = value;
    }
    // The first K tile.
    if block_begin < block_end {
        for (var i = 0u; i < ITEMS; i++) {
            let x = tid + i * NT;
            put_k(x, fetch_quad(true, hd.b, k_base, block_begin, x, d4, p.head_dim, kv_stop));
        }
    }
    // Score invocations: each row's running maximum, this invocation's share of its
    // running sum (the resumed sum is tcs 0's), its visible keys.
    var row_max: array<f32, MRS>;
    var row_sum: array<f32, MRS>;
    var starts: array<u32, MRS>;
    var ends: array<u32, MRS>;
    for (var r = 0u; r < MRS; r++) {
        let row = min(row0 + trs * MRS + r, last_q);
        let m = resumed_max(hd, row);
        row_max[r] = m;
        row_sum[r] = select(0.0, resumed_sum(m), tcs == 0u);
        starts[r] = key_start(hd.b, row);
        // A tile may run past this dispatch's key range; its keys belong to the next.
        ends[r] = min(key_end(hd.b, row), p.key_stop);
    }
    // Output invocations: the accumulator rows, resumed.
    for (var r = 0u; r < MRO; r++) {
        let row = min(row0 + tro * MRO + r, last_q);
        let seen = outputter && resumed_sum(resumed_max(hd, row)) != 0.0;
        for (var u = 0u; u < OC; u++) {
            let c4 = tco + u * TCO;
            var o = vec4<f32>(0.0);
            if seen && c4 < dv4 {
                for (var c = 0u; c < 4u; c++) {
                    if c4 * 4u + c < p.head_dim_v {
                        o[c] = f32(output[o_head + row * p.o_stride_s + c4 * 4u + c]);
                    }
                }
            }
            acc[r * OC + u] = o;
        }
    }
    workgroupBarrier();

    var scores: array<vec4<f32>, MRS>;
    var k_next: array<vec4<f32>, ITEMS>;
    var v_this: array<vec4<f32>, ITEMS>;
    for (var tile0 = block_begin; tile0 < block_end; tile0 += BC) {
        let next = tile0 + BC;
        let has_next = next < block_end; // uniform

        // 1. Loads of V of this tile and K of the next, into registers.
        for (var i = 0u; i < ITEMS; i++) {
            let x = tid + i * NT;
            v_this[i] = fetch_quad(false, hd.b, v_base, tile0, x, dv4, p.head_dim_v, kv_stop);
            if has_next {
                k_next[i] = fetch_quad(true, hd.b, k_base, next, x, d4, p.head_dim, kv_stop);
            }
        }
        // Scores of rows trs * MRS + r and keys j0 .. j0 + 3.
        let j0 = tile0 + 4u * tcs;
        if scorer {
            for (var r = 0u; r < MRS; r++) {
                scores[r] = vec4<f32>(0.0);
            }
            for (var t = 0u; t < d4; t++) {
                let k0 = ks[tcs * KS + t];
                let k1 = ks[(TCS + tcs) * KS + t];
                let k2 = ks[(2u * TCS + tcs) * KS + t];
                let k3 = ks[(3u * TCS + tcs) * KS + t];
                for (var r = 0u; r < MRS; r++) {
                    let qt = q_tile[(trs * MRS + r) * QS + t];
                    scores[r] += vec4<f32>(dot(qt, k0), dot(qt, k1), dot(qt, k2), dot(qt, k3));
                }
            }
            let keys = keys4(j0);
            for (var r = 0u; r < MRS; r++) {
                let row = min(row0 + trs * MRS + r, last_q);
                let in_range = in_key_range(keys, vec4<u32>(starts[r]), vec4<u32>(ends[r]));
                let words = mask_words_of_keys(hd.b, hd.h, row, j0);
                let s = apply_masks(scores[r], hd.b, vec4<u32>(hd.h), vec4<u32>(row), keys, in_range, words);
                scores[r] = s;
                pmax[(trs * MRS + r) * PMS + tcs] = max(max(s.x, s.y), max(s.z, s.w));
            }
        }
        workgroupBarrier();

        // 2. Online-softmax step of each score invocation's rows and keys.
        if scorer {
            for (var r = 0u; r < MRS; r++) {
                let lr = trs * MRS + r;
                var tile_max = pmax[lr * PMS];
                for (var i = 1u; i < TCS; i++) {
                    tile_max = max(tile_max, pmax[lr * PMS + i]);
                }
                let old_max = row_max[r];
                let new_max = max(old_max, tile_max);
                let alpha = softmax_rescale(vec4<f32>(old_max), vec4<f32>(new_max)).x;
                let e = softmax_probs(scores[r], vec4<f32>(new_max));
                row_sum[r] = row_sum[r] * alpha + (e.x + e.y) + (e.z + e.w);
                row_max[r] = new_max;
                probs[lr * PS + tcs] = e;
                if tcs == 0u {
                    row_alpha[lr] = alpha;
                }
            }
        }
        for (var i = 0u; i < ITEMS; i++) {
            put_v(tid + i * NT, v_this[i]);
        }
        if SPLIT && has_next {
            for (var i = 0u; i < ITEMS; i++) {
                put_k(tid + i * NT, k_next[i]);
            }
        }
        workgroupBarrier();

        // 3. Output micro-tile: rescale, then add probs x V.
        if outputter {
            for (var r = 0u; r < MRO; r++) {
                let alpha = row_alpha[tro * MRO + r];
                for (var u = 0u; u < OC; u++) {
                    acc[r * OC + u] *= alpha;
                }
            }
            for (var j4 = 0u; j4 < TCS; j4++) {
                var pr: array<vec4<f32>, MRO>;
                for (var r = 0u; r < MRO; r++) {
                    pr[r] = probs[(tro * MRO + r) * PS + j4];
                }
                for (var u = 0u; u < OC; u++) {
                    let c = tco + u * TCO;
                    let v0 = v_at(4u * j4, c);
                    let v1 = v_at(4u * j4 + 1u, c);
                    let v2 = v_at(4u * j4 + 2u, c);
                    let v3 = v_at(4u * j4 + 3u, c);
                    for (var r = 0u; r < MRO; r++) {
                        let w = pr[r];
                        acc[r * OC + u] += (w.x * v0 + w.y * v1) + (w.z * v2 + w.w * v3);
                    }
                }
            }
        }
        if !SPLIT && has_next {
            // K and V share `ks`: the next K goes over this V once every invocation is
            // done with it.
            workgroupBarrier();
            for (var i = 0u; i < ITEMS; i++) {
                put_k(tid + i * NT, k_next[i]);
            }
            workgroupBarrier();
        }
    }

    // Each row's sum from its score invocations' shares (no one reads `pmax` after the
    // last tile's softmax step, which every invocation has passed).
    if scorer {
        for (var r = 0u; r < MRS; r++) {
            pmax[(trs * MRS + r) * PMS + tcs] = row_sum[r];
        }
    }
    workgroupBarrier();

    // Normalise and store; rows that saw no key get zeros and lse = -inf.
    for (var r = 0u; r < MRO; r++) {
        let lr = tro * MRO + r;
        let row = row0 + lr;
        if !outputter || row >= p.len_q {
            continue;
        }
        var sum = 0.0;
        for (var i = 0u; i < TCS; i++) {
            sum += pmax[lr * PMS + i];
        }
        let inv = row_inv_sum(sum);
        for (var u = 0u; u < OC; u++) {
            let c4 = tco + u * TCO;
            let o = acc[r * OC + u] * inv;
            for (var c = 0u; c < 4u; c++) {
                if c4 * 4u + c < p.head_dim_v {
                    output[o_head + row * p.o_stride_s + c4 * 4u + c] = elem(o[c]);
                }
            }
        }
    }
    if scorer && tcs == 0u {
        for (var r = 0u; r < MRS; r++) {
            let lr = trs * MRS + r;
            let row = row0 + lr;
            if row < p.len_q {
                var sum = 0.0;
                for (var i = 0u; i < TCS; i++) {
                    sum += pmax[lr * PMS + i];
                }
                lse[(hd.b * p.heads_q + hd.h) * p.len_q + row] = row_lse(row_max[r], sum);
            }
        }
    }
}
