//! The linear-layer GEMM (`Y = X·Wᵀ + b`, every tiling the adapter runs) against an f64
//! reference: what `check` runs beside attention, and `tests/gpu_linear.rs` over many
//! more shapes. Native only (blocking readback).

use super::Rng;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::matmul::{encode_linear, Linear, LinearTiling};
use crate::kernels::pack_rows::{PackedRows, RowSource};
use crate::options::Precision;
use crate::tensor::{DType, Layout, Tensor};

/// One GEMM problem: `m` rows of X (row stride `x_stride`) of `k` elements against
/// rows `w_row0 ..` of W, written to outputs of `widths` columns each (the split
/// epilogue), with or without bias.
#[derive(Clone, Debug)]
pub struct LinearCase {
    pub m: usize,
    pub k: usize,
    pub x_stride: usize,
    pub widths: Vec<usize>,
    /// Rows of W (and bias entries) before the ones used.
    pub w_row0: usize,
    pub bias: bool,
    pub dtype: DType,
    pub tiling: LinearTiling,
    /// Pass W pre-packed (all its rows) instead of letting the texture tiling pack it.
    pub prepacked: bool,
    pub seed: u64,
}

impl LinearCase {
    /// One line for reports: `m13 k29 (stride 29) n[37] w_row0 5 bias`.
    pub fn describe(&self) -> String {
        format!(
            "GEMM m{} k{} (stride {}) n{:?} w_row0 {}{}",
            self.m,
            self.k,
            self.x_stride,
            self.widths,
            self.w_row0,
            if self.bias { " bias" } else { "" }
        )
    }
}

/// How a GEMM case came out.
#[derive(Clone, Debug)]
pub struct LinearOutcome {
    /// Largest |GPU − reference| over every output.
    pub max_abs: f64,
    /// Largest error over its element's bound (at most 1 when every element passes).
    pub worst_ratio: f64,
    /// The element with that ratio: `Y[row][col] = got, want want (bound b)`.
    pub worst: String,
    pub passed: bool,
}

impl LinearOutcome {
    pub fn summary(&self) -> String {
        format!(
            "max abs err {:.3e}, worst {} ({:.2}x its bound)",
            self.max_abs, self.worst, self.worst_ratio
        )
    }
}

/// The tilings the adapter can run the GEMM in: `tiled` and `blocked` everywhere,
/// `texture` with 8-lane subgroups, `coop` where the context picks it for f16
/// (tensor cores, or their emulation).
pub fn linear_tilings(ctx: &Context) -> Vec<LinearTiling> {
    let mut out = vec![LinearTiling::Tiled, LinearTiling::Blocked];
    if ctx.capabilities().subgroups.is_some_and(|(min, _)| min >= 8) {
        out.push(LinearTiling::Texture);
    }
    if ctx.linear_tiling_for(DType::F16, Precision::Highest) == LinearTiling::Coop {
        out.push(LinearTiling::Coop);
    }
    out
}

/// `check`'s GEMM cases for one tiling and dtype: one 128 x 128 block or less with a
/// bias and W's rows offset, split outputs with X's row stride off the words, and
/// several blocks both ways with strides on them; seeds from `seed`.
pub fn linear_grid(tiling: LinearTiling, dtype: DType, seed: u64) -> Vec<LinearCase> {
    let case = |n: u64, m, k, x_stride, widths: &[usize], w_row0, bias| LinearCase {
        m,
        k,
        x_stride,
        widths: widths.to_vec(),
        w_row0,
        bias,
        dtype,
        tiling,
        prepacked: false,
        seed: seed.wrapping_add(1000 + n),
    };
    vec![
        case(0, 13, 29, 29, &[37], 5, true),
        case(1, 70, 100, 131, &[9, 17, 5], 0, false),
        case(2, 200, 100, 108, &[150, 10], 3, true),
    ]
}

fn round(dtype: DType, values: Vec<f32>) -> Vec<f32> {
    match dtype {
        DType::F32 => values,
        DType::F16 => values.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
    }
}

