// The backward pass of fused attention for GPUs: FlashAttention-2's dQ and dK/dV passes
// (flash_backward.wgsl says what each computes) with both operands of every product in
// workgroup memory, as the forward's `shared` tiling keeps them; appended to
// attention_common.wgsl and backward_common.wgsl. The prelude sets DMAX (the head dims'
// bound, a multiple of 4), T (rows and keys per tile) and NT (invocations);
// kernels::backward_blocked picks the first variant that fits the adapter's workgroup
// memory.
//
// Tiling. A workgroup of NT invocations owns a tile of T query rows (dQ) or T keys
// (dK/dV) of one (batch, head) and walks tiles of T of the other side. Input tiles
// hold `tile_elem` (the prelude's: the inputs' elements, or f16 for f32 inputs whose
// products may round to f16; f16 tiles take half the memory, so they come larger),
// rows of DMAX / 4 vec4s padded to an odd count (RS), so that 8 invocations reading 8
// consecutive rows at one column hit distinct banks; P and dX tiles are f32.
//   1. stage: every invocation loads its share of the walked tiles (K and V, or Q and
//      dO) from storage into workgroup memory;
//   -- barrier --
//   2. scores: owner o < T·T/4 (invocation o, o + NT, ...) takes one row and one quad of
//      4 keys (dQ), or one key and one quad of 4 rows (dK/dV), recomputes their scores
//      and dP = dO·V (dot products over the head dims), applies the forward's rules
//      (apply_masks), and writes P = exp(s - lse) (dK/dV only) and
//      dX = P (dP - D) · cap slope · scale, a vec4 each, to workgroup memory. Where the
//      owners are fewer than the invocations (SPLIT = NT / (T·T/4) > 1), invocation
//      o + h·T·T/4 sums the h-th of SPLIT slices of the head dims, and after a barrier
//      owner o adds the other slices' sums (in slice order) before masking; where they
//      are twice as many (PAIRS), invocation o takes owners o and o + NT, which share
//      their quad, reading each walked vec4 once for both;
//   -- barrier --
//   3. products: invocation (column t = tid % D4, rows or keys tid / D4 + NR·u, u < RB)
//      adds to its RB vec4 accumulators: dQ += dX·K, or dV += Pᵀ·dO and dK += dXᵀ·Q;
//   -- barrier -- (before the next tile's stage)
// Within a tile, the quad a score owner reads is stored permuted (row 4c + u at
// u·T/4 + c), so that owners c = 0, 1, ... read consecutive rows. The owned tile (Q and
// dO, or K and V) is staged once. The walk skips the tiles the masks hide (as
// flash_backward.wgsl: key ranges, rows_seeing) and honours p.key_begin .. p.key_stop,
// adding to what an earlier dispatch left (a loop cap splits long walks). Each sum runs
// in a fixed order: results repeat bit for bit. K rows past a key length (which may hold
// anything) are staged as zeros: dQ multiplies them by dX = 0, and 0 x NaN would spread.

const D4: u32 = DMAX / 4u; // vec4 columns
const RS: u32 = D4 + 1u; // vec4s per tile row, odd
const QUADS: u32 = T / 4u; // quads of rows or keys per tile
const OWNERS: u32 = T * QUADS; // score owners
const NR: u32 = NT / D4; // rows (keys) the product invocations of one column step by
const RB: u32 = T / NR; // rows (keys) per product invocation
const SPLIT: u32 = max(1u, NT / OWNERS); // slices of the head dims per score owner
const PAIRS: bool = OWNERS == 2u * NT; // each invocation takes two score owners at once

// The owned tile (Q and dO, or K and V) and the walked one (K and V, or Q and dO).
var<workgroup> own_a: array<vec4<tile_elem>, T * RS>;
var<workgroup> own_b: array<vec4<tile_elem>, T * RS>;
var<workgroup> walk_a: array<vec4<tile_elem>, T * RS>;
var<workgroup> walk_b: array<vec4<tile_elem>, T * RS>;
// dX (and P, dK/dV only) of a tile: [row][key quad] (dQ) or [key][row quad] (dK/dV).
var<workgroup> dx_tile: array<vec4<f32>, OWNERS>;
var<workgroup> p_tile: array<vec4<f32>, OWNERS>;
// The score and dP sums of slices 1 .. SPLIT - 1 (SPLIT > 1 only).
var<workgroup> slice_x: array<vec4<f32>, OWNERS * (SPLIT - 1u) + 1u>;
var<workgroup> slice_dp: array<vec4<f32>, OWNERS * (SPLIT - 1u) + 1u>;

