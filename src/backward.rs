//! The backward pass of attention: dQ, dK and dV from q, k, v, the forward's output
//! and log-sum-exp, and the output's gradient (docs/design.md, "Backward").
//!
//! FlashAttention-2's algorithm (`shaders/flash_backward.wgsl`): a pass computing
//! `D = rowsum(dO ∘ O)`, a pass where each invocation keeps one key and walks the query
//! rows (dK, dV), and one where each keeps a query row and walks the keys (dQ); the
//! other tilings ([`BackwardTiling`]) give a workgroup a block of keys or rows. The
//! score matrix is never stored; no atomics, so results repeat bit for bit. Under
//! llvmpipe's loop cap the walks are split across dispatches that add to the previous
//! ones' sums, in a fixed order.

use crate::attention::{mask_words, side_words, upload_words, Plan};
use crate::context::{Capabilities, Context};
use crate::error::{Error, Result};
use crate::kernels::backward_blocked::{self, BlockedVariant};
use crate::kernels::backward_coop::{self, CoopBackwardVariant};
pub use crate::kernels::backward_passes::{
    rows_for, PassKernels, ROWS_128, ROWS_128_WG, ROWS_256, ROWS_256_WG, ROWS_32, ROWS_64, ROWS_64_WG,
};
use crate::kernels::backward_passes::{
    DELTA, DKDV, DKDV_SLOTS, DQ, DQ_SLOTS, MAT_DKDV, MAT_DQ, MAT_DS, SUBGROUP_128, SUBGROUP_64,
};
use crate::kernels::{dispatch_entries, groups_for, loop_budget, pipeline, AttentionParams, Slot};
use crate::options::{AttentionOptions, FusedTiling, KernelChoice, Precision};
use crate::problem::AttentionShape;
use crate::tensor::{tensor_usage, DType, Layout, Tensor};

/// The gradients of one attention call, in the inputs' layouts and dtype.
#[derive(Debug)]
pub struct Gradients {
    /// The gradient with respect to q: q's shape, layout and dtype.
    pub dq: Tensor,
    /// With respect to k (summed over the query heads that share a key/value head).
    pub dk: Tensor,
    /// With respect to v (likewise).
    pub dv: Tensor,
}

/// The backward tiling `sdpa_backward` runs for inputs of `dtype` and `shape` with
/// `options` on this context (for reports).
pub fn backward_tiling(
    ctx: &Context,
    dtype: DType,
    options: &AttentionOptions,
    shape: &AttentionShape,
) -> Result<BackwardTiling> {
    let forward = ctx.fused_config_for(options.tiling, dtype, options.precision)?;
    Ok(BackwardTiling::for_forward(
        ctx,
        forward.tiling,
        dtype,
        options.precision,
        shape,
    ))
}

/// How the dQ and dK/dV passes are tiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackwardTiling {
    /// One row or key per invocation, operands from storage (`flash_backward.wgsl`):
    /// every adapter, every head dim.
    Rows,
    /// Where the forward runs its `subgroup` tiling (CPU adapters) and both head dims
    /// are at most 128: 4 rows or keys per invocation sharing loads through 8-lane
    /// subgroups (`flash_backward_subgroup.wgsl`).
    Subgroup,
    /// Where the forward runs a GPU tiling (`shared`, `blocked`, `coop`) and a variant
    /// of `flash_backward_blocked.wgsl` holds the head dims (up to 128 in f32, 256 in
    /// f16) in the adapter's workgroup memory: tiles of rows and keys with both
    /// operands of every product in workgroup memory (`kernels::backward_blocked`; in
    /// 48 KiB, 32 rows and keys per tile at D 64, and at D 128 16 in f32 and 32 in
    /// f16).
    Blocked(BlockedVariant),
    /// Where the forward runs its tensor-core tiling (`coop`: f16 inputs, or f32 below
    /// [`Precision::Highest`]) and a variant holds the head dims (up to 128): every
    /// product a 16 x 16 x 16 f16 cooperative-matrix multiply-add with f32
    /// accumulation (`kernels::backward_coop`), on subgroups of the given lanes.
    Coop(CoopBackwardVariant, u32),
}