/// Runs the case on random inputs in [-1, 1) drawn from its seed and compares every
/// output with the f64 reference. Bound per element: f32 accumulation, k + 1
/// roundings of partial sums of at most the sum of |terms| each (2(k + 1)·eps·Σ|term|),
/// plus one f16 rounding of the result for f16 outputs. Errors from encoding (a
/// refused size) are returned.
pub fn run_linear_case(ctx: &Context, case: &LinearCase) -> Result<LinearOutcome> {
    let mut rng = Rng::new(case.seed);
    let n: usize = case.widths.iter().sum();
    let (m, k) = (case.m, case.k);
    let x = round(case.dtype, rng.vec((m - 1) * case.x_stride + k, -1.0, 1.0));
    let rows = case.w_row0 + n;
    let w = round(case.dtype, rng.vec(rows * k, -1.0, 1.0));
    let b = round(case.dtype, rng.vec(rows, -1.0, 1.0));
    let matrix =
        |r: usize, c: usize, data: &[f32]| Tensor::from_f32_as(ctx, [1, 1, r, c], Layout::Bhsd, case.dtype, data);
    let (x_gpu, w_gpu, b_gpu) = (matrix(1, x.len(), &x)?, matrix(rows, k, &w)?, matrix(1, rows, &b)?);
    let outs = case
        .widths
        .iter()
        .map(|&width| Tensor::empty(ctx, [1, 1, m, width], Layout::Bhsd, case.dtype))
        .collect::<Result<Vec<_>>>()?;
    let outputs: Vec<(&wgpu::Buffer, usize)> = outs.iter().zip(&case.widths).map(|(t, &w)| (t.buffer(), w)).collect();
    let source = RowSource::dense(w_gpu.buffer(), rows, k);
    let w_packed = if case.prepacked {
        Some(PackedRows::upload(ctx, case.dtype, &source)?)
    } else {
        None
    };
    let linear = Linear {
        x: x_gpu.buffer(),
        x_stride: case.x_stride,
        w: w_gpu.buffer(),
        w_packed: w_packed.as_ref(),
        bias: case.bias.then(|| b_gpu.buffer()),
        w_row0: case.w_row0,
        outputs: &outputs,
        m,
        k,
    };
    ctx.record_and_submit("submitting a checked GEMM", |encoder| {
        encode_linear(ctx, ctx.policy(), encoder, case.dtype, case.tiling, &linear)
    })?;
    let mut outcome = LinearOutcome {
        max_abs: 0.0,
        worst_ratio: 0.0,
        worst: "none".into(),
        passed: true,
    };
    let mut first_col = 0;
    for (out, &width) in outs.iter().zip(&case.widths) {
        let got = out.to_f32_vec(ctx)?;
        for row in 0..m {
            for col in 0..width {
                let wc = case.w_row0 + first_col + col;
                let mut want = if case.bias { f64::from(b[wc]) } else { 0.0 };
                let mut magnitude = want.abs();
                for i in 0..k {
                    let term = f64::from(x[row * case.x_stride + i]) * f64::from(w[wc * k + i]);
                    want += term;
                    magnitude += term.abs();
                }
                let mut bound = 2.0 * (k + 1) as f64 * f64::from(f32::EPSILON) * magnitude;
                if case.dtype == DType::F16 {
                    bound += want.abs() * 2f64.powi(-10);
                }
                let g = f64::from(got[row * width + col]);
                let err = (g - want).abs();
                // NaN counts as the worst possible element.
                let ratio = if err.is_nan() {
                    f64::INFINITY
                } else {
                    err / bound.max(f64::MIN_POSITIVE)
                };
                outcome.max_abs = outcome.max_abs.max(if err.is_nan() { f64::INFINITY } else { err });
                if ratio > outcome.worst_ratio {
                    outcome.worst_ratio = ratio;
                    outcome.worst = format!("Y[{row}][{}] = {g}, want {want} (bound {bound:.3e})", first_col + col);
                }
            }
        }
        first_col += width;
    }
    outcome.passed = outcome.worst_ratio <= 1.0;
    Ok(outcome)
}
