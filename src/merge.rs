//! Merging partial attentions by their log-sum-exp (docs/design.md, "Merging partial
//! attentions"; `shaders/merge_attentions.wgsl`): the outputs and lses of attention
//! over disjoint partitions of the keys give the attention over all of them, as
//! xformers' `merge_attentions` and flash-attn's combine do. The building block of
//! splitting a sequence over devices or processes.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::merge::{FOLD, STORE};
use crate::kernels::{dispatch, groups_for, loop_budget, pipeline};
use crate::tensor::{tensor_usage, DType, Layout, Tensor};
use bytemuck::{Pod, Zeroable};

/// Mirror of WGSL `MergeParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MergeParams {
    /// B · Hq · Lq.
    pub rows: u32,
    /// Hq.
    pub heads: u32,
    /// Lq.
    pub len_q: u32,
    /// Dv.
    pub dv: u32,
    /// Element stride of the batch axis of the partial folded in (or the output).
    pub stride_b: u32,
    /// Of its head axis.
    pub stride_h: u32,
    /// Of its row axis.
    pub stride_s: u32,
    /// 1 for the first partial: it sets the running state.
    pub first: u32,
}

/// The merged attention.
#[derive(Debug)]
pub struct Merged {
    /// `[B, Hq, Lq, Dv]` in the first partial's layout and dtype.
    pub out: Tensor,
    /// `[B, Hq, Lq, 1]` f32 BHSD: `log Σ exp(lse_n)`, -inf where no partition saw a key.
    pub lse: Tensor,
}

/// Merges partial attentions: `outputs[n]` (`[B, Hq, Lq, Dv]`, any layout, one dtype)
/// is attention over the n-th partition of the keys and `lses[n]` (`[B, Hq, Lq, 1]` f32
/// BHSD, as `need_lse` returns it) its log-sum-exp. Returns
/// `lse = log Σ_n exp(lse_n)` and `out = Σ_n exp(lse_n − lse) · out_n`, with f32
/// arithmetic; partitions where a row saw no key (lse −inf) add nothing, and a row no
/// partition saw gets zeros and −inf. Waits for nothing.
pub fn merge_attentions(ctx: &Context, outputs: &[&Tensor], lses: &[&Tensor]) -> Result<Merged> {
    ctx.record_and_submit("submitting an attention merge", |encoder| {
        encode_merge_attentions(ctx, encoder, outputs, lses)
    })
}

/// [`merge_attentions`] with its GPU errors awaited rather than blocked on (the web).
pub async fn merge_attentions_async(ctx: &Context, outputs: &[&Tensor], lses: &[&Tensor]) -> Result<Merged> {
    ctx.scoped_async("attention merge", || merge_attentions(ctx, outputs, lses))
        .await
}

/// Like [`merge_attentions`], recording into the caller's encoder.
pub fn encode_merge_attentions(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    outputs: &[&Tensor],
    lses: &[&Tensor],
) -> Result<Merged> {
    let first = check_partials(ctx, outputs, lses)?;
    let [b, h, lq, dv] = first.shape();
    let rows = b * h * lq;
    loop_budget::check(ctx, || format!("merging attention rows of {dv} values"), dv as u64 + 2)?;
    let too_big = |what: &str| Error::LimitExceeded {
        what: what.into(),
        limit: "u32 indices",
        unit: "elements",
        requested: (rows * dv) as u64,
        max: u32::MAX.into(),
    };
    let rows_u32 = u32::try_from(rows).map_err(|_| too_big("merged rows"))?;
    u32::try_from(rows * dv).map_err(|_| too_big("a merged output"))?;
    let merged = Merged {
        out: Tensor::empty(ctx, first.shape(), first.layout(), first.dtype())?,
        lse: Tensor::empty(ctx, [b, h, lq, 1], Layout::Bhsd, DType::F32)?,
    };
    let acc = ctx.create_buffer("attention merge state", (4 * rows * dv).max(4) as u64, tensor_usage())?;
    let dtype = first.dtype();
    let params_for = |t: &Tensor, first: bool| {
        let [sb, sh, ss, _] = t.strides();
        MergeParams {
            rows: rows_u32,
            heads: h as u32,
            len_q: lq as u32,
            dv: dv as u32,
            stride_b: sb as u32,
            stride_h: sh as u32,
            stride_s: ss as u32,
            first: u32::from(first),
        }
    };
    let groups = [groups_for(rows, 64), 1, 1];
    let fold = pipeline(ctx, &FOLD, dtype, &[])?;
    for (n, (out, lse)) in outputs.iter().zip(lses).enumerate() {
        let params = uniform(ctx, &params_for(out, n == 0))?;
        let bindings = [
            (0, &params),
            (1, &acc),
            (2, merged.lse.buffer()),
            (3, out.buffer()),
            (4, lse.buffer()),
        ];
        dispatch(ctx, encoder, &fold, &bindings, groups)?;
    }
    let store = pipeline(ctx, &STORE, dtype, &[])?;
    let params = uniform(ctx, &params_for(&merged.out, false))?;
    let bindings = [(0, &params), (1, &acc), (5, merged.out.buffer())];
    dispatch(ctx, encoder, &store, &bindings, groups)?;
    Ok(merged)
}

fn uniform(ctx: &Context, params: &MergeParams) -> Result<wgpu::Buffer> {
    ctx.create_buffer_init("merge params", bytemuck::bytes_of(params), wgpu::BufferUsages::UNIFORM)
}

/// Checks the partials (at least one; outputs of one shape and dtype; lses of their
/// rows, f32 BHSD; all of this context) and returns the first output.
fn check_partials<'a>(ctx: &Context, outputs: &[&'a Tensor], lses: &[&Tensor]) -> Result<&'a Tensor> {
    let Some(&first) = outputs.first() else {
        return Err(Error::invalid("merge_attentions", "no partial outputs"));
    };
    if outputs.len() != lses.len() {
        return Err(Error::invalid(
            "merge_attentions",
            format!("{} outputs but {} lses", outputs.len(), lses.len()),
        ));
    }
    let [b, h, lq, dv] = first.shape();
    if dv == 0 || b * h * lq == 0 {
        return Err(Error::shape(
            "partial outputs of merge_attentions",
            "[B, Hq, Lq, Dv] with every size at least 1",
            format!("{:?}", first.shape()),
        ));
    }
    for (n, (out, lse)) in outputs.iter().zip(lses).enumerate() {
        out.check_context(ctx, &format!("outputs[{n}]"))?;
        lse.check_context(ctx, &format!("lses[{n}]"))?;
        if out.shape() != first.shape() || out.dtype() != first.dtype() {
            return Err(Error::shape(
                format!("outputs[{n}] of merge_attentions"),
                format!("{:?} {} (as outputs[0])", first.shape(), first.dtype().name()),
                format!("{:?} {}", out.shape(), out.dtype().name()),
            ));
        }
        if lse.shape() != [b, h, lq, 1] || lse.dtype() != DType::F32 || lse.layout() != Layout::Bhsd {
            return Err(Error::shape(
                format!("lses[{n}] of merge_attentions"),
                format!("{:?} f32 BHSD (need_lse's)", [b, h, lq, 1]),
                format!("{:?} {} {:?}", lse.shape(), lse.dtype().name(), lse.layout()),
            ));
        }
    }
    Ok(first)
}
