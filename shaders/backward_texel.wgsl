// The backward pass for CPU adapters with 8-lane subgroups (lavapipe), the walked
// operands read as texel fetches: the `subgroup` backward tiling's kernels where the
// head dims allow them (src/kernels/backward_texel.rs picks them and writes the entry
// points, `bwd_dkdv_texel` and `bwd_dq_texel`, with every loop over rows, head-dim
// words and walked rows of a block unrolled; this file holds their helpers). The
// arithmetic is flash_backward.wgsl's (FlashAttention-2; see its header), the
// arrangement flash_texel.wgsl's, for the same reasons: llvmpipe gathers texel fetches
// but walks storage loads lane by lane, and compiles a dynamically indexed private
// array into a ladder of branches, so every row's slices and accumulators are named
// values of the entry point.
//
// Tiling: a workgroup is one subgroup of 8 invocations and owns ROWS rows of one
// (batch, kv head) in the dK/dV pass (keys) or (batch, head) in the dQ pass (query
// rows), in quads (four owned rows as a vec4's components). The other side (query
// rows, or keys) is walked in blocks of 16, 2 per lane: lane l takes walked rows
// i0 + l and i0 + 8 + l.
//
// The dK/dV pass runs first, over a band: query rows p.key_begin .. p.key_stop (in
// both passes) of the dispatch's pairs. For each block:
//   - the transposed scores and dP = V·dOᵀ against the owned keys, as
//     flash_texel.wgsl's Q·Kᵀ: lane l holds the owned quads' elements of word 8g + l of
//     each group g of 8 words; for word t of its walked rows, a lane takes the quads'
//     elements of word t from lane t % 8 (subgroupBroadcast);
//   - P = exp(s − lse) and dX = P (dP − D) per (owned, walked) pair, masked by the
//     visible key ranges only (the host sends problems with other rules to the buffer
//     kernels); each lane stores its walked rows' dX, a texel per quad of owned keys,
//     to the band's dX scratch (`dx_store`: row-major, 4 keys a texel). A band is a
//     range of query rows of a group of (batch, kv head) pairs;
//   - two accumulations, as flash_texel.wgsl's P·V: lane l owns word 8c + l of each
//     chunk c of the owned keys' gradients and, for each walked row of the block,
//     fetches that word of it and adds it times the pair's coefficient (broadcast
//     from the lane that computed it): dV += P·dO and dK += dX·Q.
// The dQ pass then reads the band's dX instead of recomputing it (FlashAttention-2's
// five products without float atomics; the scores and dP of the dQ pass would be two
// more): per block of 16 keys, each lane fetches 4 keys of half the owned rows from
// the scratch (texels masked by the rows' visible key ranges: a pair the dK/dV pass
// never visited holds a stale value), and dQ += dX·K accumulates as above, each
// coefficient broadcast from the lane that fetched it.
// The mirrors are bound at k_texels (Q in the dK/dV pass, K in the dQ pass) and
// v_texels (dO, in the dK/dV pass). No workgroup memory,
// no barriers, no atomics: each gradient element is one lane's sum in a fixed order,
// so results repeat bit for bit. docs/design.md, "Backward", has the measurements.

// The band's dX scratch (kernels::kv_texels::scratch), on kernels::kv_texels's grid:
// written by the dK/dV pass, read by the dQ pass.
@group(0) @binding(20) var dx_texels: texture_2d_array<u32>;
@group(0) @binding(21) var dx_store: texture_storage_2d_array<rgba32uint, write>;

// The scratch word of keys 0 .. 3 of query row i of the band's (batch, head) pair
// `pair` of `pairs`: rows of the band outermost, then its pairs, then quads of keys.
// Key quad kq is this word + kq. A band is one dispatch of each pass over its pairs
// (the host's TexelBands), so the dQ pass's pair is wid.y of p.bh_count, and the dK/dV
// pass's is counted from its first kv pair's first query head.
fn dx_row_word(i: u32, pair: u32, pairs: u32) -> u32 {
    return ((i - p.key_begin) * pairs + pair) * ((p.len_k + 3u) / 4u);
}

fn store_dx(w: u32, x: vec4<f32>) {
    let at = texel_of(w);
    textureStore(dx_store, vec2<i32>(at.xy), i32(at.z), bitcast<vec4<u32>>(x));
}

// dX of four keys of one row, 0 where `keep` is false (pairs the dK/dV pass did not
// visit: the scratch holds what an earlier band left there).
fn dx_fetch(w: u32, keep: vec4<bool>) -> vec4<f32> {
    let at = texel_of(w);
    let x = bitcast<vec4<f32>>(textureLoad(dx_texels, vec2<i32>(at.xy), i32(at.z), 0));
    return select(vec4<f32>(0.0), x, keep);
}

// Element d of the K rows `rows`, scaled (the dK/dV pass's scores carry the scale on
// K); zero past D.
fn k_quad(rows: vec4<u32>, d: u32) -> vec4<f32> {
    let dc = min(d, p.head_dim - 1u);
    let x = vec4<f32>(f32(k[rows.x + dc]), f32(k[rows.y + dc]), f32(k[rows.z + dc]), f32(k[rows.w + dc])) * p.scale;
    return select(vec4<f32>(0.0), x, d < p.head_dim);
}

// Element d of the V rows `rows`; zero past Dv.
fn v_quad(rows: vec4<u32>, d: u32) -> vec4<f32> {
    let dc = min(d, p.head_dim_v - 1u);
    let x = vec4<f32>(f32(v[rows.x + dc]), f32(v[rows.y + dc]), f32(v[rows.z + dc]), f32(v[rows.w + dc]));
    return select(vec4<f32>(0.0), x, d < p.head_dim_v);
}

// The word of a row that starts at element `first` (the host guarantees whole words).
fn word_at(first: u32) -> u32 {
    return first / (4u * ELEMS_PER_WORD);
}

// Stores elements d .. d + 3 of a gradient row (its first element at `row`), if within
// the head dim (whole words: the four lie all within or all past it). dK and dV go
// through backward_common.wgsl's element stores, which add what an earlier band
// stored; each dQ row is written once, by the band that holds it.
fn store_dq(row: u32, d: u32, x: vec4<f32>) {
    if d < p.head_dim {
        dq[row + d] = elem(x.x);
        dq[row + d + 1u] = elem(x.y);
        dq[row + d + 2u] = elem(x.z);
        dq[row + d + 3u] = elem(x.w);
    }
}

fn store_dk(row: u32, d: u32, x: vec4<f32>) {
    if d < p.head_dim {
        store_dk_element(row + d, x.x);
        store_dk_element(row + d + 1u, x.y);
        store_dk_element(row + d + 2u, x.z);
        store_dk_element(row + d + 3u, x.w);
    }
}

fn store_dv(row: u32, d: u32, x: vec4<f32>) {
    if d < p.head_dim_v {
        store_dv_element(row + d, x.x);
        store_dv_element(row + d + 1u, x.y);
        store_dv_element(row + d + 2u, x.z);
        store_dv_element(row + d + 3u, x.w);
    }
}
