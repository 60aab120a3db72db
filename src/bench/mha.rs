//! Where a multi-head attention layer's time goes: each phase's dispatches timed on
//! their own (GPU timestamps where available), the packed Q/K/V GEMM against three
//! separate ones, and the whole layer.

use super::{clock_for, in_alternation, summarise, time_gpu, GpuTimer, PairRatios, Timing};
use crate::check::Rng;
use crate::context::Context;
use crate::error::Result;
use crate::kernels::layer_norm::{encode_layer_norm, LayerNorm};
use crate::kernels::matmul::LinearTiling;
use crate::kernels::pack_rows::{PackedRows, RowSource};
use crate::mha::{Inputs, MhaConfig, MhaOptions, MhaWeights, MultiHeadAttention, PostNorm, ProjectionPlan};
use crate::tensor::{DType, Tensor};
use crate::{encode_sdpa, AttentionOptions, Layout, Precision};
use std::time::Duration;

/// One timed phase.
#[derive(Clone, Debug)]
pub struct MhaPhase {
    pub name: &'static str,
    pub timing: Timing,
    /// Floating-point operations (multiply-adds count 2), 0 where not meaningful.
    pub flops: f64,
    /// Whether the layer runs this phase: the parts of the layer's time (the packed
    /// projection, attention, output projection, norm), not an alternative (three
    /// GEMMs), a piece of another phase, or the whole layer.
    pub part_of_layer: bool,
}

/// What [`measure_mha`] measured.
#[derive(Clone, Debug)]
pub struct MhaBench {
    pub phases: Vec<MhaPhase>,
    /// Time of the three separate Q/K/V GEMMs over the packed one, per pair of runs
    /// made back to back, sorted.
    pub separate_over_packed: PairRatios,
}

