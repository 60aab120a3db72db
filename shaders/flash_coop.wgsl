enable f16;
enable wgpu_cooperative_matrix;

// Fused attention on tensor cores (cooperative matrices), in the FlashAttention-2
// shape: products in f16 with f32 accumulation, softmax in f32. With f16 storage this
// is the f16 kernel; with f32 storage it is Precision::Medium (Q, K, V and the
// probabilities rounded to f16 as they are staged). Built on the design measured fast
// on an H100 (docs/design.md, "Tensor cores"; our matmul_coop.wgsl): operands staged 16 bytes
// at a time into rows padded by 8 halves. Right on an NVIDIA H200 since its workgroup
// variables became whole 16-byte words (docs/design.md, "Tensor cores"): 20 TFLOP/s at
// (4,16,4096,128) f16 there, 2026-11-28.
//
// Generator parameters (a one-line prelude per variant, kernels::flash::coop): DMAX
// (head dims up to it), BR (query rows per workgroup), BANDS (16-row bands per
// subgroup, 1 or 2), BC (keys per tile), DIRECT (K and V fragments loaded straight
// from storage, below), SG (the adapter's fixed subgroup size, so that
// subgroup_id runs 0 .. SPLIT BR/(16 BANDS) - 1), SPLIT (subgroups per band, below),
// QR (Q chunks in workgroup memory, below), and LPR / RPL, the lanes per row and rows
// per lane of the softmax over a band's SPLIT SG lanes (SPLIT SG/16 and BANDS on
// 32-lane subgroups; 1 and 16 BANDS/(SPLIT SG) on narrower ones). The source goes
// through kernels::unroll: the Q fragments (`qf`),
// output tiles (`o`) and the per-band score and P fragments are arrays indexed by loop
// counters, or (the `named` axis) one named value each, their loops unrolled; the
// tuner times both, and both band counts.
//
// Per workgroup: BR query rows of one (batch, head). Subgroup g owns BANDS bands of 16
// rows from row 16 BANDS g and keeps, in registers, each band's Q as DMAX/16 A fragments
// (loaded once) and its output as DMAX/16 f32 accumulator tiles. With two bands each
// staged K and V fragment feeds two products (fragment loads per product halve; the
// registers double).
//
// D 256 (docs/isa.md; 0 spilled registers and 0 scratch on RDNA3 since 2026-12-07, from
// 9-42 spilled and 17-21 KiB of scratch): 16 Q fragments and 16 output tiles are 256
// VGPRs before any temporary, so
// - SPLIT = 2 (256x64x32): two subgroups share a band, subgroup half h holding output
//   tiles h OH .. h OH + OH - 1 (OH = D16/2) and computing score chunks h KH .. (KH =
//   KC/2) of each key tile over all of Q's chunks; the softmax's lanes per row span
//   both. The output's passes through `ss` put half h's tiles in slots h KH + u
//   (ss_col maps them back to output columns). 5 waves, was 3.
// - QR = 8 (256x32x16): Q's last QR chunks stay in workgroup memory (`qs`), re-read for
//   every score chunk after the D16 - QR in registers (the same sums in the same order),
//   and the passes through `ss` are written out with the tiles rotating (PASS_ROTATE),
//   so that `o` is only indexed by constants; a loop over the passes indexed it at run
//   time, and RDNA3's compiler kept all of it in scratch (16 KiB per wave). 30 KiB of
//   workgroup memory: 3 waves, was 4.
// - Q's fragments are loaded after the resume and each used at once by a "warm" chain
//   (LATE_Q, also in the named forms): loaded early, the compiler moved the assembly of
//   every fragment from its 32-bit words to just before the key loop and spilled.
// The key loop is software-pipelined
// by half a tile; round t, over tile t of BC keys:
//   A. O += P·V of tile t - 1 (P from the band's rows of `ps`, each P fragment loaded
//      once for all DMAX/16 output tiles), then each band's 16 x BC scores S = Q·Kᵀ of
//      tile t (B = Kᵀ read column-major from the staged K rows) to its rows of `ss`;
//   -- workgroup barrier --
//   B. softmax by every lane of the subgroup: LPR lanes per row, each on BC/LPR of its
//      columns (subgroup shuffles combine their maxima and sums); masks are skipped for
//      tiles every row of the band sees whole; P = exp(s - m) goes to `ps` as f16.
//      Meanwhile the next K tile and this V tile are written into `tiles`;
//   -- the rescale flag's workgroupUniformLoad (two barriers, back to back) --
//   C. rare: a row's reference maximum m moves only when the tile's maximum passes it
//      by more than TAU (so P <= e^TAU, which f16 holds with full relative precision);
//      then the output tiles go through `ss` to be rescaled before tile t's P·V. The
//      decision is the workgroup's: naga allows cooperative operations only in
//      workgroup-uniform control flow. After the first tile of random data it is rare.
// Every hand-over between a band's lanes (scores to the softmax, P to P·V) thus
// crosses a workgroup barrier the round has anyway: three per tile, none finer (naga
// writes subgroupBarrier() without the storage-class bit Vulkan requires).
//
// Staging: K and V tiles live in `tiles` (K, then V; rows padded to DMAX + 8 halves so the
// 8-row phases of a fragment load hit distinct banks). With WORDS (head dims and K/V
// strides whole 16-byte words, set by the host) every invocation fetches its share of
// the next K tile's and this V tile's words into registers at the start of round t,
// and writes them (as f16) in step B, so the loads overlap step A (f16 up to DMAX
// 128: EARLY_FETCH). f32 words, twice as many, and DMAX 256 copy them in step B, CW = 4
// words per invocation in flight at a time (copy_words; fetched all at once they were
// held together, 216-256 VGPRs and spills). Without WORDS the
// tiles are staged element by element with checks in step B. Rows past a key range's
// end are staged as zeros. Before the loop, `tiles` holds the first K tile and a zero V
// tile, `ps` zeros: round 0's P·V adds nothing.
//
// DIRECT (the `direct` axis, generator-level since it changes declarations): no K or V
// staging at all. Each K and V fragment is cooperatively loaded from the storage
// buffer (f16 rows, a 16-byte-aligned stride), as the reference GEMM measured at 75-80
// TFLOP/s loads both operands (L1 serves the four subgroups' re-reads): no staging
// stores, no prefetch registers, and `tiles` shrinks to Q's staging. The host runs a
// direct variant only where every fragment it loads lies inside real K and V rows
// (kernels::flash::coop, `direct_serves`: f16 storage, head dims DMAX, whole-word
// strides, no pages, key lengths or left window, key tiles that start at multiples of
// BC in a key count that is one); elsewhere its staged twin runs. Round 0's P·V, whose
// P is zero, reads the first tile's V (which round 1 multiplies anyway).
//
// The key loop ends at the last key the block's last row can see (causal, key lengths)
// and starts at p.key_begin, resuming from an earlier dispatch's output rows and
// log-sum-exps (attention_common.wgsl's resumed_max), as the other fused kernels.
//
// naga 30.0.1 trap: an index written inside coopLoad/coopStore's pointer argument makes
// its SPIR-V writer panic; every such index is named with `let` first.

