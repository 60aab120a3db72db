//! `check`: every kernel variant, and the backward pass, against the CPU reference over
//! a fixed grid.

use super::check_report::{table_header, wrap, CaseReport, CaseStatus, Report, LABEL_WIDTH, TABLE_WIDTH};
use super::{AdapterArgs, CliError};
use std::path::PathBuf;
use std::time::Instant;
use wgpu_attention::check::{
    describe, linear_grid, linear_tilings, run_backward_case, run_linear_case, standard_grid, variants, CheckCase,
};
use wgpu_attention::kernels::matmul::LinearTiling;
use wgpu_attention::{backward_tiling, AttentionOptions, AttentionShape, DType, FusedTiling, KernelChoice, Precision};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Seed of the random inputs (printed with every failure).
    #[arg(long, default_value_t = wgpu_attention::check::DEFAULT_SEED)]
    seed: u64,
    /// Also write every case (error, bound, status, seconds) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write every case as JUnit XML to FILE, which CI systems render.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
}

/// Runs every variant over the grid, prints a table, writes the requested reports
/// (also when cases fail: that is when CI needs them) and exits 1 if any case failed or
/// errored. A case that returns an error is reported and the run goes on.
pub fn run(adapter: &AdapterArgs, args: &CheckArgs) -> Result<(), CliError> {
    let outputs: Vec<&std::path::Path> = args.json.iter().chain(&args.junit).map(|p| p.as_path()).collect();
    super::output::check_outputs(&outputs, false)?;
    let ctx = adapter.context()?;
    let mut report = Report::new(ctx.adapter_info().clone(), args.seed);
    outln!("adapter: {}", report.adapter_line());
    if !ctx.capabilities().f16 {
        outln!("f16 variants skipped: adapter lacks SHADER_F16");
    }
    outln!("{}", table_header());
    for variant in variants(ctx.capabilities().f16) {
        let label = variant.label.clone();
        if let Some(e) = variant.unmet(&ctx) {
            outln!(
                "{label:<LABEL_WIDTH$} {}",
                wrap(&format!("skipped: {e}"), LABEL_WIDTH + 1, TABLE_WIDTH)
            );
            report.skipped.push((label, e.to_string()));
            continue;
        }
        for case in standard_grid(args.seed) {
            let case = variant.apply(&case);
            let started = Instant::now();
            let outcome = variant.run(&ctx, &case);
            let seconds = started.elapsed().as_secs_f64();
            let row = match outcome {
                Ok(o) => CaseReport {
                    variant: label.clone(),
                    case: describe(&case),
                    seed: case.seed,
                    max_abs_error: Some(o.out.max_abs),
                    bound: Some(o.bound),
                    seconds,
                    status: if o.passed {
                        CaseStatus::Ok
                    } else {
                        CaseStatus::Failed(o.summary())
                    },
                },
                Err(e) => CaseReport {
                    variant: label.clone(),
                    case: describe(&case),
                    seed: case.seed,
                    max_abs_error: None,
                    bound: None,
                    seconds,
                    status: CaseStatus::Error(e.to_string()),
                },
            };
            outln!("{}", row.table_line());
            report.cases.push(row);
        }
    }
    // The linear layer's GEMM (the multi-head layer's projections) in every tiling the
    // adapter runs, on `check::linear_grid`'s three awkward shapes.
    let dtypes: &[DType] = if ctx.capabilities().f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    for tiling in linear_tilings(&ctx) {
        for &dtype in dtypes {
            // Tensor cores take f32 only at precision medium, beyond f32 bounds.
            if dtype == DType::F32 && tiling == LinearTiling::Coop {
                continue;
            }
            for case in linear_grid(tiling, dtype, args.seed) {
                let started = Instant::now();
                let outcome = run_linear_case(&ctx, &case);
                let seconds = started.elapsed().as_secs_f64();
                let (max_abs_error, bound, status) = match outcome {
                    Ok(o) => (
                        Some(o.max_abs),
                        None,
                        if o.passed {
                            CaseStatus::Ok
                        } else {
                            CaseStatus::Failed(o.summary())
                        },
                    ),
                    Err(e) => (None, None, CaseStatus::Error(e.to_string())),
                };
                let row = CaseReport {
                    variant: format!("gemm/{} {}", tiling.name(), dtype.name()),
                    case: case.describe(),
                    seed: case.seed,
                    max_abs_error,
                    bound,
                    seconds,
                    status,
                };
                outln!("{}", row.table_line());
                report.cases.push(row);
            }
        }
    }
    // The backward pass on the same grid (its error over the gradients' magnitude,
    // docs/design.md "Backward"), in each dtype the adapter has, on each of its paths
    // this adapter runs: the fused pass in the adapter's tiling, the portable `rows`
    // tiling where that is another, the tensor-core one where the forward's runs (f32
    // at precision medium), and the materialized one (which refuses, and skips here,
    // what one invocation cannot walk under llvmpipe's loop cap).
    let mut paths: Vec<(String, KernelChoice, FusedTiling)> = Vec::new();
    for tiling in [
        FusedTiling::Auto,
        FusedTiling::Shared,
        FusedTiling::Registers,
        FusedTiling::Coop,
    ] {
        let options = AttentionOptions {
            tiling,
            ..Default::default()
        };
        let base = AttentionShape::new(1, 1, 1, 1, 1, 64, 64);
        let dtype = if tiling == FusedTiling::Coop {
            DType::F16
        } else {
            DType::F32
        };
        if let Ok(t) = backward_tiling(&ctx, dtype, &options, &base) {
            let name = format!("backward/{}", t.name());
            if !paths.iter().any(|(n, ..)| *n == name) {
                paths.push((name, KernelChoice::Auto, tiling));
            }
        }
    }
    paths.push((
        "backward/matrices".into(),
        KernelChoice::Materialized,
        FusedTiling::Auto,
    ));
    for (name, kernel, tiling) in &paths {
        for &dtype in dtypes {
            for case in standard_grid(args.seed) {
                // Tensor cores take f32 only at precision medium.
                let medium = *tiling == FusedTiling::Coop && dtype == DType::F32;
                let options = AttentionOptions {
                    kernel: *kernel,
                    tiling: *tiling,
                    precision: if medium {
                        Precision::Medium
                    } else {
                        case.options.precision
                    },
                    ..case.options.clone()
                };
                let case = CheckCase { dtype, options, ..case };
                // The tiling this case runs (the subgroup one stops at head dim 128).
                let name = match *kernel {
                    KernelChoice::Materialized => name.clone(),
                    _ => backward_tiling(&ctx, dtype, &case.options, &case.shape)
                        .map_or_else(|_| name.clone(), |t| format!("backward/{}", t.name())),
                };
                let label = format!("{name} {}{}", dtype.name(), if medium { " medium" } else { "" });
                let started = Instant::now();
                let outcome = run_backward_case(&ctx, &case);
                let seconds = started.elapsed().as_secs_f64();
                let (max_abs_error, bound, status) = match outcome {
                    Ok(o) => (
                        Some(o.error_over_magnitude.iter().fold(0.0f64, |m, &r| m.max(r))),
                        Some(o.bound),
                        if o.passed {
                            CaseStatus::Ok
                        } else {
                            CaseStatus::Failed(o.summary())
                        },
                    ),
                    Err(e @ wgpu_attention::Error::LimitExceeded { .. }) if *kernel == KernelChoice::Materialized => {
                        let why = format!("{}: {e}", describe(&case));
                        outln!(
                            "{label:<LABEL_WIDTH$} {}",
                            wrap(&format!("skipped: {why}"), LABEL_WIDTH + 1, TABLE_WIDTH)
                        );
                        report.skipped.push((label.clone(), why));
                        continue;
                    }
                    Err(e) => (None, None, CaseStatus::Error(e.to_string())),
                };
                let row = CaseReport {
                    variant: label.clone(),
                    case: describe(&case),
                    seed: case.seed,
                    max_abs_error,
                    bound,
                    seconds,
                    status,
                };
                outln!("{}", row.table_line());
                report.cases.push(row);
            }
        }
    }
    let (_, failed) = report.counts();
    outln!("{}", report.summary_line());
    let mut files = Vec::new();
    if let Some(path) = &args.json {
        files.push((path.clone(), report.to_json()));
    }
    if let Some(path) = &args.junit {
        files.push((path.clone(), report.to_junit()));
    }
    super::output::write_all(&files)?;
    if failed > 0 {
        return Err(CliError::Failed(format!(
            "{failed} case(s) differ from the CPU reference or failed to run"
        )));
    }
    Ok(())
}