// Where row (or key) r of a walked tile lives: quads stored permuted (header).
fn permuted(r: u32) -> u32 {
    return (r % 4u) * QUADS + r / 4u;
}

// Four dot products, over vec4 columns first .. end, of the owned row at `own` with
// walked rows 4c .. 4c + 3 (permuted): of the a tiles (Q·K) or the b tiles (dO·V).
fn dots_own_walk(own: u32, c: u32, first: u32, end: u32, of_a: bool) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    let r0 = permuted(4u * c) * RS;
    let r1 = permuted(4u * c + 1u) * RS;
    let r2 = permuted(4u * c + 2u) * RS;
    let r3 = permuted(4u * c + 3u) * RS;
    for (var t = first; t < end; t++) {
        if of_a {
            let o = vec4<f32>(own_a[own + t]);
            x += vec4<f32>(
                dot(o, vec4<f32>(walk_a[r0 + t])),
                dot(o, vec4<f32>(walk_a[r1 + t])),
                dot(o, vec4<f32>(walk_a[r2 + t])),
                dot(o, vec4<f32>(walk_a[r3 + t])),
            );
        } else {
            let o = vec4<f32>(own_b[own + t]);
            x += vec4<f32>(
                dot(o, vec4<f32>(walk_b[r0 + t])),
                dot(o, vec4<f32>(walk_b[r1 + t])),
                dot(o, vec4<f32>(walk_b[r2 + t])),
                dot(o, vec4<f32>(walk_b[r3 + t])),
            );
        }
    }
    return x;
}

// The dot products of two owned rows (at own0 and own1) with walked rows 4c .. 4c + 3,
// over vec4 columns 0 .. n, each walked vec4 read once for both: columns 0 and 1 of
// the result.
fn pair_dots(own0: u32, own1: u32, c: u32, n: u32, of_a: bool) -> mat2x4<f32> {
    var x0 = vec4<f32>(0.0);
    var x1 = vec4<f32>(0.0);
    let r0 = permuted(4u * c) * RS;
    let r1 = permuted(4u * c + 1u) * RS;
    let r2 = permuted(4u * c + 2u) * RS;
    let r3 = permuted(4u * c + 3u) * RS;
    for (var t = 0u; t < n; t++) {
        if of_a {
            let w0 = vec4<f32>(walk_a[r0 + t]);
            let w1 = vec4<f32>(walk_a[r1 + t]);
            let w2 = vec4<f32>(walk_a[r2 + t]);
            let w3 = vec4<f32>(walk_a[r3 + t]);
            let a0 = vec4<f32>(own_a[own0 + t]);
            let a1 = vec4<f32>(own_a[own1 + t]);
            x0 += vec4<f32>(dot(a0, w0), dot(a0, w1), dot(a0, w2), dot(a0, w3));
            x1 += vec4<f32>(dot(a1, w0), dot(a1, w1), dot(a1, w2), dot(a1, w3));
        } else {
            let w0 = vec4<f32>(walk_b[r0 + t]);
            let w1 = vec4<f32>(walk_b[r1 + t]);
            let w2 = vec4<f32>(walk_b[r2 + t]);
            let w3 = vec4<f32>(walk_b[r3 + t]);
            let a0 = vec4<f32>(own_b[own0 + t]);
            let a1 = vec4<f32>(own_b[own1 + t]);
            x0 += vec4<f32>(dot(a0, w0), dot(a0, w1), dot(a0, w2), dot(a0, w3));
            x1 += vec4<f32>(dot(a1, w0), dot(a1, w1), dot(a1, w2), dot(a1, w3));
        }
    }
    return mat2x4<f32>(x0, x1);
}

// Score owners o and o + NT (same quad, rows or keys NT / QUADS apart) together:
// each one's scores (unscaled) and dP, as slice_sums gives them.
fn pair_sums(o: u32, d4: u32, dv4: u32) -> array<mat2x4<f32>, 2> {
    let own0 = o / QUADS * RS;
    let own1 = (o + NT) / QUADS * RS;
    let x = pair_dots(own0, own1, o % QUADS, d4, true);
    let dp = pair_dots(own0, own1, o % QUADS, dv4, false);
    return array<mat2x4<f32>, 2>(mat2x4<f32>(x[0], dp[0]), mat2x4<f32>(x[1], dp[1]));
}

