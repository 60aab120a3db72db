// Fused attention in full f32 without tensor cores, in the FlashAttention-2 shape, on
// the register-blocked GEMM pattern of matmul_blocked.wgsl: a workgroup owns BR = 64
// query rows of one (batch, head) and streams the keys in tiles of BC = 64; both
// products of a tile (S = Q·Kᵀ and O += P·V) are GEMMs whose operands come through
// workgroup memory in double-buffered slabs, read as vec4s into register micro-tiles.
//
// Tiling. 256 invocations, (ty, tx) = (index / 16, index % 16). Invocation (ty, tx) owns
// query rows 4 ty .. 4 ty + 3 of the block in both products:
//   - S: the 4 x 4 micro-tile of keys 4 tx .. 4 tx + 3 of the tile (s0..s3, one vec4 of
//     4 keys per row);
//   - O: the 4 x (DMAX / 16) micro-tile of value columns 4 (tx + 16 q) .. + 3 for
//     q < OQ = DMAX / 64 (oQI: row I, vec4 q), so that neighbouring invocations read
//     neighbouring vec4s of a staged V row.
// Every register is a named value, never an array indexed by a loop counter (a driver
// that does not unroll such a loop keeps the array in local memory; matmul_blocked.wgsl).
// A row's 16 owners (consecutive invocations) all keep its running maximum; each keeps
// the share of its running sum over its own keys, summed at the end. The shuffles
// assume that a subgroup is a run of consecutive invocation indices starting at a
// multiple of its size, as on every driver this project has run on.
//
// Per key tile, a stream of slabs through two halves of `slabs` (8 KiB each), used in
// turn: ceil(D / 16) slabs of Qᵀ and Kᵀ (16 head-dim columns of the 64 rows and 64 keys,
// transposed so that both operands load as vec4 of 4 rows or keys), then BC / VK slabs
// of V (VK = 2048 / DMAX keys of whole rows). Each step
//   1. loads the next slab of the stream (this tile's, or the next tile's first) from
//      storage into registers: invocations 0..63 a 4 x 4 block of Q (pre-scaled),
//      64..127 one of K, or all 256 two quads of V; 16-byte loads of K and V where the
//      host found their rows to be whole 16-byte words (the `words` twin), else element
//      by element (kv_quad);
//   2. computes from the current slab: per head-dim column 2 vec4 reads and 16
//      multiply-adds (S), or per key 1 + OQ vec4 reads and 16 OQ (O);
//   3. stores the registers of 1 into the other half (transposed for Q and K: every
//      vec4 has one writer);
//   -- one barrier --
// Between the S slabs and the V slabs, the softmax: masks (apply_masks) on the micro-tile,
// the tile maximum of each row across its 16 owners (subgroup shuffles over RL lanes, the
// rest through workgroup memory in the half no slab is using), exp, the output rescaled,
// and P stored transposed (`pt`: per key, a vec4 of 4 rows) -- one barrier (two where
// partial maxima go through workgroup memory).
//
// Bank conflicts (32 banks of 4 bytes; 16-byte accesses served 8 invocations at a
// time): the transposed Q and K stores put row group g of column k at g ^ 2 (k / 4)
// (the 8 invocations of a store phase write 4 columns of 2 groups, as in the GEMM), P
// rows at g ^ (k / 4) (a store phase's 8 invocations write 8 different keys of one row
// group); reads are broadcasts or 16 distinct vec4s.
//
// Generator parameters (a prelude per variant, kernels::flash::variants): DMAX (64, 128
// or 256: head dims up to it) and RL (lanes a row's maximum and sum are reduced over with
// subgroup shuffles: 1 without subgroups, 8 or 16; lanes_max and lanes_sum come with it).
// Workgroup memory: 32 KiB for every DMAX (slabs 16, P 16).
//
// The key loop ends at the last key the block's last row can see (causal, key lengths),
// so tiles wholly above the causal diagonal are never loaded, and starts at p.key_begin:
// a dispatch may resume from an earlier one's output rows and log-sum-exps
// (attention_common.wgsl's resumed_max). K and V rows past key_limit are staged as zeros.

const NT: u32 = 256u; // invocations
const BR: u32 = 64u; // query rows per workgroup
const BC: u32 = 64u; // keys per tile
const D4: u32 = DMAX / 4u; // vec4s per staged V row
const OQ: u32 = DMAX / 64u; // output vec4 columns per invocation
const HALF: u32 = 512u; // vec4s per half of `slabs`
const KT_AT: u32 = 256u; // where Kᵀ starts in a Q/K slab (Qᵀ at 0)
const VK: u32 = HALF / D4; // keys per V slab
const NVS: u32 = BC / VK; // V slabs per tile
const NP: u32 = 16u / RL; // partials of a row's maximum and sum in workgroup memory

