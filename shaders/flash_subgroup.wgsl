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
// are consumed in blocks of 16 (or 32, see KEYS_PER_BLOCK): 64 (128) scores held in
// registers, masked in a loop over each four quads (skipped where no rule applies),
// one online-softmax step per row, then one pass over the accumulator, an octet of
// head-dim elements at a time, that rescales it and adds the block's probabilities
// times V. The accumulator lives in workgroup memory, which llvmpipe reads lane by
// lane: blocks of 16 keys touch it a quarter as often as blocks of 4 did (1.8x faster
// on lavapipe). No barriers (each invocation touches only its own slot of the
// workgroup arrays below). Lanes 0..7 of each subgroup must be active (the key loop is
// uniform across the workgroup). A dispatch walks the keys p.key_begin .. p.key_stop
// (masking those of its last block past p.key_stop) and may resume from an earlier
// one's results (resume_rows).

// Per invocation, the scaled Q rows and the unnormalised output rows are MAX_DIM
// vec4s each (component r: row r), reached by octets through q_octet/q_set_octet and
// acc_octet/acc_set_octet (acc_get/acc_set for one element), which a prelude defines
// with MAX_DIM (a multiple of 8, at least D and Dv; the host picks 64, 128 or 256).
// They live in workgroup memory, each invocation in its own slot of MAX_DIM vec4s
// (`slot`), wherever 8 slots of both fit in 32 KiB: llvmpipe turns every dynamically
// indexed access to a private array into a ladder of branches over the whole array,
// which took minutes to compile and ran slower. At MAX_DIM = 256 only the accumulator
// fits, and Q is read from the Q buffer at every block (q_rows, q_element).
const LANES: u32 = 8u;
// Invocations per workgroup (ROWS / 4): the host launches ROWS = 32, and the
// workgroup arrays hold SLOTS slots.
const SLOTS: u32 = 8u;
override ROWS: u32 = 32u;

var<private> slot: u32; // this invocation's first element in the workgroup arrays
var<private> q_rows: vec4<u32>; // where its 4 Q rows start in q
var<private> row_max: vec4<f32>;
var<private> row_sum: vec4<f32>;

// Keys go in blocks of KEYS_PER_BLOCK (16 or 32, from a prelude), as quads of 4 keys.
// Per quad, a `array<vec4<f32>, 4>` holds component r of row r for keys 4q + c,
// c = 0..3 (scores, then probabilities). Every array here is passed and indexed by
// value with constant indices, so the driver keeps it in registers: llvmpipe spills a
// dynamically indexed array to a ladder of branches, and does not unroll short
// constant-trip loops before it would. Blocks of 32 halve the accumulator's passes
// through workgroup memory and run faster on Mesa 22.3 (1.15-1.2x at (1,8,2048,64));
// on Mesa 25 they are slower (0.75x), so the host picks by driver. The second half-block's code is
// compiled only into the 32-key variants.
const WIDE_BLOCKS: bool = KEYS_PER_BLOCK > 16u;
fn quad_max(s: Quad) -> vec4<f32> {
    return max(max(s[0], s[1]), max(s[2], s[3]));
}

// Unnormalised probabilities of a quad (exactly 0 where masked).
fn quad_probs(s: Quad, m: vec4<f32>) -> Quad {
    return Quad(softmax_probs(s[0], m), softmax_probs(s[1], m), softmax_probs(s[2], m), softmax_probs(s[3], m));
}