impl BackwardTiling {
    /// The tiling for a problem of `dtype` at `precision` whose forward runs the fused
    /// tiling `forward` on `ctx`. Below [`Precision::Highest`], f32 inputs take the
    /// blocked tiling's f16 tiles where the adapter has f16, and follow a tensor-core
    /// forward onto tensor cores as f16 inputs do.
    pub fn for_forward(
        ctx: &Context,
        forward: FusedTiling,
        dtype: DType,
        precision: Precision,
        shape: &AttentionShape,
    ) -> Self {
        let dims = shape.head_dim.max(shape.head_dim_v);
        let caps = ctx.capabilities();
        let half_tiles = precision != Precision::Highest && caps.f16;
        if forward == FusedTiling::Coop && (dtype == DType::F16 || precision != Precision::Highest) {
            let coop = caps.coop_subgroup_size().and_then(|sg| {
                let dims = u32::try_from(dims).ok()?;
                let (bytes, invocations) = (caps.max_workgroup_storage, caps.max_invocations);
                let pinned = ctx
                    .policy()
                    .coop_backward_pinned
                    .filter(|v| v.fits(dims, sg, bytes, invocations));
                pinned
                    .or_else(|| {
                        backward_coop::variant_for(dims, sg, bytes, invocations)
                            .map(|v| v.with_named(ctx.policy().coop_backward_named))
                    })
                    .map(|v| (v, sg))
            });
            // Its dK/dV pass binds 14 storage buffers (the others' 10, and 4 as words).
            let storage = ctx.device().limits().max_storage_buffers_per_shader_stage as usize;
            if let Some((v, sg)) = coop.filter(|_| storage >= backward_coop::DKDV_SLOTS.len() - 1) {
                return BackwardTiling::Coop(v, sg);
            }
        }
        match forward {
            FusedTiling::Subgroup if dims <= 128 => BackwardTiling::Subgroup,
            FusedTiling::Shared | FusedTiling::Blocked | FusedTiling::Coop => {
                let fits = u32::try_from(dims).ok().and_then(|d| {
                    let (storage, invocations) = (caps.max_workgroup_storage, caps.max_invocations);
                    backward_blocked::variant_for(d, dtype, half_tiles, storage, invocations)
                });
                fits.map_or(BackwardTiling::Rows, |v| BackwardTiling::Blocked(*v))
            }
            _ => BackwardTiling::Rows,
        }
    }

