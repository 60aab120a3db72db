//! Multi-head attention on the GPU: Q/K/V projections as GEMMs writing head-split BSHD
//! tensors, attention per head ([`crate::encode_sdpa`], output in BSHD, which is the
//! head concatenation), the output projection reading it with no copy, and an optional
//! post-norm `LayerNorm(out + query)`.
//!
//! Sequences are batch-first `[B, S, width]` tensors, stored as [`Tensor`]s of shape
//! `[B, 1, S, width]` (one "head"); [`Tensor::sequence`] makes them.

mod backward;
mod config;
mod load;
pub mod reference;
mod weights;

pub use backward::{MhaGradients, NormWeightGradients, WeightGradients};
pub use config::{MhaConfig, PostNorm};
pub use load::{load_safetensors, LoadedMha, WeightNaming};
pub use weights::{MhaWeights, NormWeights, Projection};

use crate::attention::encode_sdpa;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::layer_norm::{encode_layer_norm, LayerNorm};
use crate::kernels::matmul::{encode_linear, Linear, LinearTiling};
use crate::kernels::pack_rows::{PackedRows, RowSource, TextureShape};
use crate::options::{AttentionOptions, Precision};
use crate::tensor::{DType, Layout, Tensor};

/// Which attention weights a forward pass returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeadWeights {
    /// No weights (the default): [`MhaOutput::weights`] is `None`.
    #[default]
    None,
    /// `[B, 1, Lq, Lk]`: the mean over heads (PyTorch's `average_attn_weights=True`).
    Averaged,
    /// `[B, H, Lq, Lk]`.
    PerHead,
}

/// Options of one forward pass.
#[derive(Clone, Debug, Default)]
pub struct MhaOptions {
    /// Masks (causal, key lengths, explicit, broadcastable to `[B, H, Lq, Lk]`), scale
    /// (default `1/sqrt(E/H)`) and kernel choice of the attention step. Its
    /// `output_layout` is the layer's to set; weights are asked for with
    /// [`MhaOptions::weights`] only (setting `need_weights`, `average_weights` or
    /// `need_lse` here is an error that says so).
    pub attention: AttentionOptions,
    /// The one way to ask a layer for its attention weights.
    pub weights: HeadWeights,
}

/// What a forward pass produces.
#[derive(Debug)]
pub struct MhaOutput {
    /// Batch-first `[B, Lq, E]`, as PyTorch's `batch_first` layer returns it
    /// ([`Tensor::sequence_shape`]; stored as `[B, 1, Lq, E]`), in the layer's dtype.
    pub out: Tensor,
    /// f32 attention weights, as [`HeadWeights`] asked.
    pub weights: Option<Tensor>,
}

/// The sequence inputs of a forward pass.
#[derive(Clone, Copy, Debug)]
pub enum Inputs<'a> {
    /// Keys and values are the query (one packed Q/K/V GEMM).
    SelfAttention(&'a Tensor),
    /// Query `[B, 1, Lq, E]`, key `[B, 1, Lk, kdim]`, value `[B, 1, Lk, vdim]`. When
    /// key and value are the same tensor their projections run as one GEMM.
    Cross {
        /// `[B, 1, Lq, E]`.
        query: &'a Tensor,
        /// `[B, 1, Lk, kdim]`.
        key: &'a Tensor,
        /// `[B, 1, Lk, vdim]`.
        value: &'a Tensor,
    },
}

impl<'a> Inputs<'a> {
    fn query(&self) -> &'a Tensor {
        match *self {
            Inputs::SelfAttention(x) => x,
            Inputs::Cross { query, .. } => query,
        }
    }
}

/// A weight matrix and its optional bias on the GPU (flat tensors in the layer's dtype),
/// and on adapters that run the texture GEMM the weight packed for it, once.
#[derive(Debug)]
struct GpuProjection {
    weight: Tensor,
    bias: Option<Tensor>,
    /// Boxed: a texture view is large, and most layers on GPUs have none.
    packed: Option<Box<PackedRows>>,
}

impl GpuProjection {
    /// Uploads a `[rows, cols]` weight (`cols` = in_features) and its bias.
    fn new(ctx: &Context, dtype: DType, weight: &[f32], cols: usize, bias: Option<&[f32]>) -> Result<Self> {
        let weight = upload(ctx, dtype, weight)?;
        let source = RowSource::dense(weight.buffer(), weight.len() / cols, cols);
        let packs =
            ctx.linear_tiling() == LinearTiling::Texture && TextureShape::for_matrix(ctx, source.rows, cols).is_some();
        Ok(GpuProjection {
            packed: packs
                .then(|| PackedRows::upload(ctx, dtype, &source).map(Box::new))
                .transpose()?,
            bias: bias.map(|b| upload(ctx, dtype, b)).transpose()?,
            weight,
        })
    }
}