fn quad_sum(s: Quad) -> vec4<f32> {
    return (s[0] + s[1]) + (s[2] + s[3]);
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
    let starts = key_starts(hd.b, clamped);
    // Clamped to this dispatch's key range: the last block may run past it.
    let ends = min(key_ends(hd.b, clamped), vec4<u32>(p.key_stop));
    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + ROWS - 1u, last_q)), p.key_stop);

    slot = lid.x * MAX_DIM;
    let d8 = (p.head_dim + 7u) / 8u;
    let dv8 = (p.head_dim_v + 7u) / 8u;
    let q_base = vec4<u32>(hd.b * p.q_stride_b + hd.h * p.q_stride_h) + clamped * p.q_stride_s;
    q_rows = q_base;
    // By octets, so that a private Q (MAX_DIM 256) is written with one dynamic index per
    // octet: each is a ladder of branches on llvmpipe.
    for (var t = 0u; t < d8; t++) {
        let d = t * LANES;
        q_set_octet(t, array<vec4<f32>, 8>(
            q_element(q_base, d),
            q_element(q_base, d + 1u),
            q_element(q_base, d + 2u),
            q_element(q_base, d + 3u),
            q_element(q_base, d + 4u),
            q_element(q_base, d + 5u),
            q_element(q_base, d + 6u),
            q_element(q_base, d + 7u),
        ));
    }
    resume_rows(hd, clamped, dv8 * 8u);

    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    for (var j0 = block_begin; j0 < block_end; j0 += KEYS_PER_BLOCK) {
        // Scores of the block's four quads (Q already carries the scale).
        var s0 = Quad();
        var s1 = Quad();
        var s2 = Quad();
        var s3 = Quad();
        var s4 = Quad();
        var s5 = Quad();
        var s6 = Quad();
        var s7 = Quad();
        let kr0 = row_offsets(true, hd.b, k_base, j0);
        let kr1 = row_offsets(true, hd.b, k_base, j0 + 4u);
        let kr2 = row_offsets(true, hd.b, k_base, j0 + 8u);
        let kr3 = row_offsets(true, hd.b, k_base, j0 + 12u);
        let kr4 = row_offsets(true, hd.b, k_base, j0 + 16u);
        let kr5 = row_offsets(true, hd.b, k_base, j0 + 20u);
        let kr6 = row_offsets(true, hd.b, k_base, j0 + 24u);
        let kr7 = row_offsets(true, hd.b, k_base, j0 + 28u);
        for (var t = 0u; t < d8; t++) {
            let d = t * LANES + lane;
            let qo = q_octet(t);
            s0 = add_scores(s0, qo, k_column(kr0, d));
            s1 = add_scores(s1, qo, k_column(kr1, d));
            s2 = add_scores(s2, qo, k_column(kr2, d));
            s3 = add_scores(s3, qo, k_column(kr3, d));
            if WIDE_BLOCKS {
                s4 = add_scores(s4, qo, k_column(kr4, d));
                s5 = add_scores(s5, qo, k_column(kr5, d));
                s6 = add_scores(s6, qo, k_column(kr6, d));
                s7 = add_scores(s7, qo, k_column(kr7, d));
            }
        }
        // Masks, softcap and ALiBi, unless the block needs none of them: in a loop over
        // the quads, so that the rules' code is compiled once rather than for each of
        // the block's keys (Mesa 25 took 10 s to compile the unrolled form cold).
        if !(only_key_ranges() && all(starts <= vec4<u32>(j0)) && all(vec4<u32>(j0 + KEYS_PER_BLOCK) <= ends)) {
            var quads = array<Quad, 4>(s0, s1, s2, s3);
            for (var c = 0u; c < 4u; c++) {
                quads[c] = mask_quad(hd, clamped, starts, ends, j0 + 4u * c, quads[c]);
            }
            s0 = quads[0];
            s1 = quads[1];
            s2 = quads[2];
            s3 = quads[3];
            if WIDE_BLOCKS {
                quads = array<Quad, 4>(s4, s5, s6, s7);
                for (var c = 0u; c < 4u; c++) {
                    quads[c] = mask_quad(hd, clamped, starts, ends, j0 + 16u + 4u * c, quads[c]);
                }
                s4 = quads[0];
                s5 = quads[1];
                s6 = quads[2];
                s7 = quads[3];
            }
        }

        // One online-softmax step over the block. The rescale of the accumulator rides
        // on the V pass below (alpha is exactly 1 where the maximum did not move).
        var block_max = max(max(quad_max(s0), quad_max(s1)), max(quad_max(s2), quad_max(s3)));
        if WIDE_BLOCKS {
            block_max = max(block_max, max(max(quad_max(s4), quad_max(s5)), max(quad_max(s6), quad_max(s7))));
        }
        let new_max = max(row_max, block_max);
        let alpha = softmax_rescale(row_max, new_max);
        row_max = new_max;
        let p0 = quad_probs(s0, new_max);
        let p1 = quad_probs(s1, new_max);
        let p2 = quad_probs(s2, new_max);
        let p3 = quad_probs(s3, new_max);
        var block_sum = (quad_sum(p0) + quad_sum(p1)) + (quad_sum(p2) + quad_sum(p3));
        var p4 = Quad();
        var p5 = Quad();
        var p6 = Quad();
        var p7 = Quad();
        if WIDE_BLOCKS {
            p4 = quad_probs(s4, new_max);
            p5 = quad_probs(s5, new_max);
            p6 = quad_probs(s6, new_max);
            p7 = quad_probs(s7, new_max);
            block_sum += (quad_sum(p4) + quad_sum(p5)) + (quad_sum(p6) + quad_sum(p7));
        }
        row_sum = row_sum * alpha + block_sum;

        let vr0 = row_offsets(false, hd.b, v_base, j0);
        let vr1 = row_offsets(false, hd.b, v_base, j0 + 4u);
        let vr2 = row_offsets(false, hd.b, v_base, j0 + 8u);
        let vr3 = row_offsets(false, hd.b, v_base, j0 + 12u);
        let vr4 = row_offsets(false, hd.b, v_base, j0 + 16u);
        let vr5 = row_offsets(false, hd.b, v_base, j0 + 20u);
        let vr6 = row_offsets(false, hd.b, v_base, j0 + 24u);
        let vr7 = row_offsets(false, hd.b, v_base, j0 + 28u);
        for (var t = 0u; t < dv8; t++) {
            let d = t * LANES + lane;
            var a = acc_octet(t);
            a[0] *= alpha;
            a[1] *= alpha;
            a[2] *= alpha;
            a[3] *= alpha;
            a[4] *= alpha;
            a[5] *= alpha;
            a[6] *= alpha;
            a[7] *= alpha;
            a = add_values(a, p0, v_column(vr0, d));
            a = add_values(a, p1, v_column(vr1, d));
            a = add_values(a, p2, v_column(vr2, d));
            a = add_values(a, p3, v_column(vr3, d));
            if WIDE_BLOCKS {
                a = add_values(a, p4, v_column(vr4, d));
                a = add_values(a, p5, v_column(vr5, d));
                a = add_values(a, p6, v_column(vr6, d));
                a = add_values(a, p7, v_column(vr7, d));
            }
            acc_set_octet(t, a);
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