    /// The name reports give it.
    pub fn name(self) -> &'static str {
        match self {
            BackwardTiling::Rows => "rows",
            BackwardTiling::Subgroup => "subgroup",
            BackwardTiling::Blocked(_) => "blocked",
            BackwardTiling::Coop(..) => "coop",
        }
    }

    fn kernels(self, shape: &AttentionShape, caps: &Capabilities) -> PassKernels {
        let dims = shape.head_dim.max(shape.head_dim_v) as u32;
        match self {
            BackwardTiling::Rows => rows_for(dims as usize, caps).0,
            BackwardTiling::Subgroup if dims <= 64 => SUBGROUP_64,
            BackwardTiling::Subgroup => SUBGROUP_128,
            BackwardTiling::Blocked(v) => PassKernels {
                dq: v.dq(DQ_SLOTS),
                dkdv: v.dkdv(DKDV_SLOTS),
            },
            BackwardTiling::Coop(v, sg) => PassKernels {
                dq: v.dq(sg),
                dkdv: v.dkdv(sg),
            },
        }
    }

    /// Override constants of its buffer kernels (the workgroup size of `rows` and
    /// `subgroup`'s, `ROWS` rows or keys of `rows`' lanes each; the blocked variants fix
    /// theirs in the prelude).
    fn constants(self, shape: &AttentionShape, caps: &Capabilities) -> Vec<(&'static str, u32)> {
        match self {
            BackwardTiling::Blocked(_) | BackwardTiling::Coop(..) => Vec::new(),
            BackwardTiling::Rows => vec![("ROWS", ROWS * rows_for(dims_of(shape), caps).1)],
            BackwardTiling::Subgroup => vec![("ROWS", ROWS)],
        }
    }

    /// Rows (or keys) per workgroup of its buffer kernels.
    fn rows_per_workgroup(self) -> u32 {
        match self {
            BackwardTiling::Blocked(v) => v.tile,
            BackwardTiling::Coop(v, _) => v.br,
            _ => ROWS,
        }
    }

    /// Loop iterations of one invocation of the dQ pass over `keys` keys, and of the
    /// dK/dV pass over `rows` query rows (llvmpipe's loop cap).
    fn dq_iterations(self, s: &AttentionShape, caps: &Capabilities, keys: usize) -> u64 {
        match self {
            BackwardTiling::Rows => {
                let lanes = rows_for(dims_of(s), caps).1;
                loop_budget::backward_dq_iterations(rows_vec4s(s, caps), lanes, keys)
            }
            BackwardTiling::Subgroup => loop_budget::backward_subgroup_dq_iterations(s, keys),
            BackwardTiling::Blocked(v) => backward_blocked::dq_iterations(&v, vec4s(s), keys),
            BackwardTiling::Coop(v, sg) => backward_coop::dq_iterations(&v, sg, keys),
        }
    }

    fn dkdv_iterations(self, s: &AttentionShape, caps: &Capabilities, rows: usize) -> u64 {
        match self {
            BackwardTiling::Rows => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                let lanes = rows_for(dims_of(s), caps).1;
                loop_budget::backward_dkdv_iterations(rows_vec4s(s, caps), lanes, rows, group)
            }
            BackwardTiling::Subgroup => loop_budget::backward_subgroup_dkdv_iterations(s, rows),
            BackwardTiling::Blocked(v) => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                backward_blocked::dkdv_iterations(&v, vec4s(s), rows, group)
            }
            BackwardTiling::Coop(v, sg) => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                backward_coop::dkdv_iterations(&v, sg, rows, group)
            }
        }
    }
}

/// The head dims in vec4s (D, Dv).
fn vec4s(s: &AttentionShape) -> (u64, u64) {
    ((s.head_dim as u64).div_ceil(4), (s.head_dim_v as u64).div_ceil(4))
}

fn dims_of(s: &AttentionShape) -> usize {
    s.head_dim.max(s.head_dim_v)
}

/// The vec4s each lane of `rows`' passes walks per row (D, Dv): the head dims' on CPU
/// adapters, a head-dim class's constant 8 on GPUs (`rows_for`).
fn rows_vec4s(s: &AttentionShape, caps: &Capabilities) -> (u64, u64) {
    if rows_for(dims_of(s), caps).0.dq == DQ {
        vec4s(s)
    } else {
        (8, 8)
    }
}

/// Rows (or keys) per workgroup of the dQ and dK/dV passes' buffer kernels, in both
/// tilings.
const ROWS: u32 = 32;

/// The gradients of `sdpa(q, k, v, options)` given its output `out`, its log-sum-exp
/// `lse` (`[B, Hq, Lq, 1]` f32, as `need_lse` returns it) and the output's gradient
/// `d_out` (`out`'s shape, layout and dtype). Every option with a gradient meaning is
/// honoured: scale, causal in both alignments, key lengths, bool and additive masks
/// (which get no gradient), window, ALiBi, soft cap, GQA. `options.kernel` picks the
/// path: [`KernelChoice::Materialized`] computes the forward's weights and a dX matrix
/// (memory O(L²); for small problems and as a cross-check), any other choice the
/// fused passes (memory O(L)) in the tiling [`backward_tiling`] names. Waits for
/// nothing: the gradients are ready once the queue has run.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward(
    ctx: &Context,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    options: &AttentionOptions,
) -> Result<Gradients> {
    ctx.record_and_submit("submitting attention backward", |encoder| {
        encode_sdpa_backward(ctx, encoder, q, k, v, out, lse, d_out, options)
    })
}

