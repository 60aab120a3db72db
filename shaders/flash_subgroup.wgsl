// Fused attention for CPU adapters with subgroups of at least 8 lanes (lavapipe).
// Same online softmax and masking rules as flash_attention.wgsl, arranged for a CPU.
//
// Why a separate kernel: CPU drivers run 8 invocations as one SIMD batch and perform a
// storage load lane by lane, even when every lane reads the same address, as all lanes
// do for K and V here. So for each group of 8 head-dim elements of a K or V row, lane l
// loads element 8t + l once, and subgroupBroadcast hands it to the other lanes (a
// register shuffle). Each invocation then owns 4 query rows, so every broadcast element
// feeds 4 multiply-adds: with the rows as the components of a vec4, the inner loops are
// `vec4 += vec4 * scalar`, which is what a SIMD CPU does best.
//
// Tiling: a workgroup owns ROWS query rows of one (batch, head), ROWS / 4 invocations;
// invocation `lid` owns rows row0 + lid + r * ROWS / 4 for r = 0..3 (component r). Keys
// are consumed in blocks of 4: 16 scores, one online-softmax step per row, then the V
// update. No barriers (each invocation touches only its own slot of the workgroup
// arrays below). Lanes 0..7 of each subgroup must be active
// (the key loop is uniform across the workgroup). A dispatch walks the keys
// p.key_begin .. p.key_stop and may resume from an earlier one's results (resume_rows).

// Per invocation, the scaled Q rows and the unnormalised output rows are MAX_DIM
// vec4s each (component r: row r), reached through q_octet/q_set and acc_get/acc_set,
// which a prelude defines with MAX_DIM (a multiple of 8, at least D and Dv; the host
// picks 64, 128 or 256). They live in workgroup memory, each invocation in its own
// slot of MAX_DIM vec4s (`slot`), wherever 8 slots of both fit in 32 KiB: llvmpipe
// turns every dynamically indexed access to a private array into a ladder of branches
// over the whole array, which took minutes to compile and ran slower. At MAX_DIM = 256
// only the accumulator (accessed in more places) fits, and Q stays private, read by
// octets.
const LANES: u32 = 8u;
// Invocations per workgroup (ROWS / 4): the host launches ROWS = 32, and the
// workgroup arrays hold SLOTS slots.
const SLOTS: u32 = 8u;
override ROWS: u32 = 32u;

var<private> slot: u32; // this invocation's first element in the workgroup arrays
var<private> row_max: vec4<f32>;
var<private> row_sum: vec4<f32>;
var<private> score: array<vec4<f32>, 4>; // score[c]: key j0 + c
var<private> prob: array<vec4<f32>, 4>;

// kd[c] = K[j0 + c][d]
fn add_scores(qd: vec4<f32>, kd: vec4<f32>) {
    score[0] += qd * kd.x;
    score[1] += qd * kd.y;
    score[2] += qd * kd.z;
    score[3] += qd * kd.w;
}

// vd[c] = V[j0 + c][d]
fn add_values(d: u32, vd: vec4<f32>) {
    acc_set(d, acc_get(d) + prob[0] * vd.x + prob[1] * vd.y + prob[2] * vd.z + prob[3] * vd.w);
}

