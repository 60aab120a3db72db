// Materialized path, step 3: out = P V, where P holds the probabilities of the softmax
// step, written to the output with its own strides (BHSD or BSHD).
//
// Tiling: a workgroup of 8x8 invocations covers 32 query rows x 32 value columns of
// one (batch, head); each invocation accumulates a 4x4 block (4 rows x 4 columns) in
// vec4 registers, looping over keys. The loop stops at the last key any of its rows
// can see (causal, key lengths): probabilities past it are zero.

fn store_row(acc: vec4<f32>, o_base: u32, i: u32, c0: u32) {
    if i >= p.len_q {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        if c0 + c < p.head_dim_v {
            output[o_base + i * p.o_stride_s + c0 + c] = elem(acc[c]);
        }
    }
}

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let bh_local = wid.z;
    let hd = head_of(p.bh_start + bh_local);
    let i0 = gid.y * 4u;
    let c0 = gid.x * 4u;
    if i0 >= p.len_q || c0 >= p.head_dim_v {
        return;
    }
    let last_q = p.len_q - 1u;
    let last_c = p.head_dim_v - 1u;
    let end = key_end(hd.b, min(i0 + 3u, last_q));
    let p0 = (bh_local * p.len_q + min(i0, last_q)) * p.len_k;
    let p1 = (bh_local * p.len_q + min(i0 + 1u, last_q)) * p.len_k;
    let p2 = (bh_local * p.len_q + min(i0 + 2u, last_q)) * p.len_k;
    let p3 = (bh_local * p.len_q + min(i0 + 3u, last_q)) * p.len_k;
    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;
    let cx = min(c0, last_c);
    let cy = min(c0 + 1u, last_c);
    let cz = min(c0 + 2u, last_c);
    let cw = min(c0 + 3u, last_c);

    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    // Keys in runs of consecutive rows (one run unless paged): the row offset steps by
    // the stride within a run (a kv_offset per key cost this pass 19% on lavapipe).
    var j = 0u;
    while j < end {
        let run_end = min(kv_run_end(j), end);
        var vr = v_base + kv_offset(false, hd.b, j);
        for (; j < run_end; j++) {
            let vj = vec4<f32>(f32(v[vr + cx]), f32(v[vr + cy]), f32(v[vr + cz]), f32(v[vr + cw]));
            a0 += scores[p0 + j] * vj;
            a1 += scores[p1 + j] * vj;
            a2 += scores[p2 + j] * vj;
            a3 += scores[p3 + j] * vj;
            vr += p.v_stride_s;
        }
    }
    let o_base = hd.b * p.o_stride_b + hd.h * p.o_stride_h;
    store_row(a0, o_base, i0, c0);
    store_row(a1, o_base, i0 + 1u, c0);
    store_row(a2, o_base, i0 + 2u, c0);
    store_row(a3, o_base, i0 + 3u, c0);
}
