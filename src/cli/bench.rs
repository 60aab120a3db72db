//! `bench`: a suite of attention problems on one adapter (or every adapter), printed as a
//! table and optionally written as JSON (schema in docs/bench-json.md), with the
//! roofline probe measured in the same process. `--compare` reads two JSON files instead.

use super::output::write_all;
use super::{AdapterArgs, CliError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::PathBuf;
use wgpu_attention::bench::probe::Probe;
use wgpu_attention::bench::suite::{
    fill_speedups, paired_decode_steps, run_kernel, BenchCase, BenchKernel, BenchRow, RowOutcome, Suite,
};
use wgpu_attention::bench::{gflops, Clock};
use wgpu_attention::mha::MhaConfig;
use wgpu_attention::report::adapter_json;
use wgpu_attention::{AttentionShape, Context, DType, FusedTiling, Precision, Window};

pub use super::bench_compare::SCHEMA;
/// Version tag of the JSON `bench --mha` writes.
pub const MHA_SCHEMA: &str = "wgpu-attention-bench-mha/1";

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Problem set: quick (about 15-20 s on lavapipe), standard (L up to 2048) or long
    /// (adds L = 8192 and 32768 for the fused path). Ignored when --shape is given.
    #[arg(long, default_value = "quick")]
    suite: String,
    /// B,Hq,Hkv,Lq,Lk,D[,Dv] (repeatable); replaces the suite.
    #[arg(long)]
    shape: Vec<String>,
    /// With --shape: also run each shape causal (top-left).
    #[arg(long)]
    causal: bool,
    /// With --shape: also run each shape with this sliding window LEFT,RIGHT (-1 =
    /// unbounded), causal too when --causal is given; FLOPs count the visible pairs.
    #[arg(long, allow_hyphen_values = true, value_parser = super::run::parse_window)]
    window: Option<Window>,
    /// f32, f16 or both (f16 rows only where the adapter has SHADER_F16).
    #[arg(long, default_value = "both")]
    dtype: String,
    /// What to time:
    ///   fused, materialized, decode, cpu (the f64 reference)
    ///   decode+fused, both (fused + materialized), all
    ///   decode+tiles: decode in the adapter's design, in the tiled one, and fused
    ///   backward, fused+backward: the backward pass (beside the forward); its GFLOP/s
    ///     count 2.5x the forward's FLOPs, as FlashAttention-2 does
    ///   backward+materialized: those and the materialized backward (small problems)
    ///   fused+merge: the forward and merge_attentions of two partials (no FLOPs)
    ///   decode+rope: split-K decode without and with a rotary embedding, then whole
    ///     decode steps (append and attend), alternated
    ///   decode+int8: decode from the dtype's K and V, then from int8 ones
    #[arg(long, default_value = "all", verbatim_doc_comment)]
    kernel: String,
    /// int8: also time attention against K and V quantized to int8 (an int8 KV cache,
    /// codes read inside split-K decode where it can), after the other rows.
    #[arg(long, value_name = "int8")]
    kv_dtype: Option<String>,
    /// Timed repetitions after the first call and one warm-up.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Size n of the n x n x n GEMM probe.
    #[arg(long, default_value_t = 512)]
    probe: usize,
    /// Whether f32 rows may multiply in f16 on tensor cores: highest (never), high or
    /// medium. f16 rows always may.
    #[arg(long, default_value = "highest", value_parser = super::run::parse_precision)]
    precision: Precision,
    /// MiB copied by the bandwidth probe (default: 1 GiB on GPUs, 256 MiB on CPU
    /// adapters; always within the device's buffer and binding limits).
    #[arg(long)]
    copy_mib: Option<u64>,
    /// Also write the results as JSON to this file (with --mha, the layer's phases).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run on every adapter found (respecting --backend), one after the other.
    #[arg(long)]
    all_adapters: bool,
    /// Compare two JSON files row by row (B's speedup over A) instead of measuring.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    compare: Vec<PathBuf>,
    /// Instead of the attention suite: time the phases of a self-attention layer with
    /// post-norm on [B, S, E] inputs with H heads (f32 unless --dtype f16).
    #[arg(long, value_name = "B,S,E,H")]
    mha: Option<String>,
    /// Decode one token per sequence against a KV cache of Lk keys: the shape
    /// B,Hq,Hkv,1,Lk,D with split-K decode and the fused kernel side by side (unless
    /// --kernel says otherwise), both reading the cache (as does every non-causal row
    /// with Lq = 1); GB/s is the cache read against the copy probe.
    #[arg(long, value_name = "B,Hq,Hkv,Lk,D")]
    decode: Option<String>,
    /// Instead of the attention suite: the host's cost of one call of a tiny problem
    /// (1,1,1,1,1,64 f32; fused and decode), median over --reps calls (at least 100):
    /// sdpa returning, and sdpa with the output read back.
    #[arg(long)]
    per_call: bool,
}

