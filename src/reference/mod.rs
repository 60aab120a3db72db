//! CPU reference: the contract of docs/design.md ("Semantics") written for obviousness, with f64
//! accumulation. Every GPU path is tested against this.

use crate::error::{checked_product, Error, Result};
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;

/// Results of the reference, all BHSD and in f64.
#[derive(Clone, Debug)]
pub struct ReferenceOutput {
    /// `[B, Hq, Lq, Dv]`.
    pub out: Vec<f64>,
    /// `[B, Hq, Lq, Lk]`, or `[B, 1, Lq, Lk]` with `average_weights` (the heads' sum
    /// in head order, divided by Hq); zeros on masked positions and fully masked rows.
    pub weights: Vec<f64>,
    /// `[B, Hq, Lq]`; `-inf` for fully masked rows.
    pub lse: Vec<f64>,
    /// Largest |scaled score + bias| over visible positions (rounding errors scale with it).
    pub max_abs_score: f64,
    /// Largest `scale · Σ_t |q_t k_t| + |bias|` (+ the soft cap, whose tanh rounds in
    /// proportion to it) over visible positions: what bounds the rounding error of a
    /// score computed in f32, which can exceed |score| many times when the products
    /// cancel.
    pub max_abs_product: f64,
    /// Largest |v| over all values (output errors scale with it).
    pub max_abs_value: f64,
}

/// What is added to a visible position's (soft-capped) scaled score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bias {
    /// `−slope · |p(i) − j|`, or 0 without ALiBi.
    pub alibi: f64,
    /// The additive mask's value, or 0.
    pub mask: f64,
}

impl Bias {
    /// `alibi + mask`: the whole bias added to the score.
    pub fn total(self) -> f64 {
        self.alibi + self.mask
    }

    /// `|alibi| + |mask|`: what the f32 rounding of the two terms and their sum scales with.
    pub fn magnitude(self) -> f64 {
        self.alibi.abs() + self.mask.abs()
    }
}

/// Whether query `i` may attend key `j`, and if so the bias added to its (soft-capped)
/// scaled score (docs/design.md, "Masks").
pub fn visible(
    shape: &AttentionShape,
    options: &AttentionOptions,
    b: usize,
    h: usize,
    i: usize,
    j: usize,
) -> Option<Bias> {
    let pos = options.query_position(shape.len_q, shape.len_k, b, i);
    let j = j as i64;
    if options.causal.is_some() && j > pos {
        return None;
    }
    if let Some(window) = options.window {
        if window.left.is_some_and(|left| j < pos - left as i64)
            || window.right.is_some_and(|right| j > pos + right as i64)
        {
            return None;
        }
    }
    if let Some(lens) = &options.key_lengths {
        if j >= i64::from(lens[b]) {
            return None;
        }
    }
    let alibi = options
        .alibi_slopes
        .as_ref()
        .map_or(0.0, |slopes| -f64::from(slopes[h]) * (pos - j).abs() as f64);
    let mask = match &options.mask {
        Some(mask) => f64::from(mask.bias_at(b, h, i, j as usize)?),
        None => 0.0,
    };
    Some(Bias { alibi, mask })
}

/// The scaled score after soft-capping, `cap · tanh(s / cap)` (unchanged without a cap).
pub fn soft_capped(options: &AttentionOptions, scaled: f64) -> f64 {
    match options.softcap {
        Some(cap) => {
            let cap = f64::from(cap);
            cap * (scaled / cap).tanh()
        }
        None => scaled,
    }
}

/// Checks that q, k, v (and, for the backward pass, dO) hold the elements `shape` gives
/// them, BHSD.
fn check_lengths(shape: &AttentionShape, q: usize, k: usize, v: usize, d_out: Option<usize>) -> Result<()> {
    let (b, hq, hk) = (shape.batch, shape.heads_q, shape.heads_kv);
    let out = [b, hq, shape.len_q, shape.head_dim_v];
    for (name, data, dims) in [
        ("q", Some(q), [b, hq, shape.len_q, shape.head_dim]),
        ("k", Some(k), [b, hk, shape.len_k, shape.head_dim]),
        ("v", Some(v), [b, hk, shape.len_k, shape.head_dim_v]),
        ("d_out", d_out, out),
    ] {
        let Some(data) = data else { continue };
        let expected = checked_product(name, &dims)?;
        if data != expected {
            return Err(Error::shape(
                format!("length of {name}"),
                format!("{expected} elements ({dims:?})"),
                data,
            ));
        }
    }
    Ok(())
}