/// [`sdpa_backward`] with its GPU errors awaited rather than blocked on (the web).
#[allow(clippy::too_many_arguments)]
pub async fn sdpa_backward_async(
    ctx: &Context,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    options: &AttentionOptions,
) -> Result<Gradients> {
    ctx.scoped_async("attention backward", || {
        sdpa_backward(ctx, q, k, v, out, lse, d_out, options)
    })
    .await
}

/// Like [`sdpa_backward`], recording into the caller's encoder.
#[allow(clippy::too_many_arguments)]
pub fn encode_sdpa_backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    d_out: &Tensor,
    options: &AttentionOptions,
) -> Result<Gradients> {
    // The forward's checks (shapes, dtypes, contexts, options, bindings), for the
    // fused path, whose parameters the backward kernels share.
    let forward = AttentionOptions {
        kernel: KernelChoice::Fused,
        need_weights: false,
        ..options.clone()
    };
    let plan = Plan::new(ctx, q, k, v, None, &forward)?;
    // The dK/dV pass binds 10 storage buffers (q, k, v, mask, side words, D, lse, dO,
    // dK, dV); WebGPU's default limit is 8.
    let storage = DKDV.slots.len() as u32 - 1;
    let limit = ctx.device().limits().max_storage_buffers_per_shader_stage;
    if limit < storage {
        return Err(Error::LimitExceeded {
            what: "the backward pass's dK/dV kernel".into(),
            limit: "max_storage_buffers_per_shader_stage",
            unit: "storage buffers",
            requested: storage.into(),
            max: limit.into(),
        });
    }
    let s = plan.shape;
    let dtype = q.dtype();
    for (what, t) in [("out", out), ("d_out", d_out)] {
        t.check_context(ctx, what)?;
        if t.shape() != s.out_shape() || t.dtype() != dtype {
            return Err(Error::shape(
                format!("{what} of attention backward"),
                format!("{:?} {} (the forward's output)", s.out_shape(), dtype.name()),
                format!("{:?} {}", t.shape(), t.dtype().name()),
            ));
        }
    }
    if d_out.layout() != out.layout() {
        return Err(Error::shape(
            "layout of d_out",
            format!("{:?}", out.layout()),
            format!("{:?}", d_out.layout()),
        ));
    }
    lse.check_context(ctx, "lse")?;
    let lse_shape = [s.batch, s.heads_q, s.len_q, 1];
    if lse.shape() != lse_shape || lse.dtype() != DType::F32 || lse.layout() != Layout::Bhsd {
        return Err(Error::shape(
            "lse of attention backward",
            format!("{lse_shape:?} f32 BHSD (the forward's need_lse)"),
            format!("{:?} {} {:?}", lse.shape(), lse.dtype().name(), lse.layout()),
        ));
    }
    let grads = Gradients {
        dq: Tensor::empty(ctx, q.shape(), q.layout(), dtype)?,
        dk: Tensor::empty(ctx, k.shape(), k.layout(), dtype)?,
        dv: Tensor::empty(ctx, v.shape(), v.layout(), dtype)?,
    };
    let mask = upload_words(ctx, "mask", &mask_words(options))?;
    let side = upload_words(ctx, "key lengths and ALiBi slopes", &side_words(&s, options, None))?;
    let delta = ctx.create_buffer(
        "attention backward delta",
        (4 * s.batch_heads() * s.len_q).max(4) as u64,
        tensor_usage(),
    )?;
    let base = plan.params(q, k, v, out, &forward);
    // The materialized path's score matrices: the forward's weights (P) and dX.
    let matrices = if options.kernel == KernelChoice::Materialized {
        loop_budget::check(
            ctx,
            || "the materialized attention backward".into(),
            loop_budget::backward_materialized_iterations(&s),
        )?;
        let weights = crate::attention::encode_sdpa(
            ctx,
            encoder,
            q,
            k,
            v,
            &AttentionOptions {
                need_weights: true,
                average_weights: false,
                need_lse: false,
                output_layout: None,
                ..options.clone()
            },
        )?
        .weights
        .ok_or_else(|| Error::invalid("materialized attention backward", "no weights"))?;
        let d_scores = ctx.create_buffer(
            "attention backward dX",
            (4 * s.batch_heads() * s.len_q * s.len_k).max(4) as u64,
            tensor_usage(),
        )?;
        Some((weights, d_scores))
    } else {
        None
    };
    let tiling = BackwardTiling::for_forward(
        ctx,
        plan.fused_tiling().unwrap_or(FusedTiling::Auto),
        dtype,
        options.precision,
        &s,
    );
    // The coop passes read Q, dO, K and V as 16-byte words where every one's rows are
    // whole words (their WORDS override). A buffer shorter than a word cannot be bound
    // as words: a placeholder stands in, and the kernels read elements.
    let coop = matches!(tiling, BackwardTiling::Coop(..));
    let whole = [q, k, v, d_out].iter().all(|t| t.buffer().size() >= 16);
    let word_stand_in = if coop && !whole {
        Some(ctx.create_buffer("coop backward word placeholder", 16, tensor_usage())?)
    } else {
        None
    };
    let words = coop && whole && coop_words(dtype, &base);
    // The bind group entries of a kernel's slots.
    let bind = |slots: &[Slot]| -> Vec<wgpu::BindGroupEntry> {
        slots
            .iter()
            .map(|&slot| {
                let buffer = match slot {
                    Slot::Q => q.buffer(),
                    Slot::K => k.buffer(),
                    Slot::V => v.buffer(),
                    Slot::ForwardOut => out.buffer(),
                    Slot::Mask => &mask,
                    Slot::SideWords => &side,
                    Slot::Scores => &delta,
                    Slot::Lse => lse.buffer(),
                    Slot::DOut => d_out.buffer(),
                    Slot::DQ => grads.dq.buffer(),
                    Slot::DK => grads.dk.buffer(),
                    Slot::DV => grads.dv.buffer(),
                    Slot::Probs => matrices.as_ref().map_or(q.buffer(), |m| m.0.buffer()),
                    Slot::DScores => matrices.as_ref().map_or(q.buffer(), |m| &m.1),
                    Slot::Q4 => word_stand_in.as_ref().unwrap_or(q.buffer()),
                    Slot::K4 => word_stand_in.as_ref().unwrap_or(k.buffer()),
                    Slot::V4 => word_stand_in.as_ref().unwrap_or(v.buffer()),
                    Slot::DOut4 => word_stand_in.as_ref().unwrap_or(d_out.buffer()),
                    _ => q.buffer(), // Params: replaced below
                };
                wgpu::BindGroupEntry {
                    binding: slot as u32,
                    resource: buffer.as_entire_binding(),
                }
            })
            .collect()
    };
    // A pass over `pairs` (batch, head) pairs ((batch, kv head) for dK/dV) in
    // dispatches of at most the device's workgroups per dimension, each starting at
    // p.bh_start.
    let max_pairs = ctx.capabilities().max_workgroups_per_dim.max(1) as usize;
    let run = |encoder: &mut wgpu::CommandEncoder,
               pipeline: &crate::gpu::CompiledPipeline,
               slots: &[Slot],
               params: AttentionParams,
               groups_x: u32,
               pairs: usize|
     -> Result<()> {
        for start in (0..pairs).step_by(max_pairs) {
            let count = (pairs - start).min(max_pairs);
            let chunk = AttentionParams {
                bh_start: start as u32,
                bh_count: count as u32,
                ..params
            };
            let uniform = crate::attention::uniform(ctx, "backward params", &chunk)?;
            let mut entries = bind(slots);
            entries[0].resource = uniform.as_entire_binding();
            dispatch_entries(ctx, encoder, pipeline, &entries, [groups_x, count as u32, 1])?;
        }
        Ok(())
    };

    // D = rowsum(dO ∘ O).
    let delta_pipeline = pipeline(ctx, &DELTA, dtype, &[])?;
    run(
        encoder,
        &delta_pipeline,
        DELTA.slots,
        base,
        groups_for(s.len_q, 64),
        s.batch_heads(),
    )?;

    if matrices.is_some() {
        let pipelines = [&MAT_DS, &MAT_DQ, &MAT_DKDV].map(|kernel| pipeline(ctx, kernel, dtype, &[]));
        let [ds, dq, dkdv] = pipelines;
        let scores = s.len_q * s.len_k;
        run(
            encoder,
            &ds?,
            MAT_DS.slots,
            base,
            groups_for(scores, 64),
            s.batch_heads(),
        )?;
        run(
            encoder,
            &dq?,
            MAT_DQ.slots,
            base,
            groups_for(s.len_q, 64),
            s.batch_heads(),
        )?;
        let kv_pairs = s.batch * s.heads_kv;
        run(encoder, &dkdv?, MAT_DKDV.slots, base, groups_for(s.len_k, 64), kv_pairs)?;
        return Ok(grads);
    }

    let kernels = tiling.kernels(&s, ctx.capabilities());

    // dQ, over key ranges that fit the loop cap.
    let mut constants = tiling.constants(&s, ctx.capabilities());
    if coop {
        constants.push(("WORDS", u32::from(words)));
    }
    let dq_pipeline = pipeline(ctx, &kernels.dq, dtype, &constants)?;
    let per_key_range = range_per_dispatch(ctx, s.len_k, |keys| tiling.dq_iterations(&s, ctx.capabilities(), keys))?;
    for begin in (0..s.len_k.max(1)).step_by(per_key_range) {
        let range = AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_key_range).min(s.len_k) as u32,
            ..base
        };
        let groups = groups_for(s.len_q, tiling.rows_per_workgroup() as usize);
        run(encoder, &dq_pipeline, kernels.dq.slots, range, groups, s.batch_heads())?;
    }

    // dK and dV, over query-row ranges that fit the loop cap (the row range travels in
    // key_begin / key_stop: the WGSL says so).
    let dkdv_pipeline = pipeline(ctx, &kernels.dkdv, dtype, &constants)?;
    let per_row_range = range_per_dispatch(ctx, s.len_q, |rows| {
        tiling.dkdv_iterations(&s, ctx.capabilities(), rows)
    })?;
    for begin in (0..s.len_q).step_by(per_row_range) {
        let range = AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_row_range).min(s.len_q) as u32,
            ..base
        };
        let groups = groups_for(s.len_k, tiling.rows_per_workgroup() as usize);
        run(
            encoder,
            &dkdv_pipeline,
            kernels.dkdv.slots,
            range,
            groups,
            s.batch * s.heads_kv,
        )?;
    }
    Ok(grads)
}