/// The input projections as stored on the GPU.
#[derive(Debug)]
enum InProjections {
    /// One `[E + 2·kv_width, E]` matrix (rows Q, then K, then V) when all inputs are
    /// `E` wide: self-attention runs it as one GEMM, cross-attention as row ranges.
    Packed(GpuProjection),
    /// Q, K and V matrices of their own (other kdim/vdim).
    Separate(Box<[GpuProjection; 3]>),
}

/// A multi-head attention layer whose weights live on the GPU.
#[derive(Debug)]
pub struct MultiHeadAttention {
    config: MhaConfig,
    dtype: DType,
    input: InProjections,
    output: GpuProjection,
    norm: Option<(Tensor, Tensor)>,
    /// Which of the Q, K and V projections have a bias (a packed bias holds zeros for
    /// the others, which get no gradient).
    input_biases: [bool; 3],
}

impl MultiHeadAttention {
    /// Uploads `weights` (checked against `config`) in `dtype`.
    pub fn new(ctx: &Context, config: MhaConfig, weights: &MhaWeights, dtype: DType) -> Result<Self> {
        config.validate()?;
        weights.check(&config)?;
        if dtype == DType::F16 {
            ctx.require_f16("f16 multi-head attention")?;
        }
        let upload = |values: &[f32]| upload(ctx, dtype, values);
        let input = if config.packs_projections() {
            let parts = [&weights.q, &weights.k, &weights.v];
            let weight: Vec<f32> = parts.iter().flat_map(|p| p.weight.iter().copied()).collect();
            let bias = parts.iter().any(|p| p.bias.is_some()).then(|| {
                // A missing bias is a zero one.
                parts
                    .iter()
                    .flat_map(|p| p.bias.clone().unwrap_or_else(|| vec![0.0; p.out_features]))
                    .collect::<Vec<f32>>()
            });
            InProjections::Packed(GpuProjection::new(
                ctx,
                dtype,
                &weight,
                config.embed_dim,
                bias.as_deref(),
            )?)
        } else {
            InProjections::Separate(Box::new([
                projection(ctx, dtype, &weights.q)?,
                projection(ctx, dtype, &weights.k)?,
                projection(ctx, dtype, &weights.v)?,
            ]))
        };
        let norm = match (&weights.norm, config.post_norm) {
            (Some(n), Some(_)) => Some((upload(&n.weight)?, upload(&n.bias)?)),
            _ => None,
        };
        Ok(MultiHeadAttention {
            input_biases: [&weights.q, &weights.k, &weights.v].map(|p| p.bias.is_some()),
            output: projection(ctx, dtype, &weights.o)?,
            config,
            dtype,
            input,
            norm,
        })
    }

    /// The layer's sizes.
    pub fn config(&self) -> &MhaConfig {
        &self.config
    }

    /// The element type of its weights, which its inputs must share and its output has.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Runs the layer; results are ready once the queue has run (reading them waits).
    pub fn forward(&self, ctx: &Context, inputs: Inputs, options: &MhaOptions) -> Result<MhaOutput> {
        ctx.record_and_submit("submitting multi-head attention", |encoder| {
            self.encode_forward(ctx, encoder, inputs, options)
        })
    }

    /// [`forward`](Self::forward) with its GPU errors awaited rather than blocked on
    /// (the form that reports them on the web).
    pub async fn forward_async(&self, ctx: &Context, inputs: Inputs<'_>, options: &MhaOptions) -> Result<MhaOutput> {
        ctx.scoped_async("multi-head attention", || self.forward(ctx, inputs, options))
            .await
    }

    /// Like [`forward`](Self::forward), recorded into the caller's encoder.
    pub fn encode_forward(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        inputs: Inputs,
        options: &MhaOptions,
    ) -> Result<MhaOutput> {
        let asked = &options.attention;
        if asked.need_weights || asked.average_weights || asked.need_lse {
            return Err(Error::invalid(
                "MhaOptions::attention",
                "need_weights, average_weights and need_lse belong to the layer: ask for weights with \
                 MhaOptions::weights (HeadWeights::Averaged or HeadWeights::PerHead)",
            ));
        }
        let precision = options.attention.precision;
        let [q, k, v] = self.encode_projections(ctx, encoder, inputs, ProjectionPlan::Fused, precision)?;
        let (q, k) = self.encode_rotary(ctx, encoder, q, k)?;
        let attention = AttentionOptions {
            need_weights: options.weights != HeadWeights::None,
            average_weights: options.weights == HeadWeights::Averaged,
            need_lse: false,
            output_layout: Some(Layout::Bshd),
            ..options.attention.clone()
        };
        let attended = encode_sdpa(ctx, encoder, &q, &k, &v, &attention)?;
        let out = self.encode_output(ctx, encoder, &attended.out, inputs.query(), precision)?;
        Ok(MhaOutput {
            out,
            weights: attended.weights,
        })
    }

