//! The roofline probe: what the adapter achieves on a plain GEMM (GFLOP/s, with this
//! crate's linear-layer kernel and the adapter's tiling; f32, and f16 where the adapter
//! has it, on tensor cores where it has those) and on a device-to-device copy (GB/s),
//! measured in the same process as the attention rows they are compared with.

use super::{gflops, time_gpu, Timing};
use crate::check::Rng;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::matmul::{encode_linear, Linear, LinearTiling};
use crate::kernels::pack_rows::{PackedRows, RowSource};
use crate::options::Precision;
use crate::tensor::{tensor_usage, DType};

/// Both halves of the probe.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Size n of the n x n x n GEMM.
    pub gemm_n: usize,
    pub gemm_tiling: &'static str,
    pub gemm: Timing,
    pub gemm_gflops: f64,
    /// The same GEMM in f16 (its tiling, timing and GFLOP/s), where the adapter has f16.
    pub gemm_f16: Option<(&'static str, Timing, f64)>,
    /// Bytes copied (read once and written once).
    pub copy_bytes: u64,
    /// The faster of the two copies below: the ceiling `%copy` is measured against.
    pub copy: Timing,
    /// Read + write bytes per second, in GB/s, of `copy`.
    pub copy_gbps: f64,
    /// The copy by a kernel (`kernels::copy_probe`: 16-byte loads and stores over a
    /// grid that fills the GPU), and by the driver (`copy_buffer_to_buffer`), GB/s.
    pub copy_kernel_gbps: f64,
    pub copy_driver_gbps: f64,
}

impl Probe {
    /// Measures both halves; `copy_mib` of `None` copies [`default_copy_bytes`].
    pub fn measure(ctx: &Context, gemm_n: usize, copy_mib: Option<u64>, reps: usize) -> Result<Probe> {
        let (gemm, flops) = time_matmul(ctx, gemm_n, DType::F32, reps)?;
        let gemm_f16 = if ctx.capabilities().f16 {
            let (timing, flops) = time_matmul(ctx, gemm_n, DType::F16, reps)?;
            let tiling = match ctx.linear_tiling_for(DType::F16, Precision::Highest) {
                // The probe's 8192 (or any n >= 16 in sixteens) is what the direct
                // design serves.
                LinearTiling::Coop if ctx.policy().coop_gemm_direct && gemm_n.is_multiple_of(16) => "coop-direct",
                other => other.name(),
            };
            Some((tiling, timing.clone(), gflops(flops, timing.median)))
        } else {
            None
        };
        let copy_bytes = copy_mib.map_or_else(
            || default_copy_bytes(ctx),
            |mib| within_limits(ctx, mib.saturating_mul(1 << 20)),
        );
        let (by_kernel, by_driver) = time_copy(ctx, copy_bytes, reps)?;
        let gbps = |t: &Timing| 2.0 * copy_bytes as f64 / t.median.as_secs_f64() / 1e9;
        let (copy_kernel_gbps, copy_driver_gbps) = (gbps(&by_kernel), gbps(&by_driver));
        let copy = if by_kernel.median <= by_driver.median {
            by_kernel
        } else {
            by_driver
        };
        Ok(Probe {
            gemm_n,
            gemm_tiling: ctx.linear_tiling().name(),
            gemm_gflops: gflops(flops, gemm.median),
            gemm,
            gemm_f16,
            copy_bytes,
            copy_gbps: copy_kernel_gbps.max(copy_driver_gbps),
            copy,
            copy_kernel_gbps,
            copy_driver_gbps,
        })
    }
}

impl Probe {
    /// The GEMM's GFLOP/s in `dtype` (f32 where the f16 probe did not run).
    pub fn gemm_gflops_for(&self, dtype: DType) -> f64 {
        match (dtype, &self.gemm_f16) {
            (DType::F16, Some((_, _, gflops))) => *gflops,
            _ => self.gemm_gflops,
        }
    }
}

/// Times the linear-layer GEMM on `n x n x n` in `dtype` with the adapter's tiling for
/// it (tensor cores for f16 where the adapter has them); returns the timing and its
/// FLOP count. With the texture tiling the timing includes packing X.
pub fn time_matmul(ctx: &Context, n: usize, dtype: DType, reps: usize) -> Result<(Timing, f64)> {
    let mut rng = Rng::new(2);
    let mut make = |label: &str| {
        let values = rng.vec(n * n, -1.0, 1.0);
        let bytes = match dtype {
            DType::F32 => bytemuck::cast_slice(&values).to_vec(),
            DType::F16 => {
                let halves: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
                bytemuck::cast_slice(&halves).to_vec()
            }
        };
        ctx.create_buffer_init(label, &bytes, tensor_usage())
    };
    let x = make("probe X")?;
    let w = make("probe W")?;
    let y = ctx.create_buffer("probe Y", (dtype.size() * n * n) as u64, tensor_usage())?;
    let tiling = ctx.linear_tiling_for(dtype, Precision::Highest);
    // W is packed once, like a layer's weights; X is packed inside every timed call.
    let w_packed = match tiling {
        LinearTiling::Texture => Some(PackedRows::upload(ctx, dtype, &RowSource::dense(&w, n, n))?),
        LinearTiling::Tiled | LinearTiling::Blocked | LinearTiling::Coop => None,
    };
    let linear = Linear {
        x: &x,
        x_stride: n,
        w: &w,
        w_packed: w_packed.as_ref(),
        bias: None,
        w_row0: 0,
        outputs: &[(&y, n)],
        m: n,
        k: n,
    };
    let timing = time_gpu(ctx, reps, |encoder| {
        encode_linear(ctx, ctx.policy(), encoder, dtype, tiling, &linear)
    })?;
    Ok((timing, 2.0 * (n as f64).powi(3)))
}

/// The copy probe's size: 1 GiB on GPUs (a small copy measures launch latency and the
/// L2 cache: 64 MiB read 819 GB/s on an H200 whose memory moves 4.2 TB/s), 256 MiB on
/// CPU adapters (host memory, well past their caches), within the device's buffer and
/// binding limits, in whole 16-byte words.
pub fn default_copy_bytes(ctx: &Context) -> u64 {
    within_limits(ctx, if ctx.is_cpu_adapter() { 256 << 20 } else { 1 << 30 })
}

/// `bytes`, cut to what one buffer and one storage binding may hold, in whole words.
fn within_limits(ctx: &Context, bytes: u64) -> u64 {
    let caps = ctx.capabilities();
    (bytes.min(caps.max_buffer).min(caps.max_storage_binding) / 16 * 16).max(16)
}

/// Times a device-to-device copy of `bytes` by the copy kernel and by the driver
/// (`copy_buffer_to_buffer`), in that order.
pub fn time_copy(ctx: &Context, bytes: u64, reps: usize) -> Result<(Timing, Timing)> {
    let bytes = bytes / 16 * 16;
    let src = ctx.create_buffer("probe copy source", bytes, tensor_usage())?;
    let dst = ctx.create_buffer("probe copy destination", bytes, tensor_usage())?;
    let by_kernel = time_gpu(ctx, reps, |encoder| {
        crate::kernels::copy_probe::encode_copy(ctx, encoder, &src, &dst, bytes)
    })?;
    let by_driver = time_gpu(ctx, reps, |encoder| {
        encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
        Ok(())
    })?;
    Ok((by_kernel, by_driver))
}
