//! `shaders/copy_probe.wgsl`: the bandwidth probe's copy, 16 bytes a load and a store
//! over a grid large enough to fill a GPU (`crate::bench::probe`).

use super::{dispatch, pipeline, Kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;

pub const KERNEL: Kernel = Kernel {
    file: "copy_probe.wgsl",
    source: Text::Static(include_str!("../../shaders/copy_probe.wgsl")),
    entry: "copy_words",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Invocations a workgroup (the WGSL's workgroup size).
const LANES: u64 = 256;
/// 16-byte words each invocation copies, about: enough steps that each keeps several
/// loads in flight, few enough that the grid fills any GPU.
const WORDS_PER_INVOCATION: u64 = 4;

/// Records a copy of the first `bytes` (a multiple of 16) of `src` to `dst`.
pub fn encode_copy(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    bytes: u64,
) -> Result<()> {
    let words = bytes / 16;
    if !bytes.is_multiple_of(16) || words > u64::from(u32::MAX) {
        return Err(Error::invalid(
            "copy probe",
            format!("{bytes} bytes: a multiple of 16 below 64 GiB"),
        ));
    }
    let pipeline = pipeline(ctx, &KERNEL, DType::F32, &[])?;
    let params = ctx.create_buffer_init(
        "copy probe params",
        bytemuck::bytes_of(&[words as u32, 0, 0, 0]),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let max = u64::from(ctx.capabilities().max_workgroups_per_dim);
    let groups = words.div_ceil(LANES * WORDS_PER_INVOCATION).max(1);
    let x = groups.min(max);
    let y = groups.div_ceil(x).min(max);
    ctx.scoped("recording the copy probe", || {
        dispatch(
            ctx,
            encoder,
            &pipeline,
            &[(0, &params), (1, src), (2, dst)],
            [x as u32, y as u32, 1],
        )
    })
}

/// The copy probe's kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
