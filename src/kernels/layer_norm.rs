//! `shaders/layer_norm.wgsl`: `LayerNorm(x + residual)` over the last dimension (the
//! post-norm of multi-head attention).

use super::{dispatch, groups_for, loop_budget, pipeline, Kernel};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};

pub const KERNEL: Kernel = Kernel {
    file: "layer_norm.wgsl",
    source: Text::Static(include_str!("../../shaders/layer_norm.wgsl")),
    entry: "layer_norm",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Mirror of WGSL `NormParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct NormParams {
    pub rows: u32,
    pub width: u32,
    pub eps: f32,
    pub has_residual: u32,
}

/// One LayerNorm application over `rows` rows of `width` elements, all of `dtype`.
pub struct LayerNorm<'a> {
    pub x: &'a wgpu::Buffer,
    /// Added to `x` before normalising.
    pub residual: Option<&'a wgpu::Buffer>,
    /// `[width]` scale and shift.
    pub gamma: &'a wgpu::Buffer,
    pub beta: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub rows: usize,
    pub width: usize,
    pub eps: f32,
}

/// Records one LayerNorm dispatch. The caller has checked the buffer sizes.
pub fn encode_layer_norm(ctx: &Gpu, encoder: &mut wgpu::CommandEncoder, dtype: DType, norm: &LayerNorm) -> Result<()> {
    loop_budget::check(
        ctx,
        || format!("a layer norm over rows of {}", norm.width),
        loop_budget::layer_norm_iterations(norm.width),
    )?;
    let pipeline = pipeline(ctx, &KERNEL, dtype, &[])?;
    let params = NormParams {
        rows: norm.rows as u32,
        width: norm.width as u32,
        eps: norm.eps,
        has_residual: norm.residual.is_some().into(),
    };
    let params = ctx.create_buffer_init(
        "layer norm params",
        bytemuck::bytes_of(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let bindings = [
        (0, &params),
        (1, norm.x),
        (2, norm.residual.unwrap_or(norm.x)),
        (3, norm.gamma),
        (4, norm.beta),
        (5, norm.out),
    ];
    ctx.scoped("recording a layer norm", || {
        dispatch(ctx, encoder, &pipeline, &bindings, [groups_for(norm.rows, 64), 1, 1])
    })
}

/// The layer norm's kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