/// Times the phases of a self-attention layer with post-norm on `[batch, seq, embed]`
/// inputs with `heads` heads, in `dtype`. The packed and separate Q/K/V projections are
/// timed in alternation; each other phase on its own.
pub fn measure_mha(
    ctx: &Context,
    [batch, seq, embed, heads]: [usize; 4],
    dtype: DType,
    precision: Precision,
    reps: usize,
) -> Result<MhaBench> {
    let config = MhaConfig {
        post_norm: Some(PostNorm::default()),
        ..MhaConfig::new(embed, heads)
    };
    let weights = MhaWeights::xavier_uniform(&config, 7)?;
    let layer = MultiHeadAttention::new(ctx, config.clone(), &weights, dtype)?;
    let x = Tensor::sequence(
        ctx,
        [batch, seq, embed],
        dtype,
        &Rng::new(8).vec(batch * seq * embed, -1.0, 1.0),
    )?;
    let inputs = Inputs::SelfAttention(&x);
    let (b, s, e, h) = (batch as f64, seq as f64, embed as f64, heads as f64);
    let projection_flops = 2.0 * b * s * e * 3.0 * e;
    let attention_flops = 4.0 * b * h * s * s * (e / h);
    let output_flops = 2.0 * b * s * e * e;

    // Inputs of the later phases, computed once.
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let [q, k, v] = layer.encode_projections(ctx, &mut encoder, inputs, ProjectionPlan::Fused, precision)?;
    let attention = AttentionOptions {
        output_layout: Some(Layout::Bshd),
        precision,
        ..Default::default()
    };
    let attended = encode_sdpa(ctx, &mut encoder, &q, &k, &v, &attention)?;
    ctx.queue().submit([encoder.finish()]);
    let projected = Tensor::empty(ctx, [batch, 1, seq, embed], Layout::Bhsd, dtype)?;
    let normed = Tensor::empty(ctx, [batch, 1, seq, embed], Layout::Bhsd, dtype)?;
    let ones = Tensor::sequence(ctx, [1, 1, embed], dtype, &vec![1.0; embed])?;
    let plain = MultiHeadAttention::new(
        ctx,
        MhaConfig {
            post_norm: None,
            ..config
        },
        &MhaWeights { norm: None, ..weights },
        dtype,
    )?;

    let mut phases = Vec::new();
    let mut phase = |name: &'static str, flops, timing: Result<Timing>| -> Result<()> {
        let part_of_layer = !matches!(
            name,
            "Q, K, V projections, three GEMMs" | "  of which X into a texture, per GEMM" | "whole layer"
        );
        phases.push(MhaPhase {
            name,
            timing: timing?,
            flops,
            part_of_layer,
        });
        Ok(())
    };
    let (packed, separate, ratios) = time_in_alternation(
        ctx,
        reps,
        |enc| {
            layer
                .encode_projections(ctx, enc, inputs, ProjectionPlan::Fused, precision)
                .map(drop)
        },
        |enc| {
            layer
                .encode_projections(ctx, enc, inputs, ProjectionPlan::Separate, precision)
                .map(drop)
        },
    )?;
    phase("Q/K/V projection, one packed GEMM", projection_flops, Ok(packed))?;
    phase("Q, K, V projections, three GEMMs", projection_flops, Ok(separate))?;
    if ctx.linear_tiling_for(dtype, precision) == LinearTiling::Texture {
        let source = RowSource::dense(x.buffer(), batch * seq, embed);
        phase(
            "  of which X into a texture, per GEMM",
            0.0,
            time_gpu(ctx, reps, |enc| PackedRows::encode(ctx, enc, dtype, &source).map(drop)),
        )?;
    }
    phase(
        "attention (fused kernel)",
        attention_flops,
        time_gpu(ctx, reps, |enc| encode_sdpa(ctx, enc, &q, &k, &v, &attention).map(drop)),
    )?;
    phase(
        "output projection",
        output_flops,
        time_gpu(ctx, reps, |enc| {
            plain.encode_output(ctx, enc, &attended.out, &x, precision).map(drop)
        }),
    )?;
    phase(
        "residual + LayerNorm",
        0.0,
        time_gpu(ctx, reps, |enc| {
            let norm = LayerNorm {
                x: projected.buffer(),
                residual: Some(x.buffer()),
                gamma: ones.buffer(),
                beta: ones.buffer(),
                out: normed.buffer(),
                rows: batch * seq,
                width: embed,
                eps: 1e-5,
            };
            encode_layer_norm(ctx, enc, dtype, &norm)
        }),
    )?;
    phase(
        "whole layer",
        projection_flops + attention_flops + output_flops,
        time_gpu(ctx, reps, |enc| {
            let options = MhaOptions {
                attention: AttentionOptions {
                    precision,
                    ..Default::default()
                },
                ..Default::default()
            };
            layer.encode_forward(ctx, enc, inputs, &options).map(drop)
        }),
    )?;
    Ok(MhaBench {
        phases,
        separate_over_packed: ratios,
    })
}

/// Times `a` and `b` in alternation ([`in_alternation`]), after a first call and a
/// warm-up of each; also returns each pair's ratio `b / a`.
fn time_in_alternation(
    ctx: &Context,
    reps: usize,
    mut a: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
    mut b: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<(Timing, Timing, PairRatios)> {
    let timer = GpuTimer::new(ctx);
    let first = [timer.time(ctx, &mut a)?, timer.time(ctx, &mut b)?];
    timer.time(ctx, &mut a)?;
    timer.time(ctx, &mut b)?;
    let samples = in_alternation(reps.max(1), || timer.sample(ctx, &mut a), || timer.sample(ctx, &mut b))?;
    // Both phases on one clock, so their ratios compare like with like.
    let clock = clock_for(&samples.iter().flat_map(|&(sa, sb)| [sa, sb]).collect::<Vec<_>>());
    let pairs: Vec<(Duration, Duration)> = samples.iter().map(|(sa, sb)| (sa.on(clock), sb.on(clock))).collect();
    let ratios = PairRatios::of(pairs.iter().map(|(ta, tb)| (ta.as_secs_f64(), tb.as_secs_f64())));
    Ok((
        summarise(first[0], pairs.iter().map(|p| p.0).collect(), clock),
        summarise(first[1], pairs.iter().map(|p| p.1).collect(), clock),
        ratios,
    ))
}
