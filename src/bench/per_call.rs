//! The host's cost of one attention call on a tiny problem (B = Hq = Hkv = Lq = Lk = 1,
//! D = 64, f32), where the GPU work is negligible and what a call creates, records,
//! submits and waits for is the cost: for decode, one token at a time, this overhead is
//! the latency users see (issue 17 §5; `bench --per-call`).

use super::bench_inputs;
use crate::context::Context;
use crate::error::Result;
use crate::options::{AttentionOptions, KernelChoice};
use crate::problem::AttentionShape;
use crate::tensor::DType;
use std::time::{Duration, Instant};

/// The problem timed.
pub const SHAPE: AttentionShape = AttentionShape::new(1, 1, 1, 1, 1, 64, 64);

/// Median host times of one call, for one kernel path.
#[derive(Clone, Debug)]
pub struct PerCall {
    /// The path taken (`fused/…`, `decode`).
    pub kernel: String,
    /// `sdpa` returning: checks, buffers, recording and submission.
    pub record_submit: Duration,
    /// `sdpa` and reading the output back (the GPU work finished and mapped).
    pub round_trip: Duration,
    /// The same through `sdpa_read`: one submission and one wait.
    pub one_submission: Duration,
}

/// Times `calls` calls of each path after 20 untimed ones (pipelines compiled, pools
/// warm), medians.
pub fn measure(ctx: &Context, calls: usize) -> Result<Vec<PerCall>> {
    let [q, k, v] = bench_inputs(ctx, &SHAPE, DType::F32)?;
    let mut rows = Vec::new();
    for kernel in [KernelChoice::Fused, KernelChoice::Decode] {
        let options = AttentionOptions {
            kernel,
            ..Default::default()
        };
        let name = crate::attention::resolve_kernel(ctx, DType::F32, &options, &SHAPE)?.name();
        for _ in 0..20 {
            crate::sdpa(ctx, &q, &k, &v, &options)?.out.to_f32_vec(ctx)?;
        }
        let mut submit = Vec::with_capacity(calls);
        let mut trip = Vec::with_capacity(calls);
        let mut one = Vec::with_capacity(calls);
        for _ in 0..calls.max(1) {
            let start = Instant::now();
            let out = crate::sdpa(ctx, &q, &k, &v, &options)?;
            submit.push(start.elapsed());
            ctx.wait_idle()?;
            let start = Instant::now();
            crate::sdpa(ctx, &q, &k, &v, &options)?.out.to_f32_vec(ctx)?;
            trip.push(start.elapsed());
            let start = Instant::now();
            crate::sdpa_read(ctx, &q, &k, &v, &options)?;
            one.push(start.elapsed());
            drop(out);
        }
        rows.push(PerCall {
            kernel: name,
            record_submit: median(submit),
            round_trip: median(trip),
            one_submission: median(one),
        });
    }
    Ok(rows)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
