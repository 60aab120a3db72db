//! `check`: every kernel variant against the CPU reference over a fixed grid.

use super::check_report::{CaseReport, CaseStatus, Report};
use super::{AdapterArgs, CliError};
use std::path::PathBuf;
use std::time::Instant;
use wgpu_attention::check::{run_case, standard_grid, CheckCase};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{DType, FusedTiling, KernelChoice, Precision};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Seed of the random inputs (printed with every failure).
    #[arg(long, default_value_t = 0x5EED_0001)]
    seed: u64,
    /// Also write every case (error, bound, status, seconds) as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also write every case as JUnit XML to FILE, which CI systems render.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
}

/// One kernel variant `check` runs.
pub struct Variant {
    pub label: String,
    pub kernel: KernelChoice,
    pub tiling: FusedTiling,
    pub dtype: DType,
    pub precision: Precision,
}

/// Every kernel variant: the materialized path, split-K decode and each registered fused tiling, in f32
/// and (where the adapter has it) f16. Tilings that multiply in f16 (tensor cores) run
/// their f32 variant at precision medium.
pub fn variants(f16: bool) -> Vec<Variant> {
    let dtypes: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
    let mut v = Vec::new();
    for &dtype in dtypes {
        for (name, kernel) in [
            ("materialized", KernelChoice::Materialized),
            ("decode", KernelChoice::Decode),
        ] {
            v.push(Variant {
                label: format!("{name} {}", dtype.name()),
                kernel,
                tiling: FusedTiling::Auto,
                dtype,
                precision: Precision::Highest,
            });
        }
        for spec in &FUSED_TILINGS {
            let medium = spec.f16_products && dtype == DType::F32;
            v.push(Variant {
                label: format!(
                    "fused/{} {}{}",
                    spec.name,
                    dtype.name(),
                    if medium { " medium" } else { "" }
                ),
                kernel: KernelChoice::Fused,
                tiling: spec.tiling,
                dtype,
                precision: if medium { Precision::Medium } else { Precision::Highest },
            });
        }
    }
    v
}

fn describe(case: &CheckCase) -> String {
    let s = &case.shape;
    let mut masks = Vec::new();
    if let Some(c) = case.options.causal {
        masks.push(format!("causal {c:?}"));
    }
    if case.options.key_lengths.is_some() {
        masks.push("key-lengths".into());
    }
    if let Some(m) = &case.options.mask {
        masks.push(match m.values() {
            wgpu_attention::MaskValues::Bool(_) => "bool-mask".into(),
            wgpu_attention::MaskValues::Additive(_) => "additive-mask".into(),
        });
    }
    if let Some(w) = case.options.window {
        masks.push(format!("window {w}"));
    }
    if case.options.alibi_slopes.is_some() {
        masks.push("alibi".into());
    }
    if let Some(cap) = case.options.softcap {
        masks.push(format!("softcap {cap:.2}"));
    }
    format!(
        "B{} Hq{} Hkv{} Lq{} Lk{} D{} Dv{} {:?} {}",
        s.batch,
        s.heads_q,
        s.heads_kv,
        s.len_q,
        s.len_k,
        s.head_dim,
        s.head_dim_v,
        case.layout,
        if masks.is_empty() {
            "no mask".into()
        } else {
            masks.join("+")
        }
    )
}

/// Runs every variant over the grid, prints a table, writes the requested reports
/// (also when cases fail: that is when CI needs them) and exits 1 if any case failed or
/// errored. A case that returns an error is reported and the run goes on.
pub fn run(adapter: &AdapterArgs, args: &CheckArgs) -> Result<(), CliError> {
    let outputs: Vec<&std::path::Path> = args.json.iter().chain(&args.junit).map(|p| p.as_path()).collect();
    super::npy::check_outputs(&outputs, false)?;
    let ctx = adapter.context()?;
    let mut report = Report::new(ctx.adapter_info().clone(), args.seed);
    println!("adapter: {}", report.adapter_line());
    if !ctx.capabilities().f16 {
        println!("f16 variants skipped: adapter lacks SHADER_F16");
    }
    println!(
        "{:<20} {:<58} {:>10} {:>10}  result",
        "variant", "case", "max err", "bound"
    );
    for Variant {
        label,
        kernel,
        tiling,
        dtype,
        precision,
    } in variants(ctx.capabilities().f16)
    {
        if let Err(e) = ctx.fused_config_for(tiling, dtype, precision) {
            println!("{label:<20} skipped: {e}");
            report.skipped.push((label, e.to_string()));
            continue;
        }
        for mut case in standard_grid(args.seed) {
            case.options.kernel = kernel;
            case.options.tiling = tiling;
            case.options.precision = precision;
            case.dtype = dtype;
            let started = Instant::now();
            let outcome = run_case(&ctx, &case);
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
            println!("{}", row.table_line());
            report.cases.push(row);
        }
    }
    let (passed, failed) = report.counts();
    println!("{passed} passed, {failed} failed");
    let mut files = Vec::new();
    if let Some(path) = &args.json {
        files.push((path.clone(), report.to_json()));
    }
    if let Some(path) = &args.junit {
        files.push((path.clone(), report.to_junit()));
    }
    super::npy::write_all(&files)?;
    if failed > 0 {
        return Err(CliError::Failed(format!(
            "{failed} case(s) differ from the CPU reference or failed to run"
        )));
    }
    Ok(())
}