var<workgroup> slabs: array<vec4<f32>, 2u * HALF>;
var<workgroup> pt: array<vec4<f32>, BC * 16u>;

// Four vec4s: what one invocation carries from storage to the other half of `slabs` (four
// rows of a 4 x 4 block of Q or K, or two V quads in a, b), or one row of its output
// micro-tile (its OQ quads).
struct Staged {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

// Where the Q/K staging of a slab puts column k (0..15) of row group g (0..15).
fn qk_at(k: u32, g: u32) -> u32 {
    return k * 16u + (g ^ ((k / 4u) * 2u));
}

// Where key k (0..63) of row group g sits in `pt`.
fn pt_at(k: u32, g: u32) -> u32 {
    return k * 16u + (g ^ (k / 4u));
}

// The block's coordinates, fixed for the dispatch.
struct Block {
    hd: Head,
    row0: u32,
    q_head: u32,
    k_base: u32,
    v_base: u32,
    kv_stop: u32,
}

// Quad t of key `key`'s K (is_k) or V row: zeros past kv_stop and past the head dim
// (n4 quads of `len` elements).
fn kv_row_quad(blk: Block, is_k: bool, key: u32, t: u32, n4: u32, len: u32) -> vec4<f32> {
    if key < blk.kv_stop && t < n4 {
        let base = select(blk.v_base, blk.k_base, is_k);
        return kv_quad(is_k, base + kv_offset(is_k, blk.hd.b, key), t, len);
    }
    return vec4<f32>(0.0);
}

// Step 1 for Q/K slab `slab` (head-dim columns 16 slab ..) of the tile at tile0.
fn load_qk(blk: Block, tile0: u32, slab: u32, f: u32) -> Staged {
    var st = Staged(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let g = (f % 64u) / 4u; // rows (keys) 4 g .. 4 g + 3
    let t = slab * 4u + f % 4u; // head-dim quad
    if f < 64u {
        let last_q = p.len_q - 1u;
        let r = blk.row0 + 4u * g;
        let stride = p.q_stride_s;
        st.a = qload4(blk.q_head + min(r, last_q) * stride, t) * p.scale;
        st.b = qload4(blk.q_head + min(r + 1u, last_q) * stride, t) * p.scale;
        st.c = qload4(blk.q_head + min(r + 2u, last_q) * stride, t) * p.scale;
        st.d = qload4(blk.q_head + min(r + 3u, last_q) * stride, t) * p.scale;
    } else if f < 128u {
        let d4 = (p.head_dim + 3u) / 4u;
        let key = tile0 + 4u * g;
        st.a = kv_row_quad(blk, true, key, t, d4, p.head_dim);
        st.b = kv_row_quad(blk, true, key + 1u, t, d4, p.head_dim);
        st.c = kv_row_quad(blk, true, key + 2u, t, d4, p.head_dim);
        st.d = kv_row_quad(blk, true, key + 3u, t, d4, p.head_dim);
    }
    return st;
}

// Step 3 for a Q/K slab: the 4 x 4 block transposed, one vec4 (4 rows) per column.
fn store_qk(half: u32, f: u32, st: Staged) {
    if f >= 128u {
        return;
    }
    let g = (f % 64u) / 4u;
    let k0 = (f % 4u) * 4u;
    let base = half + select(KT_AT, 0u, f < 64u);
    slabs[base + qk_at(k0, g)] = vec4<f32>(st.a.x, st.b.x, st.c.x, st.d.x);
    slabs[base + qk_at(k0 + 1u, g)] = vec4<f32>(st.a.y, st.b.y, st.c.y, st.d.y);
    slabs[base + qk_at(k0 + 2u, g)] = vec4<f32>(st.a.z, st.b.z, st.c.z, st.d.z);
    slabs[base + qk_at(k0 + 3u, g)] = vec4<f32>(st.a.w, st.b.w, st.c.w, st.d.w);
}

// Step 1 for V slab `slab` (keys VK slab ..) of the tile at tile0: quads f and f + 256
// of its rows.
fn load_v(blk: Block, tile0: u32, slab: u32, f: u32) -> Staged {
    let dv4 = (p.head_dim_v + 3u) / 4u;
    let key = tile0 + slab * VK;
    let x0 = f;
    let x1 = f + NT;
    return Staged(
        kv_row_quad(blk, false, key + x0 / D4, x0 % D4, dv4, p.head_dim_v),
        kv_row_quad(blk, false, key + x1 / D4, x1 % D4, dv4, p.head_dim_v),
        vec4<f32>(0.0),
        vec4<f32>(0.0),
    );
}

// Step 3 for a V slab: rows in key order.
fn store_v(half: u32, f: u32, st: Staged) {
    slabs[half + f] = st.a;
    slabs[half + f + NT] = st.b;
}

// The maximum of each of 4 rows' 4 scores.
fn max4(s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(
        max(max(s0.x, s0.y), max(s0.z, s0.w)),
        max(max(s1.x, s1.y), max(s1.z, s1.w)),
        max(max(s2.x, s2.y), max(s2.z, s2.w)),
        max(max(s3.x, s3.y), max(s3.z, s3.w)),
    );
}

fn sum4(s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(
        (s0.x + s0.y) + (s0.z + s0.w),
        (s1.x + s1.y) + (s1.z + s1.w),
        (s2.x + s2.y) + (s2.z + s2.w),
        (s3.x + s3.y) + (s3.z + s3.w),
    );
}

// Scores of one row of the micro-tile: masked as every kernel masks them.
fn mask_row(blk: Block, row: u32, j0: u32, start: u32, end: u32, s: vec4<f32>) -> vec4<f32> {
    let keys = keys4(j0);
    let in_range = in_key_range(keys, vec4<u32>(start), vec4<u32>(end));
    let words = mask_words_of_keys(blk.hd.b, blk.hd.h, row, j0);
    return apply_masks(s, blk.hd.b, vec4<u32>(blk.hd.h), vec4<u32>(row), keys, in_range, words);
}

// The 4 output elements of vec4 column c4 of row `row` (resumed rows), zero past Dv.
fn output_quad(o_head: u32, row: u32, c4: u32) -> vec4<f32> {
    var o = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if c4 * 4u + c < p.head_dim_v {
            o[c] = f32(output[o_head + row * p.o_stride_s + c4 * 4u + c]);
        }
    }
    return o;
}

fn store_output_quad(o_head: u32, row: u32, c4: u32, o: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        if c4 * 4u + c < p.head_dim_v {
            output[o_head + row * p.o_stride_s + c4 * 4u + c] = elem(o[c]);
        }
    }
}

