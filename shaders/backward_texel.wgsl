// The backward pass for CPU adapters with 8-lane subgroups (lavapipe), the walked
// operands read as texel fetches: the `subgroup` backward tiling's kernels where the
// head dims allow them (src/kernels/backward_texel.rs picks them and writes the entry
// points, `bwd_dq_texel` and `bwd_dkdv_texel`, with every loop over rows, head-dim
// words and walked rows of a block unrolled; this file holds their helpers). The
// algorithm and arithmetic are flash_backward.wgsl's (FlashAttention-2; see its
// header), the arrangement flash_texel.wgsl's, for the same reasons: llvmpipe gathers
// texel fetches but walks storage loads lane by lane, and compiles a dynamically
// indexed private array into a ladder of branches, so every row's slices and
// accumulators are named values of the entry point.
//
// Tiling: a workgroup is one subgroup of 8 invocations and owns ROWS rows of one
// (batch, head) in the dQ pass (query rows) or (batch, kv head) in the dK/dV pass
// (keys), in quads (four owned rows as a vec4's components). The other side (keys, or
// query rows) is walked in blocks of 16, 2 per lane: lane l takes walked rows
// i0 + l and i0 + 8 + l. For each block:
//   - two transposable products against the owned rows, as flash_texel.wgsl's Q·Kᵀ:
//     lane l holds the owned quads' elements of word 8g + l of each group g of 8
//     words; for word t of its walked rows, a lane takes the quads' elements of word
//     t from lane t % 8 (subgroupBroadcast): scores and dP = dO·Vᵀ (dQ pass: Q and dO
//     owned, K and V walked), or their transposes (dK/dV pass: K and V owned, Q and
//     dO walked);
//   - P = exp(s − lse) and dX = P (dP − D) per (owned, walked) pair, masked by the
//     visible key ranges only (the host sends problems with other rules to the buffer
//     kernels);
//   - one or two accumulations, as flash_texel.wgsl's P·V: lane l owns word 8c + l of
//     each chunk c of the owned rows' gradients and, for each walked row of the
//     block, fetches that word of it and adds it times the pair's coefficient
//     (broadcast from the lane that computed it): dQ += dX·K, or dV += P·dO and
//     dK += dX·Q.
// The mirrors are bound at k_texels (K, or Q) and v_texels (V, or dO). No workgroup
// memory, no barriers, no atomics: each gradient element is one lane's sum in a fixed
// order, so results repeat bit for bit. docs/design.md, "Backward", has the
// measurements.

// Element d of the dO rows `rows` (offsets of their first elements); zero past Dv.
fn do_quad(rows: vec4<u32>, d: u32) -> vec4<f32> {
    let dc = min(d, p.head_dim_v - 1u);
    let x = vec4<f32>(f32(d_out[rows.x + dc]), f32(d_out[rows.y + dc]), f32(d_out[rows.z + dc]), f32(d_out[rows.w + dc]));
    return select(vec4<f32>(0.0), x, d < p.head_dim_v);
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

// Stores elements d .. d + 3 of a gradient row (its first element at `row`) through
// backward_common.wgsl's element stores (which add what an earlier dispatch of a split
// walk stored), if within the head dim (whole words: the four lie all within or all
// past it).
fn store_dq(row: u32, d: u32, x: vec4<f32>) {
    if d < p.head_dim {
        store_dq_element(row + d, x.x);
        store_dq_element(row + d + 1u, x.y);
        store_dq_element(row + d + 2u, x.z);
        store_dq_element(row + d + 3u, x.w);
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
