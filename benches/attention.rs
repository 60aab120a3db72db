//! Criterion benches: one group per kernel x dtype x causal, one benchmark per sequence
//! length; GPU work timed with timestamps where the adapter has them (else wall clock
//! around submit and wait), throughput in attention FLOPs (halved for causal).
//! Default lengths keep `cargo bench` to a few minutes on lavapipe;
//! `WGPU_ATTENTION_BENCH_LARGE=1` adds L = 2048.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wgpu_attention::bench::{bench_inputs, GpuTimer};
use wgpu_attention::{encode_sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice};

fn attention(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("SKIPPING benches: no adapter ({e})");
            return;
        }
    };
    eprintln!(
        "benches on {} ({:?})",
        ctx.adapter_info().name,
        ctx.adapter_info().backend
    );
    let mut lengths = vec![256, 512];
    if std::env::var("WGPU_ATTENTION_BENCH_LARGE").as_deref() == Ok("1") {
        lengths.push(2048);
    }
    let dtypes: &[DType] = if ctx.capabilities().f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    let timer = GpuTimer::new(&ctx);
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        for &dtype in dtypes {
            for causal in [None, Some(CausalAlignment::TopLeft)] {
                let name = format!(
                    "{}/{}/{}",
                    if kernel == KernelChoice::Fused {
                        "fused"
                    } else {
                        "materialized"
                    },
                    dtype.name(),
                    if causal.is_some() { "causal" } else { "full" }
                );
                let mut group = c.benchmark_group(name.clone());
                group.sample_size(10);
                let options = AttentionOptions {
                    kernel,
                    causal,
                    ..Default::default()
                };
                for &len in &lengths {
                    let shape = AttentionShape::new(1, 8, 8, len, len, 64, 64);
                    let Ok([q, k, v]) = bench_inputs(&ctx, &shape, dtype) else {
                        continue;
                    };
                    // A problem the adapter refuses is reported and skipped, not timed.
                    let run = |encoder: &mut wgpu_attention::wgpu::CommandEncoder| {
                        encode_sdpa(&ctx, encoder, &q, &k, &v, &options).map(|_| ())
                    };
                    if let Err(e) = timer.time(&ctx, run) {
                        eprintln!("skipping {name} L={len}: {e}");
                        continue;
                    }
                    group.throughput(Throughput::Elements(shape.flops(causal.is_some()) as u64));
                    group.bench_function(BenchmarkId::new("B1_H8_D64_L", len), |b| {
                        b.iter_custom(|iters| {
                            (0..iters)
                                .map(|_| {
                                    timer
                                        .time(&ctx, run)
                                        .unwrap_or_else(|e| panic!("{name} L={len} failed after a good run: {e}"))
                                })
                                .sum()
                        })
                    });
                }
                group.finish();
            }
        }
    }
}

criterion_group!(benches, attention);
criterion_main!(benches);
