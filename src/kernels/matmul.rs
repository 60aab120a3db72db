//! `shaders/matmul.wgsl`: a plain f32 matrix multiply, used as the roofline probe of the
//! benchmark (the best plain GEMM shape for the adapter, measured in the same run).

use super::{groups_for, pipeline, Kernel};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};
use wgpu::util::DeviceExt;

pub const KERNEL: Kernel = Kernel {
    file: "matmul.wgsl",
    source: include_str!("../../shaders/matmul.wgsl"),
    entry: "main",
    slots: &[],
    preludes: &[],
};

/// Mirror of WGSL `MatmulParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct MatmulParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub pad: u32,
}

/// Records `c = a · b` for row-major f32 buffers (`m x k` times `k x n`); `k` and `n`
/// must be multiples of 4 (`n` of 8).
#[allow(clippy::too_many_arguments)]
pub fn encode_matmul(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    c: &wgpu::Buffer,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    if m == 0 || n == 0 || k == 0 || !n.is_multiple_of(8) || !k.is_multiple_of(4) {
        return Err(Error::unsupported(
            "matmul sizes",
            format!("m={m} n={n} k={k}"),
            "n a multiple of 8, k of 4, all >= 1",
        ));
    }
    let pipeline = pipeline(ctx, &KERNEL, DType::F32, &[])?;
    let params = MatmulParams {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        pad: 0,
    };
    let params = ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("matmul params"),
        contents: bytemuck::bytes_of(&params),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let bindings = [(0, &params), (1, a), (2, b), (3, c)];
    super::dispatch(
        ctx,
        encoder,
        &pipeline,
        &bindings,
        [groups_for(n / 8, 8), groups_for(m, 64), 1],
    );
    Ok(())
}
