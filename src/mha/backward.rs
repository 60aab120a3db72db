//! The multi-head layer's backward pass (docs/design.md, "Backward"): the gradients of
//! the input(s), of every projection's weight and bias and of the post-norm's scale and
//! shift, given the output's gradient.
//!
//! It recomputes the forward's projections and attention (with its log-sum-exp), then
//! walks the layer backwards: the post-norm (`shaders/layer_norm_backward.wgsl`), the
//! output projection, the attention step ([`crate::encode_sdpa_backward`]) and the input
//! projections. Every projection `Y = X · Wᵀ + b` runs its backward on the strided GEMM
//! (`shaders/gemm_strided.wgsl`): `dX = dY · W`, `dW = dYᵀ · X`, `db = 1ᵀ · dY`.

use super::{GpuProjection, HeadWeights, Inputs, MhaOptions, MultiHeadAttention, ProjectionPlan};
use crate::attention::encode_sdpa;
use crate::backward::encode_sdpa_backward;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::gemm::{encode_gemm, Gemm, Operand};
use crate::kernels::layer_norm_backward::{encode_layer_norm_backward, LayerNormBackward};
use crate::options::AttentionOptions;
use crate::tensor::{DType, Layout, Tensor};

/// The gradients of one projection `y = x · Wᵀ + b`, f32.
#[derive(Debug)]
pub struct WeightGradients {
    /// `[1, 1, out_features, in_features]`, the weight's layout (PyTorch's
    /// `nn.Linear.weight`).
    pub weight: Tensor,
    /// `[1, 1, 1, out_features]`, where the projection has a bias.
    pub bias: Option<Tensor>,
}

/// The gradients of the post-norm's LayerNorm, f32 `[1, 1, 1, E]` each.
#[derive(Debug)]
pub struct NormWeightGradients {
    /// Of the scale `gamma` (PyTorch's `norm.weight`).
    pub weight: Tensor,
    /// Of the shift `beta` (PyTorch's `norm.bias`).
    pub bias: Tensor,
}

/// What [`MultiHeadAttention::backward`] returns. Every gradient is f32, whatever the
/// layer's dtype: each is summed in f32 (over rows, and over an input's paths) and
/// stored once, and an optimiser keeps f32 master weights anyway; a sum over many rows
/// could also overflow f16's range.
#[derive(Debug)]
pub struct MhaGradients {
    /// `[B, 1, Lq, E]`: with respect to the query, or for self-attention the one input
    /// (its query, key and value paths summed), plus the post-norm's residual path.
    pub d_query: Tensor,
    /// `[B, 1, Lk, kdim]`, cross-attention only: with respect to the key argument.
    pub d_key: Option<Tensor>,
    /// `[B, 1, Lk, vdim]`, cross-attention only: with respect to the value argument
    /// (a caller that passed one tensor as key and value adds the two).
    pub d_value: Option<Tensor>,
    /// Of the query projection.
    pub q: WeightGradients,
    /// Of the key projection.
    pub k: WeightGradients,
    /// Of the value projection.
    pub v: WeightGradients,
    /// Of the output projection.
    pub o: WeightGradients,
    /// Of the post-norm, where the layer has one.
    pub norm: Option<NormWeightGradients>,
}

impl MultiHeadAttention {
    /// The gradients of [`forward`](Self::forward)`(inputs, options)` given the
    /// output's gradient `d_out` (the output's shape `[B, 1, Lq, E]` and the layer's
    /// dtype). The options must be the forward's; attention weights have no gradient
    /// here, so [`MhaOptions::weights`] must be [`HeadWeights::None`]. Results are
    /// ready once the queue has run (reading them waits).
    pub fn backward(
        &self,
        ctx: &Context,
        inputs: Inputs,
        d_out: &Tensor,
        options: &MhaOptions,
    ) -> Result<MhaGradients> {
        ctx.record_and_submit("submitting multi-head attention backward", |encoder| {
            self.encode_backward(ctx, encoder, inputs, d_out, options)
        })
    }

    /// [`backward`](Self::backward) with its GPU errors awaited rather than blocked on
    /// (the form that reports them on the web).
    pub async fn backward_async(
        &self,
        ctx: &Context,
        inputs: Inputs<'_>,
        d_out: &Tensor,
        options: &MhaOptions,
    ) -> Result<MhaGradients> {
        ctx.scoped_async("multi-head attention backward", || {
            self.backward(ctx, inputs, d_out, options)
        })
        .await
    }

