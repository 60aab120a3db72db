//! The backward pass of attention: dQ, dK and dV from q, k, v, the forward's output
//! and log-sum-exp, and the output's gradient (docs/design.md, "Backward").
//!
//! FlashAttention-2's algorithm (`shaders/flash_backward.wgsl`): a pass computing
//! `D = rowsum(dO ∘ O)`, a pass where each invocation keeps one key and walks the query
//! rows (dK, dV), and one where each keeps a query row and walks the keys (dQ); the
//! other tilings ([`BackwardTiling`]) give a workgroup a block of keys or rows. The
//! score matrix is never stored; no atomics, so results repeat bit for bit. Under
//! llvmpipe's loop cap the walks are split across dispatches that add to the previous
//! ones' sums, in a fixed order. The tiling and every other choice of a call are
//! planned in `kernels::backward_plan`; this module checks the call's tensors and
//! records the plan.

use crate::attention::{mask_words, side_words, upload_words, Plan};
use crate::context::Context;
use crate::error::{Error, Result};
pub use crate::kernels::backward_passes::{
    rows_for, PassKernels, ROWS_128, ROWS_128_WG, ROWS_256, ROWS_256_WG, ROWS_32, ROWS_64, ROWS_64_WG,
};
use crate::kernels::backward_passes::{DELTA, DKDV, MAT_DKDV, MAT_DQ, MAT_DS};
pub use crate::kernels::backward_plan::BackwardTiling;
use crate::kernels::backward_plan::FusedBackwardPlan;
use crate::kernels::{dispatch_entries, groups_for, loop_budget, pipeline, AttentionParams, Slot};
use crate::options::{AttentionOptions, FusedTiling, KernelChoice};
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
        ctx.policy(),
        forward.tiling,
        dtype,
        options.precision,
        shape,
    ))
}

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
    // The fused passes, planned whole (the materialized path has its own kernels).
    let fused = if matrices.is_some() {
        None
    } else {
        let forward_tiling = plan.fused_tiling().unwrap_or(FusedTiling::Auto);
        let tiling = BackwardTiling::for_forward(ctx, ctx.policy(), forward_tiling, dtype, options.precision, &s);
        Some(FusedBackwardPlan::new(ctx, tiling, &s, dtype, &base, [q, k, v, d_out])?)
    };
    let word_stand_in = match &fused {
        Some(p) if p.word_placeholder => {
            Some(ctx.create_buffer("coop backward word placeholder", 16, tensor_usage())?)
        }
        _ => None,
    };
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

    // (Planned above wherever the materialized path was not asked for.)
    let Some(fused) = fused else {
        return Err(Error::invalid("attention backward", "no plan for its fused passes"));
    };
    let (kernels, constants) = (&fused.kernels, &fused.constants);

    // dQ, over key ranges that fit the loop cap.
    let dq_pipeline = pipeline(ctx, &kernels.dq, dtype, constants)?;
    let per_key_range = fused.keys_per_dq_dispatch;
    for begin in (0..s.len_k.max(1)).step_by(per_key_range) {
        let range = AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_key_range).min(s.len_k) as u32,
            ..base
        };
        let groups = groups_for(s.len_q, fused.rows_per_workgroup as usize);
        run(encoder, &dq_pipeline, kernels.dq.slots, range, groups, s.batch_heads())?;
    }

    // dK and dV, over query-row ranges that fit the loop cap (the row range travels in
    // key_begin / key_stop: the WGSL says so).
    let dkdv_pipeline = pipeline(ctx, &kernels.dkdv, dtype, constants)?;
    let per_row_range = fused.rows_per_dkdv_dispatch;
    for begin in (0..s.len_q).step_by(per_row_range) {
        let range = AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_row_range).min(s.len_q) as u32,
            ..base
        };
        let groups = groups_for(s.len_k, fused.rows_per_workgroup as usize);
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
