//! Rotary position embeddings (RoPE; docs/design.md, "Rotary embeddings";
//! `shaders/rotary.wgsl`): the first `dim` elements of each head's row are rotated in
//! pairs by angles `position / scaling · theta^(−2i/dim)`, in the NeoX (`rotate_half`,
//! Hugging Face LLaMA) or GPT-J (interleaved) pairing, before attention. The host
//! computes cos and sin in f64 for the positions a call uses; the kernel only rotates.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::rotary::KERNEL;
pub use crate::kernels::rotary::{Rotary, RotaryStyle};
use crate::kernels::{dispatch, groups_for, pipeline};
use crate::tensor::Tensor;
use bytemuck::{Pod, Zeroable};

/// Mirror of WGSL `RotaryParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct RotaryParams {
    /// H.
    pub heads: u32,
    /// S.
    pub len: u32,
    /// D.
    pub head_dim: u32,
    /// Rotated elements.
    pub dim: u32,
    /// Input strides (elements) of batch, head and position.
    pub stride_b: u32,
    /// Of the head axis.
    pub stride_h: u32,
    /// Of the position axis.
    pub stride_s: u32,
    /// 1 for GPT-J pairs.
    pub interleaved: u32,
    /// Output strides of batch, head and position.
    pub out_stride_b: u32,
    /// Of the head axis.
    pub out_stride_h: u32,
    /// Of the position axis.
    pub out_stride_s: u32,
    /// First (batch, head) pair of the dispatch.
    pub bh_start: u32,
}

/// `x` (`[B, H, S, D]`, any layout and dtype) with rows rotated: row `s` of batch
/// element `b` at position `positions[b·S + s]` (positions may differ per batch
/// element, as a batch of sequences at different offsets has them). A new tensor of
/// `x`'s shape, layout and dtype. Waits for nothing.
pub fn apply_rotary(ctx: &Context, x: &Tensor, positions: &[u32], rotary: &Rotary) -> Result<Tensor> {
    ctx.record_and_submit("submitting a rotary embedding", |encoder| {
        encode_apply_rotary(ctx, encoder, x, positions, rotary)
    })
}

/// Like [`apply_rotary`], recording into the caller's encoder.
pub fn encode_apply_rotary(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    x: &Tensor,
    positions: &[u32],
    rotary: &Rotary,
) -> Result<Tensor> {
    encode_turn(ctx, encoder, x, positions, rotary, false)
}

/// The inverse rotation of [`encode_apply_rotary`] (its transpose): what carries the
/// gradient of rotated rows back to the rows before rotation.
pub(crate) fn encode_unrotate(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    x: &Tensor,
    positions: &[u32],
    rotary: &Rotary,
) -> Result<Tensor> {
    encode_turn(ctx, encoder, x, positions, rotary, true)
}

fn encode_turn(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    x: &Tensor,
    positions: &[u32],
    rotary: &Rotary,
    inverse: bool,
) -> Result<Tensor> {
    x.check_context(ctx, "x of apply_rotary")?;
    let [b, h, s, d] = x.shape();
    rotary.check(d)?;
    if positions.len() != b * s {
        return Err(Error::shape(
            "positions of apply_rotary",
            format!("{} (batch x sequence length)", b * s),
            positions.len(),
        ));
    }
    let out = Tensor::empty(ctx, x.shape(), x.layout(), x.dtype())?;
    if x.is_empty() {
        return Ok(out);
    }
    let table = ctx.create_buffer_init(
        "rotary cos and sin",
        bytemuck::cast_slice(&rotary.table_for(positions, inverse)),
        crate::tensor::tensor_usage(),
    )?;
    let [sb, sh, ss, _] = x.strides();
    let [ob, oh, os, _] = out.strides();
    let base = RotaryParams {
        heads: h as u32,
        len: s as u32,
        head_dim: d as u32,
        dim: rotary.dim as u32,
        stride_b: sb as u32,
        stride_h: sh as u32,
        stride_s: ss as u32,
        interleaved: u32::from(rotary.style == RotaryStyle::GptJ),
        out_stride_b: ob as u32,
        out_stride_h: oh as u32,
        out_stride_s: os as u32,
        bh_start: 0,
    };
    let pipeline = pipeline(ctx, &KERNEL, x.dtype(), &[])?;
    let max_pairs = ctx.capabilities().max_workgroups_per_dim.max(1) as usize;
    for start in (0..b * h).step_by(max_pairs) {
        let count = (b * h - start).min(max_pairs);
        let params = RotaryParams {
            bh_start: start as u32,
            ..base
        };
        let params = ctx.create_buffer_init(
            "rotary params",
            bytemuck::bytes_of(&params),
            wgpu::BufferUsages::UNIFORM,
        )?;
        let bindings = [(0, &params), (1, x.buffer()), (2, &table), (3, out.buffer())];
        dispatch(
            ctx,
            encoder,
            &pipeline,
            &bindings,
            [groups_for(s * d, 64), count as u32, 1],
        )?;
    }
    Ok(out)
}

/// Records `q` (`[B, Hq, Lq, D]`) rotated for attention against caches whose sequences
/// hold `lengths[b]` rows: query `i` of sequence `b` at `len[b] − Lq + i` (0 where that
/// is negative), the position a cache aligns it to (`KvCache`, `PagedKvCache`).
pub(crate) fn encode_rotate_queries(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    lengths: &[u32],
    rotary: &Rotary,
) -> Result<Tensor> {
    let lq = q.shape()[2] as u32;
    let positions: Vec<u32> = lengths
        .iter()
        .flat_map(|&len| (0..lq).map(move |i| (len + i).saturating_sub(lq)))
        .collect();
    encode_apply_rotary(ctx, encoder, q, &positions, rotary)
}

/// Records `then` on `q`, or, with a cache's `rotary`, on `q` rotated first as
/// [`encode_rotate_queries`] does (the attention step every KV cache shares).
pub(crate) fn with_cache_queries<T>(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    (q, lengths): (&Tensor, &[u32]),
    rotary: Option<&Rotary>,
    then: impl FnOnce(&mut wgpu::CommandEncoder, &Tensor) -> Result<T>,
) -> Result<T> {
    match rotary {
        Some(rotary) => {
            let rotated = encode_rotate_queries(ctx, encoder, q, lengths, rotary)?;
            then(encoder, &rotated)
        }
        None => then(encoder, q),
    }
}
