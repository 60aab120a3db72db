// Fused attention for GPUs, in the FlashAttention-2 shape: a workgroup owns BR query
// rows of one (batch, head) and streams the keys through workgroup memory in tiles of
// BC, with the online softmax of attention_common.wgsl; the score matrix is never
// stored beyond one BR x BC tile.
//
// Tiling: 64 invocations as an 8 x 8 grid (tr, tc). Per key tile:
//   1. all invocations copy the K tile (BC keys, head dims padded to DMAX, zeros past
//      the last key) into `kv`;
//   2. invocation (tr, tc) computes an MR x MC register micro-tile of S (query rows
//      tr * MR + r, keys tc + c * 8) from vec4 reads of the Q tile and the K tile,
//      masks it (apply_masks) and writes it to `probs`;
//   3. invocation r < BR owns row r's statistics: it takes the tile's row maximum,
//      turns the row of `probs` into exp(s - max) and records the rescale factor; at
//      the same time every invocation copies the V tile over the K tile in `kv`;
//   4. invocation (tr, tc) rescales its MR x OC register micro-tile of O (rows as in
//      2, value columns tc + u * 8 as vec4) and adds probs x V.
// Four barriers per tile. Q stays in workgroup memory (pre-scaled) for the whole
// dispatch. Every per-invocation array has a compile-time size and every inner loop a
// constant trip count, set by a one-line prelude per variant (DMAX, BR, BC; the host
// picks the smallest DMAX that holds D and Dv and the largest tile that fits the
// adapter's workgroup memory, see kernels::flash).
//
// The key loop ends at the last key the block's last row can see (causal, key
// lengths), so tiles wholly above the causal diagonal are never loaded, and starts at
// p.key_begin: a dispatch may resume from an earlier one's output rows and
// log-sum-exps (attention_common.wgsl's resumed_max).

const NT: u32 = 64u; // invocations
const TC: u32 = 8u; // invocations along keys / value columns
const TR: u32 = 8u; // invocations along query rows
const MR: u32 = BR / TR; // query rows per invocation
const MC: u32 = BC / TC; // keys per invocation, at most 4 (the components of a vec4)
const D4: u32 = DMAX / 4u; // vec4s per Q row
const KS: u32 = D4 + 1u; // vec4s per K/V row in `kv`, padded against bank conflicts
const OC: u32 = D4 / TC; // value vec4s per invocation and row

var<workgroup> q_tile: array<vec4<f32>, BR * D4>;
var<workgroup> kv: array<vec4<f32>, BC * KS>;
var<workgroup> probs: array<f32, BR * BC>;
var<workgroup> row_max: array<f32, BR>;
var<workgroup> row_sum: array<f32, BR>;
var<workgroup> row_alpha: array<f32, BR>;

var<private> acc: array<vec4<f32>, MR * OC>;
var<private> s_tile: array<vec4<f32>, MR>;

// Copies rows tile0 .. tile0 + BC of K (or V) into `kv`: `d4` vec4s of `len` elements
// each, zeros past the last key.
fn load_tile(src_is_k: bool, b: u32, base: u32, tile0: u32, d4: u32, len: u32, tid: u32) {
    for (var x = tid; x < BC * d4; x += NT) {
        let j = x / d4;
        let t = x % d4;
        var value = vec4<f32>(0.0);
        if tile0 + j < p.len_k {
            value = load4(src_is_k, base + kv_offset(src_is_k, b, tile0 + j), t, len);
        }
        kv[j * KS + t] = value;
    }
}

