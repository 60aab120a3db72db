//! The gradients of the whole multi-head attention layer on the CPU, in f64: what the
//! GPU backward pass is tested against (docs/design.md, "Backward").
//!
//! With `Y = X · Wᵀ + b` for each projection: `dX = dY · W`, `dW = dYᵀ · X`,
//! `db = Σ_rows dY`. The post-norm `LayerNorm(P + query)` with `x̂` the normalised
//! row, `g = dOut ∘ γ` and `s = 1/std`: `dγ = Σ_rows dOut ∘ x̂`, `dβ = Σ_rows dOut`,
//! `d(P + query) = s · (g − mean(g) − x̂ · mean(g ∘ x̂))`. The attention step is
//! [`crate::reference::attention_backward`]. Self-attention's one input gets the sum
//! of its query, key and value paths ([`MhaReferenceGradients::d_self_input`]).
//!
//! Alongside every gradient it returns its *magnitude*: per element, the sum of the
//! absolute values of the terms it is made of, propagated through the chain as if no
//! term cancelled. Rounding errors of a computation in f32 are a small multiple of it,
//! so tests judge each element against it.

use super::{concat_heads, split_heads, widen, Pass, Projection64, Weights64};
use crate::error::{Error, Result};
use crate::mha::config::MhaConfig;
use crate::mha::weights::MhaWeights;
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::reference;

/// The gradients of one projection `y = x · Wᵀ + b`.
#[derive(Clone, Debug)]
pub struct ProjectionGradients {
    /// `[out_features, in_features]`, as the weight.
    pub weight: Vec<f64>,
    /// `[out_features]`, where the projection has a bias.
    pub bias: Option<Vec<f64>>,
}

/// The gradients of the post-norm's LayerNorm.
#[derive(Clone, Debug)]
pub struct NormGradients {
    /// Of the scale `gamma`, `[E]`.
    pub weight: Vec<f64>,
    /// Of the shift `beta`, `[E]`.
    pub bias: Vec<f64>,
}

/// Every gradient of the layer, given the output's gradient.
#[derive(Clone, Debug)]
pub struct MhaReferenceGradients {
    /// With respect to the query input, `[B, Lq, E]` (its query path, plus the post-norm's
    /// residual path).
    pub d_query: Vec<f64>,
    /// With respect to the key input, `[B, Lk, kdim]` (its key path).
    pub d_key: Vec<f64>,
    /// With respect to the value input, `[B, Lk, vdim]` (its value path).
    pub d_value: Vec<f64>,
    /// Of the query projection.
    pub q: ProjectionGradients,
    /// Of the key projection.
    pub k: ProjectionGradients,
    /// Of the value projection.
    pub v: ProjectionGradients,
    /// Of the output projection.
    pub o: ProjectionGradients,
    /// Of the post-norm, where the layer has one.
    pub norm: Option<NormGradients>,
}

impl MhaReferenceGradients {
    /// The gradient with respect to a self-attention layer's one input: the sum of the
    /// query, key and value paths. An error where the three differ in size (not
    /// self-attention).
    pub fn d_self_input(&self) -> Result<Vec<f64>> {
        let n = self.d_query.len();
        if self.d_key.len() != n || self.d_value.len() != n {
            return Err(Error::shape(
                "self-attention input gradient",
                format!("query, key and value paths of {n} elements each"),
                format!("{}, {} and {}", n, self.d_key.len(), self.d_value.len()),
            ));
        }
        Ok(self
            .d_query
            .iter()
            .zip(&self.d_key)
            .zip(&self.d_value)
            .map(|((q, k), v)| q + k + v)
            .collect())
    }
}

/// The layer's gradients and, element for element, their magnitudes (the sum of the
/// absolute values of each gradient's terms, through the whole chain).
#[derive(Clone, Debug)]
pub struct MhaBackwardReference {
    /// The gradients.
    pub gradients: MhaReferenceGradients,
    /// Their magnitudes, in the same layout: what rounding errors scale with.
    pub magnitudes: MhaReferenceGradients,
}