// Element d of four K rows (zero past the head dim).
fn k_column(rows: vec4<u32>, d: u32) -> vec4<f32> {
    if d >= p.head_dim {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(f32(k[rows.x + d]), f32(k[rows.y + d]), f32(k[rows.z + d]), f32(k[rows.w + d]));
}

fn v_column(rows: vec4<u32>, d: u32) -> vec4<f32> {
    if d >= p.head_dim_v {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(f32(v[rows.x + d]), f32(v[rows.y + d]), f32(v[rows.z + d]), f32(v[rows.w + d]));
}

// The scores of key j for the 4 rows, masked: -inf where a rule masks (row r, j).
fn mask_column(hd: Head, rows: vec4<u32>, starts: vec4<u32>, ends: vec4<u32>, j: u32, s: vec4<f32>) -> vec4<f32> {
    let keys = vec4<u32>(j);
    return apply_masks(s, hd.b, vec4<u32>(hd.h), rows, keys, in_key_range(keys, starts, ends), mask_words_of_rows(hd.b, hd.h, rows, j));
}

// Online-softmax step over the 4 keys of the block, for all 4 rows at once: raises the
// running maxima, rescales the accumulators and sums, and leaves the unnormalised
// probabilities (exactly 0 at masked positions) in `prob`.
fn online_step4() {
    let block_max = max(max(score[0], score[1]), max(score[2], score[3]));
    let new_max = max(row_max, block_max);
    if any(new_max > row_max) {
        let alpha = softmax_rescale(row_max, new_max);
        row_sum *= alpha;
        // By octets: llvmpipe caps the loop iterations an invocation may run (65535 in
        // all), and this loop can run at every block (see kernels::loop_budget).
        let dv8 = (p.head_dim_v + 7u) / 8u;
        for (var t = 0u; t < dv8; t++) {
            let d = t * LANES;
            acc_set(d, acc_get(d) * alpha);
            acc_set(d + 1u, acc_get(d + 1u) * alpha);
            acc_set(d + 2u, acc_get(d + 2u) * alpha);
            acc_set(d + 3u, acc_get(d + 3u) * alpha);
            acc_set(d + 4u, acc_get(d + 4u) * alpha);
            acc_set(d + 5u, acc_get(d + 5u) * alpha);
            acc_set(d + 6u, acc_get(d + 6u) * alpha);
            acc_set(d + 7u, acc_get(d + 7u) * alpha);
        }
        row_max = new_max;
    }
    for (var c = 0u; c < 4u; c++) {
        prob[c] = softmax_probs(score[c], new_max);
    }
    row_sum += prob[0] + prob[1] + prob[2] + prob[3];
}

// The running state of the 4 rows before key p.key_begin (attention_common.wgsl's
// resumed_max).
fn resume_rows(hd: Head, rows: vec4<u32>, dims: u32) {
    row_max = vec4<f32>(resumed_max(hd, rows.x), resumed_max(hd, rows.y), resumed_max(hd, rows.z), resumed_max(hd, rows.w));
    row_sum = vec4<f32>(resumed_sum(row_max.x), resumed_sum(row_max.y), resumed_sum(row_max.z), resumed_sum(row_max.w));
    let seen = row_sum != vec4<f32>(0.0);
    let o_base = vec4<u32>(hd.b * p.o_stride_b + hd.h * p.o_stride_h) + rows * p.o_stride_s;
    for (var d = 0u; d < dims; d++) {
        var o = vec4<f32>(0.0);
        if p.key_begin > 0u && d < p.head_dim_v {
            o = vec4<f32>(
                f32(output[o_base.x + d]),
                f32(output[o_base.y + d]),
                f32(output[o_base.z + d]),
                f32(output[o_base.w + d]),
            );
        }
        acc_set(d, select(vec4<f32>(0.0), o, seen));
    }
}

@compute @workgroup_size(ROWS / 4u, 1, 1)
fn flash_subgroup(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {
    let hd = head_of(p.bh_start + wid.y);
    let lane = sg_lane % LANES;
    let stride_r = ROWS / 4u;
    let row0 = wid.x * ROWS;
    let rows = vec4<u32>(row0 + lid.x) + vec4<u32>(0u, 1u, 2u, 3u) * stride_r;
    let last_q = p.len_q - 1u;
    let clamped = min(rows, vec4<u32>(last_q));
    let starts = vec4<u32>(key_start(hd.b, clamped.x), key_start(hd.b, clamped.y), key_start(hd.b, clamped.z), key_start(hd.b, clamped.w));
    let ends = vec4<u32>(
        key_end(hd.b, clamped.x),
        key_end(hd.b, clamped.y),
        key_end(hd.b, clamped.z),
        key_end(hd.b, clamped.w),
    );
    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + ROWS - 1u, last_q)), p.key_stop);

    slot = lid.x * MAX_DIM;
    let d8 = (p.head_dim + 7u) / 8u;
    let dv8 = (p.head_dim_v + 7u) / 8u;
    let q_base = vec4<u32>(hd.b * p.q_stride_b + hd.h * p.q_stride_h) + clamped * p.q_stride_s;
    for (var d = 0u; d < d8 * 8u; d++) {
        var qd = vec4<f32>(0.0);
        if d < p.head_dim {
            qd = vec4<f32>(f32(q[q_base.x + d]), f32(q[q_base.y + d]), f32(q[q_base.z + d]), f32(q[q_base.w + d]));
        }
        q_set(d, qd * p.scale);
    }
    resume_rows(hd, clamped, dv8 * 8u);

    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    for (var j0 = block_begin; j0 < block_end; j0 += 4u) {
        for (var c = 0u; c < 4u; c++) {
            score[c] = vec4<f32>(0.0);
        }
        let kr = row_offsets(true, hd.b, k_base, j0);
        for (var t = 0u; t < d8; t++) {
            let d = t * LANES;
            let x = k_column(kr, d + lane);
            let qo = q_octet(t);
            add_scores(qo[0], subgroupBroadcast(x, 0u));
            add_scores(qo[1], subgroupBroadcast(x, 1u));
            add_scores(qo[2], subgroupBroadcast(x, 2u));
            add_scores(qo[3], subgroupBroadcast(x, 3u));
            add_scores(qo[4], subgroupBroadcast(x, 4u));
            add_scores(qo[5], subgroupBroadcast(x, 5u));
            add_scores(qo[6], subgroupBroadcast(x, 6u));
            add_scores(qo[7], subgroupBroadcast(x, 7u));
        }
        // Masks (Q already carries the scale).
        score[0] = mask_column(hd, clamped, starts, ends, j0, score[0]);
        score[1] = mask_column(hd, clamped, starts, ends, j0 + 1u, score[1]);
        score[2] = mask_column(hd, clamped, starts, ends, j0 + 2u, score[2]);
        score[3] = mask_column(hd, clamped, starts, ends, j0 + 3u, score[3]);
        online_step4();
        let vr = row_offsets(false, hd.b, v_base, j0);
        for (var t = 0u; t < dv8; t++) {
            let d = t * LANES;
            let y = v_column(vr, d + lane);
            add_values(d, subgroupBroadcast(y, 0u));
            add_values(d + 1u, subgroupBroadcast(y, 1u));
            add_values(d + 2u, subgroupBroadcast(y, 2u));
            add_values(d + 3u, subgroupBroadcast(y, 3u));
            add_values(d + 4u, subgroupBroadcast(y, 4u));
            add_values(d + 5u, subgroupBroadcast(y, 5u));
            add_values(d + 6u, subgroupBroadcast(y, 6u));
            add_values(d + 7u, subgroupBroadcast(y, 7u));
        }
    }

    // Normalise and store; rows that saw no key get zeros and lse = -inf.
    let inv = vec4<f32>(row_inv_sum(row_sum.x), row_inv_sum(row_sum.y), row_inv_sum(row_sum.z), row_inv_sum(row_sum.w));
    let lses = vec4<f32>(row_lse(row_max.x, row_sum.x), row_lse(row_max.y, row_sum.y), row_lse(row_max.z, row_sum.z), row_lse(row_max.w, row_sum.w));
    for (var r = 0u; r < 4u; r++) {
        let row = rows[r];
        if row >= p.len_q {
            continue;
        }
        let o_base = hd.b * p.o_stride_b + hd.h * p.o_stride_h + row * p.o_stride_s;
        for (var d = 0u; d < p.head_dim_v; d++) {
            output[o_base + d] = elem(acc_get(d)[r] * inv[r]);
        }
        lse[(hd.b * p.heads_q + hd.h) * p.len_q + row] = lses[r];
    }
}