pub(super) fn parse_shape(s: &str) -> Result<AttentionShape, CliError> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::bad(format!("--shape '{s}': {e}")))?;
    if v.len() != 6 && v.len() != 7 {
        return Err(CliError::bad(format!("--shape '{s}': expected B,Hq,Hkv,Lq,Lk,D[,Dv]")));
    }
    let shape = AttentionShape::new(v[0], v[1], v[2], v[3], v[4], v[5], *v.get(6).unwrap_or(&v[5]));
    shape
        .validate()
        .and_then(|()| shape.check_options(&Default::default()))
        .map_err(|e| CliError::bad(format!("--shape '{s}': {e}")))?;
    Ok(shape)
}

/// What to measure, decided before any adapter is opened.
struct Plan {
    suite: Option<Suite>,
    shapes: Vec<AttentionShape>,
    causal: bool,
    window: Option<Window>,
    dtypes: Vec<DType>,
    kernels: Vec<BenchKernel>,
    precision: Precision,
}

impl Plan {
    fn from_args(args: &BenchArgs) -> Result<Plan, CliError> {
        let mut shapes = args
            .shape
            .iter()
            .map(|s| parse_shape(s))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(sizes) = &args.decode {
            let v: Vec<&str> = sizes.split(',').collect();
            if v.len() != 5 {
                return Err(CliError::bad(format!("--decode '{sizes}': expected B,Hq,Hkv,Lk,D")));
            }
            let shape =
                parse_shape(&format!("{},{},{},1,{},{}", v[0], v[1], v[2], v[3], v[4])).map_err(|e| match e {
                    CliError::Bad(why) => CliError::bad(format!("--decode '{sizes}': {why}")),
                    other => other,
                })?;
            shapes.push(shape);
        }
        let suite =
            if shapes.is_empty() {
                Some(Suite::parse(&args.suite).ok_or_else(|| {
                    CliError::bad(format!("--suite '{}': expected quick, standard or long", args.suite))
                })?)
            } else {
                None
            };
        let dtypes = match args.dtype.as_str() {
            "f32" => vec![DType::F32],
            "f16" => vec![DType::F16],
            "both" => vec![DType::F32, DType::F16],
            other => return Err(CliError::bad(format!("--dtype '{other}': expected f32, f16 or both"))),
        };
        let kernel = match (&args.decode, args.kernel.as_str()) {
            (Some(_), "all") => "decode+fused",
            (_, k) => k,
        };
        let kernels = BenchKernel::parse(kernel).ok_or_else(|| {
            CliError::bad(format!(
                "--kernel '{}': expected fused, materialized, decode, decode+fused, decode+tiles, cpu, both, all, backward, fused+backward, backward+materialized, fused+merge, decode+rope or decode+int8",
                args.kernel
            ))
        })?;
        let mut kernels = kernels;
        match args.kv_dtype.as_deref() {
            None => {}
            Some("int8") if !kernels.contains(&BenchKernel::DecodeInt8) => kernels.push(BenchKernel::DecodeInt8),
            Some("int8") => {}
            Some(other) => return Err(CliError::bad(format!("--kv-dtype '{other}': expected int8"))),
        }
        if args.reps == 0 || args.probe == 0 || args.copy_mib == Some(0) {
            return Err(CliError::bad("--reps, --probe and --copy-mib must be at least 1"));
        }
        Ok(Plan {
            suite,
            shapes,
            causal: args.causal,
            window: args.window,
            dtypes,
            kernels,
            precision: args.precision,
        })
    }