/// The largest of a row's visible scores, NaN where any is NaN (`f64::max` would drop
/// it, and a row of NaN scores would pass for a fully masked one), -inf where there
/// are none.
pub(crate) fn row_max(scores: impl Iterator<Item = f64>) -> f64 {
    scores.fold(f64::NEG_INFINITY, |m, s| {
        if m.is_nan() || s.is_nan() {
            f64::NAN
        } else {
            m.max(s)
        }
    })
}

/// Scaled dot-product attention on BHSD host data (f32, or f64 for a reference built
/// on other f64 results, as the multi-head one). The shape, the options and the three
/// slices' lengths are checked first.
pub fn attention<T: Copy + Into<f64>>(
    q: &[T],
    k: &[T],
    v: &[T],
    shape: &AttentionShape,
    options: &AttentionOptions,
) -> Result<ReferenceOutput> {
    shape.validate()?;
    shape.check_options(options)?;
    check_lengths(shape, q.len(), k.len(), v.len(), None)?;
    let AttentionShape {
        batch,
        heads_q,
        heads_kv,
        len_q,
        len_k,
        head_dim: d,
        head_dim_v: dv,
    } = *shape;
    let scale = f64::from(shape.scale(options));
    let mut out = vec![0.0; batch * heads_q * len_q * dv];
    let mut weights = vec![0.0; batch * heads_q * len_q * len_k];
    let mut lse = vec![f64::NEG_INFINITY; batch * heads_q * len_q];
    let mut scores = vec![None::<f64>; len_k];
    let mut max_abs_score: f64 = 0.0;
    let mut max_abs_product: f64 = 0.0;
    for b in 0..batch {
        for h in 0..heads_q {
            let hk = shape.kv_head(h);
            let q_head = &q[(b * heads_q + h) * len_q * d..][..len_q * d];
            let k_head = &k[(b * heads_kv + hk) * len_k * d..][..len_k * d];
            let v_head = &v[(b * heads_kv + hk) * len_k * dv..][..len_k * dv];
            for i in 0..len_q {
                let row = (b * heads_q + h) * len_q + i;
                for (j, score) in scores.iter_mut().enumerate() {
                    *score = visible(shape, options, b, h, i, j).map(|bias| {
                        let products = (0..d).map(|t| q_head[i * d + t].into() * k_head[j * d + t].into());
                        let (dot, abs) = products.fold((0.0, 0.0), |(s, a): (f64, f64), x| (s + x, a + x.abs()));
                        // The soft cap's own rounding scales with the cap.
                        let cap = options.softcap.map_or(0.0, f64::from);
                        let product = abs * scale + bias.magnitude() + cap;
                        if product.is_finite() {
                            max_abs_product = max_abs_product.max(product);
                        }
                        soft_capped(options, dot * scale) + bias.total()
                    });
                }
                // A NaN score makes the row NaN; +inf makes it NaN too, through
                // exp(inf - inf), as every GPU path and PyTorch give.
                let max = row_max(scores.iter().flatten().copied());
                if max == f64::NEG_INFINITY {
                    continue; // fully masked row: zeros and lse = -inf
                }
                // The error bounds scale with the finite scores and values; non-finite
                // results are compared exactly (check::ErrorStats).
                max_abs_score = scores
                    .iter()
                    .flatten()
                    .filter(|s| s.is_finite())
                    .fold(max_abs_score, |m, s| m.max(s.abs()));
                let sum: f64 = scores.iter().flatten().map(|s| (s - max).exp()).sum();
                lse[row] = max + sum.ln();
                for (j, score) in scores.iter().enumerate() {
                    if let Some(s) = score {
                        let p = (s - max).exp() / sum;
                        weights[row * len_k + j] = p;
                        for c in 0..dv {
                            out[row * dv + c] += p * v_head[j * dv + c].into();
                        }
                    }
                }
            }
        }
    }
    if options.average_weights {
        let plane = len_q * len_k;
        weights = (0..batch * plane)
            .map(|x| {
                let (b, at) = (x / plane, x % plane);
                (0..heads_q)
                    .map(|h| weights[(b * heads_q + h) * plane + at])
                    .sum::<f64>()
                    / heads_q as f64
            })
            .collect();
    }
    Ok(ReferenceOutput {
        out,
        weights,
        lse,
        max_abs_score,
        max_abs_product,
        max_abs_value: v
            .iter()
            .map(|&x| x.into().abs())
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max),
    })
}

mod backward;
pub use backward::{attention_backward, ReferenceGradients};
pub mod int8;
pub(crate) mod rng;
