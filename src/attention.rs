//! Scaled dot-product attention on the GPU: one guard step that validates everything,
//! then the chosen kernel path recorded into a command encoder.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::flash::{self, FlashConfig};
use crate::kernels::kv_texels::KvTexels;
use crate::kernels::mean_heads::encode_accumulate_heads;
use crate::kernels::page_table::PageTable;
use crate::kernels::params::{MASK_ADDITIVE, MASK_BOOL, MASK_NONE};
use crate::kernels::qk_scores;
use crate::kernels::{decode, loop_budget, softmax_rows, weights_v, AttentionBindings, AttentionParams};
use crate::merge::{encode_merge_attentions, Merged};
use crate::options::{AttentionOptions, FusedTiling, KernelChoice, MaskValues};
use crate::problem::AttentionShape;
use crate::tensor::{tensor_usage, DType, Layout, Tensor};

/// What one attention call produces.
#[derive(Debug)]
pub struct AttentionOutput {
    /// `[B, Hq, Lq, Dv]` in the requested layout and the inputs' dtype.
    pub out: Tensor,
    /// `[B, Hq, Lq, Lk]` f32 BHSD, when `need_weights` was set.
    pub weights: Option<Tensor>,
    /// `[B, Hq, Lq, 1]` f32 BHSD, when `need_lse` was set.
    pub lse: Option<Tensor>,
}

/// The GPU path actually taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolvedKernel {
    /// The fused one-pass kernel, with the tiling it runs.
    Fused(FlashConfig),
    /// Scores, softmax and weights x V as three kernels through a score buffer.
    Materialized,
    /// Split-K decode: few query rows, the key range split across workgroups.
    Decode,
}

impl ResolvedKernel {
    /// The path's name for reports: `"fused/<tiling>"` (e.g. `"fused/blocked"`),
    /// `"materialized"` or `"decode"`.
    pub fn name(&self) -> String {
        match self {
            ResolvedKernel::Fused(c) => format!("fused/{}", c.name()),
            ResolvedKernel::Materialized => "materialized".into(),
            ResolvedKernel::Decode => "decode".into(),
        }
    }

    /// Whether the path multiplies in f16 (tensor cores), whatever the inputs' dtype.
    pub fn f16_products(&self) -> bool {
        match self {
            ResolvedKernel::Fused(c) => c.spec().f16_products,
            ResolvedKernel::Materialized | ResolvedKernel::Decode => false,
        }
    }
}

/// Computes `softmax(Q Kᵀ · scale + mask) V` and waits for nothing: results are ready
/// once the queue has run (reading them back waits).
pub fn sdpa(ctx: &Context, q: &Tensor, k: &Tensor, v: &Tensor, options: &AttentionOptions) -> Result<AttentionOutput> {
    ctx.record_and_submit("submitting attention", |encoder| {
        encode_sdpa(ctx, encoder, q, k, v, options)
    })
}

/// [`sdpa`] with its GPU errors awaited rather than blocked on. On the web, where
/// nothing may block, this is the form that reports them (docs/design.md, "The web").
pub async fn sdpa_async(
    ctx: &Context,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    ctx.scoped_async("attention", || sdpa(ctx, q, k, v, options)).await
}