    /// The projected queries and keys rotated by the layer's rotary embedding, if it has
    /// one: row `i` of every sequence at position `i`.
    pub(super) fn encode_rotary(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        q: Tensor,
        k: Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.encode_rotary_turn(ctx, encoder, q, k, false)
    }

    /// With `inverse`, the gradients of the rotated queries and keys carried back to
    /// the projections (the transposed rotation); else [`Self::encode_rotary`].
    pub(super) fn encode_rotary_turn(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        q: Tensor,
        k: Tensor,
        inverse: bool,
    ) -> Result<(Tensor, Tensor)> {
        let Some(rotary) = &self.config.rotary else {
            return Ok((q, k));
        };
        let mut turn = |t: &Tensor| {
            let [batch, _, len, _] = t.shape();
            let positions: Vec<u32> = (0..batch).flat_map(|_| 0..len as u32).collect();
            if inverse {
                crate::rotary::encode_unrotate(ctx, encoder, t, &positions, rotary)
            } else {
                crate::rotary::encode_apply_rotary(ctx, encoder, t, &positions, rotary)
            }
        };
        let q = turn(&q)?;
        Ok((q, turn(&k)?))
    }

    /// Records the input projections and returns Q `[B, H, Lq, D]`, K and V
    /// `[B, G, Lk, D]`, all BSHD. `plan` picks between the packed GEMMs and one GEMM
    /// per projection (for benchmarks; results are the same); `precision` whether f32
    /// inputs may be multiplied in f16 (tensor cores).
    pub fn encode_projections(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        inputs: Inputs,
        plan: ProjectionPlan,
        precision: Precision,
    ) -> Result<[Tensor; 3]> {
        let c = &self.config;
        let (query, key, value) = match inputs {
            Inputs::SelfAttention(x) => (x, x, x),
            Inputs::Cross { query, key, value } => (query, key, value),
        };
        let weights = &self.output.weight;
        for (what, t) in [
            ("query", query),
            ("key", key),
            ("value", value),
            ("the layer's weights", weights),
        ] {
            t.check_context(ctx, what)?;
        }
        let [batch, len_q] = self.check_sequence("query", query, None, c.embed_dim)?;
        let [_, len_k] = self.check_sequence("key", key, Some(batch), c.kdim)?;
        self.check_sequence("value", value, Some(batch), c.vdim)?;
        if value.shape()[2] != len_k {
            return Err(Error::shape("value length (dim 1)", len_k, value.shape()[2]));
        }
        let (hd, kv) = (c.head_dim(), c.kv_width());
        let q = Tensor::empty(ctx, [batch, c.num_heads, len_q, hd], Layout::Bshd, self.dtype)?;
        let k = Tensor::empty(ctx, [batch, c.num_kv_heads, len_k, hd], Layout::Bshd, self.dtype)?;
        let v = Tensor::empty(ctx, [batch, c.num_kv_heads, len_k, hd], Layout::Bshd, self.dtype)?;
        let tiling = ctx.linear_tiling_for(self.dtype, precision);
        let mut gemm = |x: &Tensor, p: &GpuProjection, w_row0: usize, outputs: &[(&wgpu::Buffer, usize)]| {
            let m = x.shape()[0] * x.shape()[2];
            let k = x.shape()[3];
            let linear = Linear {
                x: x.buffer(),
                x_stride: k,
                w: p.weight.buffer(),
                w_packed: p.packed.as_deref(),
                bias: p.bias.as_ref().map(Tensor::buffer),
                w_row0,
                outputs,
                m,
                k,
            };
            encode_linear(ctx, ctx.policy(), encoder, self.dtype, tiling, &linear)
        };
        let same = |a: &Tensor, b: &Tensor| a.buffer() == b.buffer();
        let fused = plan == ProjectionPlan::Fused;
        match &self.input {
            InProjections::Packed(p) if fused && same(query, key) && same(key, value) => {
                gemm(
                    query,
                    p,
                    0,
                    &[(q.buffer(), c.embed_dim), (k.buffer(), kv), (v.buffer(), kv)],
                )?;
            }
            InProjections::Packed(p) if fused && same(key, value) => {
                gemm(query, p, 0, &[(q.buffer(), c.embed_dim)])?;
                gemm(key, p, c.embed_dim, &[(k.buffer(), kv), (v.buffer(), kv)])?;
            }
            InProjections::Packed(p) => {
                gemm(query, p, 0, &[(q.buffer(), c.embed_dim)])?;
                gemm(key, p, c.embed_dim, &[(k.buffer(), kv)])?;
                gemm(value, p, c.embed_dim + kv, &[(v.buffer(), kv)])?;
            }
            InProjections::Separate(separate) => {
                let [pq, pk, pv] = separate.as_ref();
                gemm(query, pq, 0, &[(q.buffer(), c.embed_dim)])?;
                gemm(key, pk, 0, &[(k.buffer(), kv)])?;
                gemm(value, pv, 0, &[(v.buffer(), kv)])?;
            }
        }
        Ok([q, k, v])
    }

