// Subgroup helpers shared by the CPU-adapter kernels that own 4 rows per invocation
// (flash_subgroup.wgsl, flash_backward_subgroup.wgsl): the 4 rows are the components of
// a vec4, and a K, V, Q or dO element that every lane needs is loaded by one lane and
// handed to the others with subgroupBroadcast (a register shuffle on a CPU driver).
//
// A quad is 4 consecutive broadcast rows (keys, or query rows in the dK/dV pass):
// quad[c] holds, in component r, the value for owned row r and broadcast row c.
alias Quad = array<vec4<f32>, 4>;
// An octet is spelled `array<vec4<f32>, 8>`, as the preludes (q_octet, acc_octet, ...)
// spell it, never through an alias: naga 30 gives an aliased array type a SPIR-V type
// of its own, so passing one spelling where the other is declared is invalid SPIR-V
// (docs/design.md, "naga 30 and spirv-val").

// Adds Q's octet times K's: kd is element d + lane of the quad's 4 keys, one per lane,
// and broadcast element i is head-dim element d + i of each key.
fn add_scores(s: Quad, qo: array<vec4<f32>, 8>, kd: vec4<f32>) -> Quad {
    var r = s;
    let k0 = subgroupBroadcast(kd, 0u);
    r[0] += qo[0] * k0.x;
    r[1] += qo[0] * k0.y;
    r[2] += qo[0] * k0.z;
    r[3] += qo[0] * k0.w;
    let k1 = subgroupBroadcast(kd, 1u);
    r[0] += qo[1] * k1.x;
    r[1] += qo[1] * k1.y;
    r[2] += qo[1] * k1.z;
    r[3] += qo[1] * k1.w;
    let k2 = subgroupBroadcast(kd, 2u);
    r[0] += qo[2] * k2.x;
    r[1] += qo[2] * k2.y;
    r[2] += qo[2] * k2.z;
    r[3] += qo[2] * k2.w;
    let k3 = subgroupBroadcast(kd, 3u);
    r[0] += qo[3] * k3.x;
    r[1] += qo[3] * k3.y;
    r[2] += qo[3] * k3.z;
    r[3] += qo[3] * k3.w;
    let k4 = subgroupBroadcast(kd, 4u);
    r[0] += qo[4] * k4.x;
    r[1] += qo[4] * k4.y;
    r[2] += qo[4] * k4.z;
    r[3] += qo[4] * k4.w;
    let k5 = subgroupBroadcast(kd, 5u);
    r[0] += qo[5] * k5.x;
    r[1] += qo[5] * k5.y;
    r[2] += qo[5] * k5.z;
    r[3] += qo[5] * k5.w;
    let k6 = subgroupBroadcast(kd, 6u);
    r[0] += qo[6] * k6.x;
    r[1] += qo[6] * k6.y;
    r[2] += qo[6] * k6.z;
    r[3] += qo[6] * k6.w;
    let k7 = subgroupBroadcast(kd, 7u);
    r[0] += qo[7] * k7.x;
    r[1] += qo[7] * k7.y;
    r[2] += qo[7] * k7.z;
    r[3] += qo[7] * k7.w;
    return r;
}

// Adds the quad's probabilities times V into the accumulator's octet: vd is element
// d + lane of the quad's 4 V rows.
fn add_values(a: array<vec4<f32>, 8>, pr: Quad, vd: vec4<f32>) -> array<vec4<f32>, 8> {
    var r = a;
    let v0 = subgroupBroadcast(vd, 0u);
    r[0] += pr[0] * v0.x + pr[1] * v0.y + pr[2] * v0.z + pr[3] * v0.w;
    let v1 = subgroupBroadcast(vd, 1u);
    r[1] += pr[0] * v1.x + pr[1] * v1.y + pr[2] * v1.z + pr[3] * v1.w;
    let v2 = subgroupBroadcast(vd, 2u);
    r[2] += pr[0] * v2.x + pr[1] * v2.y + pr[2] * v2.z + pr[3] * v2.w;
    let v3 = subgroupBroadcast(vd, 3u);
    r[3] += pr[0] * v3.x + pr[1] * v3.y + pr[2] * v3.z + pr[3] * v3.w;
    let v4 = subgroupBroadcast(vd, 4u);
    r[4] += pr[0] * v4.x + pr[1] * v4.y + pr[2] * v4.z + pr[3] * v4.w;
    let v5 = subgroupBroadcast(vd, 5u);
    r[5] += pr[0] * v5.x + pr[1] * v5.y + pr[2] * v5.z + pr[3] * v5.w;
    let v6 = subgroupBroadcast(vd, 6u);
    r[6] += pr[0] * v6.x + pr[1] * v6.y + pr[2] * v6.z + pr[3] * v6.w;
    let v7 = subgroupBroadcast(vd, 7u);
    r[7] += pr[0] * v7.x + pr[1] * v7.y + pr[2] * v7.z + pr[3] * v7.w;
    return r;
}

// Element d of the 4 Q rows, scaled (zero past the head dim).
fn q_element(rows: vec4<u32>, d: u32) -> vec4<f32> {
    if d >= p.head_dim {
        return vec4<f32>(0.0);
    }
    return vec4<f32>(f32(q[rows.x + d]), f32(q[rows.y + d]), f32(q[rows.z + d]), f32(q[rows.w + d])) * p.scale;
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

// The quad's scores for the 4 rows, masked: -inf where a rule masks (row r, key j).
fn mask_quad(hd: Head, rows: vec4<u32>, starts: vec4<u32>, ends: vec4<u32>, j: u32, s: Quad) -> Quad {
    return Quad(
        mask_column(hd, rows, starts, ends, j, s[0]),
        mask_column(hd, rows, starts, ends, j + 1u, s[1]),
        mask_column(hd, rows, starts, ends, j + 2u, s[2]),
        mask_column(hd, rows, starts, ends, j + 3u, s[3]),
    );
}

fn mask_column(hd: Head, rows: vec4<u32>, starts: vec4<u32>, ends: vec4<u32>, j: u32, s: vec4<f32>) -> vec4<f32> {
    let keys = vec4<u32>(j);
    return apply_masks(s, hd.b, vec4<u32>(hd.h), rows, keys, in_key_range(keys, starts, ends), mask_words_of_rows(hd.b, hd.h, rows, j));
}