/// Whether the coop passes stage in 16-byte words for a problem: head dims and every
/// stride of Q, dO (the output's), K and V (a paged cache's page strides too) whole
/// words.
fn coop_words(dtype: DType, p: &AttentionParams) -> bool {
    let per_word = 16 / dtype.size() as u32;
    let rows = [
        p.q_stride_b,
        p.q_stride_h,
        p.q_stride_s,
        p.o_stride_b,
        p.o_stride_h,
        p.o_stride_s,
    ];
    let strides: Vec<u32> = p.kv_strides().into_iter().chain(rows).collect();
    crate::kernels::flash::words_fit(per_word, (p.head_dim, p.head_dim_v), &strides)
}

/// How many of `total` keys (or rows) one dispatch may walk under the context's loop
/// cap (all of them without one): the most, a multiple of 4, whose iteration count
/// `iterations` keeps within the cap.
fn range_per_dispatch(ctx: &Context, total: usize, iterations: impl Fn(usize) -> u64) -> Result<usize> {
    let Some(cap) = ctx.loop_cap() else {
        return Ok(total.max(1));
    };
    let (mut lo, mut hi) = (0usize, total.div_ceil(4));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if iterations(4 * mid) <= cap {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        return Err(Error::unsupported(
            "attention backward on this driver",
            format!("a loop cap of {cap} iterations per invocation"),
            "a cap that fits at least 4 keys or rows of its head dims",
        ));
    }
    Ok(4 * lo)
}
