//! `shaders/softmax_rows.wgsl`: row softmax of the score chunk in place, plus the
//! log-sum-exp of each row.

use super::{dispatch_entries, groups_for, pipeline, AttentionBindings, AttentionParams, Kernel, Slot};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;

pub const KERNEL: Kernel = Kernel {
    file: "softmax_rows.wgsl",
    source: Text::Static(include_str!("../../shaders/softmax_rows.wgsl")),
    entry: "main",
    slots: &[Slot::Params, Slot::SideWords, Slot::Scores, Slot::Lse],
    preludes: super::ATTENTION_PRELUDE,
    variant: Text::Static(""),
};

const ROWS_PER_GROUP: usize = 64;

pub(crate) fn encode(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<()> {
    let pipeline = pipeline(ctx, &KERNEL, dtype, &[])?;
    let rows = params.bh_count as usize * params.len_q as usize;
    let total = groups_for(rows, ROWS_PER_GROUP);
    // The shader linearises a 2-D grid, so more than 65535 row groups still fit.
    let x = total.min(ctx.capabilities().max_workgroups_per_dim).max(1);
    let y = total.div_ceil(x);
    dispatch_entries(ctx, encoder, &pipeline, &bindings.select(KERNEL.slots)?, [x, y, 1])
}

/// The materialized path's softmax kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