    /// Like [`backward`](Self::backward), recorded into the caller's encoder.
    pub fn encode_backward(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        inputs: Inputs,
        d_out: &Tensor,
        options: &MhaOptions,
    ) -> Result<MhaGradients> {
        let asked = &options.attention;
        if options.weights != HeadWeights::None || asked.need_weights || asked.average_weights || asked.need_lse {
            return Err(Error::unsupported(
                "multi-head attention backward",
                "attention weights or log-sum-exp asked for",
                "MhaOptions::weights = HeadWeights::None and no need_weights, average_weights or need_lse \
                 (weights get no gradient; the backward pass computes the log-sum-exp itself)",
            ));
        }
        let c = &self.config;
        let query = inputs.query();
        d_out.check_context(ctx, "d_out")?;
        let want = [query.shape()[0], 1, query.shape()[2], c.embed_dim];
        if d_out.shape() != want || d_out.dtype() != self.dtype {
            return Err(Error::shape(
                "d_out of multi-head attention backward",
                format!("{want:?} {} (the output's)", self.dtype.name()),
                format!("{:?} {}", d_out.shape(), d_out.dtype().name()),
            ));
        }
        // The forward again, with the log-sum-exp the attention backward needs.
        let precision = options.attention.precision;
        let [q, k, v] = self.encode_projections(ctx, encoder, inputs, ProjectionPlan::Fused, precision)?;
        let (q, k) = self.encode_rotary(ctx, encoder, q, k)?;
        let attention = AttentionOptions {
            need_weights: false,
            average_weights: false,
            need_lse: true,
            output_layout: Some(Layout::Bshd),
            ..options.attention.clone()
        };
        let attended = encode_sdpa(ctx, encoder, &q, &k, &v, &attention)?;
        let lse = attended
            .lse
            .ok_or_else(|| Error::invalid("multi-head attention backward", "the forward returned no lse"))?;
        let (batch, len_q, len_k) = (query.shape()[0], query.shape()[2], k.shape()[2]);
        let (e, rows_q, rows_k) = (c.embed_dim, batch * len_q, batch * len_k);
        let f32_tensor = |shape: [usize; 4]| Tensor::empty(ctx, shape, Layout::Bhsd, DType::F32);
        let d_query = f32_tensor([batch, 1, len_q, e])?;
        let steps = Steps {
            ctx,
            dtype: self.dtype,
            ones: super::upload(ctx, self.dtype, &[1.0])?,
        };

        // The post-norm: its residual path starts the query's gradient.
        let normed = match (&self.norm, c.post_norm) {
            (Some((gamma, _)), Some(post)) => {
                let projected = self.encode_output_projection(ctx, encoder, &attended.out, query, precision)?;
                let d_sum = Tensor::empty(ctx, [batch, 1, len_q, e], Layout::Bhsd, self.dtype)?;
                let grads = NormWeightGradients {
                    weight: f32_tensor([1, 1, 1, e])?,
                    bias: f32_tensor([1, 1, 1, e])?,
                };
                let norm = LayerNormBackward {
                    x: projected.buffer(),
                    residual: query.buffer(),
                    gamma: gamma.buffer(),
                    d_out: d_out.buffer(),
                    d_sum: d_sum.buffer(),
                    d_sum_f32: d_query.buffer(),
                    d_gamma: grads.weight.buffer(),
                    d_beta: grads.bias.buffer(),
                    rows: rows_q,
                    width: e,
                    eps: post.eps,
                };
                encode_layer_norm_backward(ctx, encoder, self.dtype, &norm)?;
                Some((d_sum, grads))
            }
            _ => None,
        };
        let d_projected = normed.as_ref().map_or(d_out, |(d_sum, _)| d_sum);
        let mut query_started = normed.is_some();

        // The output projection: its weight and bias, and the attention output's gradient.
        let o = steps.weight_gradients(
            encoder,
            self.output.bias.is_some(),
            d_projected,
            &attended.out,
            [rows_q, e, e],
        )?;
        let d_attended = Tensor::empty(ctx, attended.out.shape(), Layout::Bshd, self.dtype)?;
        steps.input_gradient(
            encoder,
            &self.output,
            0,
            d_projected,
            d_attended.buffer(),
            [rows_q, e, e],
            false,
            false,
        )?;

        let grads = encode_sdpa_backward(ctx, encoder, &q, &k, &v, &attended.out, &lse, &d_attended, &attention)?;
        // Back through the rotary embedding, if any: the transposed rotation.
        let (dq, dk) = self.encode_rotary_turn(ctx, encoder, grads.dq, grads.dk, true)?;

        // The input projections. Self-attention adds every path to the one input's gradient.
        let (key, value) = match inputs {
            Inputs::SelfAttention(x) => (x, x),
            Inputs::Cross { key, value, .. } => (key, value),
        };
        let is_self = matches!(inputs, Inputs::SelfAttention(_));
        let kv = c.kv_width();
        let (d_key, d_value) = if is_self {
            (None, None)
        } else {
            (
                Some(f32_tensor([batch, 1, len_k, c.kdim])?),
                Some(f32_tensor([batch, 1, len_k, c.vdim])?),
            )
        };
        // Each path's gradient, its input, the input's width and rows, and where its
        // input gradient goes: the query's (adding to what is there once started), or
        // for cross-attention the key's or value's own.
        let paths = [
            (&dq, query, c.embed_dim, rows_q, None),
            (&dk, key, c.kdim, rows_k, d_key.as_ref()),
            (&grads.dv, value, c.vdim, rows_k, d_value.as_ref()),
        ];
        let widths = [c.embed_dim, kv, kv];
        let mut weights = Vec::with_capacity(3);
        for (n, (d_y, x, in_features, rows, own)) in paths.into_iter().enumerate() {
            let (p, row0) = self.input_projection(n);
            let sizes = [rows, widths[n], in_features];
            weights.push(steps.weight_gradients(encoder, self.input_biases[n], d_y, x, sizes)?);
            match own {
                Some(target) => steps.input_gradient(encoder, p, row0, d_y, target.buffer(), sizes, false, true)?,
                None => {
                    steps.input_gradient(encoder, p, row0, d_y, d_query.buffer(), sizes, query_started, true)?;
                    query_started = true;
                }
            }
        }
        let [wq, wk, wv]: [WeightGradients; 3] = weights
            .try_into()
            .map_err(|_| Error::invalid("multi-head attention backward", "three input projections"))?;
        Ok(MhaGradients {
            d_query,
            d_key,
            d_value,
            q: wq,
            k: wk,
            v: wv,
            o,
            norm: normed.map(|(_, grads)| grads),
        })
    }

