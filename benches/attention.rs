//! Criterion benches: fused vs materialized, causal vs not, f32 and f16, timed around
//! submit + wait with `iter_custom` (wall clock; GPU work only, inputs uploaded once).
//! Default sizes finish in a few minutes on lavapipe; set WGPU_ATTENTION_BENCH_LARGE=1
//! for the (1, 8, 2048, 64) shape.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};
use wgpu_attention::bench::bench_inputs;
use wgpu_attention::{encode_sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice};

fn attention(c: &mut Criterion) {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("SKIPPING benches: no adapter ({e})");
            return;
        }
    };
    let len = if std::env::var("WGPU_ATTENTION_BENCH_LARGE").as_deref() == Ok("1") {
        2048
    } else {
        256
    };
    let shape = AttentionShape {
        batch: 1,
        heads_q: 8,
        heads_kv: 8,
        len_q: len,
        len_k: len,
        head_dim: 64,
        head_dim_v: 64,
    };
    let dtypes: &[DType] = if ctx.capabilities().f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    for &dtype in dtypes {
        let Ok([q, k, v]) = bench_inputs(&ctx, &shape, dtype) else {
            continue;
        };
        for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
            for causal in [None, Some(CausalAlignment::TopLeft)] {
                let name = format!(
                    "{kernel:?}/{}/{}",
                    dtype.name(),
                    if causal.is_some() { "causal" } else { "full" }
                );
                let mut group = c.benchmark_group(format!("attention_L{len}_D64"));
                group.throughput(Throughput::Elements(shape.flops(causal.is_some()) as u64));
                group.sample_size(10);
                let options = AttentionOptions {
                    kernel,
                    causal,
                    ..Default::default()
                };
                group.bench_function(name, |b| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let start = Instant::now();
                            let mut encoder = ctx.device().create_command_encoder(&Default::default());
                            if encode_sdpa(&ctx, &mut encoder, &q, &k, &v, &options).is_err() {
                                return Duration::MAX;
                            }
                            ctx.queue().submit([encoder.finish()]);
                            let _ = ctx.wait_idle();
                            total += start.elapsed();
                        }
                        total
                    })
                });
                group.finish();
            }
        }
    }
}

criterion_group!(benches, attention);
criterion_main!(benches);