//@if STAGED
// K and V again, as 16-byte words (read only with WORDS).
@group(0) @binding(9) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> v4: array<vec4<u32>>;

override WORDS: bool = false; // K/V rows are whole words at word offsets (host)
//@end

// SPLIT (the prelude's; 1 or 2) subgroups share each BANDS bands: subgroup half h of
// a band holds output tiles h OH .. h OH + OH - 1 and computes the score chunks
// h KH .. h KH + KH - 1 of every key tile.
const NSG: u32 = SPLIT * BR / (16u * BANDS); // subgroups
const NT: u32 = NSG * SG; // invocations
const D16: u32 = DMAX / 16u; // 16-wide chunks of the head dims
const KC: u32 = BC / 16u; // 16-key chunks of a tile
const OH: u32 = D16 / SPLIT; // output tiles per subgroup and band
const KH: u32 = KC / SPLIT; // score chunks per subgroup; `ss` slots per pass
const NG: u32 = (D16 + KC - 1u) / KC; // passes of the output tiles through `ss`
const OH_KH: u32 = max(OH, KH) - KH; // output tiles a rotating pass shifts down
const QK: u32 = D16 - QR; // Q chunks held in registers (QR, the prelude's, in `qs`)
const LDH: u32 = QR * 16u + 8u; // halves per row of `qs`
const LDQ: u32 = DMAX + 8u; // halves per staged Q, K or V row
const V_AT: u32 = BC * LDQ; // where the V tile starts in `tiles`
const LDS: u32 = BC + 4u; // floats per row of `ss`
const LDP: u32 = BC + 8u; // halves per row of `ps`
const QPL: u32 = BC / (4u * LPR); // column quads per lane and row in the softmax
const ROW_STEP: u32 = SPLIT * SG / LPR; // band rows between one lane's rows
const TAU: f32 = 8.0; // how far a row's maximum may run ahead of its reference
const WPR: u32 = DMAX / VE; // words per staged row
const TILE_WORDS: u32 = BC * WPR; // words of one K (or V) tile
const NPRE: u32 = (TILE_WORDS + NT - 1u) / NT; // of them per invocation
// Whether the words are fetched at the start of a round, their loads overlapping step
// A's products, or in step B just before they are written: held across the products,
// f32 words at DMAX 128 (twice f16's) and any at DMAX 256 spilled on RDNA3 (docs/isa.md).
const EARLY_FETCH: bool = ELEMS_PER_WORD == 2u && DMAX <= 128u;