// This invocation's OQ output quads of `row` (vec4 columns tx + 16 q), for a resumed row;
// zeros past OQ.
fn output_row(o_head: u32, row: u32, tx: u32) -> Staged {
    var r = Staged(output_quad(o_head, row, tx), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    if OQ > 1u {
        r.b = output_quad(o_head, row, tx + 16u);
    }
    if OQ > 2u {
        r.c = output_quad(o_head, row, tx + 32u);
        r.d = output_quad(o_head, row, tx + 48u);
    }
    return r;
}

// Stores this invocation's OQ output quads of `row` times `inv`, unless the row is
// past the end.
fn store_output_row(o_head: u32, row: u32, tx: u32, o: Staged, inv: f32) {
    if row >= p.len_q {
        return;
    }
    store_output_quad(o_head, row, tx, o.a * inv);
    if OQ > 1u {
        store_output_quad(o_head, row, tx + 16u, o.b * inv);
    }
    if OQ > 2u {
        store_output_quad(o_head, row, tx + 32u, o.c * inv);
        store_output_quad(o_head, row, tx + 48u, o.d * inv);
    }
}

@compute @workgroup_size(256, 1, 1)
fn flash_micro(@builtin(local_invocation_index) f: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = head_of(p.bh_start + wid.y);
    let ty = f / 16u;
    let tx = f % 16u;
    let last_q = p.len_q - 1u;
    let blk = Block(
        hd,
        wid.x * BR,
        hd.b * p.q_stride_b + hd.h * p.q_stride_h,
        hd.b * p.k_stride_b + hd.hk * p.k_stride_h,
        hd.b * p.v_stride_b + hd.hk * p.v_stride_h,
        key_limit(hd.b),
    );
    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;
    let ns = (p.head_dim + 15u) / 16u; // Q/K slabs per tile

    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees.
    let block_begin = block_key_begin(hd.b, min(blk.row0, last_q));
    let block_end = min(key_end(hd.b, min(blk.row0 + BR - 1u, last_q)), p.key_stop);

    // This invocation's rows, their visible key ranges (a tile may run past this
    // dispatch's range; its keys belong to the next), running maxima, and its share of
    // the running sums (the resumed sum is tx 0's).
    let rows = min(vec4<u32>(blk.row0 + 4u * ty) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_q));
    let starts = key_starts(hd.b, rows);
    let ends = min(key_ends(hd.b, rows), vec4<u32>(p.key_stop));
    var m = vec4<f32>(resumed_max(hd, rows.x), resumed_max(hd, rows.y), resumed_max(hd, rows.z), resumed_max(hd, rows.w));
    let resumed = vec4<f32>(resumed_sum(m.x), resumed_sum(m.y), resumed_sum(m.z), resumed_sum(m.w));
    var l = select(vec4<f32>(0.0), resumed, tx == 0u);

    // The output micro-tile, resumed where an earlier dispatch saw keys.
    var o00 = vec4<f32>(0.0);
    var o01 = vec4<f32>(0.0);
    var o02 = vec4<f32>(0.0);
    var o03 = vec4<f32>(0.0);
    var o10 = vec4<f32>(0.0);
    var o11 = vec4<f32>(0.0);
    var o12 = vec4<f32>(0.0);
    var o13 = vec4<f32>(0.0);
    var o20 = vec4<f32>(0.0);
    var o21 = vec4<f32>(0.0);
    var o22 = vec4<f32>(0.0);
    var o23 = vec4<f32>(0.0);
    var o30 = vec4<f32>(0.0);
    var o31 = vec4<f32>(0.0);
    var o32 = vec4<f32>(0.0);
    var o33 = vec4<f32>(0.0);
    if p.key_begin != 0u {
        let seen = resumed != vec4<f32>(0.0);
        if seen.x {
            let r = output_row(o_head, rows.x, tx);
            o00 = r.a;
            o10 = r.b;
            o20 = r.c;
            o30 = r.d;
        }
        if seen.y {
            let r = output_row(o_head, rows.y, tx);
            o01 = r.a;
            o11 = r.b;
            o21 = r.c;
            o31 = r.d;
        }
        if seen.z {
            let r = output_row(o_head, rows.z, tx);
            o02 = r.a;
            o12 = r.b;
            o22 = r.c;
            o32 = r.d;
        }
        if seen.w {
            let r = output_row(o_head, rows.w, tx);
            o03 = r.a;
            o13 = r.b;
            o23 = r.c;
            o33 = r.d;
        }
    }

    // The first tile's first Q/K slab.
    var cur = 0u; // the half the current slab is in
    if block_begin < block_end {
        store_qk(cur, f, load_qk(blk, block_begin, 0u, f));
    }
    workgroupBarrier();

    for (var tile0 = block_begin; tile0 < block_end; tile0 += BC) {
        let has_next = tile0 + BC < block_end; // uniform

        // S = Q·Kᵀ, slab by slab; the last step loads the first V slab.
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        var s2 = vec4<f32>(0.0);
        var s3 = vec4<f32>(0.0);
        for (var slab = 0u; slab < ns; slab++) {
            let qk_next = slab + 1u < ns; // uniform
            var st: Staged;
            if qk_next {
                st = load_qk(blk, tile0, slab + 1u, f);
            } else {
                st = load_v(blk, tile0, 0u, f);
            }
            for (var k = 0u; k < 16u; k++) {
                let qv = slabs[cur + qk_at(k, ty)];
                let kv = slabs[cur + KT_AT + qk_at(k, tx)];
                s0 += qv.x * kv;
                s1 += qv.y * kv;
                s2 += qv.z * kv;
                s3 += qv.w * kv;
            }
            if qk_next {
                store_qk(cur ^ HALF, f, st);
            } else {
                store_v(cur ^ HALF, f, st);
            }
            workgroupBarrier();
            cur ^= HALF;
        }

        // Softmax step: masks, each row's tile maximum across its 16 owners, P.
        let j0 = tile0 + 4u * tx;
        s0 = mask_row(blk, rows.x, j0, starts.x, ends.x, s0);
        s1 = mask_row(blk, rows.y, j0, starts.y, ends.y, s1);
        s2 = mask_row(blk, rows.z, j0, starts.z, ends.z, s2);
        s3 = mask_row(blk, rows.w, j0, starts.w, ends.w, s3);
        var tile_max = lanes_max(max4(s0, s1, s2, s3));
        if NP > 1u {
            // Through the half the last Q/K slab was in: every read of it is behind the
            // barrier that ended the S loop, and the next V slab is stored there only
            // after the barrier below.
            let red = cur ^ HALF;
            if tx % RL == 0u {
                slabs[red + (tx / RL) * 16u + ty] = tile_max;
            }
            workgroupBarrier();
            tile_max = slabs[red + ty];
            for (var i = 1u; i < NP; i++) {
                tile_max = max(tile_max, slabs[red + i * 16u + ty]);
            }
        }
        let new_max = max(m, tile_max);
        let alpha = softmax_rescale(m, new_max);
        m = new_max;
        let p0 = softmax_probs(s0, vec4<f32>(new_max.x));
        let p1 = softmax_probs(s1, vec4<f32>(new_max.y));
        let p2 = softmax_probs(s2, vec4<f32>(new_max.z));
        let p3 = softmax_probs(s3, vec4<f32>(new_max.w));
        l = l * alpha + sum4(p0, p1, p2, p3);
        let k0 = 4u * tx;
        pt[pt_at(k0, ty)] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
        pt[pt_at(k0 + 1u, ty)] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
        pt[pt_at(k0 + 2u, ty)] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
        pt[pt_at(k0 + 3u, ty)] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
        o00 *= alpha.x;
        o01 *= alpha.y;
        o02 *= alpha.z;
        o03 *= alpha.w;
        if OQ > 1u {
            o10 *= alpha.x;
            o11 *= alpha.y;
            o12 *= alpha.z;
            o13 *= alpha.w;
        }
        if OQ > 2u {
            o20 *= alpha.x;
            o21 *= alpha.y;
            o22 *= alpha.z;
            o23 *= alpha.w;
            o30 *= alpha.x;
            o31 *= alpha.y;
            o32 *= alpha.z;
            o33 *= alpha.w;
        }
        workgroupBarrier();

        // O += P·V, slab by slab; the last step loads the next tile's first Q/K slab.
        for (var vslab = 0u; vslab < NVS; vslab++) {
            let v_next = vslab + 1u < NVS; // uniform
            var st: Staged;
            if v_next {
                st = load_v(blk, tile0, vslab + 1u, f);
            } else if has_next {
                st = load_qk(blk, tile0 + BC, 0u, f);
            }
            for (var kk = 0u; kk < VK; kk++) {
                let pc = pt[pt_at(vslab * VK + kk, ty)];
                let row = cur + kk * D4 + tx;
                let v0 = slabs[row];
                o00 += pc.x * v0;
                o01 += pc.y * v0;
                o02 += pc.z * v0;
                o03 += pc.w * v0;
                if OQ > 1u {
                    let v1 = slabs[row + 16u];
                    o10 += pc.x * v1;
                    o11 += pc.y * v1;
                    o12 += pc.z * v1;
                    o13 += pc.w * v1;
                }
                if OQ > 2u {
                    let v2 = slabs[row + 32u];
                    let v3 = slabs[row + 48u];
                    o20 += pc.x * v2;
                    o21 += pc.y * v2;
                    o22 += pc.z * v2;
                    o23 += pc.w * v2;
                    o30 += pc.x * v3;
                    o31 += pc.y * v3;
                    o32 += pc.z * v3;
                    o33 += pc.w * v3;
                }
            }
            if v_next {
                store_v(cur ^ HALF, f, st);
            } else if has_next {
                store_qk(cur ^ HALF, f, st);
            }
            workgroupBarrier();
            cur ^= HALF;
        }
    }

    // Each row's sum from its owners' shares (every read of `slabs` is behind the last
    // barrier).
    var sum = lanes_sum(l);
    if NP > 1u {
        if tx % RL == 0u {
            slabs[(tx / RL) * 16u + ty] = sum;
        }
        workgroupBarrier();
        sum = slabs[ty];
        for (var i = 1u; i < NP; i++) {
            sum += slabs[i * 16u + ty];
        }
    }

    // Normalise and store; rows that saw no key get zeros and lse = -inf.
    let inv = vec4<f32>(row_inv_sum(sum.x), row_inv_sum(sum.y), row_inv_sum(sum.z), row_inv_sum(sum.w));
    let row = blk.row0 + 4u * ty;
    store_output_row(o_head, row, tx, Staged(o00, o10, o20, o30), inv.x);
    store_output_row(o_head, row + 1u, tx, Staged(o01, o11, o21, o31), inv.y);
    store_output_row(o_head, row + 2u, tx, Staged(o02, o12, o22, o32), inv.z);
    store_output_row(o_head, row + 3u, tx, Staged(o03, o13, o23, o33), inv.w);
    if tx == 0u {
        let lse_row0 = (hd.b * p.heads_q + hd.h) * p.len_q + row;
        if row < p.len_q {
            lse[lse_row0] = row_lse(m.x, sum.x);
        }
        if row + 1u < p.len_q {
            lse[lse_row0 + 1u] = row_lse(m.y, sum.y);
        }
        if row + 2u < p.len_q {
            lse[lse_row0 + 2u] = row_lse(m.z, sum.z);
        }
        if row + 3u < p.len_q {
            lse[lse_row0 + 3u] = row_lse(m.w, sum.w);
        }
    }
}