/// [`sdpa_async`] with the output read back in the same submission: one submission
/// and one wait per call, where `sdpa` then [`Tensor::to_f32_vec_async`] take two (a
/// decode loop's every token). Returns the outputs and `out`'s elements as f32, in its
/// memory order (as `to_f32_vec` gives them).
pub async fn sdpa_read_async(
    ctx: &Context,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<(AttentionOutput, Vec<f32>)> {
    read_async(ctx, |encoder| encode_sdpa(ctx, encoder, q, k, v, options)).await
}

/// Records attention with `record`, submits it and reads the output back in the same
/// submission.
pub(crate) async fn read_async(
    ctx: &Context,
    record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<AttentionOutput>,
) -> Result<(AttentionOutput, Vec<f32>)> {
    let (out, bytes) = ctx
        .record_and_read_async("attention", record, |out: &AttentionOutput| {
            (out.out.buffer().clone(), out.out.byte_len())
        })
        .await?;
    let values = out.out.values_of(&bytes);
    Ok((out, values))
}

/// [`sdpa_read_async`], blocking. Native targets only.
#[cfg(not(target_arch = "wasm32"))]
pub fn sdpa_read(
    ctx: &Context,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<(AttentionOutput, Vec<f32>)> {
    pollster::block_on(sdpa_read_async(ctx, q, k, v, options))
}

/// Like [`sdpa`], but records into the caller's encoder; nothing runs until it is
/// submitted, which [`crate::Gpu::submit`] does with any GPU error in the recorded work
/// returned (wgpu validates much of a recording only when it is finished).
pub fn encode_sdpa(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    encode_sdpa_with_texels(ctx, encoder, q, k, v, None, None, options)
}

/// [`encode_sdpa`], or with a block table [`encode_sdpa_paged`], for a KV cache with
/// a texel mirror of `k` and `v`, which the subgroup decode design reads instead of
/// their buffers (docs/design.md, "KV cache").
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_sdpa_with_texels(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    table: Option<&PageTable>,
    kv_texels: Option<&KvTexels>,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    let plan = Plan::new(ctx, q, k, v, table, options)?;
    ctx.scoped("recording attention", || {
        plan.encode(ctx, encoder, q, k, v, kv_texels, options)
    })
}

/// Attention against keys and values kept in pages (paged KV, docs/design.md "Paged
/// KV"): `k_pages` `[P, Hkv, page_size, D]` and `v_pages` `[P, Hkv, page_size, Dv]`
/// hold P pages of `page_size` rows, and `table` says which pages hold batch element
/// `b`'s keys in order, so its key `j` is row `j % page_size` of page
/// `table.pages(b)[j / page_size]`. `Lk` is `table.pages_per_sequence() · page_size`;
/// every option applies as in [`sdpa`] (key lengths say how much of each element's
/// last page is its own). Results equal [`sdpa`] over the gathered keys bit for bit.
pub fn sdpa_paged(
    ctx: &Context,
    q: &Tensor,
    k_pages: &Tensor,
    v_pages: &Tensor,
    table: &PageTable,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    ctx.record_and_submit("submitting attention", |encoder| {
        encode_sdpa_paged(ctx, encoder, q, k_pages, v_pages, table, options)
    })
}

/// Like [`sdpa_paged`], but records into the caller's encoder.
pub fn encode_sdpa_paged(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    k_pages: &Tensor,
    v_pages: &Tensor,
    table: &PageTable,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    encode_sdpa_with_texels(ctx, encoder, q, k_pages, v_pages, Some(table), None, options)
}

/// The kernel path `options` resolve to on this context for a problem of `shape` with
/// inputs of `dtype` (for reports and tests). `Auto` takes split-K decode for few
/// query rows against many keys (see [`KernelChoice::Auto`]), else the fused kernel.
pub fn resolve_kernel(
    ctx: &Context,
    dtype: DType,
    options: &AttentionOptions,
    shape: &AttentionShape,
) -> Result<ResolvedKernel> {
    Ok(match options.kernel {
        KernelChoice::Materialized => ResolvedKernel::Materialized,
        KernelChoice::Decode => ResolvedKernel::Decode,
        KernelChoice::Auto if prefers_decode(shape) && options.tiling == FusedTiling::Auto => ResolvedKernel::Decode,
        KernelChoice::Auto | KernelChoice::Fused => {
            ResolvedKernel::Fused(ctx.fused_config_for(options.tiling, dtype, options.precision)?)
        }
    })
}

/// Whether `Auto` takes split-K decode: at most 16 query rows per kv head (Lq times the
/// query heads sharing it) and at least 1024 keys, where the fused kernels give each
/// (batch, head) one workgroup walking every key alone.
pub fn prefers_decode(shape: &AttentionShape) -> bool {
    shape.heads_q / shape.heads_kv.max(1) * shape.len_q <= 16 && shape.len_k >= 1024
}

impl Context {
    /// The fused tiling used when none is asked for, for inputs whose products may
    /// (`f16_products`) or may not be computed in f16: the tiling named by
    /// `WGPU_ATTENTION_TILING` when the context was made, else the first entry of
    /// [`flash::FUSED_TILINGS`] meant for this class of adapter whose needs it meets
    /// (CPU adapters: `subgroup`, then `blocked`; in a browser `subgroup`, then
    /// `shared`; GPUs: `coop` where f16 products are allowed, then `blocked`, then
    /// `shared`), else `registers`, which runs anywhere.
    pub fn default_fused_tiling(&self, f16_products: bool) -> Result<FusedTiling> {
        let tiling = self.env_tiling()?;
        if tiling != FusedTiling::Auto {
            return Ok(tiling);
        }
        let class = flash::AdapterClass::of(self.adapter_info());
        Ok(flash::default_tiling(class, self.capabilities(), f16_products))
    }

    /// Resolves a tiling request for f32 inputs at the default (highest) precision.
    pub fn fused_config(&self, tiling: FusedTiling) -> Result<FlashConfig> {
        self.fused_config_for(tiling, DType::F32, crate::options::Precision::Highest)
    }

    /// Resolves a tiling request for inputs of `dtype` at `precision` to one this
    /// context can run, or says why not.
    pub fn fused_config_for(
        &self,
        tiling: FusedTiling,
        dtype: DType,
        precision: crate::options::Precision,
    ) -> Result<FlashConfig> {
        let f16_products = precision.allows_f16_products(dtype);
        let tiling = match tiling {
            FusedTiling::Auto => self.default_fused_tiling(f16_products)?,
            t => t,
        };
        let spec = flash::spec(tiling).ok_or_else(|| Error::invalid("tiling", "auto resolved to no tiling"))?;
        if let Some(e) = spec.unmet(&self.adapter_info().name, self.capabilities()) {
            return Err(e);
        }
        if spec.f16_products && !f16_products {
            return Err(Error::invalid(
                "tiling",
                format!(
                    "the {} tiling multiplies in f16; f32 inputs need precision medium (or high) for it",
                    spec.name
                ),
            ));
        }
        Ok(FlashConfig { tiling })
    }
}

/// Everything decided in the guard step, before any GPU work is recorded.
pub(crate) struct Plan {
    pub(crate) shape: AttentionShape,
    dtype: DType,
    kernel: ResolvedKernel,
    out_layout: Layout,
    /// (batch, head) pairs per score chunk (the materialized path, and every path's
    /// weights).
    heads_per_chunk: usize,
    /// (batch, head) pairs per fused dispatch.
    attention_heads_per_chunk: usize,
    /// Keys one fused dispatch walks (all of them except under llvmpipe's loop cap).
    keys_per_dispatch: usize,
    needs_scores: bool,
    /// How split-K decode cuts the key range, when that is the path.
    decode_split: Option<decode::DecodeSplit>,
    /// The block table, when K and V are paged.
    pages: Option<PageTable>,
    /// Disjoint key ranges the fused attention is split into, merged by log-sum-exp
    /// (`Capabilities::key_splits`), and the keys of each but the last (whole 64-key
    /// tiles).
    key_splits: usize,
    keys_per_split: usize,
}

impl Plan {
    /// The fused tiling this plan runs, if it runs the fused kernel.
    pub(crate) fn fused_tiling(&self) -> Option<FusedTiling> {
        match &self.kernel {
            ResolvedKernel::Fused(config) => Some(config.tiling),
            _ => None,
        }
    }

    pub(crate) fn new(
        ctx: &Context,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pages: Option<&PageTable>,
        options: &AttentionOptions,
    ) -> Result<Self> {
        let shape = match pages {
            None => AttentionShape::from_qkv(q.shape(), k.shape(), v.shape())?,
            Some(table) => table.logical_shape(q.shape(), k.shape(), v.shape())?,
        };
        if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
            return Err(Error::shape(
                "dtype of k and v",
                q.dtype().name(),
                format!("k {}, v {}", k.dtype().name(), v.dtype().name()),
            ));
        }
        for (what, t) in [("q", q), ("k", k), ("v", v)] {
            t.check_context(ctx, what)?;
        }
        let dtype = q.dtype();
        if dtype == DType::F16 {
            ctx.require_f16("f16 attention")?;
        }
        shape.check_options(options)?;
        let kernel = resolve_kernel(ctx, dtype, options, &shape)?;
        let decode_split = match kernel {
            ResolvedKernel::Decode => {
                let longest = options.key_lengths.as_ref().and_then(|l| l.iter().max());
                let keys = longest.map_or(shape.len_k, |&n| n as usize);
                let design = decode::DecodeDesign::for_context(ctx, ctx.policy(), options.tiling)?;
                Some(decode::choose_split(ctx, design, &shape, keys)?)
            }
            _ => None,
        };
        let keys_per_dispatch = key_range_per_dispatch(ctx, &kernel, &shape, options)?;
        let caps = ctx.capabilities();
        let binding = caps.max_storage_binding;
        for (what, bytes) in [
            ("q", q.byte_len()),
            ("k", k.byte_len()),
            ("v", v.byte_len()),
            (
                "output",
                (shape.out_shape().iter().product::<usize>() * dtype.size()) as u64,
            ),
            (
                "mask",
                options
                    .mask
                    .as_ref()
                    .map_or(0, |m| 4 * m.shape().iter().product::<usize>() as u64),
            ),
            ("decode partials", decode_split.map_or(0, |d| d.partial_bytes(&shape))),
            // f32 per row: larger than the output itself when Dv = 1 in f16.
            ("lse", 4 * (shape.batch_heads() * shape.len_q) as u64),
            // Averaged weights are bound whole by each chunk's accumulation.
            (
                "averaged weights",
                if options.need_weights && options.average_weights {
                    4 * (shape.batch * shape.len_q * shape.len_k) as u64
                } else {
                    0
                },
            ),
        ] {
            if bytes > binding {
                return Err(Error::LimitExceeded {
                    what: format!("binding {what}"),
                    limit: "max_storage_buffer_binding_size",
                    unit: "bytes",
                    requested: bytes,
                    max: binding,
                });
            }
        }
        let weights_bytes = 4 * weights_shape(&shape, options).iter().product::<usize>() as u64;
        if options.need_weights && weights_bytes > caps.max_buffer {
            return Err(Error::LimitExceeded {
                what: if options.average_weights {
                    "the averaged attention weights [B, 1, Lq, Lk] f32".into()
                } else {
                    "the attention weights [B, Hq, Lq, Lk] f32".into()
                },
                limit: "max_buffer_size",
                unit: "bytes",
                requested: weights_bytes,
                max: caps.max_buffer,
            });
        }
        let needs_scores = kernel == ResolvedKernel::Materialized || options.need_weights;
        let per_head = 4 * (shape.len_q * shape.len_k) as u64;
        let chunk_limit = binding.min(caps.max_buffer);
        if needs_scores && per_head > chunk_limit {
            return Err(Error::LimitExceeded {
                what: format!("the score matrix of one head ({} x {} f32)", shape.len_q, shape.len_k),
                limit: "max_storage_buffer_binding_size",
                unit: "bytes",
                requested: per_head,
                max: chunk_limit,
            });
        }
        let max_groups = caps.max_workgroups_per_dim as usize;
        // Averaged weights: score chunks of at most B heads, or of AVERAGE_CHUNK_BYTES
        // where that holds more, so the per-head weights are never whole and the chunk is
        // no larger than the average or that budget.
        let average_chunk = if options.need_weights && options.average_weights {
            shape.batch.max((AVERAGE_CHUNK_BYTES / per_head.max(1)) as usize)
        } else {
            usize::MAX
        };
        let heads_per_chunk = if needs_scores {
            ((chunk_limit / per_head) as usize).min(max_groups)
        } else {
            max_groups
        }
        .min(average_chunk)
        .min(shape.batch_heads())
        .max(1);
        // The fused kernels need no score chunk: as many heads per dispatch as the grid
        // takes.
        let attention_heads_per_chunk = max_groups.min(shape.batch_heads()).max(1);
        let widest = shape.len_q.max(shape.len_k).div_ceil(qk_scores::TILE);
        if widest > max_groups {
            return Err(Error::LimitExceeded {
                what: format!("workgroups along one axis for length {}", shape.len_q.max(shape.len_k)),
                limit: "max_compute_workgroups_per_dimension",
                unit: "workgroups",
                requested: widest as u64,
                max: max_groups as u64,
            });
        }
        // Key splits (docs/design.md, "Key splits"): whole 64-key tiles each; never with
        // weights, whose pass rewrites the lse the split outputs would need merged first.
        // The merge runs a workgroup per 64 rows along one axis and keeps an f32 state of
        // every output element in one binding: where those do not fit, no split.
        let rows = shape.batch_heads() * shape.len_q;
        let merge_fits = rows.div_ceil(64) <= max_groups && (4 * rows * shape.head_dim_v) as u64 <= binding;
        let (key_splits, keys_per_split) = match kernel {
            ResolvedKernel::Fused(_) if !needs_scores && ctx.policy().key_splits > 1 && merge_fits => {
                let per = shape
                    .len_k
                    .div_ceil(ctx.policy().key_splits as usize)
                    .next_multiple_of(64);
                (shape.len_k.div_ceil(per).max(1), per)
            }
            _ => (1, shape.len_k.max(1)),
        };
        Ok(Plan {
            shape,
            dtype,
            kernel,
            out_layout: options.output_layout.unwrap_or(q.layout()),
            heads_per_chunk,
            attention_heads_per_chunk,
            keys_per_dispatch,
            needs_scores,
            decode_split,
            pages: pages.cloned(),
            key_splits,
            keys_per_split,
        })
    }

    pub(crate) fn params(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        options: &AttentionOptions,
    ) -> AttentionParams {
        let strides = [q.strides(), k.strides(), v.strides(), out.strides()];
        params_for(&self.shape, self.pages.as_ref(), strides, k.shape()[2], options)
    }

    #[allow(clippy::too_many_arguments)]
    fn encode(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        kv_texels: Option<&KvTexels>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let outputs = self.allocate_outputs(ctx, options)?;
        let shared = self.allocate_shared(ctx, options)?;
        let base = self.params(q, k, v, &outputs.out, options);
        let buffers = Buffers {
            q,
            k,
            v,
            outputs: &outputs,
            shared: &shared,
            kv_texels,
        };
        if let Some(split) = self.decode_split {
            self.encode_decode(ctx, encoder, &buffers, base, split)?;
        }
        let mut merged = None;
        if let ResolvedKernel::Fused(config) = self.kernel {
            merged = self.encode_fused(ctx, encoder, &buffers, base, config)?;
        }
        if self.needs_scores {
            self.encode_score_chunks(ctx, encoder, &buffers, base, options)?;
        }
        let Outputs { out, lse, weights } = outputs;
        // Key splits: the merge of the ranges' outputs is the output.
        let (out, lse) = merged.map_or((out, lse), |m| (m.out, m.lse));
        Ok(AttentionOutput {
            out,
            weights,
            lse: options.need_lse.then_some(lse),
        })
    }

    /// The output, its log-sum-exp (always: the fused kernels resume from it) and the
    /// weights where asked for.
    fn allocate_outputs(&self, ctx: &Context, options: &AttentionOptions) -> Result<Outputs> {
        let s = &self.shape;
        Ok(Outputs {
            out: Tensor::empty(ctx, s.out_shape(), self.out_layout, self.dtype)?,
            lse: Tensor::empty(ctx, [s.batch, s.heads_q, s.len_q, 1], Layout::Bhsd, DType::F32)?,
            weights: if options.need_weights {
                Some(Tensor::empty(ctx, weights_shape(s, options), Layout::Bhsd, DType::F32)?)
            } else {
                None
            },
        })
    }

    /// What every pass binds besides q, k, v and the outputs: the mask, the side words
    /// (key lengths, ALiBi slopes, block table) and one score chunk.
    fn allocate_shared(&self, ctx: &Context, options: &AttentionOptions) -> Result<Shared> {
        let s = &self.shape;
        let chunk_bytes = if self.needs_scores {
            (4 * self.heads_per_chunk * s.len_q * s.len_k) as u64
        } else {
            4
        };
        Ok(Shared {
            mask: upload_words(ctx, "mask", &mask_words(options))?,
            side_words: upload_words(
                ctx,
                "key lengths, ALiBi slopes and block table",
                &side_words(s, options, self.pages.as_ref()),
            )?,
            scores: ctx.create_buffer("attention scores chunk", chunk_bytes, tensor_usage())?,
        })
    }

    /// Split-K decode: one split pass and one combine over every (batch, head), its
    /// partials in a buffer of their own (the weights pass keeps the score chunk).
    fn encode_decode(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        buffers: &Buffers,
        base: AttentionParams,
        split: decode::DecodeSplit,
    ) -> Result<()> {
        let s = &self.shape;
        let partials = ctx.create_buffer("decode partials", split.partial_bytes(s), tensor_usage())?;
        let params = AttentionParams {
            splits: split.splits as u32,
            key_stop: split.keys as u32,
            ..base
        };
        let params_buffer = uniform(ctx, "decode params", &params)?;
        decode::encode(
            ctx,
            encoder,
            self.dtype,
            &buffers.bind(&params_buffer, &partials),
            &params,
            s,
            split,
        )
    }

    /// The fused attention over every head, in as few dispatches as the grid allows,
    /// each walking the keys in ranges (one range unless a loop cap splits them), each
    /// range resuming from the output and lse the previous one stored. With key splits,
    /// each split's ranges write outputs of their own (the first split the plan's), and
    /// the merge of them is returned.
    fn encode_fused(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        buffers: &Buffers,
        base: AttentionParams,
        config: FlashConfig,
    ) -> Result<Option<Merged>> {
        let s = &self.shape;
        // One texel mirror of K and V for every dispatch below, where the kernel reads
        // one and no KV cache lends its own.
        let copies = match buffers.kv_texels {
            Some(_) => None,
            None => flash::texel_mirror(
                ctx,
                encoder,
                self.dtype,
                config,
                &base,
                (buffers.k.buffer(), buffers.v.buffer()),
            )?,
        };
        let mirror = buffers.kv_texels.or(copies.as_ref());
        // Key splits: the first writes the plan's outputs, each other one its own.
        let extra = self.split_outputs(ctx)?;
        let targets: Vec<(&Tensor, &Tensor)> = std::iter::once((&buffers.outputs.out, &buffers.outputs.lse))
            .chain(extra.iter().map(|(out, lse)| (out, lse)))
            .collect();
        for (bh_start, bh_count) in chunks(s.batch_heads(), self.attention_heads_per_chunk) {
            let params = chunk(base, bh_start, bh_count);
            let params_buffer = uniform(ctx, "attention params", &params)?;
            for (split, (out, lse)) in targets.iter().enumerate() {
                let bindings = AttentionBindings {
                    kv_texels: mirror,
                    output: out.buffer(),
                    lse: lse.buffer(),
                    ..buffers.bind(&params_buffer, &buffers.shared.scores)
                };
                let first = split * self.keys_per_split;
                let stop = if split + 1 == targets.len() {
                    s.len_k
                } else {
                    first + self.keys_per_split
                };
                self.encode_key_ranges(ctx, encoder, config, bindings, params, first..stop)?;
            }
        }
        if targets.len() < 2 {
            return Ok(None);
        }
        let outs: Vec<&Tensor> = targets.iter().map(|(out, _)| *out).collect();
        let lses: Vec<&Tensor> = targets.iter().map(|(_, lse)| *lse).collect();
        encode_merge_attentions(ctx, encoder, &outs, &lses).map(Some)
    }

    /// The output and lse of each key split past the first (none without splits), the
    /// lse -inf, so that a split starting past key 0 starts as if nothing were seen
    /// (attention_common.wgsl's resumed_max reads it; the output is then never read).
    fn split_outputs(&self, ctx: &Context) -> Result<Vec<(Tensor, Tensor)>> {
        if self.key_splits < 2 {
            return Ok(Vec::new());
        }
        let s = &self.shape;
        let unseen = vec![f32::NEG_INFINITY.to_bits(); s.batch_heads() * s.len_q];
        (1..self.key_splits)
            .map(|_| {
                let lse = upload_words(ctx, "lse of a key split", &unseen)?;
                Ok((
                    Tensor::empty(ctx, s.out_shape(), self.out_layout, self.dtype)?,
                    Tensor::from_buffer(ctx, lse, [s.batch, s.heads_q, s.len_q, 1], Layout::Bhsd, DType::F32)?,
                ))
            })
            .collect()
    }

    /// One split's (or the whole attention's) key range `keys`, in dispatches of at
    /// most `keys_per_dispatch` keys (one unless a loop cap splits them), each resuming
    /// from the previous one's output and lse.
    fn encode_key_ranges(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        config: FlashConfig,
        bindings: AttentionBindings,
        params: AttentionParams,
        keys: std::ops::Range<usize>,
    ) -> Result<()> {
        for key_begin in (keys.start..keys.end.max(keys.start + 1)).step_by(self.keys_per_dispatch) {
            let range = AttentionParams {
                key_begin: key_begin as u32,
                key_stop: (key_begin + self.keys_per_dispatch).min(keys.end) as u32,
                ..params
            };
            let whole = range.key_begin == params.key_begin && range.key_stop == params.key_stop;
            let range_buffer = if whole {
                None
            } else {
                Some(uniform(ctx, "attention params (key range)", &range)?)
            };
            let range_bindings = AttentionBindings {
                params: range_buffer.as_ref().unwrap_or(bindings.params),
                ..bindings
            };
            flash::encode(ctx, ctx.policy(), encoder, self.dtype, config, &range_bindings, &range)?;
        }
        Ok(())
    }

    /// Score chunks of a few heads: the materialized attention, and the weights of
    /// every path. Weights from the fused and decode paths are made as the materialized
    /// path makes them, normalised against the maximum of the same f32 scores, exact at
    /// any logit scale (docs/design.md, "Attention weights"); the row's lse is then
    /// rewritten from those scores, consistent with them.
    fn encode_score_chunks(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        buffers: &Buffers,
        base: AttentionParams,
        options: &AttentionOptions,
    ) -> Result<()> {
        let s = &self.shape;
        let scores = &buffers.shared.scores;
        for (bh_start, bh_count) in chunks(s.batch_heads(), self.heads_per_chunk) {
            let params = chunk(base, bh_start, bh_count);
            let params_buffer = uniform(ctx, "attention params", &params)?;
            let bindings = buffers.bind(&params_buffer, scores);
            qk_scores::encode(ctx, encoder, self.dtype, &bindings, &params)?;
            softmax_rows::encode(ctx, encoder, self.dtype, &bindings, &params)?;
            if self.kernel == ResolvedKernel::Materialized {
                weights_v::encode(ctx, encoder, self.dtype, &bindings, &params)?;
            }
            match &buffers.outputs.weights {
                Some(w) if options.average_weights => encode_accumulate_heads(
                    ctx,
                    encoder,
                    scores,
                    w.buffer(),
                    [s.heads_q, s.len_q * s.len_k],
                    (bh_start, bh_count),
                )?,
                Some(w) => {
                    let bytes = (4 * bh_count * s.len_q * s.len_k) as u64;
                    let offset = (4 * bh_start * s.len_q * s.len_k) as u64;
                    encoder.copy_buffer_to_buffer(scores, 0, w.buffer(), offset, bytes);
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// What a call returns, allocated before any pass.
struct Outputs {
    out: Tensor,
    lse: Tensor,
    weights: Option<Tensor>,
}

/// Buffers every pass binds besides the tensors.
struct Shared {
    mask: wgpu::Buffer,
    side_words: wgpu::Buffer,
    scores: wgpu::Buffer,
}

/// Everything one call's passes bind, bar each pass's params and scratch.
struct Buffers<'a> {
    q: &'a Tensor,
    k: &'a Tensor,
    v: &'a Tensor,
    outputs: &'a Outputs,
    shared: &'a Shared,
    kv_texels: Option<&'a KvTexels>,
}

impl<'a> Buffers<'a> {
    /// The bindings of a pass with these params and this score (or partials) buffer.
    fn bind(&self, params: &'a wgpu::Buffer, scores: &'a wgpu::Buffer) -> AttentionBindings<'a> {
        AttentionBindings {
            params,
            q: self.q.buffer(),
            k: self.k.buffer(),
            v: self.v.buffer(),
            output: self.outputs.out.buffer(),
            mask: &self.shared.mask,
            side_words: &self.shared.side_words,
            scores,
            lse: self.outputs.lse.buffer(),
            kv_texels: self.kv_texels,
            words_stand_in: None,
            kv_scales: None,
        }
    }
}

/// The params of attention of shape `s` over inputs with element strides `[q, k, v,
/// out]` (K of `k_rows` rows per batch element, or per page where `pages` is given).
pub(crate) fn params_for(
    s: &AttentionShape,
    pages: Option<&PageTable>,
    [[qb, qh, qs, _], [k_page, kh, ks, _], [v_page, vh, vs, _], [ob, oh, os, _]]: [[usize; 4]; 4],
    k_rows: usize,
    options: &AttentionOptions,
) -> AttentionParams {
    // Paged K and V: the batch element picks pages through the table, not a stride.
    let (kb, vb) = if pages.is_some() { (0, 0) } else { (k_page, v_page) };
    // A causal mask is a window's right edge at 0 (docs/design.md, "Masks"); edges
    // past Lq + Lk (+ |position_offset|, which moves queries that far from the keys)
    // reach every key, and clamping them keeps the WGSL's i32 position arithmetic in
    // range (check_options bounds the sum).
    let moved = options.position_offset.map_or(0, |o| o.unsigned_abs() as usize);
    let reach = s.len_q + s.len_k + moved;
    let window = options.window.unwrap_or_default();
    let right = match options.causal {
        Some(_) => Some(0), // no window edge is tighter than 0
        None => window.right.map(|r| r.min(reach)),
    };
    let left = window.left.map(|l| l.min(reach));
    let (mask_kind, m) = match &options.mask {
        None => (MASK_NONE, [0; 4]),
        Some(mask) => (
            match mask.values() {
                MaskValues::Bool(_) => MASK_BOOL,
                MaskValues::Additive(_) => MASK_ADDITIVE,
            },
            mask.broadcast_strides(),
        ),
    };
    AttentionParams {
        batch: s.batch as u32,
        heads_q: s.heads_q as u32,
        heads_kv: s.heads_kv as u32,
        len_q: s.len_q as u32,
        len_k: s.len_k as u32,
        head_dim: s.head_dim as u32,
        head_dim_v: s.head_dim_v as u32,
        scale: s.scale(options),
        q_stride_b: qb as u32,
        q_stride_h: qh as u32,
        q_stride_s: qs as u32,
        has_right: right.is_some() as u32,
        k_stride_b: kb as u32,
        k_stride_h: kh as u32,
        k_stride_s: ks as u32,
        pos_offset: options.query_position_offset(s.len_q, s.len_k) as i32,
        v_stride_b: vb as u32,
        v_stride_h: vh as u32,
        v_stride_s: vs as u32,
        has_key_lengths: options.key_lengths.is_some() as u32,
        o_stride_b: ob as u32,
        o_stride_h: oh as u32,
        o_stride_s: os as u32,
        mask_kind,
        m_stride_b: m[0] as u32,
        m_stride_h: m[1] as u32,
        m_stride_q: m[2] as u32,
        m_stride_k: m[3] as u32,
        bh_start: 0,
        bh_count: s.batch_heads() as u32,
        key_begin: 0,
        key_stop: s.len_k as u32,
        splits: 1,
        right: right.unwrap_or(0) as u32,
        has_left: left.is_some() as u32,
        left: left.unwrap_or(0) as u32,
        softcap: options.softcap.unwrap_or(0.0),
        has_alibi: options.alibi_slopes.is_some() as u32,
        align_to_lengths: options.aligns_to_key_lengths() as u32,
        page_size: pages.map_or(0, |_| k_rows as u32),
        table_offset: side_words_before_table(s, options) as u32,
        table_stride: pages.map_or(0, |t| t.pages_per_sequence() as u32),
        k_page_stride: k_page as u32,
        v_page_stride: v_page as u32,
    }
}

/// `base` restricted to the (batch, head) pairs `bh_start .. bh_start + bh_count`.
fn chunk(base: AttentionParams, bh_start: usize, bh_count: usize) -> AttentionParams {
    AttentionParams {
        bh_start: bh_start as u32,
        bh_count: bh_count as u32,
        ..base
    }
}

/// A uniform buffer holding `params`.
pub(crate) fn uniform(ctx: &Context, label: &str, params: &AttentionParams) -> Result<wgpu::Buffer> {
    ctx.create_buffer_init(label, bytemuck::bytes_of(params), wgpu::BufferUsages::UNIFORM)
}

/// Score-chunk budget for averaged weights: chunks of B heads, or as many heads as fit
/// in this many bytes where that is more (a few dispatches rather than one per head).
const AVERAGE_CHUNK_BYTES: u64 = 16 << 20;

/// `(start, count)` of consecutive chunks of at most `size` covering `0 .. total`.
fn chunks(total: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    let size = size.max(1);
    (0..total)
        .step_by(size)
        .map(move |start| (start, size.min(total - start)))
}

/// The weights a call returns: `[B, Hq, Lq, Lk]`, or `[B, 1, Lq, Lk]` averaged.
fn weights_shape(s: &AttentionShape, options: &AttentionOptions) -> [usize; 4] {
    let [b, h, lq, lk] = s.weights_shape();
    [b, if options.average_weights { 1 } else { h }, lq, lk]
}

/// Keys one fused dispatch may walk: all of them, except under a loop cap (Mesa 22's
/// llvmpipe ends an invocation's loops after 65535 iterations; see
/// `kernels::loop_budget`); there the fused kernels split the keys across dispatches
/// and the materialized path, which cannot, refuses (as does the fused path's weights
/// pass, the same softmax kernel).
/// The most keys a block of `rows` query rows walks when a window bounds both sides of
/// every row's range (the right side by causality or the window): `left + right + rows`
/// plus 3 for the loop start's alignment to 4, plus 64 keys of margin (the iteration
/// models already count whole tiles from the first key, so a block's tiles over this
/// walk are never more than over `len_k = walk`). `None` when a side is unbounded.
fn window_walk(options: &AttentionOptions, rows: usize) -> Option<usize> {
    let window = options.window?;
    let left = window.left?;
    let right = match options.causal {
        Some(_) => 0,
        None => window.right?,
    };
    Some(left + right + rows + 3 + 64)
}

fn key_range_per_dispatch(
    ctx: &Context,
    kernel: &ResolvedKernel,
    shape: &AttentionShape,
    options: &AttentionOptions,
) -> Result<usize> {
    let weights = options.need_weights;
    let all = shape.len_k.max(1);
    let Some(cap) = ctx.loop_cap() else {
        return Ok(all);
    };
    let refuse = |needed: u64| {
        let what = format!(
            "{} attention over {} keys (D {}, Dv {})",
            kernel.name(),
            shape.len_k,
            shape.head_dim,
            shape.head_dim_v
        );
        loop_budget::over_cap(what, needed, cap)
    };
    match kernel {
        ResolvedKernel::Fused(config) => {
            if weights {
                // The weights pass is the materialized path's softmax, which cannot split.
                let needed = loop_budget::materialized_iterations(shape);
                if needed > cap {
                    return Err(loop_budget::over_cap(
                        format!("attention weights over {} keys", shape.len_k),
                        needed,
                        cap,
                    ));
                }
            }
            // A window bounded on both sides bounds the keys any block walks, whatever
            // Lk: one dispatch then suffices (splitting it anyway halved the speed of a
            // 1024-key window at Lk = 8192 on Mesa 22.3's lavapipe).
            if let Some(walk) = window_walk(options, config.rows(shape, ctx.capabilities(), ctx.policy())) {
                let walked = AttentionShape {
                    len_k: walk.min(shape.len_k),
                    ..*shape
                };
                if loop_budget::fused_iterations(config, &walked, ctx.capabilities(), ctx.policy()) <= cap {
                    return Ok(all);
                }
            }
            let most = loop_budget::keys_per_dispatch(config, shape, cap, ctx.capabilities(), ctx.policy())
                .ok_or_else(|| {
                    let one_block = AttentionShape { len_k: 4, ..*shape };
                    refuse(loop_budget::fused_iterations(
                        config,
                        &one_block,
                        ctx.capabilities(),
                        ctx.policy(),
                    ))
                })?;
            // As few dispatches as the cap allows, with equal key ranges.
            let dispatches = shape.len_k.div_ceil(most).max(1);
            Ok(shape.len_k.div_ceil(dispatches).next_multiple_of(4).min(all))
        }
        ResolvedKernel::Materialized => {
            let needed = loop_budget::materialized_iterations(shape);
            if needed > cap {
                return Err(refuse(needed));
            }
            Ok(all)
        }
        // Decode bounds each split by the cap itself (decode::choose_split); only its
        // weights pass, the materialized softmax, cannot split.
        ResolvedKernel::Decode => {
            let needed = loop_budget::materialized_iterations(shape);
            if weights && needed > cap {
                return Err(loop_budget::over_cap(
                    format!("attention weights over {} keys", shape.len_k),
                    needed,
                    cap,
                ));
            }
            Ok(all)
        }
    }
}

/// The explicit mask as 32-bit words: bool as 0/1, additive as f32 bits.
pub(crate) fn mask_words(options: &AttentionOptions) -> Vec<u32> {
    match options.mask.as_ref().map(|m| m.values()) {
        None => vec![0],
        Some(MaskValues::Bool(b)) => b.iter().map(|&x| x as u32).collect(),
        Some(MaskValues::Additive(a)) => a.iter().map(|x| x.to_bits()).collect(),
    }
}

/// The side words (`side_words` in attention_common.wgsl): key lengths `[B]` (zeros
/// when there are none), then the ALiBi slopes `[Hq]` as f32 bits when given, then the
/// block table `[B, pages per sequence]` when K and V are paged.
pub(crate) fn side_words(s: &AttentionShape, options: &AttentionOptions, pages: Option<&PageTable>) -> Vec<u32> {
    let mut words = options.key_lengths.clone().unwrap_or_else(|| vec![0; s.batch]);
    if let Some(slopes) = &options.alibi_slopes {
        words.extend(slopes.iter().map(|x| x.to_bits()));
    }
    debug_assert_eq!(words.len(), side_words_before_table(s, options));
    if let Some(table) = pages {
        words.extend_from_slice(table.entries());
    }
    words
}

/// Where the block table starts in the side words.
fn side_words_before_table(s: &AttentionShape, options: &AttentionOptions) -> usize {
    s.batch + options.alibi_slopes.as_ref().map_or(0, Vec::len)
}

pub(crate) fn upload_words(ctx: &Context, label: &str, words: &[u32]) -> Result<wgpu::Buffer> {
    ctx.create_buffer_init(label, bytemuck::cast_slice(words), wgpu::BufferUsages::STORAGE)
}