//@if DIRECT
var<workgroup> tiles: array<f16, BR * LDQ>; // Q's staging only
//@else
var<workgroup> tiles: array<f16, 2u * BC * LDQ>;
//@end
var<workgroup> ss: array<f32, BR * LDS>;
var<workgroup> ps: array<f16, BR * LDP>;
//@if QR
var<workgroup> qs: array<f16, BR * LDH>; // Q's last QR chunks, for the whole kernel
//@end
// Some row's reference maximum moved this tile (element 0); DIRECT: whether the key
// loop ran (element 1, read once as a workgroup-uniform value). Four words, not one: every
// workgroup variable of a coop kernel is a multiple of 16 bytes, because the driver
// orders them as it likes and cooperative loads and stores need 16-byte-aligned
// pointers (docs/design.md, "Tensor cores"; a lone atomic shifted every tile on an H200).
var<workgroup> moved: array<atomic<u32>, 4>;

//@if STAGED
var<private> pre_k: array<vec4<u32>, NPRE>;
var<private> pre_v: array<vec4<u32>, NPRE>;

// Fetches this invocation's words of the K (or V) tile at tile0 into registers: row j
// of the tile, words up to `len` elements, zeros past `stop` keys.
fn fetch_words(src_is_k: bool, b: u32, base: u32, tile0: u32, len: u32, stop: u32, tid: u32) {
    let interior = tile0 + BC <= stop;
    for (var t = 0u; t < NPRE; t++) {
        let x = tid + t * NT;
        let j = x / WPR;
        let d = (x % WPR) * VE;
        var word = vec4<u32>(0u);
        if x < TILE_WORDS && (interior || tile0 + j < stop) && d < len {
            let at = (base + kv_offset(src_is_k, b, tile0 + j) + d) / VE;
            if src_is_k {
                word = k4[at];
            } else {
                word = v4[at];
            }
        }
        if src_is_k {
            pre_k[t] = word;
        } else {
            pre_v[t] = word;
        }
    }
}

// Fetches this invocation's words of the K (or V) tile at tile0 and writes each into
// its place in `tiles` at once (the words of fetch_words, put where put_words puts
// them), so that no word is held past its store: the late staging (!EARLY_FETCH).
const CW: u32 = 4u; // words per invocation in flight
fn copy_words(src_is_k: bool, b: u32, base: u32, tile0: u32, len: u32, stop: u32, tid: u32) {
    let interior = tile0 + BC <= stop;
    let region = select(V_AT, 0u, src_is_k);
    // CW words at a time: a loop from tid, which the compiler does not unroll (fully
    // unrolled, every word's load was issued first and all were held at once).
    for (var x0 = tid; x0 < TILE_WORDS; x0 += CW * NT) {
        for (var i = 0u; i < CW; i++) {
            let x = x0 + i * NT;
            let j = x / WPR;
            let d = (x % WPR) * VE;
            if x < TILE_WORDS {
                var word = vec4<u32>(0u);
                if (interior || tile0 + j < stop) && d < len {
                    let at = (base + kv_offset(src_is_k, b, tile0 + j) + d) / VE;
                    if src_is_k {
                        word = k4[at];
                    } else {
                        word = v4[at];
                    }
                }
                put_word(region + j * LDQ + d, word);
            }
        }
    }
}

