// Shared by the fused kernels of flash_attention.wgsl (flash_subgroup.wgsl and
// flash_blocked.wgsl keep their own state), appended after attention_common.wgsl:
// per-invocation state for one query row, driven by attention_common.wgsl's masking
// and softmax rules.
//
// Each query row is owned by ROW_LANES consecutive invocations (a prelude constant; 1
// but for the GPU head-dim classes past 64). Lane `l` of a row owns the row's vec4s
// l, l + ROW_LANES, l + 2 ROW_LANES, ... (row_vec4): its share of the Q row
// (pre-multiplied by the scale) and of the output accumulator live in private vec4
// arrays of ROW_VEC4. Keys are consumed in blocks of 4: 4 partial scores, summed over
// the row's lanes (row_sum_lanes, from the prelude: subgroup shuffles where
// ROW_LANES > 1), one running-max update, one rescale of the accumulator, then 4
// rank-1 updates with the V rows. Every lane of a row sees the same scores, so the
// running max and sum agree across them. Rows that see no key write zeros and
// lse = -inf. A dispatch walks the keys p.key_begin .. p.key_stop and may resume from
// an earlier one's results (resume_row).
//
// The row's layout over its lanes and its loop bounds: row_lanes.wgsl, before this
// file.

var<private> q_row: array<vec4<f32>, ROW_VEC4>;
var<private> acc: array<vec4<f32>, ROW_VEC4>;

var<private> row_max: f32;
var<private> row_sum: f32;

struct RowSetup {
    hd: Head,
    row: u32, // this invocation's query row, possibly past the last (then i is the last)
    i: u32,
    start: u32,
    end: u32,
    k_base: u32,
    v_base: u32,
}

// Loads this invocation's Q row and clears its accumulator; returns the loop bounds.
fn setup_row(lid: u32, wid: vec3<u32>) -> RowSetup {
    let hd = head_of(p.bh_start + wid.y);
    let row = wid.x * block_rows() + enter_row(lid);
    let i = min(row, p.len_q - 1u);
    let q_base = hd.b * p.q_stride_b + hd.h * p.q_stride_h + i * p.q_stride_s;
    let d4 = row_vec4s(p.head_dim);
    for (var t = 0u; t < d4; t++) {
        q_row[t] = qload4(q_base, row_vec4(t)) * p.scale;
    }
    resume_row(hd, i);
    return RowSetup(
        hd,
        row,
        i,
        key_start(hd.b, i),
        key_end(hd.b, i),
        hd.b * p.k_stride_b + hd.hk * p.k_stride_h,
        hd.b * p.v_stride_b + hd.hk * p.v_stride_h,
    );
}

// The keys the workgroup's block of rows walks: from its first row's first key to the
// last key its last row sees (that row sees the most). Computed from the workgroup id
// alone, so that WGSL's uniformity analysis (Tint's, stricter than naga's) sees the
// loop bounds, and the barriers inside flash_shared's loop, as uniform.
fn block_keys(wid: vec3<u32>) -> vec2<u32> {
    let b = head_of(p.bh_start + wid.y).b;
    let row0 = wid.x * block_rows();
    let end = min(key_end(b, min(row0 + block_rows() - 1u, p.len_q - 1u)), p.key_stop);
    return vec2<u32>(block_key_begin(b, min(row0, p.len_q - 1u)), end);
}

// The running state before key p.key_begin (attention_common.wgsl's resumed_max).
fn resume_row(hd: Head, i: u32) {
    let dv4 = row_vec4s(p.head_dim_v);
    row_max = resumed_max(hd, i);
    row_sum = resumed_sum(row_max);
    let o_base = hd.b * p.o_stride_b + hd.h * p.o_stride_h + i * p.o_stride_s;
    for (var t = 0u; t < dv4; t++) {
        var o = vec4<f32>(0.0);
        let d = row_vec4(t) * 4u;
        if row_sum != 0.0 {
            for (var c = 0u; c < 4u; c++) {
                if d + c < p.head_dim_v {
                    o[c] = f32(output[o_base + d + c]);
                }
            }
        }
        acc[t] = o;
    }
}

// Masks four raw scores (already scaled through q_row) of keys j0..j0+3.
fn mask4(raw: vec4<f32>, s: RowSetup, j0: u32) -> vec4<f32> {
    let keys = keys4(j0);
    let in_range = in_key_range(keys, vec4<u32>(s.start), vec4<u32>(s.end));
    return apply_masks(raw, s.hd.b, vec4<u32>(s.hd.h), vec4<u32>(s.i), keys, in_range, mask_words_of_keys(s.hd.b, s.hd.h, s.i, j0));
}

// Online-softmax step for four masked scores: raises the running max, rescales the
// accumulator and running sum, and returns the four unnormalised probabilities
// (exactly 0 at masked positions).
fn online_step(s4: vec4<f32>) -> vec4<f32> {
    // NaN scores make the row NaN, as in the reference (max_or_nan).
    let block_max = max_or_nan(max_or_nan(s4.x, s4.y), max_or_nan(s4.z, s4.w));
    let new_max = max_or_nan(row_max, block_max);
    if is_neg_inf(new_max) {
        return vec4<f32>(0.0); // nothing visible yet
    }
    if new_max > row_max {
        let alpha = softmax_rescale(vec4<f32>(row_max), vec4<f32>(new_max)).x;
        row_sum *= alpha;
        let dv4 = row_vec4s(p.head_dim_v);
        for (var t = 0u; t < dv4; t++) {
            acc[t] *= alpha;
        }
        row_max = new_max;
    }
    let pr = softmax_probs(s4, vec4<f32>(new_max));
    row_sum += pr.x + pr.y + pr.z + pr.w;
    return pr;
}

// Normalises and stores this lane's share of its output row, and (lane 0) the row's
// log-sum-exp.
fn finish_row(s: RowSetup) {
    let row = s.row;
    if row >= p.len_q {
        return;
    }
    let inv = row_inv_sum(row_sum);
    let o_base = s.hd.b * p.o_stride_b + s.hd.h * p.o_stride_h + row * p.o_stride_s;
    let dv4 = row_vec4s(p.head_dim_v);
    for (var t = 0u; t < dv4; t++) {
        let o = acc[t] * inv;
        let d = row_vec4(t) * 4u;
        for (var c = 0u; c < 4u; c++) {
            if d + c < p.head_dim_v {
                output[o_base + d + c] = elem(o[c]);
            }
        }
    }
    if lane == 0u {
        lse[(s.hd.b * p.heads_q + s.hd.h) * p.len_q + row] = row_lse(row_max, row_sum);
    }
}