    /// The problems for an adapter (f16 only where it has SHADER_F16).
    fn cases(&self, f16: bool) -> Vec<BenchCase> {
        let wanted = |dtype: DType| self.dtypes.contains(&dtype) && (dtype == DType::F32 || f16);
        let mut cases = match self.suite {
            Some(suite) => suite.cases(f16),
            None => {
                let causal: &[bool] = if self.causal { &[false, true] } else { &[false] };
                let mut masks: Vec<(bool, Option<Window>)> = causal.iter().map(|&c| (c, None)).collect();
                if let Some(window) = self.window {
                    masks.push((self.causal, Some(window)));
                }
                let mut out = Vec::new();
                for &shape in &self.shapes {
                    for dtype in [DType::F32, DType::F16] {
                        for &(causal, window) in &masks {
                            out.push(BenchCase {
                                shape,
                                causal,
                                window,
                                dtype,
                                precision: self.precision,
                            });
                        }
                    }
                }
                out
            }
        };
        cases.retain(|c| wanted(c.dtype));
        for case in &mut cases {
            case.precision = self.precision;
        }
        cases
    }
}

pub fn run(adapter: &AdapterArgs, args: &BenchArgs) -> Result<(), CliError> {
    if !args.compare.is_empty() {
        return super::bench_compare::run(&args.compare[0], &args.compare[1]);
    }
    if let Some(path) = &args.json {
        super::output::check_outputs(&[path.as_path()], false)?;
    }
    if let Some(sizes) = &args.mha {
        return mha_phases(adapter, args, sizes);
    }
    if args.per_call {
        return per_call(adapter, args);
    }
    let plan = Plan::from_args(args)?;
    let contexts = if args.all_adapters {
        // Every adapter the filters admit (--backend/--adapter, else the environment).
        let adapters = adapter.selector()?.adapters()?;
        if adapters.is_empty() {
            return Err(CliError::bad("--all-adapters: no adapters found"));
        }
        adapters
            .iter()
            .map(Context::from_adapter)
            .collect::<Result<Vec<_>, _>>()?
    } else {
        vec![adapter.context()?]
    };
    let mut runs = Vec::new();
    for ctx in &contexts {
        runs.push(measure(ctx, &plan, args)?);
    }
    if runs.len() > 1 {
        print_side_by_side(&runs)?;
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "schema": SCHEMA,
            "tool_version": env!("CARGO_PKG_VERSION"),
            "unix_time": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            "suite": plan.suite.map(|s| s.name()),
            "reps": args.reps,
            "flops": "2*B*Hq*Lq*Lk*(D+Dv), i.e. 4*B*Hq*Lq*Lk*D when Dv = D; halved for causal; with a window, 2*B*Hq*(D+Dv) per visible pair",
            "compulsory_bytes": "Q, K, V read once and O written once, at the row's dtype",
            "runs": runs,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::bad(e.to_string()))?;
        write_all(&[(path, text.into_bytes())])?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs the plan on one adapter, printing its table; returns the JSON of the run.
fn measure(ctx: &Context, plan: &Plan, args: &BenchArgs) -> Result<Value, CliError> {
    let info = ctx.adapter_info();
    let cases = plan.cases(ctx.capabilities().f16);
    let fused_tiling = ctx
        .fused_config_for(FusedTiling::Auto, DType::F32, plan.precision)?
        .name();
    let fused_tiling_f16 = ctx
        .fused_config_for(FusedTiling::Auto, DType::F16, plan.precision)?
        .name();
    let decode_design =
        wgpu_attention::kernels::decode::DecodeDesign::for_context(ctx, ctx.policy(), FusedTiling::Auto)?.name();
    let gemm_tiling = ctx.linear_tiling_for(DType::F32, plan.precision).name();
    let gemm_tiling_f16 = ctx.linear_tiling_for(DType::F16, plan.precision).name();
    let clock = Clock::for_context(ctx);
    outln!(
        "adapter: {} ({:?}, {:?}), driver {} {}",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        info.driver_info
    );
    outln!(
        "timing: {}, median of {} runs after the first call and one warm-up; first call (compile) separate",
        clock.name(),
        args.reps
    );
    outln!(
        "tiles (precision {}): f32 fused {fused_tiling}, GEMM {gemm_tiling}; f16 fused {fused_tiling_f16}, GEMM {gemm_tiling_f16}; decode {decode_design}",
        plan.precision.name()
    );
    let coop: Vec<String> = ctx
        .capabilities()
        .cooperative_matrix
        .iter()
        .map(|c| c.label())
        .collect();
    outln!(
        "cooperative matrices (tensor cores): {}",
        wgpu_attention::CoopConfig::summary(&coop)
    );

    let progress = progress_bar(cases.len() * plan.kernels.len() + 1);
    progress.set_message(format!("probe on {}", info.name));
    let probe = Probe::measure(ctx, args.probe, args.copy_mib, args.reps)?;
    progress.inc(1);
    outln!(
        "probe: GEMM {0}x{0}x{0} f32 ({1}) {2:.2} ms = {3:.2} GFLOP/s",
        probe.gemm_n,
        probe.gemm_tiling,
        probe.gemm.median.as_secs_f64() * 1e3,
        probe.gemm_gflops,
    );
    outln!(
        "probe: copy {0} MiB {1:.2} ms = {2:.2} GB/s (read + write; kernel {3:.2}, driver {4:.2}): the %copy ceiling",
        probe.copy_bytes >> 20,
        probe.copy.median.as_secs_f64() * 1e3,
        probe.copy_gbps,
        probe.copy_kernel_gbps,
        probe.copy_driver_gbps
    );
    if let Some((tiling, timing, gflops)) = &probe.gemm_f16 {
        outln!(
            "probe: GEMM {0}x{0}x{0} f16 ({tiling}) {1:.2} ms = {gflops:.2} GFLOP/s (f16 rows' % of probe)",
            probe.gemm_n,
            timing.median.as_secs_f64() * 1e3,
        );
    }
    print_header()?;
    let mut rows = Vec::new();
    let mut paired_json = Vec::new();
    for case in &cases {
        progress.set_message(format!("{} {}", shape_text(&case.shape), case.dtype.name()));
        // Each kernel is its own step of the bar.
        let mut case_rows = Vec::new();
        for &kernel in &plan.kernels {
            case_rows.push(run_kernel(ctx, case, kernel, args.reps, &probe)?);
            progress.inc(1);
        }
        fill_speedups(&mut case_rows);
        // With both decode-step rows: the two kinds of step in alternation, for a ratio
        // that the machine's drift between the rows does not bias.
        let paired = if plan.kernels.contains(&BenchKernel::DecodeStepRotary) {
            Some(paired_decode_steps(ctx, case, 2 * args.reps.max(1))?)
        } else {
            None
        };
        progress.suspend(|| -> Result<(), CliError> {
            outln!("{}", case_line(case));
            case_rows.iter().try_for_each(print_row)?;
            if let Some((p, median, (lo, hi))) = paired.as_ref().and_then(|p| Some((p, p.median()?, p.range()?))) {
                outln!(
                    "  decode-step+rope / decode-step, {} pairs in alternation: median {median:.3}, range {lo:.3} to {hi:.3}",
                    p.0.len()
                );
            }
            Ok(())
        })?;
        if let Some(p) = &paired {
            paired_json.push(json!({
                "case": shape_text(&case.shape),
                "dtype": case.dtype.name(),
                "ratio": "decode-step+rope / decode-step",
                "ratios": p.0,
                "median": p.median(),
            }));
        }
        rows.extend(case_rows);
    }
    progress.finish_and_clear();
    for note in [
        "GFLOP/s count 2·B·Hq·Lq·Lk·(D+Dv), halved for causal, visible pairs only with a window;",
        "GB/s count Q, K, V, O once; %gemm and %copy are of the probe's rates; x mat and x cpu are",
        "speed-ups over the materialized and CPU-reference rows; MiB/c is GPU memory allocated per",
        "call; tok/s (Lq = 1 only) is the batch's new tokens per second.",
    ] {
        outln!("{note}");
    }
    // The CPU reference always reads the wall clock; GPU rows fall back to it.
    let walled = rows
        .iter()
        .filter(|r| r.kernel != "cpu-reference" && r.measured().is_some_and(|m| m.timing.clock != clock))
        .count();
    if walled > 0 {
        let note = format!("{walled} row(s) timed on the wall clock instead: most of their GPU timestamps were implausible (under a quarter of a wait over 2 ms for the same submission), as on Mesa 22.3's lavapipe once a KV cache's texel mirror has been dropped; the JSON's `clock` says which.");
        outln!("{}", super::check_report::wrap(&note, 0, 100));
    }

    let caps = ctx.capabilities();
    Ok(json!({
        "adapter": adapter_json(info, ctx.device().features(), &ctx.device().limits(), &caps.cooperative_matrix),
        "enabled_features": format!("{:?}", ctx.device().features()),
        "subgroups": caps.subgroups.map(|(lo, hi)| json!([lo, hi])),
        "precision": plan.precision.name(),
        "fused_tiling": fused_tiling,
        "decode_design": decode_design,
        "fused_tiling_f16": fused_tiling_f16,
        "gemm_tiling": gemm_tiling,
        "gemm_tiling_f16": gemm_tiling_f16,
        "cooperative_matrix": caps.cooperative_matrix.iter().map(|c| c.label()).collect::<Vec<_>>(),
        "timing_clock": clock.name(),
        "probe": {
            "gemm_n": probe.gemm_n,
            "gemm_median_ms": ms(probe.gemm.median),
            "gemm_gflops": probe.gemm_gflops,
            "gemm_f16_tiling": probe.gemm_f16.as_ref().map(|(tiling, _, _)| tiling),
            "gemm_f16_median_ms": probe.gemm_f16.as_ref().map(|(_, timing, _)| ms(timing.median)),
            "gemm_f16_gflops": probe.gemm_f16.as_ref().map(|(_, _, gflops)| gflops),
            "copy_bytes": probe.copy_bytes,
            "copy_median_ms": ms(probe.copy.median),
            "copy_gbps": probe.copy_gbps,
            "copy_kernel_gbps": probe.copy_kernel_gbps,
            "copy_driver_gbps": probe.copy_driver_gbps,
        },
        "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
        "paired": paired_json,
    }))
}

fn progress_bar(steps: usize) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(steps as u64), target);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}") {
        bar.set_style(style);
    }
    bar
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn shape_text(s: &AttentionShape) -> String {
    format!(
        "{},{},{},{},{},{},{}",
        s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_k, s.head_dim, s.head_dim_v
    )
}

