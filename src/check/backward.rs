//! Checking the backward pass against the f64 reference gradients: the rule of
//! docs/design.md ("Backward"), used by `check` and the tests.

use super::{random_qkv, score_error, sum_error, CheckCase, Rng, Tolerance};
use crate::attention::sdpa;
use crate::backward::sdpa_backward;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::reference::{attention, attention_backward};
use crate::tensor::{relayout, DType, Layout, Tensor};
use half::f16;

/// What one backward case gave.
#[derive(Clone, Debug)]
pub struct BackwardOutcome {
    /// Largest error of dQ, dK and dV, each over its magnitude (see
    /// [`backward_magnitudes`]).
    pub error_over_magnitude: [f64; 3],
    /// The bound on each ratio ([`backward_rel_bound`]).
    pub bound: f64,
    /// Gradient elements that came back NaN or infinite.
    pub non_finite: usize,
    pub passed: bool,
}

impl BackwardOutcome {
    pub fn summary(&self) -> String {
        let [q, k, v] = self.error_over_magnitude;
        format!(
            "backward: error / magnitude dq {q:.3e}, dk {k:.3e}, dv {v:.3e} (bound {:.1e}), non-finite {}",
            self.bound, self.non_finite
        )
    }
}

/// Each gradient's error bound, as a fraction of its magnitude (docs/design.md,
/// "Backward"): the arithmetic's, about 17 f32 epsilons, or 4 f16 epsilons where the
/// gradients are stored in f16 or the forward they start from may multiply in f16
/// (`precision` below `Highest`); plus what the inputs every gradient takes in carry,
/// scaled with the problem's scores as the forward's bounds are (`forward`: the
/// reference forward): P = exp(s − lse) from a recomputed score (δ, [`score_error`]),
/// the forward's lse ([`Tolerance::lse_bound`]) and exp's rounding, and D from the
/// forward's output (`2δ` and the sums' rounding, relative to the terms of dP it
/// cancels against).
pub fn backward_rel_bound(
    dtype: DType,
    precision: crate::options::Precision,
    s: &AttentionShape,
    forward: &crate::reference::ReferenceOutput,
) -> f64 {
    let eps = f64::from(f32::EPSILON);
    let delta = score_error(s, forward.max_abs_product);
    let probabilities = delta + Tolerance::lse_bound(s, forward) + 2.0 * eps;
    let output = 2.0 * delta + sum_error(s);
    let arithmetic = match (dtype, precision) {
        (DType::F32, crate::options::Precision::Highest) => 1e-6,
        _ => 2e-3,
    };
    arithmetic + probabilities + output
}

/// The largest finite |x| (bounds scale with the finite values; non-finite results are
/// compared exactly, `ErrorStats`).
fn max_abs(x: &[f32]) -> f64 {
    x.iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(f64::from(v.abs())))
}

/// The magnitudes the gradients' rounding errors scale with: the terms before they
/// cancel (`dS = P (dP − D)` cancels exactly where one key takes all the weight). With
/// A = Dv·max|dO|·max|v| (bounding |dP| and |D|) and c the largest column sum of P over
/// the rows and heads that see a key: dQ ~ scale·max|k|·2A, dK ~ scale·max|q|·2A·c,
/// dV ~ max|dO|·c. Over the finite values only (NaN and infinities are compared exactly).
pub fn backward_magnitudes(
    [q, k, v, d_out]: [&[f32]; 4],
    s: &AttentionShape,
    options: &AttentionOptions,
) -> Result<[f64; 3]> {
    let forward = attention(q, k, v, s, options)?;
    let group = s.heads_q / s.heads_kv;
    let mut column = vec![0.0f64; s.batch * s.heads_kv * s.len_k];
    for (at, p) in forward.weights.iter().enumerate() {
        if !p.is_finite() {
            continue; // a NaN row's
        }
        let j = at % s.len_k;
        let h = at / (s.len_q * s.len_k) % s.heads_q;
        let b = at / (s.heads_q * s.len_q * s.len_k);
        column[(b * s.heads_kv + h / group) * s.len_k + j] += p;
    }
    let c = column.iter().fold(0.0f64, |m, &x| m.max(x));
    let a = s.head_dim_v as f64 * max_abs(d_out) * max_abs(v);
    let scale = f64::from(s.scale(options));
    Ok([
        scale * max_abs(k) * 2.0 * a,
        scale * max_abs(q) * 2.0 * a * c,
        max_abs(d_out) * c,
    ])
}

