//! `shaders/mean_heads.wgsl`: attention weights averaged over heads.

use super::{dispatch, groups_for, pipeline, Kernel};
use crate::context::Context;
use crate::error::Result;
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};

pub const KERNEL: Kernel = Kernel {
    file: "mean_heads.wgsl",
    source: include_str!("../../shaders/mean_heads.wgsl"),
    entry: "mean_heads",
    slots: &[],
    preludes: &[],
    variant: "",
};

/// Mirror of WGSL `MeanParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MeanParams {
    pub heads: u32,
    pub plane: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// Records `averaged[b, i] = mean_h per_head[b, h, i]` for f32 `[batch, heads, plane]`.
pub fn encode_mean_heads(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    per_head: &wgpu::Buffer,
    averaged: &wgpu::Buffer,
    [batch, heads, plane]: [usize; 3],
) -> Result<()> {
    let pipeline = pipeline(ctx, &KERNEL, DType::F32, &[])?;
    let params = MeanParams {
        heads: heads as u32,
        plane: plane as u32,
        ..Default::default()
    };
    let params = ctx.create_buffer_init(
        "mean heads params",
        bytemuck::bytes_of(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let max = ctx.capabilities().max_workgroups_per_dim;
    let groups = [groups_for(plane, 64).min(max), batch as u32, 1];
    ctx.scoped("recording a head average", || {
        dispatch(
            ctx,
            encoder,
            &pipeline,
            &[(0, &params), (1, per_head), (2, averaged)],
            groups,
        )
    })
}
