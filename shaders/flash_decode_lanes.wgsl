// Split-K decode for GPUs with subgroups (FlashDecoding with lane groups): the same
// splits, 4-row blocks and partial results as flash_decode.wgsl (decode_combine there
// merges them), arranged so that every K and V byte is read once, 16 bytes to a load,
// coalesced, with no barrier and no workgroup memory in the key loop. Appended to
// attention_common.wgsl, decode_common.wgsl and decode_kv_buffers.wgsl (the k4 and
// v4 views of K and V) after a generator prelude (kernels::decode::LanesVariant):
// SG, the adapter's fixed subgroup size; LK, the lanes that share a key (8 or 16 on
// GPUs, 4 on lavapipe's 8-lane subgroups so that groups merge there too, 4 or 8 for
// int8; dividing SG); one of decode_lanes_float.wgsl and decode_lanes_int8.wgsl, which
// say how a 16-byte word of K or V becomes EW elements and give each row's scales
// (an int8 KV cache's; 1 otherwise); and LW, the 16-byte words of a head-dim row one
// lane holds (DMAX / (LK * EW), at least 1).
//
// Tiling. A workgroup is one subgroup of SG lanes; workgroup (x, y) takes split x and
// row block y (4 query rows sharing one kv head, as a vec4's components). The lanes
// form SG / LK key groups of LK: group g walks keys begin + g, begin + g + SG / LK,
// ..., so one step of the subgroup reads SG / LK consecutive rows. Lane l of a group
// holds words l, l + LK, ... of a row (LW of them): its share of every Q row (loaded
// once, scaled, element e of the 4 rows as one vec4) and of every output row. Per key:
//   1. the lane has its K and V words and the rows' scales (loaded a step ahead,
//      before any arithmetic, so two steps' loads are in flight), dots its K elements
//      with its Q share, and log2(LK) subgroupShuffleXor steps sum the group's parts:
//      every lane of the group has the key's 4 scores (times K's row scale);
//   2. masks: none for keys every row sees when visible ranges are the only rule;
//      else decode_common's mask_quad;
//   3. online softmax per group, every lane alike: the accumulator and sum are
//      rescaled only when a score passes the running maximum (rare after the first
//      keys), then P·V adds the key's V elements times its 4 probabilities (times V's
//      row scale).
// Past the split's end the groups' last steps read the last readable key, masked.
// Then the groups of the subgroup merge (m, sum, accumulator) by shuffles, and the
// first group writes the split's rows normalised, with their log-sum-exp.
//
// Needs head dims up to DMAX whose rows, and every K and V stride, are whole 16-byte
// words (the host checks: kernels::decode::lanes_fit); elsewhere Tiles runs.

// Key groups a subgroup walks at once.
const GROUPS: u32 = SG / LK;
// A lane's elements of a row.
const LE: u32 = LW * EW;

// Element e (of 4 per vec4) of a word's elements.
fn element(x: WordElements, e: u32) -> f32 {
    return x[e / 4u][e % 4u];
}

// A lane's words of key j's K and V rows: words part, part + LK, ... (zero past a
// row), and the rows' scales.
struct RowWords {
    k: array<vec4<u32>, LW>,
    v: array<vec4<u32>, LW>,
    scale: vec2<f32>,
}

fn load_row_words(b: u32, k_base: u32, v_base: u32, j: u32, part: u32, k_words: u32, v_words: u32) -> RowWords {
    let k_at = (k_base + kv_offset(true, b, j)) / EW;
    let v_at = (v_base + kv_offset(false, b, j)) / EW;
    var r: RowWords;
    r.scale = row_scales(k_at, v_at);
    for (var i = 0u; i < LW; i++) {
        let w = part + i * LK;
        r.k[i] = select(vec4<u32>(0u), k4[k_at + min(w, k_words - 1u)], w < k_words);
        r.v[i] = select(vec4<u32>(0u), v4[v_at + min(w, v_words - 1u)], w < v_words);
    }
    return r;
}