// Writes the fetched K (or V) words into their tile of `tiles`.
fn put_words(src_is_k: bool, tid: u32) {
    let region = select(V_AT, 0u, src_is_k);
    for (var t = 0u; t < NPRE; t++) {
        let x = tid + t * NT;
        if x < TILE_WORDS {
            let at = region + (x / WPR) * LDQ + (x % WPR) * VE;
            if src_is_k {
                put_word(at, pre_k[t]);
            } else {
                put_word(at, pre_v[t]);
            }
        }
    }
}

// Stages the K (or V) tile at tile0 element by element (head dims or strides that are
// not whole words): zeros past `stop` keys and `len` head dims.
fn stage_elements(src_is_k: bool, b: u32, base: u32, tile0: u32, len: u32, stop: u32, tid: u32) {
    let region = select(V_AT, 0u, src_is_k);
    for (var x = tid; x < BC * DMAX; x += NT) {
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
        tiles[region + j * LDQ + d] = value;
    }
}
//@end

// O += P·V for a band: P from its rows of `ps`, V from the V tile, each P fragment
// loaded once for all DMAX/16 output tiles, each V fragment once for all BANDS bands
// (DIRECT: from the V rows of the tile at pv0). A macro, written out where it runs: the
// output tiles may be named values, which no function can take as one argument.
//@macro PV_STEP
    for (var kc = 0u; kc < KC; kc++) {
        //@array pf BANDS coop_mat16x16<f16, A>
        //@each bb < BANDS
        let ia = (band + 16u * bb) * LDP + kc * 16u;
        pf@{bb} = coopLoadT<coop_mat16x16<f16, A>>(&ps[ia], LDP);
        //@end
        //@each c < OH
        //@if DIRECT
        let ib = v_at + (pv0 + kc * 16u) * v_rows + (half * OH + c) * 16u;
        let b = coopLoadT<coop_mat16x16<f16, B>>(&v[ib], v_rows);
        //@else
        let ib = V_AT + kc * 16u * LDQ + (half * OH + c) * 16u;
        let b = coopLoadT<coop_mat16x16<f16, B>>(&tiles[ib], LDQ);
        //@end
        //@each bb < BANDS
        o@{bb * OH + c} = coopMultiplyAdd(pf@{bb}, b, o@{bb * OH + c});
        //@end
        //@end
    }
//@endmacro

// The output tiles' passes through the band's rows of `ss`, KC slots per pass: slot
// h KH + u holds tile g KH + u of subgroup half h in pass g. Written out with the
// tiles rotating (ROTATE): every pass stores the first KH tiles and then shifts the tiles down
// by KH, so that `o` is only ever indexed by constants, in the arrayed form too (a
// loop over the passes otherwise indexes it at run time, and the compiler keeps it in
// scratch: 16 KiB per wave at D 256). After NG passes the order is back.
//@macro PASS_STORE
        //@each bb < BANDS
        //@if ROTATE
        //@unroll u < KH
        let is = (band + 16u * bb) * LDS + (half * KH + u) * 16u;
        coopStoreT(o@{bb * OH + u}, &ss[is], LDS);
        //@end
        //@else
        //@each u < KH while g * KH + u < OH
        let is = (band + 16u * bb) * LDS + (half * KH + u) * 16u;
        coopStoreT(o@{bb * OH + g * KH + u}, &ss[is], LDS);
        //@end
        //@end
        //@end
//@endmacro
//@macro PASS_ROTATE
        //@if ROTATE
        //@each bb < BANDS
        //@unroll i < OH_KH
        o@{bb * OH + i} = o@{bb * OH + i + KH};
        //@end
        //@end
        //@end
//@endmacro
//@macro PASS_LOAD
        //@each bb < BANDS
        //@if ROTATE
        //@unroll u < KH
        let is = (band + 16u * bb) * LDS + (half * KH + u) * 16u;
        o@{bb * OH + OH_KH + u} = coopLoadT<coop_mat16x16<f32, C>>(&ss[is], LDS);
        //@end
        //@else
        //@each u < KH while g * KH + u < OH
        let is = (band + 16u * bb) * LDS + (half * KH + u) * 16u;
        o@{bb * OH + g * KH + u} = coopLoadT<coop_mat16x16<f32, C>>(&ss[is], LDS);
        //@end
        //@end
        //@end
//@endmacro