    /// Records the output projection of the attention output (`[B, H, Lq, D]` BSHD,
    /// read as `[B·Lq, E]`) and the post-norm, if any.
    pub fn encode_output(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        attended: &Tensor,
        query: &Tensor,
        precision: Precision,
    ) -> Result<Tensor> {
        for (what, t) in [
            ("attended", attended),
            ("query", query),
            ("the layer's weights", &self.output.weight),
        ] {
            t.check_context(ctx, what)?;
        }
        let projected = self.encode_output_projection(ctx, encoder, attended, query, precision)?;
        let e = self.config.embed_dim;
        let [batch, _, len_q, _] = attended.shape();
        let rows = batch * len_q;
        let (Some((gamma, beta)), Some(post)) = (&self.norm, self.config.post_norm) else {
            return Ok(projected);
        };
        let normed = Tensor::empty(ctx, [batch, 1, len_q, e], Layout::Bhsd, self.dtype)?;
        let norm = LayerNorm {
            x: projected.buffer(),
            residual: Some(query.buffer()),
            gamma: gamma.buffer(),
            beta: beta.buffer(),
            out: normed.buffer(),
            rows,
            width: e,
            eps: post.eps,
        };
        encode_layer_norm(ctx, encoder, self.dtype, &norm)?;
        Ok(normed)
    }

    /// The output projection alone (what the post-norm reads), after
    /// [`encode_output`](Self::encode_output)'s checks of the shapes.
    fn encode_output_projection(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        attended: &Tensor,
        query: &Tensor,
        precision: Precision,
    ) -> Result<Tensor> {
        let e = self.config.embed_dim;
        let [batch, _, len_q, _] = attended.shape();
        let rows = batch * len_q;
        if attended.layout() != Layout::Bshd || attended.len() != rows * e || query.len() != rows * e {
            return Err(Error::invalid(
                "multi-head attention output projection",
                format!(
                    "needs a BSHD attention output and a query of {rows} x {e}, got {:?} {:?} and {:?}",
                    attended.layout(),
                    attended.shape(),
                    query.shape()
                ),
            ));
        }
        let projected = Tensor::empty(ctx, [batch, 1, len_q, e], Layout::Bhsd, self.dtype)?;
        let linear = Linear {
            x: attended.buffer(),
            x_stride: e,
            w: self.output.weight.buffer(),
            w_packed: self.output.packed.as_deref(),
            bias: self.output.bias.as_ref().map(Tensor::buffer),
            w_row0: 0,
            outputs: &[(projected.buffer(), e)],
            m: rows,
            k: e,
        };
        encode_linear(
            ctx,
            ctx.policy(),
            encoder,
            self.dtype,
            ctx.linear_tiling_for(self.dtype, precision),
            &linear,
        )?;
        Ok(projected)
    }

    /// Checks a `[B, 1, S, width]` sequence tensor; returns `[B, S]`.
    fn check_sequence(&self, what: &str, t: &Tensor, batch: Option<usize>, width: usize) -> Result<[usize; 2]> {
        let [b, one, s, w] = t.shape();
        if one != 1 || w != width || batch.is_some_and(|want| want != b) || s == 0 {
            return Err(Error::shape(
                format!("{what} sequence [B, 1, S, width]"),
                format!("[{}, 1, S >= 1, {width}]", batch.map_or("B".into(), |b| b.to_string())),
                format!("{:?}", t.shape()),
            ));
        }
        if t.dtype() != self.dtype {
            return Err(Error::shape(
                format!("{what} dtype"),
                self.dtype.name(),
                t.dtype().name(),
            ));
        }
        Ok([b, s])
    }
}

/// How the input projections are dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectionPlan {
    /// As few GEMMs as the inputs allow (one for self-attention).
    Fused,
    /// One GEMM per projection.
    Separate,
}

/// Host values as a flat tensor of `dtype`.
fn upload(ctx: &Context, dtype: DType, values: &[f32]) -> Result<Tensor> {
    Tensor::from_f32_as(ctx, [1, 1, 1, values.len()], Layout::Bhsd, dtype, values)
}

fn projection(ctx: &Context, dtype: DType, p: &Projection) -> Result<GpuProjection> {
    GpuProjection::new(ctx, dtype, &p.weight, p.in_features, p.bias.as_deref())
}