/// The table: a line naming each case, then one row per kernel, in at most 100
/// columns (min and max times, and everything else, are in `--json`).
fn print_header() -> Result<(), CliError> {
    outln!(
        "{:<20} {:>8} {:>9} {:>8} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>10}",
        "case / kernel",
        "first ms",
        "median ms",
        "GFLOP/s",
        "GB/s",
        "%gemm",
        "%copy",
        "x mat",
        "x cpu",
        "MiB/c",
        "tok/s"
    );
    Ok(())
}

/// The line that names a case: its shape, mask and dtype.
fn case_line(case: &BenchCase) -> String {
    format!(
        "{} (B,Hq,Hkv,Lq,Lk,D,Dv) {} {}",
        shape_text(&case.shape),
        case.mask_name(),
        case.dtype.name()
    )
}

/// Whether tokens per second mean something for a case: one new token per sequence
/// (decode); for a prefill they would only restate the time.
fn is_decode(case: &BenchCase) -> bool {
    case.shape.len_q == 1
}

fn print_row(row: &BenchRow) -> Result<(), CliError> {
    let head = format!("  {:<18}", row.kernel);
    match &row.outcome {
        RowOutcome::Skipped(reason) => outln!("{head} {}", super::check_report::wrap(reason, 21, 100)),
        RowOutcome::Measured(m) => {
            let ratio = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
            let tokens = if is_decode(&row.case) {
                format!("{:.1}", m.tokens_per_second)
            } else {
                "-".to_string()
            };
            outln!(
                "{head} {:>8.1} {:>9.2} {:>8.2} {:>6.2} {:>4.0}% {:>4.0}% {:>5} {:>5} {:>6} {:>10}",
                ms(m.timing.first),
                ms(m.timing.median),
                m.gflops,
                m.gbps,
                m.percent_of_probe_gflops,
                m.percent_of_probe_gbps,
                ratio(m.speedup_over_materialized),
                ratio(m.speedup_over_cpu_reference),
                m.allocated_bytes
                    .map_or("-".to_string(), |b| format!("{:.2}", b as f64 / 1048576.0)),
                tokens,
            );
        }
    }
    Ok(())
}

