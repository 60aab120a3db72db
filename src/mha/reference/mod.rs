//! CPU reference for the whole multi-head attention layer, in f64: projections, head
//! split, [`crate::reference::attention`], head concat, output projection and post-norm.

use super::config::MhaConfig;
use super::weights::{MhaWeights, Projection};
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::reference;
use crate::tensor::{relayout, Layout};

mod backward;

pub use backward::{
    f16_stored_backward, multi_head_attention_backward, MhaBackwardReference, MhaReferenceGradients, NormGradients,
    ProjectionGradients,
};

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
    inputs: [&[f32]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
    round: &dyn Fn(f64) -> f64,
) -> Result<MhaReference> {
    let held = Weights64::of(config, weights)?;
    let [query, key, value] = inputs.map(widen);
    let pass = Pass::run(config, &held, [&query, &key, &value], sizes, options, round)?;
    let largest = pass
        .concat
        .iter()
        .chain(&pass.projected)
        .fold(1.0f64, |m, x| m.max(x.abs()));
    let norm_gain = match (&held.norm, &pass.norm) {
        (Some(norm), Some(stats)) => {
            let gamma = norm.weight.iter().fold(0.0f64, |m, g| m.max(g.abs()));
            stats.inv_std.iter().fold(1.0f64, |m, s| m.max(gamma * s))
        }
        _ => 1.0,
    };
    let weights = if options.average_weights {
        average_heads(
            &pass.attended.weights,
            pass.batch,
            config.num_heads,
            pass.len_q * pass.len_k,
        )
    } else {
        pass.attended.weights
    };
    Ok(MhaReference {
        out: pass.out,
        weights,
        error_scale: largest * norm_gain,
    })
}

/// f32 host values widened to f64.
fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// A projection's weight and bias in f64 (what the reference computes with, and what
/// a finite-difference test perturbs).
#[derive(Clone, Debug)]
struct Projection64 {
    weight: Vec<f64>,
    bias: Option<Vec<f64>>,
    out_features: usize,
    in_features: usize,
}

/// LayerNorm scale and shift in f64.
#[derive(Clone, Debug)]
struct Norm64 {
    weight: Vec<f64>,
    bias: Vec<f64>,
    eps: f64,
}

/// The layer's weights in f64, checked against its config; the norm only where the
/// config has a post-norm (as the GPU layer applies it).
#[derive(Clone, Debug)]
struct Weights64 {
    q: Projection64,
    k: Projection64,
    v: Projection64,
    o: Projection64,
    norm: Option<Norm64>,
}

impl Weights64 {
    fn of(config: &MhaConfig, w: &MhaWeights) -> Result<Self> {
        w.check(config)?;
        let p = |p: &Projection| Projection64 {
            weight: widen(&p.weight),
            bias: p.bias.as_deref().map(widen),
            out_features: p.out_features,
            in_features: p.in_features,
        };
        Ok(Weights64 {
            q: p(&w.q),
            k: p(&w.k),
            v: p(&w.v),
            o: p(&w.o),
            norm: match (&w.norm, config.post_norm) {
                (Some(n), Some(post)) => Some(Norm64 {
                    weight: widen(&n.weight),
                    bias: widen(&n.bias),
                    eps: f64::from(post.eps),
                }),
                _ => None,
            },
        })
    }
}

/// Per-row statistics of the post-norm.
#[derive(Clone, Debug)]
struct NormStats {
    /// `(x + query - mean) / std`, `[B·Lq, E]`.
    normalized: Vec<f64>,
    /// `1 / sqrt(var + eps)` per row.
    inv_std: Vec<f64>,
}

/// Every intermediate of one forward pass (what the backward pass reuses).
#[derive(Clone, Debug)]
struct Pass {
    batch: usize,
    len_q: usize,
    len_k: usize,
    /// Projected Q `[B·Lq, E]`, K and V `[B·Lk, kv_width]` (BSHD memory).
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    /// The attention step's result, BHSD, with per-head weights `[B, H, Lq, Lk]`.
    attended: reference::ReferenceOutput,
    /// The heads concatenated, `[B·Lq, E]`.
    concat: Vec<f64>,
    /// The output projection, `[B·Lq, E]`.
    projected: Vec<f64>,
    norm: Option<NormStats>,
    out: Vec<f64>,
}

