enable f16;
enable wgpu_cooperative_matrix;

// Fused attention on tensor cores (cooperative matrices), in the FlashAttention-2
// shape: products in f16 with f32 accumulation, softmax in f32. With f16 storage this
// is the f16 kernel; with f32 storage it is Precision::Medium (Q, K, V and the
// probabilities rounded to f16 as they are staged).
//
// Tiling: NSG = BR / 16 subgroups of SG invocations (SG must be the adapter's fixed
// subgroup size, so that subgroup_id runs 0..NSG-1; the host checks this and the
// 16x16x16 f16->f32 configuration). The workgroup owns BR query rows of one (batch,
// head); subgroup g owns the band of rows 16g .. 16g + 15. Per tile of BC keys:
//   1. all invocations stage the K tile as f16 in `kvs` (zeros past the last key and
//      the head dim);
//   2. subgroup g computes its 16 x BC band of S = Q·Kᵀ as BC/16 f32 tiles, A from
//      the Q band in `qs` (row-major), B = Kᵀ read column-major from K's rows, and
//      stores it to `ss`;
//   3. invocation r < BR owns row r: scales and masks its scores (apply_masks), keeps
//      the row maximum and sum, and writes P = exp(s - max) as f16 to `ps`; the other
//      invocations meanwhile stage the V tile over the K tile;
//   4. subgroup g adds its band of P·V into its Dv/16 f32 output tiles (registers).
// Output tiles are opaque, so a row's rescale cannot be applied in registers: the
// maximum a row's probabilities are taken against moves only when a tile's maximum
// exceeds it by more than TAU (so P <= e^TAU, which f16 holds with its full relative
// precision), and only then do the output tiles go through `ss` to be rescaled, for
// the whole workgroup at once (a workgroup-uniform flag). After the first tile of
// random data that is rare. At the end the tiles go through `ss` once more to be
// normalised and stored.
//
// Every coop load and store reads or writes a whole 16 x 16 tile inside a workgroup
// array, at 16-byte aligned offsets (rows padded by 8 halves or 4 floats). The key
// loop ends at the last key the block's last row can see (causal, key lengths) and
// starts at p.key_begin, resuming from an earlier dispatch's output rows and
// log-sum-exps (attention_common.wgsl's resumed_max), as the other fused kernels.
//
// naga 30.0.1 trap: an index written inside coopLoad/coopStore's pointer argument makes
// its SPIR-V writer panic; every such index is named with `let` first.

override SG: u32 = 32u; // invocations per subgroup (the host sets the adapter's)

const NSG: u32 = BR / 16u; // subgroups, one 16-row band each
const D16: u32 = DMAX / 16u; // 16-wide chunks of the head dims
const KC: u32 = BC / 16u; // 16-key chunks of a tile
const LDQ: u32 = DMAX + 8u; // halves per staged Q, K or V row
const LDS: u32 = BC + 4u; // floats per row of `ss`
const LDP: u32 = BC + 8u; // halves per row of `ps`
const TAU: f32 = 8.0; // how far a row's maximum may run ahead of its reference

var<workgroup> qs: array<f16, BR * LDQ>;
var<workgroup> kvs: array<f16, BC * LDQ>;
var<workgroup> ss: array<f32, BR * LDS>;
var<workgroup> ps: array<f16, BR * LDP>;
var<workgroup> row_max: array<f32, BR>;
var<workgroup> row_sum: array<f32, BR>;
var<workgroup> row_alpha: array<f32, BR>;
var<workgroup> moved: atomic<u32>; // some row's reference maximum moved this tile

// Stages rows tile0 .. tile0 + BC of K (or V) as f16, zeros past `stop` keys and
// `len` head dims.
fn stage_kv(src_is_k: bool, b: u32, base: u32, tile0: u32, len: u32, stop: u32, tid: u32) {
    for (var x = tid; x < BC * DMAX; x += NSG * SG) {
        let j = x / DMAX;
        let d = x % DMAX;
        var value = f16(0.0);
        if tile0 + j < stop && d < len {
            let at = base + kv_offset(src_is_k, b, tile0 + j) + d;
            if src_is_k {
                value = f16(k[at]);
            } else {
                value = f16(v[at]);
            }
        }
        kvs[j * LDQ + d] = value;
    }
}