@compute @workgroup_size(64, 1, 1)
fn flash_blocked(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = head_of(p.bh_start + wid.y);
    let tr = tid / TC;
    let tc = tid % TC;
    let row0 = wid.x * BR;
    let last_q = p.len_q - 1u;
    let d4 = (p.head_dim + 3u) / 4u;
    let dv4 = (p.head_dim_v + 3u) / 4u;
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;

    // Q tile, pre-scaled; rows past the end repeat the last row (never stored).
    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;
    for (var x = tid; x < BR * D4; x += NT) {
        let r = x / D4;
        let t = x % D4;
        var value = vec4<f32>(0.0);
        if t < d4 {
            value = qload4(q_head + min(row0 + r, last_q) * p.q_stride_s, t) * p.scale;
        }
        q_tile[x] = value;
    }
    // Row statistics, and this invocation's accumulator rows, resumed.
    if tid < BR {
        let m = resumed_max(hd, min(row0 + tid, last_q));
        row_max[tid] = m;
        row_sum[tid] = resumed_sum(m);
    }
    var starts: array<u32, MR>;
    var ends: array<u32, MR>;
    for (var r = 0u; r < MR; r++) {
        let row = min(row0 + tr * MR + r, last_q);
        // A tile may run past this dispatch's key range; its keys belong to the next.
        starts[r] = key_start(hd.b, row);
        ends[r] = min(key_end(hd.b, row), p.key_stop);
        let seen = resumed_sum(resumed_max(hd, row)) != 0.0;
        for (var u = 0u; u < OC; u++) {
            let c4 = tc + u * TC;
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

    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + BR - 1u, last_q)), p.key_stop);
    for (var tile0 = block_begin; tile0 < block_end; tile0 += BC) {
        load_tile(true, hd.b, k_base, tile0, d4, p.head_dim, tid);
        workgroupBarrier();

        // 2. Scores of rows tr * MR + r and keys tc + c * TC.
        for (var r = 0u; r < MR; r++) {
            s_tile[r] = vec4<f32>(0.0);
        }
        for (var t = 0u; t < d4; t++) {
            var kt: array<vec4<f32>, MC>;
            for (var c = 0u; c < MC; c++) {
                kt[c] = kv[(tc + c * TC) * KS + t];
            }
            for (var r = 0u; r < MR; r++) {
                let qt = q_tile[(tr * MR + r) * D4 + t];
                for (var c = 0u; c < MC; c++) {
                    s_tile[r][c] += dot(qt, kt[c]);
                }
            }
        }
        let keys = vec4<u32>(tile0 + tc) + vec4<u32>(0u, 1u, 2u, 3u) * TC;
        for (var r = 0u; r < MR; r++) {
            let row = min(row0 + tr * MR + r, last_q);
            let last_k = vec4<u32>(p.len_k - 1u);
            let kc = min(keys, last_k);
            var words = vec4<u32>(1u);
            if p.mask_kind != MASK_NONE {
                words = vec4<u32>(
                    mask_word(hd.b, hd.h, row, kc.x),
                    mask_word(hd.b, hd.h, row, kc.y),
                    mask_word(hd.b, hd.h, row, kc.z),
                    mask_word(hd.b, hd.h, row, kc.w),
                );
            }
            let in_range = in_key_range(keys, vec4<u32>(starts[r]), vec4<u32>(ends[r]));
            let masked = apply_masks(s_tile[r], hd.b, vec4<u32>(hd.h), vec4<u32>(row), keys, in_range, words);
            for (var c = 0u; c < MC; c++) {
                probs[(tr * MR + r) * BC + tc + c * TC] = masked[c];
            }
        }
        workgroupBarrier();

        // 3. Row owners: online-softmax step over the tile; everyone: the V tile.
        if tid < BR {
            var tile_max = neg_inf();
            for (var j = 0u; j < BC; j++) {
                tile_max = max(tile_max, probs[tid * BC + j]);
            }
            let old_max = row_max[tid];
            let new_max = max(old_max, tile_max);
            let alpha = softmax_rescale(vec4<f32>(old_max), vec4<f32>(new_max)).x;
            var sum = 0.0;
            for (var j = 0u; j < BC; j++) {
                let e = softmax_probs(vec4<f32>(probs[tid * BC + j]), vec4<f32>(new_max)).x;
                probs[tid * BC + j] = e;
                sum += e;
            }
            row_sum[tid] = row_sum[tid] * alpha + sum;
            row_max[tid] = new_max;
            row_alpha[tid] = alpha;
        }
        load_tile(false, hd.b, v_base, tile0, dv4, p.head_dim_v, tid);
        workgroupBarrier();

        // 4. O micro-tile: rescale, then add probs x V.
        for (var r = 0u; r < MR; r++) {
            let alpha = row_alpha[tr * MR + r];
            for (var u = 0u; u < OC; u++) {
                acc[r * OC + u] *= alpha;
            }
        }
        for (var j = 0u; j < BC; j++) {
            var vj: array<vec4<f32>, OC>;
            for (var u = 0u; u < OC; u++) {
                vj[u] = kv[j * KS + tc + u * TC];
            }
            for (var r = 0u; r < MR; r++) {
                let pr = probs[(tr * MR + r) * BC + j];
                for (var u = 0u; u < OC; u++) {
                    acc[r * OC + u] += pr * vj[u];
                }
            }
        }
        workgroupBarrier();
    }

    // Normalise and store; rows that saw no key get zeros and lse = -inf.
    for (var r = 0u; r < MR; r++) {
        let row = row0 + tr * MR + r;
        if row >= p.len_q {
            continue;
        }
        let inv = row_inv_sum(row_sum[tr * MR + r]);
        for (var u = 0u; u < OC; u++) {
            let c4 = tc + u * TC;
            let o = acc[r * OC + u] * inv;
            for (var c = 0u; c < 4u; c++) {
                if c4 * 4u + c < p.head_dim_v {
                    output[o_head + row * p.o_stride_s + c4 * 4u + c] = elem(o[c]);
                }
            }
        }
    }
    if tid < BR && row0 + tid < p.len_q {
        lse[(hd.b * p.heads_q + hd.h) * p.len_q + row0 + tid] = row_lse(row_max[tid], row_sum[tid]);
    }
}