fn row_json(row: &BenchRow) -> Value {
    let s = &row.case.shape;
    let mut out = json!({
        "batch": s.batch,
        "heads_q": s.heads_q,
        "heads_kv": s.heads_kv,
        "len_q": s.len_q,
        "len_k": s.len_k,
        "head_dim": s.head_dim,
        "head_dim_v": s.head_dim_v,
        "mask": row.case.mask_name(),
        "dtype": row.case.dtype.name(),
        "precision": row.case.precision.name(),
        "kernel": row.kernel,
        "flops": row.case.flops(),
        "compulsory_bytes": row.case.compulsory_bytes(),
    });
    let fields = match &row.outcome {
        RowOutcome::Skipped(reason) => json!({ "status": "skipped", "reason": reason }),
        RowOutcome::Measured(m) => json!({
            "status": "measured",
            "clock": m.timing.clock.name(),
            "reps": m.timing.reps,
            "first_ms": ms(m.timing.first),
            "median_ms": ms(m.timing.median),
            "min_ms": ms(m.timing.min),
            "max_ms": ms(m.timing.max),
            "gflops": m.gflops,
            "gbps": m.gbps,
            "tokens_per_second": m.tokens_per_second,
            "percent_of_probe_gflops": m.percent_of_probe_gflops,
            "percent_of_probe_gbps": m.percent_of_probe_gbps,
            "speedup_over_materialized": m.speedup_over_materialized,
            "speedup_over_cpu_reference": m.speedup_over_cpu_reference,
            "allocated_bytes": m.allocated_bytes,
        }),
    };
    if let (Some(out), Some(fields)) = (out.as_object_mut(), fields.as_object()) {
        out.extend(fields.clone());
    }
    out
}

