//! The gradients of attention on the CPU, in f64: what every GPU backward path is tested
//! against (docs/design.md, "Backward"). Written for obviousness: each row's
//! probabilities recomputed exactly, then the chain rule term by term.
//!
//! For a row i with visible keys j, s_ij = softcap(scale · q_i·k_j) + bias_ij,
//! P = softmax(s), O_i = Σ_j P_ij v_j. Given dO:
//!   dV_j += P_ij dO_i;  dP_ij = dO_i·v_j;  D_i = Σ_j P_ij dP_ij (= dO_i·O_i);
//!   dS_ij = P_ij (dP_ij − D_i);  dX_ij = dS_ij · (1 − tanh²(x_ij / cap)) with a soft cap
//!   (x = scale · q·k), dS_ij without;  dQ_i += scale Σ_j dX_ij k_j;  dK_j += scale dX_ij q_i.
//! Biases (ALiBi, additive masks) have no gradient here; masked positions contribute
//! nothing; a row with no visible key has zero gradients. Under GQA, dK and dV of a
//! key/value head sum over the query heads that share it.

use super::{soft_capped, visible};
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;

/// Gradients of attention, BHSD, in f64.
#[derive(Clone, Debug)]
pub struct ReferenceGradients {
    /// `[B, Hq, Lq, D]`.
    pub dq: Vec<f64>,
    /// `[B, Hkv, Lk, D]`.
    pub dk: Vec<f64>,
    /// `[B, Hkv, Lk, Dv]`.
    pub dv: Vec<f64>,
    /// `D_i = dO_i · O_i`, `[B, Hq, Lq]` (0 for rows with no visible key).
    pub delta: Vec<f64>,
}

