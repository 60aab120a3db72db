// Residual add + LayerNorm over the last dimension: out = LN(x + residual) · gamma + beta,
// the post-norm of a transformer block (seed 003). Rows are independent.
//
// Tiling: one invocation per row, 64 rows per workgroup, no workgroup memory and no
// barriers (the width is the embedding size, a few hundred elements: the three passes
// over a row are cheap next to the projections around this kernel). Statistics are in
// f32 and two-pass (mean, then the mean of squared deviations), which stays exact when
// the mean is large next to the spread.
//
// A generated header defines `elem` (f32, or f16 with `enable f16;`).

struct NormParams {
    rows: u32,
    width: u32,
    eps: f32,
    has_residual: u32,
}

@group(0) @binding(0) var<uniform> np: NormParams;
@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> residual: array<elem>;
@group(0) @binding(3) var<storage, read> gamma: array<elem>;
@group(0) @binding(4) var<storage, read> beta: array<elem>;
@group(0) @binding(5) var<storage, read_write> normed: array<elem>;

fn input_at(i: u32) -> f32 {
    var value = f32(x[i]);
    if np.has_residual != 0u {
        value += f32(residual[i]);
    }
    return value;
}

@compute @workgroup_size(64, 1, 1)
fn layer_norm(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if row >= np.rows {
        return;
    }
    let base = row * np.width;
    let n = f32(np.width);
    var sum = 0.0;
    for (var c = 0u; c < np.width; c++) {
        sum += input_at(base + c);
    }
    let mean = sum / n;
    var squares = 0.0;
    for (var c = 0u; c < np.width; c++) {
        let dev = input_at(base + c) - mean;
        squares += dev * dev;
    }
    let inv_std = inverseSqrt(squares / n + np.eps);
    for (var c = 0u; c < np.width; c++) {
        let y = (input_at(base + c) - mean) * inv_std;
        normed[base + c] = elem(y * f32(gamma[c]) + f32(beta[c]));
    }
}
