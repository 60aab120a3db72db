//! `shaders/layer_norm_backward.wgsl`: the backward pass of `LayerNorm(x + residual)`
//! (the multi-head layer's post-norm): the gradient of `x + residual`, and of the
//! scale and shift summed over rows.

use super::{dispatch, groups_for, loop_budget, pipeline, Kernel};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::{tensor_usage, DType};
use bytemuck::{Pod, Zeroable};

const SOURCE: &str = include_str!("../../shaders/layer_norm_backward.wgsl");

/// One invocation per row: statistics and the gradient of `x + residual`.
pub const ROWS: Kernel = Kernel {
    file: "layer_norm_backward.wgsl",
    source: Text::Static(SOURCE),
    entry: "layer_norm_backward_rows",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// One invocation per column: the gradients of gamma and beta.
pub const COLUMNS: Kernel = Kernel {
    entry: "layer_norm_backward_columns",
    ..ROWS
};

/// Mirror of WGSL `NormBackwardParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct NormBackwardParams {
    pub rows: u32,
    pub width: u32,
    pub eps: f32,
    pub accumulate: u32,
    pub row_begin: u32,
    pub row_end: u32,
    pub pad0: u32,
    pub pad1: u32,
}

/// One LayerNorm backward pass over `rows` rows of `width`. `x`, `residual`, `gamma`
/// and `d_out` are of the layer's dtype, as the forward read them.
pub struct LayerNormBackward<'a> {
    pub x: &'a wgpu::Buffer,
    pub residual: &'a wgpu::Buffer,
    pub gamma: &'a wgpu::Buffer,
    pub d_out: &'a wgpu::Buffer,
    /// The gradient of `x + residual` in the layer's dtype, `[rows, width]`.
    pub d_sum: &'a wgpu::Buffer,
    /// The same in f32.
    pub d_sum_f32: &'a wgpu::Buffer,
    /// f32 `[width]` each.
    pub d_gamma: &'a wgpu::Buffer,
    pub d_beta: &'a wgpu::Buffer,
    pub rows: usize,
    pub width: usize,
    pub eps: f32,
}

/// Records the row pass, then the column pass split into row ranges that fit the loop
/// cap. The caller has checked the buffer sizes.
pub fn encode_layer_norm_backward(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    norm: &LayerNormBackward,
) -> Result<()> {
    loop_budget::check(
        ctx,
        || format!("a layer norm backward over rows of {}", norm.width),
        loop_budget::layer_norm_backward_row_iterations(norm.width),
    )?;
    let stats = ctx.create_buffer(
        "layer norm backward statistics",
        (8 * norm.rows).max(4) as u64,
        tensor_usage(),
    )?;
    let base = NormBackwardParams {
        rows: norm.rows as u32,
        width: norm.width as u32,
        eps: norm.eps,
        ..Default::default()
    };
    let uniform = |params: &NormBackwardParams| {
        ctx.create_buffer_init(
            "layer norm backward params",
            bytemuck::bytes_of(params),
            wgpu::BufferUsages::UNIFORM,
        )
    };
    let params = uniform(&base)?;
    let rows_pipeline = pipeline(ctx, &ROWS, dtype, &[])?;
    let bindings = [
        (0, &params),
        (1, norm.x),
        (2, norm.residual),
        (3, norm.gamma),
        (4, norm.d_out),
        (5, &stats),
        (6, norm.d_sum),
        (7, norm.d_sum_f32),
    ];
    ctx.scoped("recording a layer norm backward", || {
        dispatch(
            ctx,
            encoder,
            &rows_pipeline,
            &bindings,
            [groups_for(norm.rows, 64), 1, 1],
        )
    })?;

    let per = match ctx.loop_cap() {
        // Iterations grow by one per row.
        Some(cap) => (cap.saturating_sub(loop_budget::layer_norm_backward_column_iterations(0)) as usize).max(1),
        None => norm.rows.max(1),
    };
    let columns_pipeline = pipeline(ctx, &COLUMNS, dtype, &[])?;
    for begin in (0..norm.rows).step_by(per) {
        let params = uniform(&NormBackwardParams {
            row_begin: begin as u32,
            row_end: (begin + per).min(norm.rows) as u32,
            accumulate: u32::from(begin > 0),
            ..base
        })?;
        let bindings = [
            (0, &params),
            (1, norm.x),
            (2, norm.residual),
            (4, norm.d_out),
            (5, &stats),
            (8, norm.d_gamma),
            (9, norm.d_beta),
        ];
        ctx.scoped("recording a layer norm backward", || {
            dispatch(
                ctx,
                encoder,
                &columns_pipeline,
                &bindings,
                [groups_for(norm.width, 64), 1, 1],
            )
        })?;
    }
    Ok(())
}

/// The layer norm backward's kernels (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![ROWS, COLUMNS]
}