// A slice's share of vec4 columns 0 .. n: slice h of SPLIT.
fn slice_of(h: u32, n: u32) -> vec2<u32> {
    let per = (n + SPLIT - 1u) / SPLIT;
    return vec2<u32>(min(h * per, n), min((h + 1u) * per, n));
}

// Slice h = i / OWNERS of score owner o = i % OWNERS: its scores (unscaled) and dP over
// its share of the head dims, columns 0 and 1 of the result; slices past the first
// leave theirs in workgroup memory for the first (gather_slices, after a barrier).
fn slice_sums(i: u32, d4: u32, dv4: u32) -> mat2x4<f32> {
    let o = i % OWNERS;
    let h = i / OWNERS;
    let r = o / QUADS;
    let c = o % QUADS;
    let qk = slice_of(h, d4);
    let ov = slice_of(h, dv4);
    let x = dots_own_walk(r * RS, c, qk.x, qk.y, true);
    let dp = dots_own_walk(r * RS, c, ov.x, ov.y, false);
    if h > 0u {
        slice_x[(h - 1u) * OWNERS + o] = x;
        slice_dp[(h - 1u) * OWNERS + o] = dp;
    }
    return mat2x4<f32>(x, dp);
}

// Owner o's whole sums: its first slice's plus the others', in slice order.
fn gather_slices(o: u32, first: mat2x4<f32>) -> mat2x4<f32> {
    var sums = first;
    for (var g = 1u; g < SPLIT; g++) {
        sums[0] += slice_x[(g - 1u) * OWNERS + o];
        sums[1] += slice_dp[(g - 1u) * OWNERS + o];
    }
    return sums;
}

// dQ pass, step 2 for owner o (row r = o / QUADS, keys j0 + 4c .. + 3): dX.
fn dq_scores(hd: Head, row0: u32, j0: u32, o: u32, sums: mat2x4<f32>) {
    let r = o / QUADS;
    let c = o % QUADS;
    let i = min(row0 + r, p.len_q - 1u);
    let x = sums[0] * p.scale;
    let keys = keys4(j0 + 4u * c);
    let in_range = in_key_range(keys, vec4<u32>(key_start(hd.b, i)), vec4<u32>(min(key_end(hd.b, i), p.key_stop)));
    let s = apply_masks(x, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_range, mask_words_of_keys(hd.b, hd.h, i, j0 + 4u * c));
    let pr = probs_of(s, vec4<f32>(lse_at(hd, i)));
    dx_tile[o] = dx_of(pr, sums[1], vec4<f32>(delta_at(hd, i)), cap_slope(x)) * p.scale;
}

