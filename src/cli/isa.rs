//! `isa`: what a GPU compiler makes of each kernel (registers, spills, scratch,
//! occupancy, instruction counts), on a Vulkan adapter or on RADV's null hardware, with
//! a budget gate for CI (docs/isa.md).

use super::output::{check_outputs, write_all};
use super::{write_stdout, CliError};
use std::path::PathBuf;
use std::process::Command;
use wgpu_attention::isa::{self, budget::Budget, kernels::IsaKernel, radv, Row, RuntimeChecks};

/// Marks the child `isa --radv-null` starts with the driver's environment.
const CHILD_VARIABLE: &str = "WGPU_ATTENTION_ISA_CHILD";

#[derive(clap::Args, Debug)]
pub struct IsaArgs {
    /// Compile on RADV's null hardware for this AMD family (navi31: RDNA3, gfx1201:
    /// RDNA4, ...): Mesa 25's RADV under $WGPU_ATTENTION_MESA25 or target/ci/mesa25
    /// (`.ci/mesa-backports.sh` unpacks it). Needs no GPU. Without it: the Vulkan
    /// device whose name contains `--adapter` (else WGPU_ADAPTER_NAME), else the first.
    #[arg(long, value_name = "FAMILY")]
    radv_null: Option<String>,
    /// Which kernels: `gpu` (what a GPU-class adapter runs from the pickers and tuners)
    /// or `all` (every variant the crate can dispatch).
    #[arg(long, default_value = "gpu", value_name = "gpu|all")]
    set: String,
    /// Only kernels whose label contains this (case-insensitive; repeatable: any).
    #[arg(long = "kernel", value_name = "TEXT")]
    kernels: Vec<String>,
    /// Runtime checks to compile with, comma-separated: checked (wgpu's default),
    /// no-loop-bound, no-bounds-checks, unchecked. The budget gates the first.
    #[arg(long, default_value = "checked", value_name = "LIST")]
    checks: String,
    /// Compile this WGSL file (its entry point `--entry`) instead of the crate's kernels;
    /// a file `--dump-wgsl` wrote names its own entry point, override values and
    /// subgroup size in its first line.
    #[arg(long, value_name = "FILE")]
    wgsl: Option<PathBuf>,
    /// The entry point of `--wgsl`.
    #[arg(long, value_name = "NAME", requires = "wgsl")]
    entry: Option<String>,
    /// Write each selected kernel's full WGSL to DIR/LABEL.wgsl, a first line naming
    /// what else it compiles with, for `--wgsl` to compile an edited copy as the crate
    /// compiles the kernel (a directory made if missing).
    #[arg(long, value_name = "DIR", conflicts_with = "wgsl")]
    dump_wgsl: Option<PathBuf>,
    /// Fail (exit 1) on any kernel outside this budget (a TSV; tune/isa-budget.tsv).
    #[arg(long, value_name = "FILE")]
    budget: Option<PathBuf>,
    /// Write the measured figures as a budget TSV (to start or tighten one).
    #[arg(long, value_name = "FILE")]
    write_budget: Option<PathBuf>,
    /// Every statistic of every kernel as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Compile on this many threads (default: the cores there are).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

pub fn run(adapter: &super::AdapterArgs, args: &IsaArgs) -> Result<(), CliError> {
    let checks = parse_checks(&args.checks)?;
    let kernels = selected(args)?;
    let budget = match &args.budget {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| CliError::bad(format!("--budget {}: {e}", path.display())))
                .and_then(|t| {
                    Budget::parse(&t).map_err(|e| CliError::bad(format!("--budget {}: {e}", path.display())))
                })?,
        ),
        None => None,
    };
    let outputs: Vec<&std::path::Path> = [&args.json, &args.write_budget]
        .into_iter()
        .flatten()
        .map(|p| p.as_path())
        .collect();
    // The table goes to standard output: no file may be `-`.
    check_outputs(&outputs, false)?;
    if args.threads == Some(0) {
        return Err(CliError::bad("--threads: at least 1"));
    }
    if let Some(dir) = &args.dump_wgsl {
        return dump_wgsl(dir, &kernels);
    }
    if let Some(family) = &args.radv_null {
        if std::env::var_os(CHILD_VARIABLE).is_none() {
            return run_on_radv(family);
        }
    }
    // Vulkan only, and by name: `--adapter` (else WGPU_ADAPTER_NAME) is matched as text
    // in the Vulkan device's name; `info`'s numbers and backend prefixes are wgpu's.
    let name = if args.radv_null.is_some() {
        Some("RADV".to_string())
    } else {
        let name = adapter
            .adapter
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok());
        if let Some(n) = name.as_deref().filter(|n| n.starts_with('#') || n.contains(':')) {
            return Err(CliError::bad(format!(
                "isa matches --adapter (or WGPU_ADAPTER_NAME) as part of a Vulkan device's name, not '{n}' \
                 (numbers and backend prefixes name wgpu's adapters)"
            )));
        }
        name
    };
    let compiler = isa::vulkan::Compiler::open(name.as_deref()).map_err(CliError::bad)?;
    let device = format!("{} ({})", compiler.info.name, compiler.info.driver.trim());
    outln!("isa: {device}, {} kernels x {} checks", kernels.len(), checks.len());
    let rows = compile_all(&compiler, &kernels, &checks, args.threads);
    print_table(&rows)?;
    let failed = rows.iter().filter(|r| r.result.is_err()).count();

    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    if let Some(path) = &args.json {
        files.push((path.clone(), json(&device, &rows).into_bytes()));
    }
    if let Some(path) = &args.write_budget {
        let default_rows: Vec<Row> = rows.iter().filter(|r| r.checks == checks[0]).cloned().collect();
        let header = vec![
            format!("Written by `wgpu-attention isa --write-budget` on {device}"),
            format!(
                "runtime checks: {}; the gate (`isa --budget`) fails on any kernel above its row",
                checks[0].label()
            ),
        ];
        files.push((path.clone(), Budget::write(&default_rows, &header).into_bytes()));
    }
    write_all(&files)?;

    if let Some(budget) = budget {
        let gated: Vec<Row> = rows.iter().filter(|r| r.checks == checks[0]).cloned().collect();
        let (broken, unmeasured) = budget.check(&gated);
        if !unmeasured.is_empty() && args.kernels.is_empty() && args.wgsl.is_none() {
            outln!(
                "budget: {} rows measured by nothing (retired kernels?): {}",
                unmeasured.len(),
                unmeasured.join("; ")
            );
        }
        if !broken.is_empty() {
            for line in &broken {
                outln!("over budget: {line}");
            }
            return Err(CliError::Failed(format!("{} kernels outside the budget", broken.len())));
        }
        outln!("budget: every kernel within its row ({} kernels)", gated.len());
    }
    if failed > 0 {
        return Err(CliError::Failed(format!(
            "{failed} kernels did not compile (rows above)"
        )));
    }
    Ok(())
}

