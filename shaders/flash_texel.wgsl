// Fused attention for CPU adapters with 8-lane subgroups (lavapipe), K and V read as
// texel fetches: the `subgroup` tiling's kernel where the head dims allow it
// (src/kernels/flash_texel.rs picks it and writes the entry point, `flash_texel`,
// whose loops it unrolls; this file holds the helpers). Same masking and
// online-softmax rules as every kernel (attention_common.wgsl).
//
// Why this shape: llvmpipe runs a subgroup of 8 invocations as one SIMD batch. It
// gathers texel fetches but walks storage and workgroup-memory loads lane by lane,
// and it compiles a dynamically indexed private array into a ladder of branches. So
// nothing here is indexed dynamically: per row and head-dim slice, values are named
// SSA values of the unrolled entry point, which LLVM keeps in registers or spills with
// whole-vector stack loads and stores.
//
// Tiling: a workgroup is one subgroup of 8 invocations and owns ROWS query rows of one
// (batch, head), in quads (four rows as a vec4's components). Keys go in blocks of
// 8 * KEYS_PER_LANE: lane l scores keys j0 + 8c + l. A K or V row is fetched a 16-byte
// word at a time from the texel mirror (4 f32 or 8 f16 elements, one texel; the
// mirror's layout is kernels::kv_texels::TexelGrid):
//   - Q·Kᵀ: lane l holds, for every quad, the Q elements of word 8g + l of each group
//     g of 8 words; for word t of its keys, lane l takes the quad's Q elements of word
//     t from lane t % 8 (subgroupBroadcast) and multiplies them into its keys'
//     scores: one broadcast feeds KEYS_PER_LANE multiply-adds.
//   - softmax: subgroupMax gives every lane the block maxima of the quad's rows;
//     each lane keeps its own partial sums, added across lanes at the end.
//   - P·V: lane l owns word 8c + l of each chunk c of the output rows; for each key of
//     the block it fetches that word of the key's V row and adds it, times the key's
//     probability (broadcast from the lane that scored the key), into every row.
// No workgroup memory, no barriers. docs/design.md, "Kernel paths and tilings", has
// the measurements.

// 1 where explicit masks, soft-capping or ALiBi apply (only_key_ranges() is false):
// the host compiles a pipeline with the rules' code only for such problems.
override FULL_RULES: u32 = 1u;
// 1 for paged K and V (p.page_size > 0).
override PAGED: u32 = 1u;

// The first word of key j's row in K or V (j clamped to last_read_key: rows past it
// are never fetched, their keys always masked). The host guarantees whole words. Through the
// block table only in pipelines made for paged K and V (PAGED): kv_offset's branch
// on the page size, though uniform, slowed the key loop and its cold compile.
fn row_word(src_is_k: bool, b: u32, base: u32, j: u32) -> u32 {
    let jc = min(j, last_read_key(b));
    var offset = jc * select(p.v_stride_s, p.k_stride_s, src_is_k);
    if PAGED != 0u {
        offset = kv_offset(src_is_k, b, jc);
    }
    return (base + offset) / (4u * ELEMS_PER_WORD);
}

// Key j's scores for the quad of rows from `first` (clamped to the last row), masked.
fn mask_pair(hd: Head, first: u32, j: u32, s: vec4<f32>) -> vec4<f32> {
    let rows = min(vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.len_q - 1u));
    let starts = key_starts(hd.b, rows);
    let ends = min(key_ends(hd.b, rows), vec4<u32>(p.key_stop));
    let keys = vec4<u32>(j);
    return apply_masks(s, hd.b, vec4<u32>(hd.h), rows, keys, in_key_range(keys, starts, ends), mask_words_of_rows(hd.b, hd.h, rows, j));
}

// The running maxima of a quad of rows before key p.key_begin (resumed_max).
fn resumed_quad_max(hd: Head, rows: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(resumed_max(hd, rows.x), resumed_max(hd, rows.y), resumed_max(hd, rows.z), resumed_max(hd, rows.w));
}

// Lane `lane`'s share of the running sums that go with `m`: all of it in lane 0, whose
// partial sums the others' are added to at the end.
fn resumed_quad_sum(m: vec4<f32>, lane: u32) -> vec4<f32> {
    let s = vec4<f32>(resumed_sum(m.x), resumed_sum(m.y), resumed_sum(m.z), resumed_sum(m.w));
    return select(vec4<f32>(0.0), s, lane == 0u);
}

// Elements d .. d + 3 of an output row (its first element at `row`) as the accumulator
// resumes it: the stored normalised row where a previous key range saw keys, else
// zeros. The host guarantees whole words, so the four lie all within the head dim or
// all past it.
fn resumed_out(row: u32, seen: bool, d: u32) -> vec4<f32> {
    if p.key_begin == 0u {
        return vec4<f32>(0.0);
    }
    let at = row + min(d, p.head_dim_v - 4u);
    let o = vec4<f32>(f32(output[at]), f32(output[at + 1u]), f32(output[at + 2u]), f32(output[at + 3u]));
    return select(vec4<f32>(0.0), o, seen && d < p.head_dim_v);
}

// Stores elements d .. d + 3 of an output row, if within the head dim (whole words, as
// above).
fn store_out(row: u32, d: u32, x: vec4<f32>) {
    if d < p.head_dim_v {
        output[row + d] = elem(x.x);
        output[row + d + 1u] = elem(x.y);
        output[row + d + 2u] = elem(x.z);
        output[row + d + 3u] = elem(x.w);
    }
}