// dK/dV pass, step 2 for owner o (key key0 + o / QUADS, rows i0 + 4c .. + 3 of the
// visible rows' end `rows_end`): P and dX.
fn dkdv_scores(hd: Head, key0: u32, i0: u32, rows_end: u32, o: u32, sums: mat2x4<f32>) {
    let r = o / QUADS;
    let c = o % QUADS;
    let j = key0 + r;
    let b = hd.b;
    let x = sums[0] * p.scale;
    let rows4 = vec4<u32>(i0 + 4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
    let r4 = min(rows4, vec4<u32>(p.len_q - 1u));
    let in_range = in_key_range(vec4<u32>(j), key_starts(b, r4), key_ends(b, r4)) & (rows4 < vec4<u32>(rows_end));
    let s = apply_masks(x, b, vec4<u32>(hd.h), r4, vec4<u32>(j), in_range, mask_words_of_rows(b, hd.h, r4, j));
    let lse4 = vec4<f32>(lse_at(hd, r4.x), lse_at(hd, r4.y), lse_at(hd, r4.z), lse_at(hd, r4.w));
    let delta4 = vec4<f32>(delta_at(hd, r4.x), delta_at(hd, r4.y), delta_at(hd, r4.z), delta_at(hd, r4.w));
    let pr = probs_of(s, lse4);
    p_tile[o] = pr;
    dx_tile[o] = dx_of(pr, sums[1], delta4, cap_slope(x)) * p.scale;
}

@compute @workgroup_size(NT, 1, 1)
fn bwd_dq_blocked(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = head_of(p.bh_start + wid.y);
    let row0 = wid.x * T;
    let last_row = p.len_q - 1u;
    let d4 = (p.head_dim + 3u) / 4u;
    let dv4 = (p.head_dim_v + 3u) / 4u;
    // The owned rows: Q and dO.
    for (var e = tid; e < T * D4; e += NT) {
        let r = e / D4;
        let t = e % D4;
        let i = min(row0 + r, last_row);
        own_a[r * RS + t] = vec4<tile_elem>(qrow4(q_base(hd, i), t));
        own_b[r * RS + t] = vec4<tile_elem>(doload4(do_base(hd, i), t));
    }
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let limit = key_limit(hd.b);
    var acc: array<vec4<f32>, RB>;
    for (var u = 0u; u < RB; u++) {
        acc[u] = vec4<f32>(0.0);
    }
    let col = tid % D4;
    let first = block_key_begin(hd.b, min(row0, last_row));
    let last = min(key_end(hd.b, min(row0 + T - 1u, last_row)), p.key_stop);
    for (var j0 = first; j0 < last; j0 += T) {
        workgroupBarrier();
        // 1. K and V of keys j0 .. j0 + T.
        for (var e = tid; e < T * D4; e += NT) {
            let r = e / D4;
            let t = e % D4;
            let j = min(j0 + r, p.len_k - 1u);
            let at = permuted(r) * RS + t;
            var kt = vec4<f32>(0.0);
            if j0 + r < limit {
                kt = load4(true, k_base + kv_offset(true, hd.b, j), t, p.head_dim);
            }
            walk_a[at] = vec4<tile_elem>(kt);
            walk_b[at] = vec4<tile_elem>(load4(false, v_base + kv_offset(false, hd.b, j), t, p.head_dim_v));
        }
        workgroupBarrier();
        // 2. dX of (row r, keys 4c .. 4c + 3).
        if SPLIT > 1u {
            let sums = slice_sums(tid, d4, dv4);
            workgroupBarrier();
            if tid < OWNERS {
                dq_scores(hd, row0, j0, tid, gather_slices(tid, sums));
            }
        } else if PAIRS {
            let sums = pair_sums(tid, d4, dv4);
            dq_scores(hd, row0, j0, tid, sums[0]);
            dq_scores(hd, row0, j0, tid + NT, sums[1]);
        } else {
            for (var o = tid; o < OWNERS; o += NT) {
                dq_scores(hd, row0, j0, o, slice_sums(o, d4, dv4));
            }
        }
        workgroupBarrier();
        // 3. dQ += dX·K.
        for (var c = 0u; c < QUADS; c++) {
            let k0 = vec4<f32>(walk_a[permuted(4u * c) * RS + col]);
            let k1 = vec4<f32>(walk_a[permuted(4u * c + 1u) * RS + col]);
            let k2 = vec4<f32>(walk_a[permuted(4u * c + 2u) * RS + col]);
            let k3 = vec4<f32>(walk_a[permuted(4u * c + 3u) * RS + col]);
            for (var u = 0u; u < RB; u++) {
                let dx = dx_tile[(tid / D4 + NR * u) * QUADS + c];
                acc[u] += dx.x * k0 + dx.y * k1 + dx.z * k2 + dx.w * k3;
            }
        }
    }
    // dQ of the owned rows, column col.
    for (var u = 0u; u < RB; u++) {
        let row = row0 + tid / D4 + NR * u;
        if row < p.len_q {
            let base = q_base(hd, row);
            for (var c = 0u; c < 4u; c++) {
                let d = col * 4u + c;
                if d < p.head_dim {
                    store_dq_element(base + d, acc[u][c]);
                }
            }
        }
    }
}

@compute @workgroup_size(NT, 1, 1)
fn bwd_dkdv_blocked(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    // p.bh_start + wid.y counts (batch, kv head) pairs; p.key_begin .. p.key_stop are
    // query rows in this pass.
    let pair = p.bh_start + wid.y;
    let b = pair / p.heads_kv;
    let hk = pair % p.heads_kv;
    let key0 = wid.x * T;
    let d4 = (p.head_dim + 3u) / 4u;
    let dv4 = (p.head_dim_v + 3u) / 4u;
    let k_base = b * p.k_stride_b + hk * p.k_stride_h;
    let v_base = b * p.v_stride_b + hk * p.v_stride_h;
    // The owned keys: K and V.
    for (var e = tid; e < T * D4; e += NT) {
        let r = e / D4;
        let t = e % D4;
        let j = min(key0 + r, p.len_k - 1u);
        own_a[r * RS + t] = vec4<tile_elem>(load4(true, k_base + kv_offset(true, b, j), t, p.head_dim));
        own_b[r * RS + t] = vec4<tile_elem>(load4(false, v_base + kv_offset(false, b, j), t, p.head_dim_v));
    }
    var acc_k: array<vec4<f32>, RB>;
    var acc_v: array<vec4<f32>, RB>;
    for (var u = 0u; u < RB; u++) {
        acc_k[u] = vec4<f32>(0.0);
        acc_v[u] = vec4<f32>(0.0);
    }
    let col = tid % D4;
    let group = p.heads_q / p.heads_kv;
    let rows = rows_seeing(b, key0, min(key0 + T, p.len_k) - 1u);
    let last_row = p.len_q - 1u;
    for (var g = 0u; g < group; g++) {
        let hd = Head(b, hk * group + g, hk);
        for (var i0 = rows.x; i0 < rows.y; i0 += T) {
            workgroupBarrier();
            // 1. Q and dO of rows i0 .. i0 + T.
            for (var e = tid; e < T * D4; e += NT) {
                let r = e / D4;
                let t = e % D4;
                let i = min(i0 + r, last_row);
                let at = permuted(r) * RS + t;
                walk_a[at] = vec4<tile_elem>(qrow4(q_base(hd, i), t));
                walk_b[at] = vec4<tile_elem>(doload4(do_base(hd, i), t));
            }
            workgroupBarrier();
            // 2. P and dX of (key r, rows 4c .. 4c + 3).
            if SPLIT > 1u {
                let sums = slice_sums(tid, d4, dv4);
                workgroupBarrier();
                if tid < OWNERS {
                    dkdv_scores(hd, key0, i0, rows.y, tid, gather_slices(tid, sums));
                }
            } else if PAIRS {
                let sums = pair_sums(tid, d4, dv4);
                dkdv_scores(hd, key0, i0, rows.y, tid, sums[0]);
                dkdv_scores(hd, key0, i0, rows.y, tid + NT, sums[1]);
            } else {
                for (var o = tid; o < OWNERS; o += NT) {
                    dkdv_scores(hd, key0, i0, rows.y, o, slice_sums(o, d4, dv4));
                }
            }
            workgroupBarrier();
            // 3. dV += Pᵀ·dO, dK += dXᵀ·Q.
            for (var c = 0u; c < QUADS; c++) {
                let q0 = vec4<f32>(walk_a[permuted(4u * c) * RS + col]);
                let q1 = vec4<f32>(walk_a[permuted(4u * c + 1u) * RS + col]);
                let q2 = vec4<f32>(walk_a[permuted(4u * c + 2u) * RS + col]);
                let q3 = vec4<f32>(walk_a[permuted(4u * c + 3u) * RS + col]);
                let o0 = vec4<f32>(walk_b[permuted(4u * c) * RS + col]);
                let o1 = vec4<f32>(walk_b[permuted(4u * c + 1u) * RS + col]);
                let o2 = vec4<f32>(walk_b[permuted(4u * c + 2u) * RS + col]);
                let o3 = vec4<f32>(walk_b[permuted(4u * c + 3u) * RS + col]);
                for (var u = 0u; u < RB; u++) {
                    let at = (tid / D4 + NR * u) * QUADS + c;
                    let pr = p_tile[at];
                    let dx = dx_tile[at];
                    acc_v[u] += pr.x * o0 + pr.y * o1 + pr.z * o2 + pr.w * o3;
                    acc_k[u] += dx.x * q0 + dx.y * q1 + dx.z * q2 + dx.w * q3;
                }
            }
        }
    }
    // dK and dV of the owned keys, column col.
    for (var u = 0u; u < RB; u++) {
        let key = key0 + tid / D4 + NR * u;
        if key < p.len_k {
            let kb = k_base + kv_offset(true, b, key);
            let vb = v_base + kv_offset(false, b, key);
            let seen = key < key_limit(b); // else 0 (backward_common.wgsl, key_limit)
            for (var c = 0u; c < 4u; c++) {
                let d = col * 4u + c;
                if d < p.head_dim {
                    store_dk_element(kb + d, select(0.0, acc_k[u][c], seen));
                }
                if d < p.head_dim_v {
                    store_dv_element(vb + d, select(0.0, acc_v[u][c], seen));
                }
            }
        }
    }
}
