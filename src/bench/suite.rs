//! Benchmark suites: which attention problems to time, and one row per (problem, kernel)
//! with the derived figures (GFLOP/s, GB/s, percent of the probe, speedups).

use super::probe::Probe;
use super::{
    bench_data, bench_inputs, check_bench_data, gflops, in_alternation, time_gpu, time_host, PairRatios, Timing,
};
use crate::attention::{encode_sdpa, resolve_kernel};
pub use crate::bench_cases::{BenchCase, Suite};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::options::{AttentionOptions, KernelChoice};
use crate::problem::AttentionShape;
use crate::reference;
use crate::tensor::{DType, Layout, Tensor};

/// The CPU reference is skipped above this many FLOPs (it runs at well under 1 GFLOP/s).
pub const CPU_REFERENCE_MAX_FLOPS: f64 = 1.5e9;

/// The implementations a row can time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchKernel {
    Fused,
    Materialized,
    /// Split-K decode.
    Decode,
    /// Attention against the case's K and V quantized to int8 (`QuantizedKv`): split-K
    /// decode reading the codes where it can (`lanes`), else the dequantized values;
    /// GB/s counts the codes and scales.
    DecodeInt8,
    /// Split-K decode in its `tiles` design (asked for by a tiling, so it runs whatever
    /// the adapter's own pick), beside [`BenchKernel::Decode`] for the ratio.
    DecodeTiles,
    /// The crate's f64 CPU reference (single-threaded).
    CpuReference,
    /// The backward pass (dQ, dK, dV from the fused forward's output and lse), its
    /// FLOPs counted as FlashAttention-2 does: 2.5 times the forward's.
    Backward,
    /// The materialized backward (from the forward's weights; same FLOP count).
    MaterializedBackward,
    /// `merge_attentions` of two partials of the case's output shape (the fused
    /// forward's output twice; no FLOPs counted).
    Merge,
    /// Split-K decode from a cache with a rotary embedding over the whole head dim
    /// (keys rotated when the cache was filled, the query at every call).
    DecodeRotary,
    /// A whole generation step on a cache holding Lk − 1 rows: append one key and value
    /// row per sequence, attend with one query, wait; wall clock, as a caller sees it
    /// (each step appends, so later steps see a few more keys).
    DecodeStep,
    /// [`BenchKernel::DecodeStep`] on a cache with a rotary embedding: the appended key
    /// rotated in the append's copy, the query before attending.
    DecodeStepRotary,
}

impl BenchKernel {
    pub fn parse(name: &str) -> Option<Vec<BenchKernel>> {
        Some(match name {
            "fused" => vec![BenchKernel::Fused],
            "materialized" => vec![BenchKernel::Materialized],
            "decode" => vec![BenchKernel::Decode],
            "decode+fused" => vec![BenchKernel::Decode, BenchKernel::Fused],
            "decode+tiles" => vec![BenchKernel::Decode, BenchKernel::DecodeTiles, BenchKernel::Fused],
            "decode+int8" => vec![BenchKernel::Decode, BenchKernel::DecodeInt8],
            "cpu" | "reference" => vec![BenchKernel::CpuReference],
            "backward" => vec![BenchKernel::Backward],
            "fused+backward" => vec![BenchKernel::Fused, BenchKernel::Backward],
            "fused+merge" => vec![BenchKernel::Fused, BenchKernel::Merge],
            "decode+rope" => vec![
                BenchKernel::Decode,
                BenchKernel::DecodeRotary,
                BenchKernel::DecodeStep,
                BenchKernel::DecodeStepRotary,
            ],
            "backward+materialized" => vec![
                BenchKernel::Fused,
                BenchKernel::Backward,
                BenchKernel::MaterializedBackward,
            ],
            "both" => vec![BenchKernel::Fused, BenchKernel::Materialized],
            "all" => vec![BenchKernel::Fused, BenchKernel::Materialized, BenchKernel::CpuReference],
            _ => return None,
        })
    }
}

