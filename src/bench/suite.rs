//! Benchmark suites: which attention problems to time, and one row per (problem, kernel)
//! with the derived figures (GFLOP/s, GB/s, percent of the probe, speedups).

use super::probe::Probe;
use super::{bench_data, bench_inputs, gflops, time_gpu, time_host, Timing};
use crate::attention::{encode_sdpa, resolve_kernel};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, CausalAlignment, KernelChoice, Precision, Window};
use crate::problem::AttentionShape;
use crate::reference;
use crate::tensor::DType;

/// The CPU reference is skipped above this many FLOPs (it runs at well under 1 GFLOP/s).
pub const CPU_REFERENCE_MAX_FLOPS: f64 = 1.5e9;

/// A named list of problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// About a minute on lavapipe.
    Quick,
    /// The L = 2048 shapes and friends.
    Standard,
    /// Standard plus long sequences for the fused path, up to L = 32768.
    Long,
}

impl Suite {
    pub fn parse(name: &str) -> Option<Suite> {
        match name {
            "quick" => Some(Suite::Quick),
            "standard" => Some(Suite::Standard),
            "long" => Some(Suite::Long),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Suite::Quick => "quick",
            Suite::Standard => "standard",
            Suite::Long => "long",
        }
    }

    /// The suite's problems; f16 ones only where `f16` is available.
    pub fn cases(self, f16: bool) -> Vec<BenchCase> {
        let mut out = Vec::new();
        let mut add = |shape: AttentionShape, dtypes: &[DType]| {
            for &dtype in dtypes {
                // Causal only where Lq = Lk, where "half the FLOPs" is the true count.
                for causal in [false, true] {
                    if !causal || shape.len_q == shape.len_k {
                        out.push(BenchCase {
                            shape,
                            causal,
                            window: None,
                            dtype,
                            precision: Precision::Highest,
                        });
                    }
                }
            }
        };
        let f32_f16: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
        match self {
            Suite::Quick => {
                add(AttentionShape::new(1, 8, 8, 512, 512, 64, 64), f32_f16);
                add(AttentionShape::new(2, 8, 2, 256, 256, 64, 64), &[DType::F32]);
                add(AttentionShape::new(1, 4, 4, 64, 1024, 128, 128), &[DType::F32]);
            }
            Suite::Standard | Suite::Long => {
                add(AttentionShape::new(1, 8, 8, 1024, 1024, 64, 64), f32_f16);
                add(AttentionShape::new(1, 8, 8, 2048, 2048, 64, 64), f32_f16);
                add(AttentionShape::new(2, 16, 4, 1024, 1024, 64, 64), &[DType::F32]);
                add(AttentionShape::new(1, 8, 8, 512, 512, 128, 128), &[DType::F32]);
            }
        }
        if self == Suite::Long {
            for len in [8192, 32768] {
                out.push(BenchCase {
                    shape: AttentionShape::new(1, 1, 1, len, len, 64, 64),
                    causal: false,
                    window: None,
                    dtype: DType::F32,
                    precision: Precision::Highest,
                });
            }
        }
        out
    }
}

/// One problem of a suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchCase {
    pub shape: AttentionShape,
    /// Causal with top-left alignment.
    pub causal: bool,
    /// A sliding window (with `causal`, around the top-left-aligned position).
    pub window: Option<Window>,
    pub dtype: DType,
    /// Whether f32 inputs may be multiplied in f16 (tensor cores).
    pub precision: Precision,
}

impl BenchCase {
    /// Attention FLOPs: 2·B·Hq·Lq·Lk·(D + Dv), i.e. 4·B·Hq·Lq·Lk·D when Dv = D; halved
    /// for causal; with a window, 2·B·Hq·(D + Dv) per visible (query, key) pair, counted.
    pub fn flops(&self) -> f64 {
        let s = &self.shape;
        match self.window {
            None => s.flops(self.causal),
            Some(window) => {
                let options = self.options(KernelChoice::Auto);
                let offset = options.query_position_offset(s.len_q, s.len_k);
                let right = if self.causal { Some(0) } else { window.right };
                let pairs: u64 = (0..s.len_q as i64)
                    .map(|i| {
                        let pos = i + offset;
                        let start = window.left.map_or(0, |l| (pos - l as i64).max(0));
                        let end = right.map_or(s.len_k as i64, |r| (pos + r as i64 + 1).min(s.len_k as i64));
                        (end - start).max(0) as u64
                    })
                    .sum();
                2.0 * s.batch_heads() as f64 * pairs as f64 * (s.head_dim + s.head_dim_v) as f64
            }
        }
    }

