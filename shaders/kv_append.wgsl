// Appends new key or value rows to a KV cache in place (src/kv_cache.rs), after
// rotary_common.wgsl (keys may be rotated as they are written): row s of
// (batch element b, kv head h) of the new rows becomes row starts[b] + s of the cache,
// for s < counts[b] (rows past a batch element's count are not written). Source and
// cache are addressed by strides, so either may be BHSD or BSHD; both hold `elem`.
// A paged cache (page_size > 0) is a pool of pages [P, H, page_size, dim]: cache row r
// of element b is row r % page_size of page table[b][r / page_size], and dst_b is the
// page stride.
//
// kv_texels copies the rows an append wrote from the cache into its texel mirror
// (src/kernels/kv_texels.rs, read by decode_kv_texels.wgsl): the whole 16-byte words
// that hold each row, word w of the buffer to texel (w % width, (w / width) %
// TEXEL_ROWS) of layer w / (width * TEXEL_ROWS), width = 1 << TEXEL_SHIFT. A word two
// rows share may be copied twice, with the same value: the buffer holds the written
// rows by then.
//
// Tiling (both entry points): workgroups of 64 invocations; workgroup (y, z) is one
// (b, h) pair, number y + z * groups.y (z exists only past the 65535 workgroups one
// grid axis allows), and the invocations of a pair stride over its new rows' elements
// (kv_append) or words (kv_texels), one per trip, so any number of new rows fits one
// dispatch.

struct AppendParams {
    heads: u32,
    new_len: u32,
    dim: u32,
    batch: u32,
    src_b: u32,
    src_h: u32,
    src_s: u32,
    dst_b: u32,
    dst_h: u32,
    dst_s: u32,
    page_size: u32,
    table_stride: u32,
    // Rotary embedding of the rows appended (keys): rows' first rot_dim elements are
    // rotated (rotary_common.wgsl) with row s of element b at rot[(b · new_len + s) ·
    // rot_dim / 2 + pair]; 0: copied as they are.
    rot_dim: u32,
    rot_interleaved: u32,
    rot_pad0: u32,
    rot_pad1: u32,
}

@group(0) @binding(0) var<uniform> ap: AppendParams;
@group(0) @binding(1) var<storage, read> src: array<elem>;
@group(0) @binding(2) var<storage, read_write> dst: array<elem>;
// starts[b] = rows_of[b], counts[b] = rows_of[batch + b]; a paged cache's block table
// [batch, table_stride] follows.
@group(0) @binding(3) var<storage, read> rows_of: array<u32>;

// Offset of cache row r of batch element b (head 0, element 0).
fn dst_row(b: u32, r: u32) -> u32 {
    if ap.page_size == 0u {
        return b * ap.dst_b + r * ap.dst_s;
    }
    let page = rows_of[2u * ap.batch + b * ap.table_stride + r / ap.page_size];
    return page * ap.dst_b + (r % ap.page_size) * ap.dst_s;
}

// The (b, h) pair of workgroup row (y, z) and its rows start .. start + count of
// element b; no rows past the last pair.
struct PairRows {
    b: u32,
    h: u32,
    start: u32,
    count: u32,
}

fn pair_rows(gid: vec3<u32>, groups: vec3<u32>) -> PairRows {
    let pair = gid.y + gid.z * groups.y;
    if pair >= ap.batch * ap.heads {
        return PairRows(0u, 0u, 0u, 0u);
    }
    let b = pair / ap.heads;
    return PairRows(b, pair % ap.heads, rows_of[b], min(rows_of[ap.batch + b], ap.new_len));
}

// cos and sin of each appended row's pairs, when ap.rot_dim > 0.
@group(0) @binding(6) var<storage, read> rot: array<vec2<f32>>;

@compute @workgroup_size(64, 1, 1)
fn kv_append(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let pr = pair_rows(gid, groups);
    for (var x = gid.x; x < pr.count * ap.dim; x += groups.x * 64u) {
        let s = x / ap.dim;
        let d = x % ap.dim;
        let row = pr.b * ap.src_b + pr.h * ap.src_h + s * ap.src_s;
        let at = dst_row(pr.b, pr.start + s) + pr.h * ap.dst_h + d;
        if d < ap.rot_dim {
            let rp = rotary_pair(d, ap.rot_dim, ap.rot_interleaved != 0u);
            let cs = rot[(pr.b * ap.new_len + s) * (ap.rot_dim / 2u) + rp.pair];
            dst[at] = elem(rotated(f32(src[row + d]), f32(src[row + rp.partner]), cs, rp.first));
        } else {
            dst[at] = src[row + d];
        }
    }
}