    /// The GPU weight of input projection `n` (Q, K, V) and its first row in it.
    fn input_projection(&self, n: usize) -> (&GpuProjection, usize) {
        match &self.input {
            super::InProjections::Packed(p) => (
                p,
                [0, self.config.embed_dim, self.config.embed_dim + self.config.kv_width()][n],
            ),
            super::InProjections::Separate(separate) => (&separate[n], 0),
        }
    }
}

/// The GEMMs of a projection's backward pass.
struct Steps<'a> {
    ctx: &'a Context,
    dtype: DType,
    /// A single 1 of the layer's dtype: the broadcast operand of `db = 1ᵀ · dY`.
    ones: Tensor,
}

impl Steps<'_> {
    /// `dW = dYᵀ · X` and `db = 1ᵀ · dY` for `[rows, out_features, in_features]`
    /// (`dY` `[rows, out]`, `X` `[rows, in]`, both dense).
    fn weight_gradients(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        has_bias: bool,
        d_y: &Tensor,
        x: &Tensor,
        [rows, out_features, in_features]: [usize; 3],
    ) -> Result<WeightGradients> {
        let ctx = self.ctx;
        let weight = Tensor::empty(ctx, [1, 1, out_features, in_features], Layout::Bhsd, DType::F32)?;
        let gemm = Gemm {
            a: Operand::transposed(d_y.buffer(), out_features),
            b: Operand::rows(x.buffer(), 0, in_features),
            c: weight.buffer(),
            m: out_features,
            n: in_features,
            depth: rows,
            accumulate: false,
            f32_out: true,
        };
        encode_gemm(ctx, encoder, self.dtype, &gemm)?;
        let bias = if has_bias {
            let bias = Tensor::empty(ctx, [1, 1, 1, out_features], Layout::Bhsd, DType::F32)?;
            let gemm = Gemm {
                a: Operand::broadcast(self.ones.buffer()),
                b: Operand::rows(d_y.buffer(), 0, out_features),
                c: bias.buffer(),
                m: 1,
                n: out_features,
                depth: rows,
                accumulate: false,
                f32_out: true,
            };
            encode_gemm(ctx, encoder, self.dtype, &gemm)?;
            Some(bias)
        } else {
            None
        };
        Ok(WeightGradients { weight, bias })
    }

    /// `dX (+)= dY · W` into `target` (`[rows, in_features]`, f32 when `f32_out`, else
    /// the layer's dtype), W the projection's rows from `row0` on.
    #[allow(clippy::too_many_arguments)]
    fn input_gradient(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        p: &GpuProjection,
        row0: usize,
        d_y: &Tensor,
        target: &wgpu::Buffer,
        [rows, out_features, in_features]: [usize; 3],
        accumulate: bool,
        f32_out: bool,
    ) -> Result<()> {
        let gemm = Gemm {
            a: Operand::rows(d_y.buffer(), 0, out_features),
            b: Operand::rows(p.weight.buffer(), row0 * in_features, in_features),
            c: target,
            m: rows,
            n: in_features,
            depth: out_features,
            accumulate,
            f32_out,
        };
        encode_gemm(self.ctx, encoder, self.dtype, &gemm)
    }
}
