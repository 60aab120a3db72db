// The backward pass of the post-norm out = LN(x + residual) · gamma + beta
// (layer_norm.wgsl), given d_out. With s = x + residual, x̂ = (s − mean) / std per row
// and g = d_out ∘ gamma:
//   d_s = (g − mean(g) − x̂ · mean(g ∘ x̂)) / std,  d_gamma = Σ_rows d_out ∘ x̂,  d_beta = Σ_rows d_out.
// Two entry points, both without workgroup memory or barriers:
//   layer_norm_backward_rows: one invocation per row (64 rows per workgroup). It
//     recomputes the row's statistics exactly as the forward does (f32, two-pass),
//     stores them (mean, 1/std) for the column pass, and writes d_s twice: in the
//     layer's dtype (an operand of the next GEMMs) and in f32 (the residual path's
//     share of the query's gradient, which the query projection's GEMM adds to).
//   layer_norm_backward_columns: one invocation per column (64 per workgroup), summing
//     d_gamma and d_beta over rows [row_begin, row_end) in row order; with
//     `accumulate`, onto the previous dispatch's sums (how the rows are split across
//     dispatches under llvmpipe's loop cap). No atomics: every sum has one owner and
//     one order, so results repeat bit for bit.
//
// A generated header defines `elem` (f32, or f16 with `enable f16;`).

struct NormBackwardParams {
    rows: u32,
    width: u32,
    eps: f32,
    accumulate: u32,
    row_begin: u32,
    row_end: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> nb: NormBackwardParams;
@group(0) @binding(1) var<storage, read> x: array<elem>;
@group(0) @binding(2) var<storage, read> residual: array<elem>;
@group(0) @binding(3) var<storage, read> gamma: array<elem>;
@group(0) @binding(4) var<storage, read> d_out: array<elem>;
// (mean, 1/std) per row.
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> d_sum: array<elem>;
@group(0) @binding(7) var<storage, read_write> d_sum_f32: array<f32>;
@group(0) @binding(8) var<storage, read_write> d_gamma: array<f32>;
@group(0) @binding(9) var<storage, read_write> d_beta: array<f32>;

fn summed_at(i: u32) -> f32 {
    return f32(x[i]) + f32(residual[i]);
}

@compute @workgroup_size(64, 1, 1)
fn layer_norm_backward_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    if row >= nb.rows {
        return;
    }
    let base = row * nb.width;
    let n = f32(nb.width);
    var sum = 0.0;
    for (var c = 0u; c < nb.width; c++) {
        sum += summed_at(base + c);
    }
    let mean = sum / n;
    var squares = 0.0;
    for (var c = 0u; c < nb.width; c++) {
        let dev = summed_at(base + c) - mean;
        squares += dev * dev;
    }
    let inv_std = inverseSqrt(squares / n + nb.eps);
    stats[2u * row] = mean;
    stats[2u * row + 1u] = inv_std;
    var g_sum = 0.0;
    var gx_sum = 0.0;
    for (var c = 0u; c < nb.width; c++) {
        let g = f32(d_out[base + c]) * f32(gamma[c]);
        g_sum += g;
        gx_sum += g * (summed_at(base + c) - mean) * inv_std;
    }
    let g_mean = g_sum / n;
    let gx_mean = gx_sum / n;
    for (var c = 0u; c < nb.width; c++) {
        let g = f32(d_out[base + c]) * f32(gamma[c]);
        let xhat = (summed_at(base + c) - mean) * inv_std;
        let d = (g - g_mean - xhat * gx_mean) * inv_std;
        d_sum[base + c] = elem(d);
        d_sum_f32[base + c] = d;
    }
}

@compute @workgroup_size(64, 1, 1)
fn layer_norm_backward_columns(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    if col >= nb.width {
        return;
    }
    var dg = 0.0;
    var db = 0.0;
    for (var row = nb.row_begin; row < nb.row_end; row++) {
        let i = row * nb.width + col;
        let xhat = (summed_at(i) - stats[2u * row]) * stats[2u * row + 1u];
        let d = f32(d_out[i]);
        dg += d * xhat;
        db += d;
    }
    if nb.accumulate != 0u {
        dg += d_gamma[col];
        db += d_beta[col];
    }
    d_gamma[col] = dg;
    d_beta[col] = db;
}
