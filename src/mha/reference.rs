//! CPU reference for the whole multi-head attention layer, in f64: projections, head
//! split, [`crate::reference::attention`], head concat, output projection and post-norm.

use super::config::MhaConfig;
use super::weights::{MhaWeights, Projection};
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::reference;
use crate::tensor::{relayout, Layout};

/// The layer's output `[B, Lq, E]` and per-head attention weights `[B, H, Lq, Lk]`.
#[derive(Clone, Debug)]
pub struct MhaReference {
    /// The layer's output `[B, Lq, E]`, after the post-norm if there is one.
    pub out: Vec<f64>,
    /// The attention weights `[B, H, Lq, Lk]` (`[B, 1, Lq, Lk]` with the options'
    /// `average_weights`), as [`crate::reference::ReferenceOutput::weights`].
    pub weights: Vec<f64>,
    /// Largest |value| among the attention output and the output projection (rounding
    /// errors scale with it), times the post-norm's largest gain `|gamma| / std`.
    pub error_scale: f64,
}

/// Batch-first inputs: `query` `[B, Lq, E]`, `key` `[B, Lk, kdim]`, `value`
/// `[B, Lk, vdim]` (for self-attention pass the query three times). The options'
/// masks, scale and causal alignment apply as in [`crate::sdpa`]; the rest is ignored.
pub fn multi_head_attention(
    config: &MhaConfig,
    weights: &MhaWeights,
    inputs: [&[f32]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
) -> Result<MhaReference> {
    compute(config, weights, inputs, sizes, options, &|x| x)
}

/// The same computation with every intermediate a GPU layer stores (projected Q, K
/// and V, attention output, output projection, result) rounded to f16: what a plain
/// f16 implementation would get. The f16 tolerance is judged against its error.
pub fn f16_stored(
    config: &MhaConfig,
    weights: &MhaWeights,
    inputs: [&[f32]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
) -> Result<MhaReference> {
    compute(config, weights, inputs, sizes, options, &|x| {
        f64::from(half::f16::from_f64(x).to_f32())
    })
}

fn compute(
    config: &MhaConfig,
    weights: &MhaWeights,
    [query, key, value]: [&[f32]; 3],
    [batch, len_q, len_k]: [usize; 3],
    options: &AttentionOptions,
    round: &dyn Fn(f64) -> f64,
) -> Result<MhaReference> {
    weights.check(config)?;
    let sizes = [
        ("query", query.len(), batch * len_q * config.embed_dim),
        ("key", key.len(), batch * len_k * config.kdim),
        ("value", value.len(), batch * len_k * config.vdim),
    ];
    for (what, got, expected) in sizes {
        if got != expected {
            return Err(crate::error::Error::shape(format!("{what} elements"), expected, got));
        }
    }
    let (e, hd) = (config.embed_dim, config.head_dim());
    let rounded = |x: Vec<f64>| -> Vec<f64> { x.into_iter().map(round).collect() };
    let q = rounded(project(&weights.q, query, batch * len_q));
    let k = rounded(project(&weights.k, key, batch * len_k));
    let v = rounded(project(&weights.v, value, batch * len_k));
    let shape = AttentionShape::new(batch, config.num_heads, config.num_kv_heads, len_q, len_k, hd, hd);
    let attended = reference::attention(
        &split_heads(&q, batch, len_q, config.num_heads, hd),
        &split_heads(&k, batch, len_k, config.num_kv_heads, hd),
        &split_heads(&v, batch, len_k, config.num_kv_heads, hd),
        &shape,
        options,
    )?;
    let concat = rounded(concat_heads(&attended.out, batch, len_q, config.num_heads, hd));
    let projected = rounded(project(&weights.o, &concat, batch * len_q));
    let largest = concat.iter().chain(&projected).fold(1.0f64, |m, x| m.max(x.abs()));
    let mut norm_gain: f64 = 1.0;
    let out = match (&weights.norm, config.post_norm) {
        (Some(norm), Some(post)) => {
            let gamma = norm.weight.iter().fold(0.0f64, |m, &g| m.max(f64::from(g).abs()));
            let mut out = Vec::with_capacity(projected.len());
            for (row, x) in projected.chunks(e).zip(query.chunks(e)) {
                let summed: Vec<f64> = row.iter().zip(x).map(|(a, &b)| a + f64::from(b)).collect();
                let mean = summed.iter().sum::<f64>() / e as f64;
                let var = summed.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / e as f64;
                let inv_std = 1.0 / (var + f64::from(post.eps)).sqrt();
                norm_gain = norm_gain.max(gamma * inv_std);
                for (c, s) in summed.iter().enumerate() {
                    out.push(round(
                        (s - mean) * inv_std * f64::from(norm.weight[c]) + f64::from(norm.bias[c]),
                    ));
                }
            }
            out
        }
        _ => projected,
    };
    Ok(MhaReference {
        out,
        weights: attended.weights,
        error_scale: largest * norm_gain,
    })
}

/// `rows` rows of `x` (any element type) through the projection, in f64.
fn project<T: Copy + Into<f64>>(p: &Projection, x: &[T], rows: usize) -> Vec<f64> {
    let (n, k) = (p.out_features, p.in_features);
    let mut y = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let w = &p.weight[c * k..(c + 1) * k];
            let dot: f64 = xr.iter().zip(w).map(|(&a, &b)| a.into() * f64::from(b)).sum();
            y.push(dot + p.bias.as_ref().map_or(0.0, |b| f64::from(b[c])));
        }
    }
    y
}

/// `[B, S, H·D]` (BSHD memory) to `[B, H, S, D]`.
fn split_heads(x: &[f64], batch: usize, seq: usize, heads: usize, dim: usize) -> Vec<f64> {
    relayout(x, [batch, heads, seq, dim], Layout::Bshd, Layout::Bhsd)
}

/// `[B, H, S, D]` to `[B, S, H·D]`.
fn concat_heads(x: &[f64], batch: usize, seq: usize, heads: usize, dim: usize) -> Vec<f64> {
    relayout(x, [batch, heads, seq, dim], Layout::Bhsd, Layout::Bshd)
}