/// Runs this command again in a child that sees only RADV's null device.
fn run_on_radv(family: &str) -> Result<(), CliError> {
    let driver = radv::find_driver().map_err(CliError::bad)?;
    let scratch = std::env::temp_dir().join(format!("wgpu-attention-isa-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| CliError::bad(format!("{}: {e}", scratch.display())))?;
    let environment = radv::environment(&driver, family, &scratch).map_err(CliError::bad);
    let result = environment.and_then(|environment| {
        let exe = std::env::current_exe().map_err(|e| CliError::bad(format!("cannot find this program: {e}")))?;
        let mut child = Command::new(exe)
            .args(std::env::args_os().skip(1))
            .envs(environment)
            .env(CHILD_VARIABLE, "1")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| CliError::bad(format!("cannot start isa on RADV: {e}")))?;
        // The null device's one warning (no PCI bus) is noise; everything else is shown.
        if let Some(stderr) = child.stderr.take() {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if !radv::is_null_device_noise(&line) {
                    eprintln!("{line}");
                }
            }
        }
        let status = child.wait().map_err(|e| CliError::bad(format!("isa on RADV: {e}")))?;
        match status.code() {
            Some(0) => Ok(()),
            Some(1) => Err(CliError::Failed("isa on RADV's null hardware (above)".into())),
            _ => Err(CliError::bad(format!(
                "isa on RADV's null hardware ended with {status} (above)"
            ))),
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn parse_checks(list: &str) -> Result<Vec<RuntimeChecks>, CliError> {
    let mut out = Vec::new();
    for name in list.split(',') {
        let checks = RuntimeChecks::parse("--checks", name)?;
        if out.contains(&checks) {
            return Err(CliError::bad(format!("--checks: '{name}' is listed twice")));
        }
        out.push(checks);
    }
    Ok(out)
}

/// Writes each kernel's source, with the header `--wgsl` reads, under `dir`.
fn dump_wgsl(dir: &std::path::Path, kernels: &[IsaKernel]) -> Result<(), CliError> {
    let files: Vec<(PathBuf, Vec<u8>)> = kernels
        .iter()
        .map(|k| (dir.join(format!("{}.wgsl", k.file_stem())), k.dumped().into_bytes()))
        .collect();
    std::fs::create_dir_all(dir).map_err(|e| CliError::bad(format!("--dump-wgsl {}: {e}", dir.display())))?;
    write_all(&files)?;
    outln!("isa: {} kernels written under {}", files.len(), dir.display());
    Ok(())
}

/// The kernels the arguments select; an empty selection is refused (nothing measured is
/// not a result).
fn selected(args: &IsaArgs) -> Result<Vec<IsaKernel>, CliError> {
    if let Some(path) = &args.wgsl {
        let source =
            std::fs::read_to_string(path).map_err(|e| CliError::bad(format!("--wgsl {}: {e}", path.display())))?;
        let kernel = IsaKernel::from_source(path.display().to_string(), source, args.entry.clone())
            .map_err(|e| CliError::bad(format!("--wgsl {}: {e}", path.display())))?;
        return Ok(vec![kernel]);
    }
    let all = match args.set.as_str() {
        "gpu" => isa::kernels::gpu(),
        "all" => isa::kernels::all(),
        other => return Err(CliError::bad(format!("--set: '{other}' is not gpu or all"))),
    };
    let wanted: Vec<String> = args.kernels.iter().map(|k| k.to_lowercase()).collect();
    let kernels: Vec<IsaKernel> = all
        .into_iter()
        .filter(|k| wanted.is_empty() || wanted.iter().any(|w| k.label.to_lowercase().contains(w)))
        .collect();
    if kernels.is_empty() {
        return Err(CliError::bad(format!(
            "no kernel of --set {} has a label containing {}",
            args.set,
            wanted.join(" or ")
        )));
    }
    Ok(kernels)
}

/// Compiles every kernel under every checks setting on `threads` threads, in order.
fn compile_all(
    compiler: &isa::vulkan::Compiler,
    kernels: &[IsaKernel],
    checks: &[RuntimeChecks],
    threads: Option<usize>,
) -> Vec<Row> {
    let jobs: Vec<(&IsaKernel, RuntimeChecks)> = kernels
        .iter()
        .flat_map(|k| checks.iter().map(move |&c| (k, c)))
        .collect();
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(kernel, checks)) = jobs.get(i) else { break };
                let row = isa::compile(compiler, kernel, checks);
                rows.lock().unwrap_or_else(|p| p.into_inner()).push((i, row));
            });
        }
    });
    let mut rows = rows.into_inner().unwrap_or_else(|p| p.into_inner());
    rows.sort_by_key(|(i, _)| *i);
    rows.into_iter().map(|(_, r)| r).collect()
}