impl Pass {
    /// The forward pass, every stored intermediate passed through `round`.
    fn run(
        config: &MhaConfig,
        w: &Weights64,
        [query, key, value]: [&[f64]; 3],
        [batch, len_q, len_k]: [usize; 3],
        options: &AttentionOptions,
        round: &dyn Fn(f64) -> f64,
    ) -> Result<Self> {
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
        let mut q = rounded(project(&w.q, query, batch * len_q));
        let mut k = rounded(project(&w.k, key, batch * len_k));
        if let Some(rotary) = &config.rotary {
            // Each head's slice of row s of a sequence, at position s; stored again.
            for (x, len, heads) in [(&mut q, len_q, config.num_heads), (&mut k, len_k, config.num_kv_heads)] {
                for (r, head) in x.chunks_mut(hd).enumerate() {
                    let position = ((r / heads) % len) as u32;
                    let rotated = rotary.rotate_row64(head, position);
                    for (slot, value) in head.iter_mut().zip(rotated) {
                        *slot = round(value);
                    }
                }
            }
        }
        let v = rounded(project(&w.v, value, batch * len_k));
        let shape = AttentionShape::new(batch, config.num_heads, config.num_kv_heads, len_q, len_k, hd, hd);
        let per_head = AttentionOptions {
            average_weights: false,
            ..options.clone()
        };
        let attended = reference::attention(
            &split_heads(&q, batch, len_q, config.num_heads, hd),
            &split_heads(&k, batch, len_k, config.num_kv_heads, hd),
            &split_heads(&v, batch, len_k, config.num_kv_heads, hd),
            &shape,
            &per_head,
        )?;
        let concat = rounded(concat_heads(&attended.out, batch, len_q, config.num_heads, hd));
        let projected = rounded(project(&w.o, &concat, batch * len_q));
        let (out, norm) = match &w.norm {
            Some(norm) => {
                let mut out = Vec::with_capacity(projected.len());
                let mut stats = NormStats {
                    normalized: Vec::with_capacity(projected.len()),
                    inv_std: Vec::with_capacity(batch * len_q),
                };
                for (row, x) in projected.chunks(e).zip(query.chunks(e)) {
                    let summed: Vec<f64> = row.iter().zip(x).map(|(a, b)| a + b).collect();
                    let mean = summed.iter().sum::<f64>() / e as f64;
                    let var = summed.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / e as f64;
                    let inv_std = 1.0 / (var + norm.eps).sqrt();
                    stats.inv_std.push(inv_std);
                    for (c, s) in summed.iter().enumerate() {
                        let normalized = (s - mean) * inv_std;
                        stats.normalized.push(normalized);
                        out.push(round(normalized * norm.weight[c] + norm.bias[c]));
                    }
                }
                (out, Some(stats))
            }
            None => (projected.clone(), None),
        };
        Ok(Pass {
            batch,
            len_q,
            len_k,
            q,
            k,
            v,
            attended,
            concat,
            projected,
            norm,
            out,
        })
    }
}

/// `[B, H, n]` to its mean over heads, `[B, 1, n]` (summed in head order).
fn average_heads(x: &[f64], batch: usize, heads: usize, n: usize) -> Vec<f64> {
    let mut mean = vec![0.0; batch * n];
    for b in 0..batch {
        for h in 0..heads {
            for (m, w) in mean[b * n..(b + 1) * n].iter_mut().zip(&x[(b * heads + h) * n..][..n]) {
                *m += w;
            }
        }
        for m in &mut mean[b * n..(b + 1) * n] {
            *m /= heads as f64;
        }
    }
    mean
}

/// `rows` rows of `x` through the projection, in f64.
fn project(p: &Projection64, x: &[f64], rows: usize) -> Vec<f64> {
    let (n, k) = (p.out_features, p.in_features);
    let mut y = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let w = &p.weight[c * k..(c + 1) * k];
            let dot: f64 = xr.iter().zip(w).map(|(a, b)| a * b).sum();
            y.push(dot + p.bias.as_ref().map_or(0.0, |b| b[c]));
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
