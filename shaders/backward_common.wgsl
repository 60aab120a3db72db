// What the backward kernels share (flash_backward.wgsl, flash_backward_subgroup.wgsl,
// flash_backward_blocked.wgsl), appended to attention_common.wgsl:
// the gradient bindings, the forward's lse and D = rowsum(dO * O) per row (in
// `scores`), P = exp(s - lse), the soft cap's slope, dX, the keys whose rows may hold
// anything, the rows a block of keys is visible to, Q and dO loads, and the gradient
// stores that resume a split walk (docs/design.md, "Backward").

@group(0) @binding(13) var<storage, read> d_out: array<elem>;
// The forward's output, read only (attention_common.wgsl's `output` is read-write, and
// a buffer bound both ways in one dispatch is refused: dO may be O's own buffer).
@group(0) @binding(17) var<storage, read> o_in: array<elem>;
@group(0) @binding(14) var<storage, read_write> dq: array<elem>;
@group(0) @binding(15) var<storage, read_write> dk: array<elem>;
@group(0) @binding(16) var<storage, read_write> dv: array<elem>;

// The query rows of this dispatch's range (p.key_begin .. p.key_stop in this pass)
// that can see any key of first_key .. last_key of batch element b: key_start and
// key_end grow with the row, so binary searches find the first row whose range ends
// past first_key and the last whose range starts at or before last_key.
fn rows_seeing(b: u32, first_key: u32, last_key: u32) -> vec2<u32> {
    var lo = p.key_begin;
    var hi = p.key_stop;
    while lo < hi {
        let mid = (lo + hi) / 2u;
        if key_end(b, mid) > first_key {
            hi = mid;
        } else {
            lo = mid + 1u;
        }
    }
    let begin = lo;
    hi = p.key_stop;
    while lo < hi {
        let mid = (lo + hi) / 2u;
        if key_start(b, mid) <= last_key {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return vec2<u32>(begin, lo);
}

fn do_base(hd: Head, i: u32) -> u32 {
    return hd.b * p.o_stride_b + hd.h * p.o_stride_h + i * p.o_stride_s;
}

fn q_base(hd: Head, i: u32) -> u32 {
    return hd.b * p.q_stride_b + hd.h * p.q_stride_h + i * p.q_stride_s;
}

fn lse_at(hd: Head, i: u32) -> f32 {
    return lse[(hd.b * p.heads_q + hd.h) * p.len_q + i];
}

fn delta_at(hd: Head, i: u32) -> f32 {
    return scores[(hd.b * p.heads_q + hd.h) * p.len_q + i];
}

// P = exp(s - lse), 0 where s is masked (which covers rows that saw no key: their
// lse is -inf, and so is every score).
fn probs_of(s: vec4<f32>, lse4: vec4<f32>) -> vec4<f32> {
    let masked = bitcast<vec4<u32>>(s) == vec4<u32>(NEG_INF_BITS);
    return select(exp(s - lse4), vec4<f32>(0.0), masked);
}

// d softcap(x) / dx = 1 - (softcap(x) / cap)², 1 without a cap.
fn cap_slope(x: vec4<f32>) -> vec4<f32> {
    if p.softcap == 0.0 {
        return vec4<f32>(1.0);
    }
    let t = soft_cap(x) / p.softcap;
    return vec4<f32>(1.0) - t * t;
}

// dX = P (dP - D) · slope for one vec4 of (row, key) pairs; exactly 0 where the key is
// masked for the row, whatever dP holds (a masked key's V row may hold NaN).
fn dx_of(pr: vec4<f32>, dp: vec4<f32>, delta: vec4<f32>, slope: vec4<f32>) -> vec4<f32> {
    return select(pr * (dp - delta) * slope, vec4<f32>(0.0), pr == vec4<f32>(0.0));
}

// Four consecutive elements of a dO row (laid out as the output), zero past Dv.
fn doload4(base: u32, t4: u32) -> vec4<f32> {
    let d = t4 * 4u;
    if d + 3u < p.head_dim_v {
        return vec4<f32>(f32(d_out[base + d]), f32(d_out[base + d + 1u]), f32(d_out[base + d + 2u]), f32(d_out[base + d + 3u]));
    }
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if d + c < p.head_dim_v {
            r[c] = f32(d_out[base + d + c]);
        }
    }
    return r;
}

// Four consecutive elements of a Q row, zero past D (attention_common.wgsl's qload4
// with a fast path for whole vec4s).
fn qrow4(base: u32, t4: u32) -> vec4<f32> {
    let d = t4 * 4u;
    if d + 3u < p.head_dim {
        return vec4<f32>(f32(q[base + d]), f32(q[base + d + 1u]), f32(q[base + d + 2u]), f32(q[base + d + 3u]));
    }
    return qload4(base, t4);
}

// Stores one element of dQ (dK, dV) at `at`, adding what an earlier dispatch of the
// walk stored there (p.key_begin > 0: a loop cap split the walk). Every backward
// kernel stores its gradients through these.
fn store_dq_element(at: u32, value: f32) {
    var y = value;
    if p.key_begin != 0u {
        y += f32(dq[at]);
    }
    dq[at] = elem(y);
}

fn store_dk_element(at: u32, value: f32) {
    var y = value;
    if p.key_begin != 0u {
        y += f32(dk[at]);
    }
    dk[at] = elem(y);
}

fn store_dv_element(at: u32, value: f32) {
    var y = value;
    if p.key_begin != 0u {
        y += f32(dv[at]);
    }
    dv[at] = elem(y);
}