/// The gradients of [`super::multi_head_attention`] (same arguments) given the output's
/// gradient `d_out` (`[B, Lq, E]`), in f64.
pub fn multi_head_attention_backward(
    config: &MhaConfig,
    weights: &MhaWeights,
    inputs: [&[f32]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
    d_out: &[f32],
) -> Result<MhaBackwardReference> {
    let held = Weights64::of(config, weights)?;
    let [q, k, v] = inputs.map(widen);
    backward(config, &held, [&q, &k, &v], sizes, options, &widen(d_out), &|x| x)
}

/// The same gradients with every intermediate an f16 GPU layer stores rounded to f16
/// (the forward's, plus the output projection's and the attention step's gradients):
/// what a plain f16 implementation would get. The f16 tolerance is judged against its
/// error.
pub fn f16_stored_backward(
    config: &MhaConfig,
    weights: &MhaWeights,
    inputs: [&[f32]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
    d_out: &[f32],
) -> Result<MhaBackwardReference> {
    let held = Weights64::of(config, weights)?;
    let [q, k, v] = inputs.map(widen);
    backward(config, &held, [&q, &k, &v], sizes, options, &widen(d_out), &|x| {
        f64::from(half::f16::from_f64(x).to_f32())
    })
}

/// A tensor and its magnitude, element for element.
#[derive(Clone, Debug)]
struct Tracked {
    value: Vec<f64>,
    magnitude: Vec<f64>,
}

impl Tracked {
    fn exact(value: Vec<f64>) -> Self {
        Tracked {
            magnitude: value.iter().map(|x| x.abs()).collect(),
            value,
        }
    }

    fn rounded(mut self, round: &dyn Fn(f64) -> f64) -> Self {
        self.value.iter_mut().for_each(|x| *x = round(*x));
        self
    }

    fn add(&mut self, other: &Tracked) {
        for (a, b) in self.value.iter_mut().zip(&other.value) {
            *a += b;
        }
        for (a, b) in self.magnitude.iter_mut().zip(&other.magnitude) {
            *a += b;
        }
    }
}

/// One projection's gradients and their magnitudes.
struct LinearGradients {
    dx: Tracked,
    weight: Tracked,
    bias: Option<Tracked>,
}

/// The backward pass of `y = x · Wᵀ + b` over `rows` rows of `x`.
fn linear_backward(p: &Projection64, x: &[f64], dy: &Tracked, rows: usize) -> LinearGradients {
    let (n, k) = (p.out_features, p.in_features);
    let zeros = |len: usize| Tracked {
        value: vec![0.0; len],
        magnitude: vec![0.0; len],
    };
    let (mut dx, mut weight, mut bias) = (zeros(rows * k), zeros(n * k), zeros(n));
    for r in 0..rows {
        for c in 0..n {
            let (g, m) = (dy.value[r * n + c], dy.magnitude[r * n + c]);
            bias.value[c] += g;
            bias.magnitude[c] += m;
            for t in 0..k {
                let (xv, wv) = (x[r * k + t], p.weight[c * k + t]);
                weight.value[c * k + t] += g * xv;
                weight.magnitude[c * k + t] += m * xv.abs();
                dx.value[r * k + t] += g * wv;
                dx.magnitude[r * k + t] += m * wv.abs();
            }
        }
    }
    LinearGradients {
        dx,
        weight,
        bias: p.bias.is_some().then_some(bias),
    }
}

/// The post-norm's backward pass: the gradient of `P + query` and of gamma and beta.
fn norm_backward(
    pass: &Pass,
    gamma: &[f64],
    d_out: &Tracked,
    width: usize,
    stats: &super::NormStats,
) -> (Tracked, Tracked, Tracked) {
    let rows = pass.batch * pass.len_q;
    let mut d_sum = Tracked {
        value: Vec::with_capacity(rows * width),
        magnitude: Vec::with_capacity(rows * width),
    };
    let mut d_gamma = Tracked::exact(vec![0.0; width]);
    let mut d_beta = Tracked::exact(vec![0.0; width]);
    for r in 0..rows {
        let at = |c: usize| r * width + c;
        let xhat = |c: usize| stats.normalized[at(c)];
        let g: Vec<f64> = (0..width).map(|c| d_out.value[at(c)] * gamma[c]).collect();
        let g_mag: Vec<f64> = (0..width).map(|c| d_out.magnitude[at(c)] * gamma[c].abs()).collect();
        let n = width as f64;
        let mean_g = g.iter().sum::<f64>() / n;
        let mean_gx = (0..width).map(|c| g[c] * xhat(c)).sum::<f64>() / n;
        let mag_mean_g = g_mag.iter().sum::<f64>() / n;
        let mag_mean_gx = (0..width).map(|c| g_mag[c] * xhat(c).abs()).sum::<f64>() / n;
        let s = stats.inv_std[r];
        for c in 0..width {
            d_sum.value.push(s * (g[c] - mean_g - xhat(c) * mean_gx));
            d_sum
                .magnitude
                .push(s * (g_mag[c] + mag_mean_g + xhat(c).abs() * mag_mean_gx));
            d_gamma.value[c] += d_out.value[at(c)] * xhat(c);
            d_gamma.magnitude[c] += d_out.magnitude[at(c)] * xhat(c).abs();
            d_beta.value[c] += d_out.value[at(c)];
            d_beta.magnitude[c] += d_out.magnitude[at(c)];
        }
    }
    (d_sum, d_gamma, d_beta)
}

/// The magnitudes of the attention step's dQ, dK and dV (BHSD), from the per-head
/// weights `p` and the magnitude of dO: with `|dP_ij| <= Σ_c |dO_ic| |v_jc|`, each
/// `dS_ij = P_ij (dP_ij − D_i)` is bounded by `P_ij (|dP_ij| + Σ_l P_il |dP_il|)`; the
/// soft cap's derivative is at most 1.
fn attention_magnitudes(
    shape: &AttentionShape,
    scale: f64,
    [q, k, v]: [&[f64]; 3],
    p: &[f64],
    d_out: &[f64],
) -> [Vec<f64>; 3] {
    let (lq, lk, d) = (shape.len_q, shape.len_k, shape.head_dim);
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..shape.batch {
        for h in 0..shape.heads_q {
            let hk = shape.kv_head(h);
            let kv_row = |j: usize| (b * shape.heads_kv + hk) * lk + j;
            for i in 0..lq {
                let row = (b * shape.heads_q + h) * lq + i;
                let probs = &p[row * lk..(row + 1) * lk];
                let dp: Vec<f64> = (0..lk)
                    .map(|j| (0..d).map(|c| d_out[row * d + c] * v[kv_row(j) * d + c].abs()).sum())
                    .collect();
                let delta: f64 = probs.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
                for j in 0..lk {
                    if probs[j] == 0.0 {
                        continue;
                    }
                    let ds = probs[j] * (dp[j] + delta);
                    for t in 0..d {
                        dq[row * d + t] += scale * ds * k[kv_row(j) * d + t].abs();
                        dk[kv_row(j) * d + t] += scale * ds * q[row * d + t].abs();
                        dv[kv_row(j) * d + t] += probs[j] * d_out[row * d + t];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// The whole backward pass on f64 weights and inputs, each intermediate a GPU layer
/// stores passed through `round`.
fn backward(
    config: &MhaConfig,
    w: &Weights64,
    inputs: [&[f64]; 3],
    sizes: [usize; 3],
    options: &AttentionOptions,
    d_out: &[f64],
    round: &dyn Fn(f64) -> f64,
) -> Result<MhaBackwardReference> {
    let pass = Pass::run(config, w, inputs, sizes, options, round)?;
    let (batch, len_q, len_k) = (pass.batch, pass.len_q, pass.len_k);
    let (e, hd) = (config.embed_dim, config.head_dim());
    if d_out.len() != batch * len_q * e {
        return Err(Error::shape("d_out elements", batch * len_q * e, d_out.len()));
    }
    let d_out = Tracked::exact(d_out.to_vec());
    // Through the post-norm: its residual path goes straight to the query.
    let (d_projected, mut d_query, norm) = match (&w.norm, &pass.norm) {
        (Some(norm), Some(stats)) => {
            let (d_sum, d_gamma, d_beta) = norm_backward(&pass, &norm.weight, &d_out, e, stats);
            (d_sum.clone().rounded(round), d_sum, Some((d_gamma, d_beta)))
        }
        _ => (d_out, Tracked::exact(vec![0.0; batch * len_q * e]), None),
    };
    let out_proj = linear_backward(&w.o, &pass.concat, &d_projected, batch * len_q);
    let d_attended = out_proj.dx.clone().rounded(round);

    let shape = AttentionShape::new(batch, config.num_heads, config.num_kv_heads, len_q, len_k, hd, hd);
    let (hq, hkv) = (config.num_heads, config.num_kv_heads);
    let heads = |x: &[f64], len: usize, h: usize| split_heads(x, batch, len, h, hd);
    let (q, k, v) = (
        heads(&pass.q, len_q, hq),
        heads(&pass.k, len_k, hkv),
        heads(&pass.v, len_k, hkv),
    );
    let d_o = heads(&d_attended.value, len_q, hq);
    let grads = reference::attention_backward(&q, &k, &v, &d_o, &shape, options)?;
    let scale = f64::from(shape.scale(options));
    let magnitudes = attention_magnitudes(
        &shape,
        scale,
        [&q, &k, &v],
        &pass.attended.weights,
        &heads(&d_attended.magnitude, len_q, hq),
    );
    let [mq, mk, mv] = magnitudes;
    let concat = |x: &[f64], len: usize, h: usize| concat_heads(x, batch, len, h, hd);
    let tracked = |value: Vec<f64>, magnitude: Vec<f64>| Tracked { value, magnitude }.rounded(round);
    let mut dq = tracked(concat(&grads.dq, len_q, hq), concat(&mq, len_q, hq));
    let mut dk = tracked(concat(&grads.dk, len_k, hkv), concat(&mk, len_k, hkv));
    if let Some(rotary) = &config.rotary {
        // Back through the rotation (its transpose), stored again; a pair's magnitudes
        // mix, so each takes their sum.
        for (t, len, heads) in [(&mut dq, len_q, hq), (&mut dk, len_k, hkv)] {
            for (r, (head, magnitude)) in t.value.chunks_mut(hd).zip(t.magnitude.chunks_mut(hd)).enumerate() {
                let position = ((r / heads) % len) as u32;
                let turned = rotary.unrotate_row64(head, position);
                for (slot, value) in head.iter_mut().zip(turned) {
                    *slot = round(value);
                }
                for i in 0..rotary.dim / 2 {
                    let (a, b) = rotary.pair(i);
                    let sum = magnitude[a] + magnitude[b];
                    magnitude[a] = sum;
                    magnitude[b] = sum;
                }
            }
        }
    }
    let dv = tracked(concat(&grads.dv, len_k, hkv), concat(&mv, len_k, hkv));

    let [query, key, value] = inputs;
    let q_proj = linear_backward(&w.q, query, &dq, batch * len_q);
    let k_proj = linear_backward(&w.k, key, &dk, batch * len_k);
    let v_proj = linear_backward(&w.v, value, &dv, batch * len_k);
    d_query.add(&q_proj.dx);

    // Split the tracked results into the gradients and their magnitudes.
    let pick = |t: &Tracked, magnitude: bool| {
        if magnitude {
            t.magnitude.clone()
        } else {
            t.value.clone()
        }
    };
    let projection = |g: &LinearGradients, m: bool| ProjectionGradients {
        weight: pick(&g.weight, m),
        bias: g.bias.as_ref().map(|b| pick(b, m)),
    };
    let gradients = |m: bool| MhaReferenceGradients {
        d_query: pick(&d_query, m),
        d_key: pick(&k_proj.dx, m),
        d_value: pick(&v_proj.dx, m),
        q: projection(&q_proj, m),
        k: projection(&k_proj, m),
        v: projection(&v_proj, m),
        o: projection(&out_proj, m),
        norm: norm.as_ref().map(|(g, b)| NormGradients {
            weight: pick(g, m),
            bias: pick(b, m),
        }),
    };
    Ok(MhaBackwardReference {
        gradients: gradients(false),
        magnitudes: gradients(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mha::config::PostNorm;
    use crate::options::{CausalAlignment, Mask};
    use crate::reference::rng::Rng;

    /// `Σ out · w`: its gradient with respect to the output is `w`.
    fn loss(
        config: &MhaConfig,
        w: &Weights64,
        inputs: [&[f64]; 3],
        sizes: [usize; 3],
        options: &AttentionOptions,
        dw: &[f64],
    ) -> f64 {
        let pass = Pass::run(config, w, inputs, sizes, options, &|x| x).expect("forward");
        pass.out.iter().zip(dw).map(|(o, w)| o * w).sum()
    }

    /// Random weights with random biases and norm parameters (none zero).
    fn weights(config: &MhaConfig, seed: u64) -> Weights64 {
        let mut w = MhaWeights::xavier_uniform(config, seed).expect("config");
        let mut rng = Rng::new(seed ^ 0xb1a5);
        for p in [&mut w.q, &mut w.k, &mut w.v, &mut w.o] {
            if let Some(b) = &mut p.bias {
                *b = rng.vec(b.len(), -0.5, 0.5);
            }
        }
        if let Some(n) = &mut w.norm {
            n.weight = rng.vec(n.weight.len(), 0.5, 1.5);
            n.bias = rng.vec(n.bias.len(), -0.5, 0.5);
        }
        Weights64::of(config, &w).expect("weights")
    }

    /// Every parameter of `w`, for perturbing one at a time.
    fn parameters(w: &mut Weights64) -> Vec<(&'static str, &mut Vec<f64>)> {
        let mut all: Vec<(&'static str, &mut Vec<f64>)> = Vec::new();
        for (name, bias_name, p) in [
            ("q.weight", "q.bias", &mut w.q),
            ("k.weight", "k.bias", &mut w.k),
            ("v.weight", "v.bias", &mut w.v),
            ("o.weight", "o.bias", &mut w.o),
        ] {
            all.push((name, &mut p.weight));
            if let Some(b) = &mut p.bias {
                all.push((bias_name, b));
            }
        }
        if let Some(n) = &mut w.norm {
            all.push(("norm.weight", &mut n.weight));
            all.push(("norm.bias", &mut n.bias));
        }
        all
    }

    /// The analytic gradients in the order of [`parameters`].
    fn analytic(g: &MhaReferenceGradients) -> Vec<&Vec<f64>> {
        let mut all = Vec::new();
        for p in [&g.q, &g.k, &g.v, &g.o] {
            all.push(&p.weight);
            if let Some(b) = &p.bias {
                all.push(b);
            }
        }
        if let Some(n) = &g.norm {
            all.push(&n.weight);
            all.push(&n.bias);
        }
        all
    }

    /// Every gradient entry against a central difference of the f64 forward.
    fn check_against_finite_differences(
        config: MhaConfig,
        sizes: [usize; 3],
        self_attention: bool,
        options: AttentionOptions,
        seed: u64,
    ) {
        let [batch, len_q, len_k] = sizes;
        let mut rng = Rng::new(seed);
        let mut draw = |n: usize| -> Vec<f64> { widen(&rng.vec(n, -1.0, 1.0)) };
        let query = draw(batch * len_q * config.embed_dim);
        let (key, value) = if self_attention {
            (query.clone(), query.clone())
        } else {
            (draw(batch * len_k * config.kdim), draw(batch * len_k * config.vdim))
        };
        let dw = draw(batch * len_q * config.embed_dim);
        let w = weights(&config, seed);
        let inputs = [&query[..], &key, &value];
        let got = backward(&config, &w, inputs, sizes, &options, &dw, &|x| x)
            .expect("backward")
            .gradients;
        let h = 1e-6;
        let close = |what: &str, idx: usize, numeric: f64, analytic: f64| {
            assert!(
                (numeric - analytic).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "seed {seed}, {what}[{idx}]: numeric {numeric}, analytic {analytic} ({config:?}, {options:?})"
            );
        };
        // The inputs: self-attention perturbs its one input in all three places.
        let d_inputs: Vec<(&str, Vec<f64>)> = if self_attention {
            vec![("d_input", got.d_self_input().expect("self"))]
        } else {
            vec![
                ("d_query", got.d_query.clone()),
                ("d_key", got.d_key.clone()),
                ("d_value", got.d_value.clone()),
            ]
        };
        for (which, (what, analytic)) in d_inputs.iter().enumerate() {
            for (idx, &a) in analytic.iter().enumerate() {
                let at = |delta: f64| {
                    let mut xs = [query.clone(), key.clone(), value.clone()];
                    for (n, x) in xs.iter_mut().enumerate() {
                        if self_attention || n == which {
                            x[idx] += delta;
                        }
                    }
                    loss(&config, &w, [&xs[0], &xs[1], &xs[2]], sizes, &options, &dw)
                };
                close(what, idx, (at(h) - at(-h)) / (2.0 * h), a);
            }
        }
        let analytic = analytic(&got);
        let count = parameters(&mut w.clone()).len();
        assert_eq!(count, analytic.len(), "seed {seed}: one gradient per parameter");
        for (n, grad) in analytic.iter().enumerate() {
            for (idx, &a) in grad.iter().enumerate() {
                let at = |delta: f64| {
                    let mut moved = w.clone();
                    let mut params = parameters(&mut moved);
                    params[n].1[idx] += delta;
                    drop(params);
                    loss(&config, &moved, inputs, sizes, &options, &dw)
                };
                let name = parameters(&mut w.clone())[n].0;
                close(name, idx, (at(h) - at(-h)) / (2.0 * h), a);
            }
        }
    }

    #[test]
    fn the_layer_gradients_match_central_differences() {
        // Self-attention with biases, a post-norm and a causal mask.
        let mut post = MhaConfig::new(6, 2);
        post.post_norm = Some(PostNorm::default());
        let causal = AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        };
        check_against_finite_differences(post, [2, 3, 3], true, causal, 11);
        // Cross-attention, other key/value widths, GQA, no biases, a bool mask.
        let gqa = MhaConfig {
            embed_dim: 8,
            num_heads: 4,
            num_kv_heads: 2,
            kdim: 5,
            vdim: 3,
            bias: false,
            post_norm: None,
            rotary: None,
        };
        let mut rng = Rng::new(12);
        let allow: Vec<bool> = (0..2 * 3 * 4).map(|_| rng.uniform(0.0, 1.0) < 0.7).collect();
        let masked = AttentionOptions {
            mask: Some(Mask::boolean(&[2, 1, 3, 4], allow).expect("mask")),
            ..Default::default()
        };
        check_against_finite_differences(gqa, [2, 3, 4], false, masked, 13);
        // Cross-attention with biases and a post-norm (its residual path in d_query).
        let mut cross = MhaConfig::new(4, 2);
        cross.kdim = 3;
        cross.vdim = 5;
        cross.post_norm = Some(PostNorm { eps: 1e-3 });
        check_against_finite_differences(cross, [1, 2, 3], false, AttentionOptions::default(), 14);
        // Rotary embeddings: NeoX pairs over part of each head in causal self-attention,
        // GPT-J pairs over all of it in cross-attention.
        let mut neox = MhaConfig::new(12, 2);
        neox.rotary = Some(crate::rotary::Rotary::new(4));
        let causal = AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        };
        check_against_finite_differences(neox, [2, 3, 3], true, causal, 15);
        let mut gptj = MhaConfig::new(8, 2);
        gptj.kdim = 5;
        gptj.rotary = Some(crate::rotary::Rotary {
            style: crate::rotary::RotaryStyle::GptJ,
            theta: 7.0,
            ..crate::rotary::Rotary::new(4)
        });
        check_against_finite_differences(gptj, [1, 2, 4], false, AttentionOptions::default(), 16);
    }

    #[test]
    fn a_wrong_d_out_is_an_error_not_a_panic() {
        let config = MhaConfig::new(4, 2);
        let w = MhaWeights::xavier_uniform(&config, 1).expect("weights");
        let x = vec![0.5f32; 2 * 4];
        let err = multi_head_attention_backward(
            &config,
            &w,
            [&x, &x, &x],
            [1, 2, 2],
            &AttentionOptions::default(),
            &[1.0; 3],
        )
        .expect_err("short d_out");
        assert!(err.to_string().contains("d_out"), "{err}");
    }
}