@compute @workgroup_size(NSG * SG, 1, 1)
fn flash_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
) {
    let nt = NSG * SG;
    let hd = head_of(p.bh_start + wid.y);
    let row0 = wid.x * BR;
    let last_q = p.len_q - 1u;
    let d16 = (p.head_dim + 15u) / 16u;
    let dv16 = (p.head_dim_v + 15u) / 16u;
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;
    let band = sg * 16u; // first row of this subgroup's band
    // Keys past the key length are never visible to any row: their V rows are staged
    // as zeros, so that 0 x (whatever the buffer holds there) cannot reach the output.
    var kv_stop = p.len_k;
    if p.has_key_lengths != 0u {
        kv_stop = min(kv_stop, side_words[hd.b]);
    }

    // Q band, unscaled (f16 inputs stay exact); rows past the end are zeros.
    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;
    for (var x = tid; x < BR * DMAX; x += nt) {
        let r = x / DMAX;
        let d = x % DMAX;
        var value = f16(0.0);
        if row0 + r < p.len_q && d < p.head_dim {
            value = f16(q[q_head + (row0 + r) * p.q_stride_s + d]);
        }
        qs[r * LDQ + d] = value;
    }
    for (var r = tid; r < BR; r += nt) {
        let m = resumed_max(hd, min(row0 + r, last_q));
        row_max[r] = m;
        row_sum[r] = resumed_sum(m);
    }
    if tid == 0u {
        atomicStore(&moved, 0u);
    }

    // Output tiles: zeros, or the rows an earlier key range left (through `ss`, as f32).
    var o: array<coop_mat16x16<f32, C>, D16>;
    for (var c = 0u; c < D16; c++) {
        o[c] = coop_mat16x16<f32, C>();
    }
    if p.key_begin != 0u {
        for (var c0 = 0u; c0 < D16; c0 += KC) {
            for (var x = tid; x < BR * BC; x += nt) {
                let r = x / BC;
                let col = c0 * 16u + x % BC;
                let row = row0 + r;
                var value = 0.0;
                if row < p.len_q && col < p.head_dim_v && !is_neg_inf(resumed_max(hd, row)) {
                    value = f32(output[o_head + row * p.o_stride_s + col]);
                }
                ss[r * LDS + x % BC] = value;
            }
            workgroupBarrier();
            for (var u = 0u; u < KC; u++) {
                if c0 + u >= dv16 {
                    break;
                }
                let is = band * LDS + u * 16u;
                o[c0 + u] = coopLoadT<coop_mat16x16<f32, C>>(&ss[is], LDS);
            }
            workgroupBarrier();
        }
    }
    workgroupBarrier();

    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + BR - 1u, last_q)), p.key_stop);
    for (var tile0 = block_begin; tile0 < block_end; tile0 += BC) {
        // 1. K tile.
        stage_kv(true, hd.b, k_base, tile0, p.head_dim, p.len_k, tid);
        workgroupBarrier();

        // 2. This band's scores, unscaled.
        for (var kc = 0u; kc < KC; kc++) {
            var s = coop_mat16x16<f32, C>();
            for (var dc = 0u; dc < D16; dc++) {
                if dc >= d16 {
                    break;
                }
                let ia = band * LDQ + dc * 16u;
                let ib = kc * 16u * LDQ + dc * 16u;
                let a = coopLoadT<coop_mat16x16<f16, A>>(&qs[ia], LDQ);
                let b = coopLoad<coop_mat16x16<f16, B>>(&kvs[ib], LDQ);
                s = coopMultiplyAdd(a, b, s);
            }
            let is = band * LDS + kc * 16u;
            coopStoreT(s, &ss[is], LDS);
        }
        workgroupBarrier();

        // 3. Row owners: scale, mask, online-softmax step, P as f16. Everyone: V tile.
        for (var r = tid; r < BR; r += nt) {
            let i = min(row0 + r, last_q);
            let start = vec4<u32>(key_start(hd.b, i));
            let end = vec4<u32>(min(key_end(hd.b, i), p.key_stop));
            var tile_max = neg_inf();
            for (var j = 0u; j < BC; j += 4u) {
                let at = r * LDS + j;
                let raw = vec4<f32>(ss[at], ss[at + 1u], ss[at + 2u], ss[at + 3u]) * p.scale;
                let keys = keys4(tile0 + j);
                let in_range = in_key_range(keys, start, end);
                let s4 = apply_masks(raw, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_range, mask_words_of_keys(hd.b, hd.h, i, tile0 + j));
                ss[at] = s4.x;
                ss[at + 1u] = s4.y;
                ss[at + 2u] = s4.z;
                ss[at + 3u] = s4.w;
                tile_max = max(tile_max, max(max(s4.x, s4.y), max(s4.z, s4.w)));
            }
            var m = row_max[r];
            var alpha = 1.0;
            if is_neg_inf(m) {
                // Nothing seen yet: the row's output tiles and sum are zero.
                m = tile_max;
                alpha = 0.0;
            } else if tile_max > m + TAU {
                alpha = softmax_rescale(vec4<f32>(m), vec4<f32>(tile_max)).x;
                m = tile_max;
                atomicMax(&moved, 1u);
            }
            var sum = 0.0;
            for (var j = 0u; j < BC; j += 4u) {
                let at = r * LDS + j;
                let p4 = softmax_probs(vec4<f32>(ss[at], ss[at + 1u], ss[at + 2u], ss[at + 3u]), vec4<f32>(m));
                let e = vec4<f16>(p4);
                let pa = r * LDP + j;
                ps[pa] = e.x;
                ps[pa + 1u] = e.y;
                ps[pa + 2u] = e.z;
                ps[pa + 3u] = e.w;
                // The f32 values: the log-sum-exp stays as exact as the scores (P·V
                // weighs the f16 ones, an error within the f16 rule).
                sum += dot(p4, vec4<f32>(1.0));
            }
            row_sum[r] = row_sum[r] * alpha + sum;
            row_max[r] = m;
            row_alpha[r] = alpha;
        }
        stage_kv(false, hd.b, v_base, tile0, p.head_dim_v, kv_stop, tid);
        let rescale = workgroupUniformLoad(&moved);

        // Rare: some row's reference maximum moved; rescale every row's output tiles
        // by its alpha (1 for the rows that did not move), through `ss`.
        if rescale != 0u {
            for (var c0 = 0u; c0 < D16; c0 += KC) {
                for (var u = 0u; u < KC; u++) {
                    if c0 + u >= dv16 {
                        break;
                    }
                    let is = band * LDS + u * 16u;
                    coopStoreT(o[c0 + u], &ss[is], LDS);
                }
                workgroupBarrier();
                for (var x = tid; x < BR * BC; x += nt) {
                    let r = x / BC;
                    ss[r * LDS + x % BC] *= row_alpha[r];
                }
                workgroupBarrier();
                for (var u = 0u; u < KC; u++) {
                    if c0 + u >= dv16 {
                        break;
                    }
                    let is = band * LDS + u * 16u;
                    o[c0 + u] = coopLoadT<coop_mat16x16<f32, C>>(&ss[is], LDS);
                }
                // Which lanes load which elements is the driver's choice: the next
                // round's stores must not overtake this round's loads.
                workgroupBarrier();
            }
        }

        // 4. This band's P·V.
        for (var c = 0u; c < D16; c++) {
            if c >= dv16 {
                break;
            }
            for (var kc = 0u; kc < KC; kc++) {
                let ia = band * LDP + kc * 16u;
                let ib = kc * 16u * LDQ + c * 16u;
                let a = coopLoadT<coop_mat16x16<f16, A>>(&ps[ia], LDP);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&kvs[ib], LDQ);
                o[c] = coopMultiplyAdd(a, b, o[c]);
            }
        }
        workgroupBarrier();
        if tid == 0u {
            atomicStore(&moved, 0u);
        }
    }

    // Normalise and store through `ss`; rows that saw no key get zeros and lse = -inf.
    for (var c0 = 0u; c0 < D16; c0 += KC) {
        for (var u = 0u; u < KC; u++) {
            if c0 + u >= dv16 {
                break;
            }
            let is = band * LDS + u * 16u;
            coopStoreT(o[c0 + u], &ss[is], LDS);
        }
        workgroupBarrier();
        for (var x = tid; x < BR * BC; x += nt) {
            let r = x / BC;
            let col = c0 * 16u + x % BC;
            let row = row0 + r;
            if row < p.len_q && col < p.head_dim_v {
                output[o_head + row * p.o_stride_s + col] = elem(ss[r * LDS + x % BC] * row_inv_sum(row_sum[r]));
            }
        }
        workgroupBarrier();
    }
    for (var r = tid; r < BR; r += nt) {
        if row0 + r < p.len_q {
            lse[(hd.b * p.heads_q + hd.h) * p.len_q + row0 + r] = row_lse(row_max[r], row_sum[r]);
        }
    }
}
