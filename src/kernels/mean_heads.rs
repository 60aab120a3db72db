//! `shaders/mean_heads.wgsl`: attention weights averaged over heads, accumulated one
//! chunk of per-head weights at a time (the attention plan's score chunks), so the
//! per-head weights `[B, H, Lq, Lk]` are never held whole.

use super::{dispatch, groups_for, pipeline, Kernel};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};

pub const KERNEL: Kernel = Kernel {
    file: "mean_heads.wgsl",
    source: Text::Static(include_str!("../../shaders/mean_heads.wgsl")),
    entry: "accumulate_heads",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Mirror of WGSL `MeanParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MeanParams {
    pub heads: u32,
    pub plane: u32,
    pub bh_start: u32,
    pub bh_count: u32,
}

/// Records the addition of `chunk` (f32 per-head weights, planes `bh_start ..
/// bh_start + bh_count` of the flattened `[batch, heads]` axis, `plane` elements each)
/// to `averaged` (`[batch, plane]`): a batch element's first head starts its sum, its
/// last divides it by `heads`. Chunks must come in order and cover every head.
pub fn encode_accumulate_heads(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    chunk: &wgpu::Buffer,
    averaged: &wgpu::Buffer,
    [heads, plane]: [usize; 2],
    (bh_start, bh_count): (usize, usize),
) -> Result<()> {
    let pipeline = pipeline(ctx, &KERNEL, DType::F32, &[])?;
    let params = MeanParams {
        heads: heads as u32,
        plane: plane as u32,
        bh_start: bh_start as u32,
        bh_count: bh_count as u32,
    };
    let params = ctx.create_buffer_init(
        "head average params",
        bytemuck::bytes_of(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let max = ctx.capabilities().max_workgroups_per_dim;
    let batches = (bh_start + bh_count).div_ceil(heads) - bh_start / heads;
    let groups = [groups_for(plane, 64).min(max), batches as u32, 1];
    ctx.scoped("recording a head average", || {
        dispatch(
            ctx,
            encoder,
            &pipeline,
            &[(0, &params), (1, chunk), (2, averaged)],
            groups,
        )
    })
}

/// The head-averaging kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
