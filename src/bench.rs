//! Measuring kernels: wall-clock timing of submit-and-wait after warm-up, with the first
//! call (pipeline compilation included) reported separately. Used by the `bench`
//! command and the criterion benches.

use crate::attention::encode_sdpa;
use crate::check::Rng;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::matmul::{encode_linear, Linear};
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::tensor::{tensor_usage, DType, Layout, Tensor};
use std::time::{Duration, Instant};

/// Timings of one benchmark row.
#[derive(Clone, Debug)]
pub struct Timing {
    /// The first call, including pipeline compilation.
    pub first: Duration,
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
    pub reps: usize,
}

fn summarise(first: Duration, mut samples: Vec<Duration>) -> Timing {
    samples.sort();
    Timing {
        first,
        median: samples[samples.len() / 2],
        min: samples[0],
        max: samples[samples.len() - 1],
        reps: samples.len(),
    }
}

/// Times `record` (which records GPU work) submitted and waited for, `reps` times after
/// one untimed warm-up beyond the first call.
pub fn time_gpu(
    ctx: &Context,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<Timing> {
    let mut run = || -> Result<Duration> {
        ctx.scoped("timing GPU work", || {
            let start = Instant::now();
            let mut encoder = ctx.device().create_command_encoder(&Default::default());
            record(&mut encoder)?;
            ctx.queue().submit([encoder.finish()]);
            ctx.wait_idle()?;
            Ok(start.elapsed())
        })
    };
    let first = run()?;
    run()?;
    let samples = (0..reps.max(1)).map(|_| run()).collect::<Result<Vec<_>>>()?;
    Ok(summarise(first, samples))
}

/// Random q, k, v for a benchmark shape (BHSD).
pub fn bench_inputs(ctx: &Context, shape: &AttentionShape, dtype: DType) -> Result<[Tensor; 3]> {
    let mut rng = Rng::new(1);
    let mut make = |h: usize, l: usize, d: usize| {
        let data = rng.vec(shape.batch * h * l * d, -1.0, 1.0);
        Tensor::from_f32_as(ctx, [shape.batch, h, l, d], Layout::Bhsd, dtype, &data)
    };
    Ok([
        make(shape.heads_q, shape.len_q, shape.head_dim)?,
        make(shape.heads_kv, shape.len_k, shape.head_dim)?,
        make(shape.heads_kv, shape.len_k, shape.head_dim_v)?,
    ])
}

/// Times one attention configuration on the GPU.
pub fn time_attention(
    ctx: &Context,
    shape: &AttentionShape,
    options: &AttentionOptions,
    dtype: DType,
    reps: usize,
) -> Result<Timing> {
    let [q, k, v] = bench_inputs(ctx, shape, dtype)?;
    time_gpu(ctx, reps, |encoder| {
        encode_sdpa(ctx, encoder, &q, &k, &v, options).map(|_| ())
    })
}

/// Times the roofline probe, the linear-layer GEMM on `n x n x n` (f32, the adapter's
/// tiling); returns the timing and its FLOP count.
pub fn time_matmul(ctx: &Context, n: usize, reps: usize) -> Result<(Timing, f64)> {
    let mut rng = Rng::new(2);
    let make = |data: &[f32]| {
        ctx.create_buffer_init("matmul probe input", bytemuck::cast_slice(data), tensor_usage())
    };
    let x = make(&rng.vec(n * n, -1.0, 1.0))?;
    let w = make(&rng.vec(n * n, -1.0, 1.0))?;
    let y = ctx.create_buffer("matmul probe output", (4 * n * n) as u64, tensor_usage())?;
    let linear = Linear {
        x: &x,
        x_stride: n,
        w: &w,
        bias: None,
        outputs: &[(&y, n)],
        m: n,
        k: n,
    };
    let tiling = ctx.linear_tiling();
    let timing = time_gpu(ctx, reps, |encoder| {
        encode_linear(ctx, encoder, DType::F32, tiling, &linear)
    })?;
    Ok((timing, 2.0 * (n as f64).powi(3)))
}

/// GFLOP/s for `flops` in `t`.
pub fn gflops(flops: f64, t: Duration) -> f64 {
    flops / t.as_secs_f64() / 1e9
}
