// Scores of keys against a block's Q rows held in workgroup memory, shared by the
// split-K decode designs that stage Q there (flash_decode.wgsl, flash_decode_subgroup.wgsl;
// the lanes design keeps Q in registers and scores its own way). Appended after
// decode_common.wgsl; each kernel file defines kv_vec4s and decode_k_load.

// The block's Q rows, scaled: row r's elements 4t .. 4t + 3 at r * DEC_MAX_VEC4 + t
// (head dims up to 256). Each kernel fills it, and every lane reads it at the same
// address.
const DEC_MAX_VEC4: u32 = 64u;
var<workgroup> dec_q: array<vec4<f32>, DEC_ROWS * DEC_MAX_VEC4>;

// Elements 4t .. 4t + 3 of quad qd's four rows.
fn q_quad(qd: u32, t: u32) -> array<vec4<f32>, 4> {
    let at = qd * 4u * DEC_MAX_VEC4 + t;
    return array<vec4<f32>, 4>(dec_q[at], dec_q[at + DEC_MAX_VEC4], dec_q[at + 2u * DEC_MAX_VEC4], dec_q[at + 3u * DEC_MAX_VEC4]);
}

// Each of the four rows dotted with the same four K elements.
fn quad_dots(rows: array<vec4<f32>, 4>, kv: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(rows[0], kv), dot(rows[1], kv), dot(rows[2], kv), dot(rows[3], kv));
}

// A load of K or V: 4 elements, or 8 (f16 read 16 bytes at a time) as two vec4s.
alias KvLoad = array<vec4<f32>, 2>;

// Adds elements 4t .. 4t + 3 of the block's rows dotted with those of key x (ka) and,
// when `two`, of key y (kb) to raw (laid out as decode_scores returns it).
fn add_scores(raw: array<vec4<f32>, 4>, t: u32, ka: vec4<f32>, kb: vec4<f32>, two: bool) -> array<vec4<f32>, 4> {
    var r = raw;
    let q0 = q_quad(0u, t);
    r[0] += quad_dots(q0, ka);
    var q1 = q0;
    if DEC_QUADS > 1u {
        q1 = q_quad(1u, t);
        r[1] += quad_dots(q1, ka);
    }
    if two {
        r[2] += quad_dots(q0, kb);
        if DEC_QUADS > 1u {
            r[3] += quad_dots(q1, kb);
        }
    }
    return r;
}

// The scores against the block's quads of the key whose K row starts at k_rows.x and,
// when `two` (a constant at every call, so the other form compiles away), of the key
// at k_rows.y: [x quad 0, x quad 1, y quad 0, y quad 1], the second quads zero in
// 4-row blocks. Each Q element is read once for both keys: on llvmpipe these
// workgroup reads go lane by lane and cost as much as the K loads. K comes from the
// kernel's decode_k_load, kv_vec4s() vec4s a load (each kernel file defines both: one
// design reads K through kv_words, the other from k).
fn decode_scores(k_rows: vec2<u32>, d4: u32, two: bool) -> array<vec4<f32>, 4> {
    var raw = array<vec4<f32>, 4>();
    let per = kv_vec4s();
    for (var u = 0u; u * per < d4; u++) {
        let ka = decode_k_load(k_rows.x, u);
        var kb = ka;
        if two {
            kb = decode_k_load(k_rows.y, u);
        }
        raw = add_scores(raw, u * per, ka[0], kb[0], two);
        if per > 1u {
            raw = add_scores(raw, u * per + 1u, ka[1], kb[1], two);
        }
    }
    return raw;
}
