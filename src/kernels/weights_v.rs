//! `shaders/weights_v.wgsl`: output = probabilities x V for a chunk of (batch, head) pairs.

use super::{dispatch_entries, groups_for, pipeline, AttentionBindings, AttentionParams, Kernel, Slot};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;

pub const KERNEL: Kernel = Kernel {
    file: "weights_v.wgsl",
    source: Text::Static(include_str!("../../shaders/weights_v.wgsl")),
    entry: "main",
    slots: &[Slot::Params, Slot::V, Slot::Output, Slot::SideWords, Slot::Scores],
    preludes: super::ATTENTION_PRELUDE,
    variant: Text::Static(""),
};

/// Rows and value columns covered by one workgroup (8x8 invocations of 4x4 blocks).
pub const TILE: usize = 32;

pub(crate) fn encode(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<()> {
    let pipeline = pipeline(ctx, &KERNEL, dtype, &[])?;
    let groups = [
        groups_for(params.head_dim_v as usize, TILE),
        groups_for(params.len_q as usize, TILE),
        params.bh_count,
    ];
    dispatch_entries(ctx, encoder, &pipeline, &bindings.select(KERNEL.slots)?, groups)
}

/// The materialized path's weights-times-V kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
