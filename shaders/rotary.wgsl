// Rotary position embeddings (RoPE), applied out of place to a [B, H, S, D] tensor in
// any layout, after rotary_common.wgsl (docs/design.md, "Rotary embeddings"). The host
// computes the angles in f64 for every (batch element, position) the call uses and
// uploads cos and sin as f32
// (`table`, [B·S, dim / 2] vec2 rows), so large positions lose nothing to an f32 angle
// or to sin/cos accuracy far from zero; the kernel only rotates.
//
// One invocation per element: gid.x walks the S·D elements of one (batch, head) row
// block, workgroup_id.y = b·H + h. Element d < dim is rotated with its partner
// (rotary_common.wgsl); elements d >= dim are copied.

struct RotaryParams {
    heads: u32,
    len: u32, // S
    head_dim: u32, // D
    dim: u32, // rotated dims (even, <= D)
    stride_b: u32,
    stride_h: u32,
    stride_s: u32,
    interleaved: u32, // 1: GPT-J, 0: NeoX
    out_stride_b: u32,
    out_stride_h: u32,
    out_stride_s: u32,
    bh_start: u32,
}

@group(0) @binding(0) var<uniform> r: RotaryParams;
@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<elem>;

@compute @workgroup_size(64, 1, 1)
fn rotary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = gid.x / r.head_dim;
    let d = gid.x % r.head_dim;
    if s >= r.len {
        return;
    }
    let bh = r.bh_start + wid.y;
    let b = bh / r.heads;
    let h = bh % r.heads;
    let row = b * r.stride_b + h * r.stride_h + s * r.stride_s;
    let out = b * r.out_stride_b + h * r.out_stride_h + s * r.out_stride_s + d;
    let value = f32(x[row + d]);
    if d >= r.dim {
        y[out] = elem(value);
        return;
    }
    let rp = rotary_pair(d, r.dim, r.interleaved != 0u);
    let cs = table[(b * r.len + s) * (r.dim / 2u) + rp.pair];
    let value_rotated = rotated(value, f32(x[row + rp.partner]), cs, rp.first);
    y[out] = elem(value_rotated);
}