    /// Compulsory traffic: Q, K, V read once and O written once.
    pub fn compulsory_bytes(&self) -> f64 {
        let s = &self.shape;
        let elements = s.batch
            * (s.heads_q * s.len_q * (s.head_dim + s.head_dim_v) + s.heads_kv * s.len_k * (s.head_dim + s.head_dim_v));
        (elements * self.dtype.size()) as f64
    }

    /// `none`, `causal-top-left`, and `+window=LEFT,RIGHT` (-1: unbounded) after either.
    pub fn mask_name(&self) -> String {
        let base = if self.causal { "causal-top-left" } else { "none" };
        match self.window {
            None => base.to_string(),
            Some(w) => format!("{base}+window={w}"),
        }
    }

    fn options(&self, kernel: KernelChoice) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal.then_some(CausalAlignment::TopLeft),
            window: self.window,
            kernel,
            precision: self.precision,
            ..Default::default()
        }
    }
}

/// The implementations a row can time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchKernel {
    Fused,
    Materialized,
    /// Split-K decode.
    Decode,
    /// The crate's f64 CPU reference (single-threaded).
    CpuReference,
}

impl BenchKernel {
    pub fn parse(name: &str) -> Option<Vec<BenchKernel>> {
        Some(match name {
            "fused" => vec![BenchKernel::Fused],
            "materialized" => vec![BenchKernel::Materialized],
            "decode" => vec![BenchKernel::Decode],
            "decode+fused" => vec![BenchKernel::Decode, BenchKernel::Fused],
            "cpu" | "reference" => vec![BenchKernel::CpuReference],
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
    let outcome = match outcome {
        Ok((timing, allocated_bytes)) => {
            let gf = gflops(case.flops(), timing.median);
            let gbps = case.compulsory_bytes() / timing.median.as_secs_f64() / 1e9;
            RowOutcome::Measured(Measured {
                gflops: gf,
                gbps,
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
            let [q, k, v] = bench_data(&shape);
            let options = case.options(KernelChoice::Auto);
            // The reference is slow: one timed run after the first.
            let timing = time_host(reps.min(1), || {
                reference::attention(&q, &k, &v, &shape, &options).map(|_| ())
            })?;
            Ok((name, Ok((timing, None))))
        }
        BenchKernel::Fused | BenchKernel::Materialized | BenchKernel::Decode => {
            let choice = match kernel {
                BenchKernel::Fused => KernelChoice::Fused,
                BenchKernel::Decode => KernelChoice::Decode,
                _ => KernelChoice::Materialized,
            };
            let options = case.options(choice);
            let name = resolve_kernel(ctx, case.dtype, &options, &shape)?.name();
            let [q, k, v] = bench_inputs(ctx, &shape, case.dtype)?;
            let before = ctx.allocated_bytes();
            let calls = reps.max(1) as u64 + 2;
            match time_gpu(ctx, reps, |encoder| {
                encode_sdpa(ctx, encoder, &q, &k, &v, &options).map(|_| ())
            }) {
                Ok(timing) => {
                    let per_call = (ctx.allocated_bytes() - before) / calls;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn case(len_q: usize, len_k: usize, causal: bool, window: Option<Window>) -> BenchCase {
        BenchCase {
            shape: AttentionShape::new(1, 1, 1, len_q, len_k, 1, 1),
            causal,
            window,
            dtype: DType::F32,
            precision: Precision::Highest,
        }
    }

    #[test]
    fn window_flops_count_the_visible_pairs() {
        // Per pair: 2 · (D + Dv) = 4 FLOPs. Causal window (2, 0) on 5 x 5: rows see 1, 2,
        // 3, 3, 3 keys.
        let w = |left, right| Some(Window { left, right });
        assert_eq!(case(5, 5, true, w(Some(2), Some(0))).flops(), 4.0 * 12.0);
        // No causal, 2 x 5: p(i) = i + 3; window (1, 1) sees keys 2..=4 and 3..=4.
        assert_eq!(case(2, 5, false, w(Some(1), Some(1))).flops(), 4.0 * 5.0);
        // Unbounded on both sides: every pair, as without a window.
        assert_eq!(
            case(3, 7, false, w(None, None)).flops(),
            case(3, 7, false, None).flops()
        );
        assert_eq!(
            case(5, 5, true, w(Some(2), Some(0))).mask_name(),
            "causal-top-left+window=2,0"
        );
        assert_eq!(case(5, 5, false, w(None, Some(3))).mask_name(), "none+window=-1,3");
    }
}
