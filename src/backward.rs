//! The backward pass of attention: dQ, dK and dV from q, k, v, the forward's output
//! and log-sum-exp, and the output's gradient (docs/design.md, "Backward").
//!
//! FlashAttention-2's algorithm (`shaders/flash_backward.wgsl`): a pass computing
//! `D = rowsum(dO ∘ O)`, a pass where each invocation keeps one key and walks the query
//! rows (dK, dV), and one where each keeps a query row and walks the keys (dQ). The
//! score matrix is never stored; no atomics, so results repeat bit for bit. Under
//! llvmpipe's loop cap the walks are split across dispatches that add to the previous
//! ones' sums, in a fixed order.

use crate::attention::{mask_words, side_words, upload_words, Plan};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::{dispatch, groups_for, loop_budget, pipeline, Kernel, Slot, ATTENTION_PRELUDE};
use crate::options::{AttentionOptions, KernelChoice};
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

const SOURCE: &str = include_str!("../shaders/flash_backward.wgsl");

const fn backward_kernel(entry: &'static str, slots: &'static [Slot]) -> Kernel {
    Kernel {
        file: "flash_backward.wgsl",
        source: SOURCE,
        entry,
        slots,
        preludes: ATTENTION_PRELUDE,
        variant: "",
    }
}

/// `D_i = dO_i · O_i`.
pub const DELTA: Kernel = backward_kernel("bwd_delta", &[Slot::Params, Slot::Scores, Slot::DOut, Slot::ForwardOut]);
/// dQ: one query row per invocation.
pub const DQ: Kernel = backward_kernel(
    "bwd_dq",
    &[
        Slot::Params,
        Slot::Q,
        Slot::K,
        Slot::V,
        Slot::Mask,
        Slot::SideWords,
        Slot::Scores,
        Slot::Lse,
        Slot::DOut,
        Slot::DQ,
    ],
);
/// dK and dV: one key per invocation.
pub const DKDV: Kernel = backward_kernel(
    "bwd_dkdv",
    &[
        Slot::Params,
        Slot::Q,
        Slot::K,
        Slot::V,
        Slot::Mask,
        Slot::SideWords,
        Slot::Scores,
        Slot::Lse,
        Slot::DOut,
        Slot::DK,
        Slot::DV,
    ],
);

/// Rows (or keys) per workgroup of the dQ and dK/dV passes.
const ROWS: u32 = 32;

/// The gradients of `sdpa(q, k, v, options)` given its output `out`, its log-sum-exp
/// `lse` (`[B, Hq, Lq, 1]` f32, as `need_lse` returns it) and the output's gradient
/// `d_out` (`out`'s shape, layout and dtype). Every option with a gradient meaning is
/// honoured: scale, causal in both alignments, key lengths, bool and additive masks
/// (which get no gradient), window, ALiBi, soft cap, GQA. Waits for nothing: the
/// gradients are ready once the queue has run.
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
    let bind = |slots: &[Slot]| -> Vec<(u32, &wgpu::Buffer)> {
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
                    _ => q.buffer(), // Params: replaced below
                };
                (slot as u32, buffer)
            })
            .collect()
    };
    let rows_groups = |n: usize| groups_for(n, ROWS as usize);
    let heads = s.batch_heads() as u32;
    let kv_heads = (s.batch * s.heads_kv) as u32;

    // D = rowsum(dO ∘ O).
    let params = crate::attention::uniform(ctx, "backward params", &base)?;
    let delta_pipeline = pipeline(ctx, &DELTA, dtype, &[])?;
    let mut entries = bind(DELTA.slots);
    entries[0].1 = &params;
    dispatch(
        ctx,
        encoder,
        &delta_pipeline,
        &entries,
        [groups_for(s.len_q, 64), heads, 1],
    )?;

    // dQ, over key ranges that fit the loop cap.
    let dq_pipeline = pipeline(ctx, &DQ, dtype, &[("ROWS", ROWS)])?;
    let per_key_range = range_per_dispatch(ctx, s.len_k, |keys| loop_budget::backward_dq_iterations(&s, keys))?;
    for begin in (0..s.len_k.max(1)).step_by(per_key_range) {
        let range = crate::kernels::AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_key_range).min(s.len_k) as u32,
            ..base
        };
        let params = crate::attention::uniform(ctx, "backward dq params", &range)?;
        let mut entries = bind(DQ.slots);
        entries[0].1 = &params;
        dispatch(ctx, encoder, &dq_pipeline, &entries, [rows_groups(s.len_q), heads, 1])?;
    }

    // dK and dV, over query-row ranges that fit the loop cap (the row range travels in
    // key_begin / key_stop: the WGSL says so).
    let dkdv_pipeline = pipeline(ctx, &DKDV, dtype, &[("ROWS", ROWS)])?;
    let per_row_range = range_per_dispatch(ctx, s.len_q, |rows| loop_budget::backward_dkdv_iterations(&s, rows))?;
    for begin in (0..s.len_q).step_by(per_row_range) {
        let range = crate::kernels::AttentionParams {
            key_begin: begin as u32,
            key_stop: (begin + per_row_range).min(s.len_q) as u32,
            ..base
        };
        let params = crate::attention::uniform(ctx, "backward dk/dv params", &range)?;
        let mut entries = bind(DKDV.slots);
        entries[0].1 = &params;
        dispatch(
            ctx,
            encoder,
            &dkdv_pipeline,
            &entries,
            [rows_groups(s.len_k), kv_heads, 1],
        )?;
    }
    Ok(grads)
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