@compute @workgroup_size(SG)
fn decode_split_lanes(
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let blk = decode_block(wid);
    let b = blk.b;
    let hk = blk.hk;
    let group = lane / LK;
    let part = lane % LK;
    let k_words = p.head_dim / EW;
    let v_words = p.head_dim_v / EW;

    // This lane's share of the 4 Q rows, scaled: element e of word i at q[i * EW + e].
    var qs: array<vec4<f32>, LE>;
    for (var i = 0u; i < LW; i++) {
        let w = part + i * LK;
        for (var c = 0u; c < EW / 4u; c++) {
            let t = (w * EW) / 4u + c;
            var rows = array<vec4<f32>, 4>();
            if w < k_words {
                for (var r = 0u; r < 4u; r++) {
                    rows[r] = decode_q4(blk, r, t);
                }
            }
            for (var x = 0u; x < 4u; x++) {
                qs[i * EW + c * 4u + x] = vec4<f32>(rows[0][x], rows[1][x], rows[2][x], rows[3][x]);
            }
        }
    }

    var acc: array<vec4<f32>, LE>;
    for (var e = 0u; e < LE; e++) {
        acc[e] = vec4<f32>(0.0);
    }
    var m = vec4<f32>(neg_inf());
    var l = vec4<f32>(0.0);
    let k_base = b * p.k_stride_b + hk * p.k_stride_h;
    let v_base = b * p.v_stride_b + hk * p.v_stride_h;
    let last_k = last_read_key(b); // keys past it are masked; their rows may hold anything
    let plain = only_key_ranges();

    // Every lane runs every step (the shuffles need the whole subgroup): steps past
    // the split read the last readable key and mask it.
    // The loop is pipelined by one step: the next key's K and V words are loaded before
    // this key's arithmetic, so each lane has two steps' loads in flight.
    let steps = (max(blk.stop, blk.begin) - blk.begin + GROUPS - 1u) / GROUPS;
    var next = load_row_words(b, k_base, v_base, min(blk.begin + group, last_k), part, k_words, v_words);
    for (var step = 0u; step < steps; step++) {
        let j = blk.begin + step * GROUPS + group;
        let kw = next.k;
        let vw = next.v;
        let scale = next.scale;
        if step + 1u < steps {
            let jn = min(j + GROUPS, last_k);
            next = load_row_words(b, k_base, v_base, jn, part, k_words, v_words);
        }
        var s = vec4<f32>(0.0);
        for (var i = 0u; i < LW; i++) {
            let x = word_elements(kw[i]);
            for (var e = 0u; e < EW; e++) {
                s += qs[i * EW + e] * element(x, e);
            }
        }
        for (var o = 1u; o < LK; o *= 2u) {
            s += subgroupShuffleXor(s, o);
        }
        s *= scale.x;
        let open = plain && j >= blk.open_begin && j < blk.open_end;
        if !open {
            s = mask_quad(b, hk, blk.block, 0u, j, blk.stop, s);
        }
        if any(s > m) {
            let new_max = max(m, s);
            let alpha = softmax_rescale(m, new_max);
            l *= alpha;
            for (var e = 0u; e < LE; e++) {
                acc[e] *= alpha;
            }
            m = new_max;
        }
        let pr = softmax_probs(s, m);
        l += pr;
        let pv = pr * scale.y;
        for (var i = 0u; i < LW; i++) {
            let x = word_elements(vw[i]);
            for (var e = 0u; e < EW; e++) {
                acc[i * EW + e] += pv * element(x, e);
            }
        }
    }

    // The groups' states merged: lane l and lane l ^ mask hold the same columns.
    for (var mask = LK; mask < SG; mask *= 2u) {
        let other_m = subgroupShuffleXor(m, mask);
        let other_l = subgroupShuffleXor(l, mask);
        let new_max = max(m, other_m);
        let mine = softmax_rescale(m, new_max);
        let theirs = softmax_rescale(other_m, new_max);
        l = l * mine + other_l * theirs;
        for (var e = 0u; e < LE; e++) {
            acc[e] = acc[e] * mine + subgroupShuffleXor(acc[e], mask) * theirs;
        }
        m = new_max;
    }

    if group == 0u {
        let inv = vec4<f32>(row_inv_sum(l.x), row_inv_sum(l.y), row_inv_sum(l.z), row_inv_sum(l.w));
        if part == 0u {
            for (var r = 0u; r < 4u; r++) {
                store_partial_lse(blk, r, m[r], l[r]);
            }
        }
        for (var i = 0u; i < LW; i++) {
            let w = part + i * LK;
            if w < v_words {
                for (var e = 0u; e < EW; e++) {
                    let o = acc[i * EW + e] * inv;
                    for (var r = 0u; r < 4u; r++) {
                        store_partial(blk, r, w * EW + e, o[r]);
                    }
                }
            }
        }
    }
}