/// With several adapters: each row's median on each, in one table.
fn print_side_by_side(runs: &[Value]) -> Result<(), CliError> {
    outln!();
    outln!("side by side (median ms):");
    let names: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "{} ({})",
                r["adapter"]["name"].as_str().unwrap_or("?"),
                r["adapter"]["backend"].as_str().unwrap_or("?")
            )
        })
        .collect();
    outln!("{:<60} {}", "row", names.join(" | "));
    let Some(first_rows) = runs[0]["rows"].as_array() else {
        return Ok(());
    };
    for row in first_rows {
        let key = super::bench_compare::row_key(row);
        let cells: Vec<String> = runs
            .iter()
            .map(|run| {
                run["rows"]
                    .as_array()
                    .and_then(|rows| rows.iter().find(|r| super::bench_compare::row_key(r) == key))
                    .and_then(|r| r["median_ms"].as_f64())
                    .map_or("-".to_string(), |t| format!("{t:.2}"))
            })
            .collect();
        outln!("{key:<60} {}", cells.join(" | "));
    }
    Ok(())
}

/// `bench --mha B,S,E,H`: the layer's phases side by side with the GEMM probe.
fn mha_phases(adapter: &AdapterArgs, args: &BenchArgs, sizes: &str) -> Result<(), CliError> {
    let v: Vec<usize> = sizes
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::bad(format!("--mha '{sizes}': {e}")))?;
    let &[batch, seq, embed, heads] = v.as_slice() else {
        return Err(CliError::bad(format!("--mha '{sizes}': expected B,S,E,H")));
    };
    if v.contains(&0) {
        return Err(CliError::bad(format!("--mha '{sizes}': sizes must be at least 1")));
    }
    // Before the adapter and the probe, so a bad shape costs nothing.
    MhaConfig::new(embed, heads)
        .validate()
        .map_err(|e| CliError::bad(format!("--mha '{sizes}': {e}")))?;
    let dtype = if args.dtype == "f16" { DType::F16 } else { DType::F32 };
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    outln!(
        "adapter: {} ({:?}, {:?}), driver {} {}; GEMM tiling {}",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        info.driver_info,
        ctx.linear_tiling_for(dtype, args.precision).name()
    );
    let probe = Probe::measure(&ctx, args.probe, args.copy_mib, args.reps)?;
    let probe_gflops = probe.gemm_gflops;
    outln!(
        "probe: GEMM {0}x{0}x{0} f32 {1:.2} GFLOP/s (same process, before the layer)",
        args.probe,
        probe_gflops
    );
    let measured =
        wgpu_attention::bench::mha::measure_mha(&ctx, [batch, seq, embed, heads], dtype, args.precision, args.reps)?;
    let phases = &measured.phases;
    outln!(
        "multi-head self-attention with post-norm, B={batch} S={seq} E={embed} H={heads}, {}, {}: median of {} runs",
        dtype.name(),
        phases[0].timing.clock.name(),
        phases[0].timing.reps
    );
    outln!(
        "{:<36} {:>10} {:>10} {:>8} {:>9}",
        "phase",
        "median ms",
        "GFLOP/s",
        "%gemm",
        "%layer"
    );
    // Shares of the layer's parts, which sum to 100%; alternatives and pieces get none.
    let parts: f64 = phases
        .iter()
        .filter(|p| p.part_of_layer)
        .map(|p| p.timing.median.as_secs_f64())
        .sum();
    for p in phases {
        let secs = p.timing.median.as_secs_f64();
        let rate = if p.flops > 0.0 {
            gflops(p.flops, p.timing.median)
        } else {
            0.0
        };
        let (rate_text, pct) = if p.flops > 0.0 {
            (format!("{rate:.2}"), format!("{:.0}%", 100.0 * rate / probe_gflops))
        } else {
            ("-".into(), "-".into())
        };
        let share = if p.part_of_layer {
            format!("{:.0}%", 100.0 * secs / parts.max(1e-12))
        } else {
            "-".into()
        };
        outln!(
            "{:<36} {:>10.2} {:>10} {:>8} {:>9}",
            p.name,
            1e3 * secs,
            rate_text,
            pct,
            share
        );
    }
    if let Some(whole) = phases.iter().find(|p| p.name == "whole layer") {
        outln!(
            "%layer: each part's share of the parts' sum, {:.2} ms; the whole layer in one submission took {:.2} ms",
            1e3 * parts,
            1e3 * whole.timing.median.as_secs_f64()
        );
    }
    let ratios = &measured.separate_over_packed;
    if let (Some(median), Some((low, high))) = (ratios.median(), ratios.range()) {
        let packed_faster = ratios.0.iter().filter(|&&r| r > 1.0).count();
        outln!(
            "three GEMMs / packed GEMM, {} pairs run back to back: median {median:.3}, range {low:.3} to {high:.3}; packed faster in {packed_faster} of {}",
            ratios.0.len(),
            ratios.0.len()
        );
    }
    if let Some(path) = &args.json {
        let device = ctx.device();
        let doc = json!({
            "schema": MHA_SCHEMA,
            "tool_version": env!("CARGO_PKG_VERSION"),
            "adapter": adapter_json(info, device.features(), &device.limits(), &ctx.capabilities().cooperative_matrix),
            "layer": {"batch": batch, "seq": seq, "embed": embed, "heads": heads, "dtype": dtype.name()},
            "reps": args.reps,
            "probe_gemm_gflops": probe_gflops,
            "phases": phases.iter().map(|p| json!({
                "name": p.name,
                "median_ms": 1e3 * p.timing.median.as_secs_f64(),
                "gflops": (p.flops > 0.0).then(|| gflops(p.flops, p.timing.median)),
                "part_of_layer": p.part_of_layer,
            })).collect::<Vec<_>>(),
            "separate_over_packed": ratios.0,
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::bad(e.to_string()))?;
        write_all(&[(path, text.into_bytes())])?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--per-call`: the host's cost of one tiny call, per path.
fn per_call(adapter: &AdapterArgs, args: &BenchArgs) -> Result<(), CliError> {
    use wgpu_attention::bench::per_call;
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    outln!(
        "adapter: {} ({:?}, {:?}), driver {} {}",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        info.driver_info
    );
    let s = per_call::SHAPE;
    let calls = args.reps.max(100);
    outln!(
        "per call, {},{},{},{},{},{} f32, median of {calls}:",
        s.batch,
        s.heads_q,
        s.heads_kv,
        s.len_q,
        s.len_k,
        s.head_dim
    );
    for row in per_call::measure(&ctx, calls)? {
        outln!(
            "  {:<18} sdpa returns {:>8.1} µs   with the output read back {:>8.1} µs   sdpa_read (one submission) {:>8.1} µs",
            row.kernel,
            row.record_submit.as_secs_f64() * 1e6,
            row.round_trip.as_secs_f64() * 1e6,
            row.one_submission.as_secs_f64() * 1e6
        );
    }
    Ok(())
}