/// The statistics the table shows (JSON has all): RADV's names; other drivers' rows
/// show what they share with these, and `--json` for the rest.
const SHOWN: [(&str, &str); 8] = [
    ("VGPRs", "VGPRs"),
    ("SGPRs", "SGPRs"),
    ("Spilled VGPRs", "spill V"),
    ("Spilled SGPRs", "spill S"),
    ("Scratch size", "scratch"),
    ("LDS size", "LDS"),
    ("Subgroups per SIMD", "waves"),
    ("Instructions", "instrs"),
];

fn print_table(rows: &[Row]) -> Result<(), CliError> {
    let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(6).max(6);
    let mut header = format!("{:<width$}  {:>7}  {:>3}", "kernel", "checks", "sg");
    for (_, short) in SHOWN {
        header.push_str(&format!("  {short:>7}"));
    }
    outln!("{header}");
    for row in rows {
        let mut line = format!("{:<width$}  {:>7}", row.label, short_checks(row.checks));
        match &row.result {
            Ok(exe) => {
                line.push_str(&format!("  {:>3}", exe.subgroup_size));
                for (name, _) in SHOWN {
                    match row.stat(name) {
                        Some(v) => line.push_str(&format!("  {v:>7}")),
                        None => line.push_str(&format!("  {:>7}", "-")),
                    }
                }
            }
            Err(e) => line.push_str(&format!("  error: {}", e.lines().next().unwrap_or(""))),
        }
        write_stdout(format_args!("{line}"))?;
    }
    Ok(())
}

fn short_checks(c: RuntimeChecks) -> &'static str {
    match (c.loop_bounding, c.bounds_checks) {
        (true, true) => "checked",
        (false, true) => "no-loop",
        (true, false) => "no-bnds",
        (false, false) => "none",
    }
}

fn json(device: &str, rows: &[Row]) -> String {
    use serde_json::{json, Map, Value};
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut o = Map::new();
            o.insert("kernel".into(), json!(r.label));
            o.insert("checks".into(), json!(r.checks.label()));
            o.insert("required_subgroup".into(), json!(r.required_subgroup));
            match &r.result {
                Ok(exe) => {
                    o.insert("executable".into(), json!(exe.name));
                    o.insert("subgroup".into(), json!(exe.subgroup_size));
                    let stats: Map<String, Value> = exe
                        .statistics
                        .iter()
                        .map(|s| (s.name.clone(), json!(s.value)))
                        .collect();
                    o.insert("statistics".into(), Value::Object(stats));
                }
                Err(e) => {
                    o.insert("error".into(), json!(e));
                }
            }
            Value::Object(o)
        })
        .collect();
    let report = json!({ "device": device, "kernels": rows });
    format!("{}\n", serde_json::to_string_pretty(&report).unwrap_or_default())
}