// For kv_texels: the cache (dst) as 16-byte words, and its mirror.
@group(0) @binding(4) var<storage, read> cache_words: array<vec4<u32>>;
@group(0) @binding(5) var texels: texture_storage_2d_array<rgba32uint, write>;

// log2 of the texels per texture row, and the rows per layer (set by the host,
// kernels::kv_texels::TexelGrid).
override TEXEL_SHIFT: u32 = 12u;
override TEXEL_ROWS: u32 = 1024u;

@compute @workgroup_size(64, 1, 1)
fn kv_texels(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let pr = pair_rows(gid, groups);
    let per_word = 4u * ELEMS_PER_WORD;
    // Words a row can touch: its elements, and one more where it starts mid-word.
    let row_words = (ap.dim + per_word - 1u) / per_word + 1u;
    let words = arrayLength(&cache_words);
    for (var x = gid.x; x < pr.count * row_words; x += groups.x * 64u) {
        let row_start = dst_row(pr.b, pr.start + x / row_words) + pr.h * ap.dst_h;
        let first = row_start / per_word;
        let last = (row_start + ap.dim - 1u) / per_word;
        let w = first + x % row_words;
        if w <= last && w < words {
            let row = w >> TEXEL_SHIFT;
            let at = vec2<u32>(w & ((1u << TEXEL_SHIFT) - 1u), row % TEXEL_ROWS);
            textureStore(texels, at, row / TEXEL_ROWS, cache_words[w]);
        }
    }
}

// For kv_quantize: an int8 KV cache's codes, four to a 32-bit word (byte c of word i
// is element 4i + c; dst_b, dst_h and dst_s count elements, and rows are whole words),
// and its row scales, the scale of the row starting at element e at e / dim
// (src/quantized_kv.rs, docs/design.md "int8 KV cache").
@group(0) @binding(7) var<storage, read_write> codes: array<u32>;
@group(0) @binding(8) var<storage, read_write> scales: array<f32>;

// Element d of appended row s of a pair as kv_append would write it: rotated where
// ap.rot_dim reaches, and rounded to the rows' element type.
fn appended(pr: PairRows, s: u32, d: u32) -> f32 {
    let row = pr.b * ap.src_b + pr.h * ap.src_h + s * ap.src_s;
    if d < ap.rot_dim {
        let rp = rotary_pair(d, ap.rot_dim, ap.rot_interleaved != 0u);
        let cs = rot[(pr.b * ap.new_len + s) * (ap.rot_dim / 2u) + rp.pair];
        return f32(elem(rotated(f32(src[row + d]), f32(src[row + rp.partner]), cs, rp.first)));
    }
    return f32(src[row + d]);
}

// Quantizes appended rows (symmetric, per row): scale = max|x| / 127, code =
// round(x / max|x| * 127) (ties to even) clamped to [-127, 127]. A row whose largest
// magnitude is below f32's smallest normal (zero, or subnormals a GPU may flush) has
// scale 0 and codes 0. A row holding any NaN or infinity has codes 0 and a NaN scale,
// so every element reads back NaN: never a finite number that was not there (issue 64;
// `max` may drop a NaN, so the row's exponent bits are tested instead). Same tiling as
// kv_append, each invocation one whole row.
@compute @workgroup_size(64, 1, 1)
fn kv_quantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let pr = pair_rows(gid, groups);
    for (var s = gid.x; s < pr.count; s += groups.x * 64u) {
        var top = 0.0;
        var finite = true;
        for (var d = 0u; d < ap.dim; d++) {
            let x = appended(pr, s, d);
            top = max(top, abs(x));
            finite = finite && (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
        }
        let live = top >= 1.17549435e-38 && finite;
        let at = dst_row(pr.b, pr.start + s) + pr.h * ap.dst_h;
        for (var w = 0u; w < ap.dim / 4u; w++) {
            var word = 0u;
            for (var c = 0u; c < 4u; c++) {
                let x = appended(pr, s, 4u * w + c);
                let code = select(0.0, clamp(round(x / top * 127.0), -127.0, 127.0), live);
                word |= (bitcast<u32>(i32(code)) & 0xffu) << (8u * c);
            }
            codes[at / 4u + w] = word;
        }
        // A quiet NaN made at run time (WGSL forbids non-finite constant expressions).
        let nan = bitcast<f32>(0x7fc00000u | (ap.dim & 0u));
        scales[at / ap.dim] = select(select(0.0, top / 127.0, live), nan, !finite);
    }
}