/// The gradients of [`super::attention`] with respect to q, k and v, given the
/// output's gradient `d_out` (`[B, Hq, Lq, Dv]`), on BHSD host data.
pub fn attention_backward<T: Copy + Into<f64>>(
    q: &[T],
    k: &[T],
    v: &[T],
    d_out: &[T],
    shape: &AttentionShape,
    options: &AttentionOptions,
) -> Result<ReferenceGradients> {
    shape.validate()?;
    shape.check_options(options)?;
    let AttentionShape {
        batch,
        heads_q,
        heads_kv,
        len_q,
        len_k,
        head_dim: d,
        head_dim_v: dv,
    } = *shape;
    super::check_lengths(shape, q.len(), k.len(), v.len(), Some(d_out.len()))?;
    let scale = f64::from(shape.scale(options));
    let cap = options.softcap.map(f64::from);
    let mut grads = ReferenceGradients {
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
        delta: vec![0.0; batch * heads_q * len_q],
    };
    // Per row: (x_ij, s_ij) for visible keys.
    let mut scores = vec![None::<(f64, f64)>; len_k];
    let mut probs = vec![0.0; len_k];
    for b in 0..batch {
        for h in 0..heads_q {
            let hk = shape.kv_head(h);
            let q_at = |i: usize, t: usize| q[((b * heads_q + h) * len_q + i) * d + t].into();
            let k_at = |j: usize, t: usize| k[((b * heads_kv + hk) * len_k + j) * d + t].into();
            let v_at = |j: usize, c: usize| v[((b * heads_kv + hk) * len_k + j) * dv + c].into();
            let do_at = |i: usize, c: usize| d_out[((b * heads_q + h) * len_q + i) * dv + c].into();
            for i in 0..len_q {
                for (j, score) in scores.iter_mut().enumerate() {
                    *score = visible(shape, options, b, h, i, j).map(|bias| {
                        let x = scale * (0..d).map(|t| q_at(i, t) * k_at(j, t)).sum::<f64>();
                        (x, soft_capped(options, x) + bias.total())
                    });
                }
                let max = super::row_max(scores.iter().flatten().map(|s| s.1));
                if max == f64::NEG_INFINITY {
                    continue; // no visible key: zero gradients
                }
                let sum: f64 = scores.iter().flatten().map(|s| (s.1 - max).exp()).sum();
                for (p, score) in probs.iter_mut().zip(&scores) {
                    *p = score.map_or(0.0, |s| (s.1 - max).exp() / sum);
                }
                let row = (b * heads_q + h) * len_q + i;
                // dP_ij = dO_i · v_j, and D_i = Σ_j P_ij dP_ij.
                let dp: Vec<f64> = (0..len_k)
                    .map(|j| {
                        if probs[j] == 0.0 {
                            0.0
                        } else {
                            (0..dv).map(|c| do_at(i, c) * v_at(j, c)).sum()
                        }
                    })
                    .collect();
                let delta: f64 = (0..len_k).map(|j| probs[j] * dp[j]).sum();
                grads.delta[row] = delta;
                for j in 0..len_k {
                    let Some((x, _)) = scores[j] else { continue };
                    let p = probs[j];
                    let kv_row = (b * heads_kv + hk) * len_k + j;
                    for c in 0..dv {
                        grads.dv[kv_row * dv + c] += p * do_at(i, c);
                    }
                    let ds = p * (dp[j] - delta);
                    let dx = match cap {
                        Some(cap) => ds * (1.0 - (x / cap).tanh().powi(2)),
                        None => ds,
                    };
                    for t in 0..d {
                        grads.dq[row * d + t] += scale * dx * k_at(j, t);
                        grads.dk[kv_row * d + t] += scale * dx * q_at(i, t);
                    }
                }
            }
        }
    }
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{CausalAlignment, Mask, Window};
    use crate::reference::rng::Rng;

    /// Σ out · w for a fixed random w: its gradient with respect to the output is w.
    fn loss(q: &[f64], k: &[f64], v: &[f64], w: &[f64], shape: &AttentionShape, options: &AttentionOptions) -> f64 {
        let out = super::super::attention(q, k, v, shape, options).expect("forward").out;
        out.iter().zip(w).map(|(o, w)| o * w).sum()
    }

    /// Every gradient entry against a central difference of the f64 forward.
    fn check_against_finite_differences(shape: AttentionShape, options: AttentionOptions, seed: u64) {
        let mut rng = Rng::new(seed);
        let mut draw = |n: usize| -> Vec<f64> { rng.vec(n, -1.0, 1.0).into_iter().map(f64::from).collect() };
        let q = draw(shape.batch * shape.heads_q * shape.len_q * shape.head_dim);
        let k = draw(shape.batch * shape.heads_kv * shape.len_k * shape.head_dim);
        let v = draw(shape.batch * shape.heads_kv * shape.len_k * shape.head_dim_v);
        let w = draw(shape.batch * shape.heads_q * shape.len_q * shape.head_dim_v);
        let grads = attention_backward(&q, &k, &v, &w, &shape, &options).expect("backward");
        let h = 1e-6;
        for (which, analytic) in [(0, &grads.dq), (1, &grads.dk), (2, &grads.dv)] {
            for idx in 0..analytic.len() {
                let mut plus = [q.clone(), k.clone(), v.clone()];
                let mut minus = plus.clone();
                plus[which][idx] += h;
                minus[which][idx] -= h;
                let numeric = (loss(&plus[0], &plus[1], &plus[2], &w, &shape, &options)
                    - loss(&minus[0], &minus[1], &minus[2], &w, &shape, &options))
                    / (2.0 * h);
                assert!(
                    (numeric - analytic[idx]).abs() <= 1e-6 * (1.0 + numeric.abs()),
                    "seed {seed}, {} [{idx}]: numeric {numeric}, analytic {} ({options:?})",
                    ["dq", "dk", "dv"][which],
                    analytic[idx]
                );
            }
        }
    }

    #[test]
    fn the_reference_gradients_match_central_differences() {
        // GQA, Dv != D, Lq != Lk, and each option with a gradient meaning (causal with
        // key lengths, soft cap with ALiBi and a scale, a window with an additive mask
        // that hides some positions).
        let shape = AttentionShape::new(2, 4, 2, 3, 5, 3, 2);
        let mut rng = Rng::new(7);
        let cases = [
            AttentionOptions::default(),
            AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                key_lengths: Some(vec![4, 2]),
                ..Default::default()
            },
            AttentionOptions {
                softcap: Some(0.7),
                alibi_slopes: Some(vec![0.5, 0.25, 0.125, 1.0]),
                scale: Some(1.3),
                ..Default::default()
            },
            AttentionOptions {
                window: Some(Window {
                    left: Some(1),
                    right: Some(0),
                }),
                mask: Some(
                    Mask::additive(
                        &[2, 1, 3, 5],
                        rng.vec(30, -1.0, 1.0)
                            .into_iter()
                            .map(|x| if x > 0.8 { f32::NEG_INFINITY } else { x })
                            .collect(),
                    )
                    .expect("mask"),
                ),
                ..Default::default()
            },
        ];
        for (n, options) in cases.into_iter().enumerate() {
            check_against_finite_differences(shape, options, 40 + n as u64);
        }
    }

    #[test]
    fn rows_with_no_visible_key_get_zero_gradients_never_nan() {
        let shape = AttentionShape::new(1, 1, 1, 2, 3, 2, 2);
        let options = AttentionOptions {
            key_lengths: Some(vec![0]),
            ..Default::default()
        };
        let ones = [1.0f32; 6];
        let g = attention_backward(&ones[..4], &ones, &ones, &ones[..4], &shape, &options).expect("backward");
        assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0), "{g:?}");
    }
}