/// [`run_backward_case_async`], blocking. Native targets only.
#[cfg(not(target_arch = "wasm32"))]
pub fn run_backward_case(ctx: &Context, case: &CheckCase) -> Result<BackwardOutcome> {
    pollster::block_on(run_backward_case_async(ctx, case))
}

/// Runs the forward (fused, with its lse) and the backward pass on `case`'s random
/// inputs and a random dO (seeded from the case), and compares the gradients with the
/// reference's.
pub async fn run_backward_case_async(ctx: &Context, case: &CheckCase) -> Result<BackwardOutcome> {
    let s = case.shape;
    let [q, k, v] = random_qkv(case);
    let mut rng = Rng::new(case.seed ^ 0xBAC4_3A2D);
    let d_out: Vec<f32> = rng
        .vec(s.batch * s.heads_q * s.len_q * s.head_dim_v, -case.range, case.range)
        .into_iter()
        .map(|x| match case.dtype {
            DType::F32 => x,
            DType::F16 => f16::from_f32(x).to_f32(),
        })
        .collect();
    let options = AttentionOptions {
        need_weights: false,
        average_weights: false,
        ..case.options.clone()
    };
    let want = attention_backward(&q, &k, &v, &d_out, &s, &options)?;
    let magnitude = backward_magnitudes([&q, &k, &v, &d_out], &s, &options)?;
    let layout = case.layout;
    let shapes = [
        [s.batch, s.heads_q, s.len_q, s.head_dim],
        [s.batch, s.heads_kv, s.len_k, s.head_dim],
        [s.batch, s.heads_kv, s.len_k, s.head_dim_v],
        s.out_shape(),
    ];
    let upload = |data: &[f32], shape: [usize; 4]| {
        Tensor::from_f32_as(
            ctx,
            shape,
            layout,
            case.dtype,
            &relayout(data, shape, Layout::Bhsd, layout),
        )
    };
    let (qt, kt, vt) = (upload(&q, shapes[0])?, upload(&k, shapes[1])?, upload(&v, shapes[2])?);
    let forward = sdpa(
        ctx,
        &qt,
        &kt,
        &vt,
        &AttentionOptions {
            need_lse: true,
            output_layout: Some(layout),
            ..options.clone()
        },
    )?;
    let lse = forward
        .lse
        .as_ref()
        .ok_or_else(|| Error::invalid("backward check", "no lse"))?;
    let dot = upload(&d_out, shapes[3])?;
    let grads = sdpa_backward(ctx, &qt, &kt, &vt, &forward.out, lse, &dot, &options)?;
    let mut ratios = [0.0; 3];
    let mut non_finite = 0;
    for (n, (t, want, shape)) in [
        (&grads.dq, &want.dq, shapes[0]),
        (&grads.dk, &want.dk, shapes[1]),
        (&grads.dv, &want.dv, shapes[2]),
    ]
    .into_iter()
    .enumerate()
    {
        let got = relayout(&t.to_f32_vec_async(ctx).await?, shape, layout, Layout::Bhsd);
        non_finite += got.iter().filter(|x| !x.is_finite()).count();
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0f64, f64::max);
        ratios[n] = worst / magnitude[n].max(1e-30);
    }
    let bound = backward_rel_bound(
        case.dtype,
        case.options.precision,
        &s,
        &attention(&q, &k, &v, &s, &options)?,
    );
    Ok(BackwardOutcome {
        error_over_magnitude: ratios,
        bound,
        non_finite,
        passed: non_finite == 0 && ratios.iter().all(|&r| r <= bound),
    })
}