// The output column of column x of the band's `ss` rows in pass g (PASS_STORE's slots).
// Without a split (SPLIT_ON 0), column g KC 16 + x, written at the call (through the
// function, 6-10 instructions more on RDNA3).
fn ss_col(g: u32, x: u32) -> u32 {
    let u = x / 16u;
    return ((u / KH) * OH + g * KH + u % KH) * 16u + x % 16u;
}

@compute @workgroup_size(NT, 1, 1)
fn flash_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let hd = head_of(p.bh_start + wid.y);
    let row0 = wid.x * BR;
    let last_q = p.len_q - 1u;
    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;
    //@if DIRECT
    // Where K's and V's rows start and their strides, in 16-byte words of 8 halves:
    // the values themselves (the host runs a direct variant only on whole-word strides),
    // written so that every fragment's pointer is visibly 16-byte aligned.
    let k_at = 8u * (k_base / 8u);
    let v_at = 8u * (v_base / 8u);
    let k_rows = 8u * (p.k_stride_s / 8u);
    let v_rows = 8u * (p.v_stride_s / 8u);
    //@end
    let band = (sg / SPLIT) * 16u * BANDS; // first row of this subgroup's bands, within the block
    let half = sg % SPLIT; // which part of the bands' output tiles and score chunks
    let rl = half * SG + lane; // this lane among its bands' SPLIT subgroups
    let quad0 = rl % LPR; // this lane's first column quad in the softmax
    // Keys past the key length are never visible to any row: their V rows are staged
    // as zeros, so that 0 x (whatever the buffer holds there) cannot reach the output.
    var kv_stop = p.len_k;
    if p.has_key_lengths != 0u {
        kv_stop = min(kv_stop, side_words[hd.b]);
    }

    // Q, unscaled (f16 inputs stay exact), 2 BC rows at a time through `tiles` (every
    // variant has BR <= 2 BC): each subgroup takes its band's fragments.
    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;
    for (var x = tid; x < BR * DMAX; x += NT) {
        let r = x / DMAX;
        let d = x % DMAX;
        var value = f16(0.0);
        if row0 + r < p.len_q && d < p.head_dim {
            value = f16(q[q_head + (row0 + r) * p.q_stride_s + d]);
        }
        tiles[r * LDQ + d] = value;
        //@if QR
        if d >= QK * 16u {
            qs[r * LDH + d - QK * 16u] = value;
        }
        //@end
    }
    if tid == 0u {
        atomicStore(&moved[0], 0u);
    }
    workgroupBarrier();
    //@if EARLY_Q
    //@array qf QK*BANDS coop_mat16x16<f16, A>
    //@each bb < BANDS
    //@each dc < QK
    let ia = (band + 16u * bb) * LDQ + dc * 16u;
    qf@{bb * QK + dc} = coopLoadT<coop_mat16x16<f16, A>>(&tiles[ia], LDQ);
    //@end
    //@end
    //@end

    // This lane's rows of the band: running maximum, sum and last rescale factor.
    var row_max: array<f32, RPL>;
    var row_sum: array<f32, RPL>;
    var row_alpha: array<f32, RPL>;
    for (var rr = 0u; rr < RPL; rr++) {
        let r = rl / LPR + rr * ROW_STEP;
        row_max[rr] = resumed_max(hd, min(row0 + band + r, last_q));
        row_sum[rr] = resumed_sum(row_max[rr]);
        row_alpha[rr] = 1.0;
    }

    // Output tiles: zeros, or the rows an earlier key range left (through the band's
    // rows of `ss`, BC columns at a time).
    //@array o OH*BANDS coop_mat16x16<f32, C>
    //@each c < OH * BANDS
    o@{c} = coop_mat16x16<f32, C>();
    //@end
    if p.key_begin != 0u {
        //@each g < NG
            for (var rr = 0u; rr < RPL; rr++) {
                let r = rl / LPR + rr * ROW_STEP;
                let row = row0 + band + r;
                let seen = row < p.len_q && !is_neg_inf(row_max[rr]);
                for (var u = 0u; u < QPL; u++) {
                    let j = 4u * (quad0 + LPR * u);
                    for (var e = 0u; e < 4u; e++) {
                        //@if SPLIT_ON
                        let col = ss_col(g, j + e);
                        //@else
                        let col = g * KC * 16u + j + e;
                        //@end
                        var value = 0.0;
                        if seen && col < p.head_dim_v {
                            value = f32(output[o_head + row * p.o_stride_s + col]);
                        }
                        ss[(band + r) * LDS + j + e] = value;
                    }
                }
            }
            workgroupBarrier();
            //@expand PASS_ROTATE
            //@expand PASS_LOAD
            workgroupBarrier();
        //@end
    }

    // Uniform across the workgroup: from its first row's first key to the last key its
    // last row sees. The band's own range decides which tiles skip the masks.
    let block_begin = block_key_begin(hd.b, min(row0, last_q));
    let block_end = min(key_end(hd.b, min(row0 + BR - 1u, last_q)), p.key_stop);
    let band_first = min(row0 + band, last_q);
    let band_last = min(row0 + band + 16u * BANDS - 1u, last_q);
    let band_start = key_start(hd.b, band_last);
    let band_end = min(key_end(hd.b, band_first), p.key_stop);
    let plain = only_key_ranges();

    //@if LATE_Q
    // Q's fragments, from `tiles` (the resume above leaves it alone), loaded here and
    // not before the resume: each is loaded as 32-bit words and assembled from halves,
    // and given no use before the key loop the compiler moved that assembly of all of
    // them to just before the loop, where RDNA3's compiler split them into 16-bit
    // values and spilled (D 256, docs/isa.md). The "warm" chain uses each fragment at
    // once; its result goes to the band's `ss` rows, which two barriers separate from
    // the first scores stored there.
    //@array qf QK*BANDS coop_mat16x16<f16, A>
    //@each bb < BANDS
    //@each dc < QK
    let ia = (band + 16u * bb) * LDQ + dc * 16u;
    qf@{bb * QK + dc} = coopLoadT<coop_mat16x16<f16, A>>(&tiles[ia], LDQ);
    //@end
    //@end
    //@each bb < BANDS
    {
        var warm = coop_mat16x16<f32, C>();
        let zb = coop_mat16x16<f16, B>();
        //@each dc < QK
        warm = coopMultiplyAdd(qf@{bb * QK + dc}, zb, warm);
        //@end
        let is = (band + 16u * bb) * LDS + half * 16u;
        coopStoreT(warm, &ss[is], LDS);
    }
    //@end

    //@end

    // Every band has its Q fragments: `tiles` takes the first K tile and a zero V tile,
    // `ps` zeros (the first round's P·V below adds nothing).
    workgroupBarrier();
    for (var x = rl; x < 16u * BANDS * LDP; x += SPLIT * SG) {
        ps[band * LDP + x] = f16(0.0);
    }
    //@if DIRECT
    if tid == 0u {
        atomicStore(&moved[1], u32(block_begin < block_end));
    }
    // Whether the loop runs, as a value naga takes as uniform (the last P·V's condition).
    let ran = workgroupUniformLoad(&moved[1]) != 0u;
    //@else
    for (var x = tid; x < BC * LDQ; x += NT) {
        tiles[V_AT + x] = f16(0.0);
    }
    if WORDS {
        if EARLY_FETCH {
            fetch_words(true, hd.b, k_base, block_begin, p.head_dim, p.len_k, tid);
            put_words(true, tid);
        } else {
            copy_words(true, hd.b, k_base, block_begin, p.head_dim, p.len_k, tid);
        }
    } else {
        stage_elements(true, hd.b, k_base, block_begin, p.head_dim, p.len_k, tid);
    }
    workgroupBarrier();
    //@end

    // Software-pipelined by half a tile: round t computes the scores of tile t and
    // P·V of tile t - 1, so that every exchange between a band's lanes (scores to the
    // softmax, P to P·V) crosses a workgroup barrier the round has anyway. naga writes
    // subgroupBarrier() with no storage-class bit, which Vulkan rejects (docs/design.md,
    // "naga 30 and spirv-val"), so nothing finer is available.
    for (var tile0 = block_begin; tile0 < block_end; tile0 += BC) {
        let next = tile0 + BC;
        let has_next = next < block_end;
        //@if DIRECT
        // V of the previous tile (round 0: of this one, times a zero P).
        let pv0 = select(tile0 - BC, tile0, tile0 == block_begin);
        //@else
        if WORDS && EARLY_FETCH {
            if has_next {
                fetch_words(true, hd.b, k_base, next, p.head_dim, p.len_k, tid);
            }
            fetch_words(false, hd.b, v_base, tile0, p.head_dim_v, kv_stop, tid);
        }
        //@end

        // P·V of the previous tile (P in `ps`, V in the V tile), then this tile's
        // scores, unscaled, to the band's rows of `ss`.
        //@expand PV_STEP
        for (var kh = 0u; kh < KH; kh++) {
            let kc = half * KH + kh;
            //@array s BANDS coop_mat16x16<f32, C>
            //@each bb < BANDS
            s@{bb} = coop_mat16x16<f32, C>();
            //@end
            //@each dc < QK
            //@if DIRECT
            let ib = k_at + (tile0 + kc * 16u) * k_rows + dc * 16u;
            let b = coopLoad<coop_mat16x16<f16, B>>(&k[ib], k_rows);
            //@else
            let ib = kc * 16u * LDQ + dc * 16u;
            let b = coopLoad<coop_mat16x16<f16, B>>(&tiles[ib], LDQ);
            //@end
            //@each bb < BANDS
            s@{bb} = coopMultiplyAdd(qf@{bb * QK + dc}, b, s@{bb});
            //@end
            //@end
            // Q's chunks past QK, from `qs`, after those in registers (the same sums in
            // the same order).
            //@if QR
            //@each dr < QR
            //@if DIRECT
            let ib = k_at + (tile0 + kc * 16u) * k_rows + (QK + dr) * 16u;
            let b = coopLoad<coop_mat16x16<f16, B>>(&k[ib], k_rows);
            //@else
            let ib = kc * 16u * LDQ + (QK + dr) * 16u;
            let b = coopLoad<coop_mat16x16<f16, B>>(&tiles[ib], LDQ);
            //@end
            //@each bb < BANDS
            let ia = (band + 16u * bb) * LDH + dr * 16u;
            let a = coopLoadT<coop_mat16x16<f16, A>>(&qs[ia], LDH);
            s@{bb} = coopMultiplyAdd(a, b, s@{bb});
            //@end
            //@end
            //@end
            //@each bb < BANDS
            let is = (band + 16u * bb) * LDS + kc * 16u;
            coopStoreT(s@{bb}, &ss[is], LDS);
            //@end
        }
        // The scores are in; every band is done with the K tile and the V tile.
        workgroupBarrier();

        // Softmax step of this lane's rows, over its column quads.
        let interior = plain && tile0 >= band_start && next <= band_end;
        for (var rr = 0u; rr < RPL; rr++) {
            let r = rl / LPR + rr * ROW_STEP;
            let i = min(row0 + band + r, last_q);
            let start = vec4<u32>(key_start(hd.b, i));
            let end = vec4<u32>(min(key_end(hd.b, i), p.key_stop));
            var sv: array<vec4<f32>, QPL>;
            var tile_max = neg_inf();
            for (var u = 0u; u < QPL; u++) {
                let j = 4u * (quad0 + LPR * u);
                let at = (band + r) * LDS + j;
                var s4 = vec4<f32>(ss[at], ss[at + 1u], ss[at + 2u], ss[at + 3u]) * p.scale;
                if !interior {
                    let keys = keys4(tile0 + j);
                    let in_range = in_key_range(keys, start, end);
                    s4 = apply_masks(s4, hd.b, vec4<u32>(hd.h), vec4<u32>(i), keys, in_range, mask_words_of_keys(hd.b, hd.h, i, tile0 + j));
                }
                sv[u] = s4;
                tile_max = max(tile_max, max(max(s4.x, s4.y), max(s4.z, s4.w)));
            }
            for (var x = 1u; x < LPR; x *= 2u) {
                tile_max = max(tile_max, subgroupShuffleXor(tile_max, x));
            }
            var m = row_max[rr];
            var alpha = 1.0;
            if is_neg_inf(m) {
                // Nothing seen yet: the row's output and sum are zero.
                m = tile_max;
                alpha = 0.0;
            } else if tile_max > m + TAU {
                alpha = softmax_rescale(vec4<f32>(m), vec4<f32>(tile_max)).x;
                m = tile_max;
                atomicMax(&moved[0], 1u);
            }
            var sum = 0.0;
            for (var u = 0u; u < QPL; u++) {
                let j = 4u * (quad0 + LPR * u);
                let p4 = softmax_probs(sv[u], vec4<f32>(m));
                let e = vec4<f16>(p4);
                let pa = (band + r) * LDP + j;
                ps[pa] = e.x;
                ps[pa + 1u] = e.y;
                ps[pa + 2u] = e.z;
                ps[pa + 3u] = e.w;
                // The f32 values: the log-sum-exp stays as exact as the scores (P·V
                // weighs the f16 ones, an error within the f16 rule).
                sum += dot(p4, vec4<f32>(1.0));
            }
            for (var x = 1u; x < LPR; x *= 2u) {
                sum += subgroupShuffleXor(sum, x);
            }
            row_sum[rr] = row_sum[rr] * alpha + sum;
            row_max[rr] = m;
            row_alpha[rr] = alpha;
        }

        // The next K tile and this V tile go in.
        //@if STAGED
        if WORDS {
            if EARLY_FETCH {
                if has_next {
                    put_words(true, tid);
                }
                put_words(false, tid);
            } else {
                if has_next {
                    copy_words(true, hd.b, k_base, next, p.head_dim, p.len_k, tid);
                }
                copy_words(false, hd.b, v_base, tile0, p.head_dim_v, kv_stop, tid);
            }
        } else {
            if has_next {
                stage_elements(true, hd.b, k_base, next, p.head_dim, p.len_k, tid);
            }
            stage_elements(false, hd.b, v_base, tile0, p.head_dim_v, kv_stop, tid);
        }
        //@end

        // Rare: some row's reference maximum moved; every row's output tiles are
        // rescaled by its alpha (1 for the rows that did not move) before this tile's
        // P·V is added. The flag is cleared after every invocation read it and before
        // any can set it again (past the next round's barrier). A function variable
        // would not do as the condition: naga takes every one as non-uniform.
        let rescale = workgroupUniformLoad(&moved[0]) != 0u;
        if tid == 0u {
            atomicStore(&moved[0], 0u);
        }
        if rescale {
            //@each g < NG
                //@expand PASS_STORE
                workgroupBarrier();
                for (var rr = 0u; rr < RPL; rr++) {
                    let at = (band + rl / LPR + rr * ROW_STEP) * LDS;
                    for (var u = 0u; u < QPL; u++) {
                        let j = at + 4u * (quad0 + LPR * u);
                        ss[j] *= row_alpha[rr];
                        ss[j + 1u] *= row_alpha[rr];
                        ss[j + 2u] *= row_alpha[rr];
                        ss[j + 3u] *= row_alpha[rr];
                    }
                }
                workgroupBarrier();
                //@expand PASS_ROTATE
                //@expand PASS_LOAD
                // Which lanes load which elements is the driver's choice: the next
                // round's stores must not overtake this round's loads.
                workgroupBarrier();
            //@end
        }
    }
    // The last tile's P·V.
    //@if DIRECT
    if ran {
        let pv0 = block_begin + (block_end - 1u - block_begin) / BC * BC;
        //@expand PV_STEP
    }
    //@else
    //@expand PV_STEP
    //@end

    // Normalise and store through the band's `ss` rows; rows that saw no key get zeros
    // and lse = -inf. Every output tile goes through, also those past the value head
    // dim (the lanes' stores check the column): a loop that stopped there would index
    // `o` with values only known at run time, a suspect for this kernel's wrong results
    // on NVIDIA (docs/design.md, "Tensor cores"; tests/coop_patterns.wgsl's
    // accumulators_at_runtime_indices).
    //@each g < NG
        //@expand PASS_STORE
        //@expand PASS_ROTATE
        workgroupBarrier();
        for (var rr = 0u; rr < RPL; rr++) {
            let r = rl / LPR + rr * ROW_STEP;
            let row = row0 + band + r;
            let inv = row_inv_sum(row_sum[rr]);
            for (var u = 0u; u < QPL; u++) {
                let j = 4u * (quad0 + LPR * u);
                for (var e = 0u; e < 4u; e++) {
                    //@if SPLIT_ON
                    let col = ss_col(g, j + e);
                    //@else
                    let col = g * KC * 16u + j + e;
                    //@end
                    if row < p.len_q && col < p.head_dim_v {
                        output[o_head + row * p.o_stride_s + col] = elem(ss[(band + r) * LDS + j + e] * inv);
                    }
                }
            }
        }
        workgroupBarrier();
    //@end
    if quad0 == 0u {
        for (var rr = 0u; rr < RPL; rr++) {
            let row = row0 + band + rl / LPR + rr * ROW_STEP;
            if row < p.len_q {
                lse[(hd.b * p.heads_q + hd.h) * p.len_q + row] = row_lse(row_max[rr], row_sum[rr]);
            }
        }
    }
}