/// One measured (or skipped) row.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub case: BenchCase,
    /// `fused/<tiling>`, `materialized` or `cpu-reference`.
    pub kernel: String,
    pub outcome: RowOutcome,
}

#[derive(Clone, Debug)]
pub enum RowOutcome {
    Measured(Measured),
    /// Not run, and why (too slow for the CPU reference, refused by a limit, ...).
    Skipped(String),
}

#[derive(Clone, Debug)]
pub struct Measured {
    pub timing: Timing,
    pub gflops: f64,
    pub gbps: f64,
    /// Query rows of every sequence per second, B·Lq over the median: with `bench
    /// --decode` (Lq = 1), the tokens a decode step's attention yields per second
    /// across the batch.
    pub tokens_per_second: f64,
    /// GFLOP/s as a percentage of the probe's GEMM.
    pub percent_of_probe_gflops: f64,
    /// GB/s as a percentage of the probe's copy.
    pub percent_of_probe_gbps: f64,
    /// GPU memory one call allocates beyond its inputs (output, statistics, scratch).
    pub allocated_bytes: Option<u64>,
    /// Materialized median / this median, when both ran.
    pub speedup_over_materialized: Option<f64>,
    /// CPU reference median / this median, when both ran.
    pub speedup_over_cpu_reference: Option<f64>,
}

impl BenchRow {
    pub fn measured(&self) -> Option<&Measured> {
        match &self.outcome {
            RowOutcome::Measured(m) => Some(m),
            RowOutcome::Skipped(_) => None,
        }
    }
}

/// Times `case` with one kernel. Speedups are left empty: see [`fill_speedups`].
pub fn run_kernel(
    ctx: &Context,
    case: &BenchCase,
    kernel: BenchKernel,
    reps: usize,
    probe: &Probe,
) -> Result<BenchRow> {
    let (name, outcome) = time_kernel(ctx, case, kernel, reps)?;
    let flops = match kernel {
        BenchKernel::Backward | BenchKernel::MaterializedBackward => 2.5 * case.flops(),
        BenchKernel::Merge => 0.0,
        _ => case.flops(),
    };
    let outcome = match outcome {
        Ok((timing, allocated_bytes)) => {
            let gf = gflops(flops, timing.median);
            let seconds = timing.median.as_secs_f64();
            let bytes = match kernel {
                BenchKernel::DecodeInt8 => case.compulsory_bytes_int8_kv(),
                _ => case.compulsory_bytes(),
            };
            let gbps = bytes / seconds / 1e9;
            let tokens = (case.shape.batch * case.shape.len_q) as f64;
            RowOutcome::Measured(Measured {
                gflops: gf,
                gbps,
                tokens_per_second: tokens / seconds,
                percent_of_probe_gflops: 100.0 * gf / probe.gemm_gflops_for(case.dtype),
                percent_of_probe_gbps: 100.0 * gbps / probe.copy_gbps,
                allocated_bytes,
                speedup_over_materialized: None,
                speedup_over_cpu_reference: None,
                timing,
            })
        }
        Err(reason) => RowOutcome::Skipped(reason),
    };
    Ok(BenchRow {
        case: *case,
        kernel: name,
        outcome,
    })
}

/// Fills in the speedups over the materialized and CPU-reference rows among `rows` (the
/// rows of one case).
pub fn fill_speedups(rows: &mut [BenchRow]) {
    let median = |rows: &[BenchRow], name: &str| {
        rows.iter()
            .find(|r| r.kernel == name)
            .and_then(|r| r.measured().map(|m| m.timing.median.as_secs_f64()))
    };
    let (materialized, cpu) = (median(rows, "materialized"), median(rows, "cpu-reference"));
    for row in rows {
        if let RowOutcome::Measured(m) = &mut row.outcome {
            let mine = m.timing.median.as_secs_f64();
            m.speedup_over_materialized = materialized.map(|t| t / mine);
            m.speedup_over_cpu_reference = cpu.map(|t| t / mine);
        }
    }
}

type KernelOutcome = std::result::Result<(Timing, Option<u64>), String>;

/// Times one kernel on one case. Limits the kernel refuses become a skipped row; other
/// errors end the run.
fn time_kernel(ctx: &Context, case: &BenchCase, kernel: BenchKernel, reps: usize) -> Result<(String, KernelOutcome)> {
    let shape = case.shape;
    match kernel {
        BenchKernel::CpuReference => {
            let name = "cpu-reference".to_string();
            if case.flops() > CPU_REFERENCE_MAX_FLOPS {
                return Ok((name, Err(format!("skipped: over {CPU_REFERENCE_MAX_FLOPS:.1e} FLOPs"))));
            }
            if let Err(e) = check_bench_data(&shape) {
                return Ok((name, Err(format!("refused: {e}"))));
            }
            let [q, k, v] = bench_data(&shape);
            let options = case.options(KernelChoice::Auto);
            // The reference is slow: one timed run after the first.
            let timing = time_host(reps.min(1), || {
                reference::attention(&q, &k, &v, &shape, &options).map(|_| ())
            })?;
            Ok((name, Ok((timing, None))))
        }
        BenchKernel::Merge => {
            let name = "merge(2)".to_string();
            let [q, k, v] = bench_inputs(ctx, &shape, case.dtype)?;
            let options = AttentionOptions {
                need_lse: true,
                ..case.options(KernelChoice::Fused)
            };
            let forward = crate::attention::sdpa(ctx, &q, &k, &v, &options)?;
            let lse = forward
                .lse
                .as_ref()
                .ok_or_else(|| Error::invalid("merge bench", "no lse"))?;
            let before = ctx.allocated_bytes();
            let timing = time_gpu(ctx, reps, |encoder| {
                crate::merge::encode_merge_attentions(ctx, encoder, &[&forward.out, &forward.out], &[lse, lse])
                    .map(|_| ())
            })?;
            let calls = reps.max(1) as u64 + 2;
            Ok((name, Ok((timing, Some((ctx.allocated_bytes() - before) / calls)))))
        }
        BenchKernel::DecodeStep | BenchKernel::DecodeStepRotary => {
            let rotary = (kernel == BenchKernel::DecodeStepRotary).then(|| bench_rotary(&shape));
            let name = if rotary.is_some() {
                "decode-step+rope"
            } else {
                "decode-step"
            }
            .to_string();
            match decode_steps(ctx, case, rotary, reps) {
                Ok(timing) => Ok((name, Ok((timing, None)))),
                Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. } | Error::Unsupported { .. })) => {
                    Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => Err(e),
            }
        }
        BenchKernel::DecodeInt8 => {
            let options = case.options(KernelChoice::Decode);
            let name = if crate::quantized_kv::reads_codes(ctx, case.dtype, &shape, &options)? {
                "decode/lanes+int8".to_string()
            } else {
                format!(
                    "{}+int8 (dequantized)",
                    resolve_kernel(ctx, case.dtype, &options, &shape)?.name()
                )
            };
            let timed = (|| {
                let [q, k, v] = bench_inputs(ctx, &shape, case.dtype)?;
                let kv = crate::quantized_kv::QuantizedKv::quantize(ctx, &k, &v)?;
                drop((k, v));
                let before = ctx.allocated_bytes();
                let timing = time_gpu(ctx, reps, |encoder| {
                    crate::quantized_kv::encode_sdpa_quantized(ctx, encoder, &q, &kv, &options).map(|_| ())
                })?;
                Ok((timing, ctx.allocated_bytes() - before))
            })();
            let calls = reps.max(1) as u64 + 2;
            match timed {
                Ok((timing, allocated)) => Ok((name, Ok((timing, Some(allocated / calls))))),
                Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. } | Error::Unsupported { .. })) => {
                    Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => Err(e),
            }
        }
        BenchKernel::Backward | BenchKernel::MaterializedBackward => {
            let materialized = kernel == BenchKernel::MaterializedBackward;
            let choice = if materialized {
                KernelChoice::Materialized
            } else {
                KernelChoice::Fused
            };
            let options = AttentionOptions {
                need_lse: true,
                ..case.options(choice)
            };
            let name = if materialized {
                "backward/matrices".to_string()
            } else {
                format!(
                    "backward/{}",
                    crate::backward::backward_tiling(ctx, case.dtype, &options, &shape)?.name()
                )
            };
            let [q, k, v] = match bench_inputs(ctx, &shape, case.dtype) {
                Ok(inputs) => inputs,
                Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. })) => {
                    return Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => return Err(e),
            };
            let forward = crate::attention::sdpa(ctx, &q, &k, &v, &options)?;
            let lse = forward
                .lse
                .as_ref()
                .ok_or_else(|| Error::invalid("backward bench", "no lse"))?;
            // dO: the output itself (any values do; the timing does not depend on them).
            let d_out = &forward.out;
            let before = ctx.allocated_bytes();
            let timed = time_gpu(ctx, reps, |encoder| {
                crate::backward::encode_sdpa_backward(ctx, encoder, &q, &k, &v, &forward.out, lse, d_out, &options)
                    .map(|_| ())
            });
            let calls = reps.max(1) as u64 + 2;
            match timed {
                Ok(timing) => Ok((name, Ok((timing, Some((ctx.allocated_bytes() - before) / calls))))),
                Err(e @ (Error::LimitExceeded { .. } | Error::Unsupported { .. })) => {
                    Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => Err(e),
            }
        }
        BenchKernel::Fused
        | BenchKernel::Materialized
        | BenchKernel::Decode
        | BenchKernel::DecodeTiles
        | BenchKernel::DecodeRotary => {
            let choice = match kernel {
                BenchKernel::Fused => KernelChoice::Fused,
                BenchKernel::Decode | BenchKernel::DecodeTiles | BenchKernel::DecodeRotary => KernelChoice::Decode,
                _ => KernelChoice::Materialized,
            };
            let mut options = case.options(choice);
            if kernel == BenchKernel::DecodeTiles {
                // Any tiling but `subgroup` asks for the tiled decode design.
                options.tiling = crate::options::FusedTiling::Registers;
            }
            let rotary = (kernel == BenchKernel::DecodeRotary).then(|| bench_rotary(&shape));
            let mut name = resolve_kernel(ctx, case.dtype, &options, &shape)?.name();
            if rotary.is_some() {
                name.push_str("+rope");
            }
            if kernel == BenchKernel::DecodeTiles {
                name.push_str("/tiles");
            }
            let [q, k, v] = match bench_inputs(ctx, &shape, case.dtype) {
                Ok(inputs) => inputs,
                Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. })) => {
                    return Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => return Err(e),
            };
            // Decode reads K and V from a KV cache, as when generating (with the cache's
            // texel mirror where it keeps one), and so does every kernel at Lq = 1 (a
            // generation step, `bench --decode`), so that the fused row is timed on the
            // same inputs as decode's: from plain tensors the fused texel kernel also
            // copies K and V into a new mirror each call, at (1,32,8,32768,128) f32 on
            // lavapipe about a third of its time (page faults of fresh memory). A cache
            // aligns positions bottom-right, so top-left causal cases read the tensors.
            let from_cache = !case.causal
                && (matches!(
                    kernel,
                    BenchKernel::Decode | BenchKernel::DecodeTiles | BenchKernel::DecodeRotary
                ) || shape.len_q == 1);
            let timed = (|| {
                let cache = if from_cache {
                    Some(filled_cache(ctx, &shape, case.dtype, &k, &v, rotary)?)
                } else {
                    None
                };
                let before = ctx.allocated_bytes();
                let timing = time_gpu(ctx, reps, |encoder| {
                    match &cache {
                        Some(cache) => cache.encode_attend(ctx, encoder, &q, &options),
                        None => encode_sdpa(ctx, encoder, &q, &k, &v, &options),
                    }
                    .map(|_| ())
                })?;
                Ok((timing, ctx.allocated_bytes() - before))
            })();
            let calls = reps.max(1) as u64 + 2;
            match timed {
                Ok((timing, allocated)) => {
                    let per_call = allocated / calls;
                    Ok((name, Ok((timing, Some(per_call)))))
                }
                Err(e @ (Error::LimitExceeded { .. } | Error::Unsupported { .. })) => {
                    Ok((name, Err(format!("refused: {e}"))))
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// A cache for decode steps: room for `steps` more rows after Lk − 1 held ones, and
/// one step's query and new key and value rows.
struct StepCache {
    cache: KvCache,
    q: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    options: AttentionOptions,
}

impl StepCache {
    fn new(ctx: &Context, case: &BenchCase, rotary: Option<crate::rotary::Rotary>, steps: usize) -> Result<Self> {
        let shape = case.shape;
        let held = shape.len_k.saturating_sub(1);
        let room = AttentionShape {
            len_k: held + steps,
            ..shape
        };
        let mut cache = KvCache::for_shape(ctx, &room, Layout::Bhsd, case.dtype)?;
        cache.set_rotary(rotary)?;
        if held > 0 {
            let [_, k, v] = bench_inputs(ctx, &AttentionShape { len_k: held, ..shape }, case.dtype)?;
            cache.append(ctx, &k, &v)?;
        }
        let [q, k_new, v_new] = bench_inputs(ctx, &AttentionShape { len_k: 1, ..shape }, case.dtype)?;
        ctx.wait_idle()?;
        Ok(StepCache {
            cache,
            q,
            k_new,
            v_new,
            options: case.options(KernelChoice::Decode),
        })
    }

    /// One generation step: append, attend, wait.
    fn step(&mut self, ctx: &Context) -> Result<()> {
        self.cache.append(ctx, &self.k_new, &self.v_new)?;
        self.cache.attend(ctx, &self.q, &self.options)?;
        ctx.wait_idle()
    }
}

/// Times [`BenchKernel::DecodeStep`]: a cache holding Lk − 1 rows, then per step one
/// appended row and one query attended, waited for.
fn decode_steps(ctx: &Context, case: &BenchCase, rotary: Option<crate::rotary::Rotary>, reps: usize) -> Result<Timing> {
    let mut steps = StepCache::new(ctx, case, rotary, reps.max(1) + 2)?;
    time_host(reps, || steps.step(ctx))
}

/// `pairs` pairs of decode steps ([`BenchKernel::DecodeStep`]) timed in alternation
/// ([`in_alternation`]), one on a plain cache and one on a cache with the bench's
/// rotary embedding, after one warm-up step each: each pair's ratio rotary / plain.
pub fn paired_decode_steps(ctx: &Context, case: &BenchCase, pairs: usize) -> Result<PairRatios> {
    let mut plain = StepCache::new(ctx, case, None, pairs + 1)?;
    let mut rope = StepCache::new(ctx, case, Some(bench_rotary(&case.shape)), pairs + 1)?;
    plain.step(ctx)?;
    rope.step(ctx)?;
    let timed = |steps: &mut StepCache| -> Result<f64> {
        let start = std::time::Instant::now();
        steps.step(ctx)?;
        Ok(start.elapsed().as_secs_f64())
    };
    Ok(PairRatios::of(in_alternation(
        pairs,
        || timed(&mut plain),
        || timed(&mut rope),
    )?))
}

/// The rotary embedding of the bench's RoPE rows: NeoX pairs over the whole head dim
/// (its even part).
fn bench_rotary(shape: &AttentionShape) -> crate::rotary::Rotary {
    crate::rotary::Rotary::new(shape.head_dim & !1)
}

/// A KV cache of capacity Lk holding all of `k` and `v` (rotated by `rotary`).
fn filled_cache(
    ctx: &Context,
    shape: &AttentionShape,
    dtype: DType,
    k: &Tensor,
    v: &Tensor,
    rotary: Option<crate::rotary::Rotary>,
) -> Result<KvCache> {
    let mut cache = KvCache::for_shape(ctx, shape, Layout::Bhsd, dtype)?;
    cache.set_rotary(rotary)?;
    cache.append(ctx, k, v)?;
    Ok(cache)
}
