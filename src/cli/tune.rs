//! `tune`: every fused tiling the adapter can run, every tensor-core variant that fits
//! it and every lane count of the micro-tile tiling, over a list of shapes: each checked against the CPU reference on a small
//! problem of the same head dims, then timed; a table, optional JSON, and the winning
//! tensor-core variant per head-dim class written into a tuning table the library reads
//! (`wgpu_attention::tune`).

use super::output::write_all;
use super::tune_scoring::{shape_label, winners, Deadline, Scored};
use super::{write_stdout, AdapterArgs, CliError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use wgpu_attention::bench::{bench_inputs, gflops, time_gpu};
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::kernels::backward_coop::CoopBackwardVariant;
use wgpu_attention::kernels::flash::{micro_lanes, spec, CoopVariant, FUSED_TILINGS};
use wgpu_attention::report::adapter_json;
use wgpu_attention::tune::{coop_candidates, coop_forms, read_table_text, TuneEntry, TuneTable};
use wgpu_attention::{
    encode_sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Error, FusedTiling, KernelChoice,
    Layout, Precision,
};

/// Version tag of the JSON this command writes.
pub const SCHEMA: &str = "wgpu-attention-tune/1";

#[derive(clap::Args)]
pub struct TuneArgs {
    /// B,Hq,Hkv,Lq,Lk,D[,Dv] (repeatable). Default: D = 64, 128 and 256 at L = 4096 on
    /// GPUs, at L = 256 (D = 64, 128) on CPU adapters.
    #[arg(long)]
    shape: Vec<String>,
    /// f16, f32 (tensor cores at precision medium) or both; default: f16 where the
    /// adapter has SHADER_F16, else f32.
    #[arg(long)]
    dtype: Option<String>,
    /// Timed repetitions after the first call and one warm-up.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Write every row and the winners as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Add the winners to this tuning table (created if absent; entries for other
    /// adapters and classes kept). `user` names the table the library reads for this
    /// user (WGPU_ATTENTION_TUNE_FILE, else ~/.config/wgpu-attention/tune.tsv).
    #[arg(long, value_name = "FILE|user")]
    table: Option<String>,
    /// Only these tensor-core variants (comma-separated DMAXxBRxBC, then `r32` for two
    /// bands per subgroup, `d` for K and V loaded from storage, `n` for named fragments,
    /// e.g. `128x64x32,128x64x48r32dn`), where they fit; default: every one that fits,
    /// in every form.
    #[arg(long, value_name = "LIST")]
    variants: Option<String>,
    /// Run the tensor-core variants with their cooperative-matrix operations emulated
    /// (adapters without tensor cores, e.g. lavapipe in CI): checks every variant's
    /// logic; the timings say nothing about tensor cores.
    #[arg(long)]
    emulate_coop: bool,
    /// Time every candidate split into each of these numbers of key ranges, merged by
    /// log-sum-exp (comma-separated, 1 to 16; e.g. `1,2,4` for a problem whose grid is
    /// smaller than the GPU). Winners are taken from unsplit rows.
    #[arg(long, value_name = "LIST", default_value = "1")]
    key_splits: String,
    /// Only these fused tilings (comma-separated names `info` lists, e.g.
    /// `micro,shared`); default: every one the adapter runs.
    #[arg(long, value_name = "LIST")]
    tilings: Option<String>,
    /// Time the tensor-core backward's variants instead (rows per workgroup, walked
    /// tile, arrayed or named; `--variants` then names those, e.g. `128x64x32n`): each
    /// checked against the f64 reference gradients, then timed; no tuning table.
    #[arg(long, conflicts_with_all = ["table", "key_splits", "tilings"])]
    backward: bool,
    /// Start no candidate after this many seconds; report (table, JSON, winners) what
    /// was measured by then. For a GPU lent for a short time, where a killed run would
    /// leave no table.
    #[arg(long, value_name = "SECONDS")]
    deadline: Option<u64>,
}

/// What a candidate pins beyond its tiling: a tensor-core variant, or the lanes the
/// micro-tile tiling reduces rows over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pin {
    Coop(CoopVariant),
    MicroLanes(u32),
}

impl Pin {
    fn label(self) -> String {
        match self {
            Pin::Coop(v) => v.label(),
            Pin::MicroLanes(lanes) => format!("lanes{lanes}"),
        }
    }

    fn coop(self) -> Option<CoopVariant> {
        match self {
            Pin::Coop(v) => Some(v),
            Pin::MicroLanes(_) => None,
        }
    }
}

/// One measured candidate.
struct Row {
    shape: AttentionShape,
    dtype: DType,
    tiling: &'static str,
    variant: Option<Pin>,
    /// Key ranges the attention was split into.
    key_splits: u32,
    /// `ok`, or why not (a failed check, a refused limit).
    status: String,
    median_ms: Option<f64>,
    gflops: Option<f64>,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "shape": [self.shape.batch, self.shape.heads_q, self.shape.heads_kv, self.shape.len_q,
                      self.shape.len_k, self.shape.head_dim, self.shape.head_dim_v],
            "dtype": self.dtype.name(),
            "tiling": self.tiling,
            "variant": self.variant.map(Pin::label),
            "key_splits": self.key_splits,
            "status": self.status,
            "median_ms": self.median_ms,
            "gflops": self.gflops,
        })
    }
}

pub fn run(adapter: &AdapterArgs, args: &TuneArgs) -> Result<(), CliError> {
    // Every refusal comes before anything is measured or written: the flags first, then
    // the outputs (checked, not made: the table's directories are made when it is
    // written), the adapter, and what the flags ask of it (`plan`).
    if args.reps == 0 {
        return Err(CliError::bad("--reps must be at least 1"));
    }
    let table_path = match args.table.as_deref() {
        Some("") => {
            return Err(CliError::bad(
                "--table: an empty path names no file (give FILE or user)",
            ))
        }
        Some("user") => {
            Some(TuneTable::user_path()?.ok_or_else(|| CliError::bad("--table user: no HOME or XDG_CONFIG_HOME"))?)
        }
        Some(path) => Some(PathBuf::from(path)),
        None => None,
    };
    if args.json.as_ref().is_some_and(|j| j.as_os_str().is_empty()) {
        return Err(CliError::bad("--json: an empty path names no file"));
    }
    let asked: Option<Vec<DType>> = match args.dtype.as_deref() {
        None => None,
        Some("f16") => Some(vec![DType::F16]),
        Some("f32") => Some(vec![DType::F32]),
        Some("both") => Some(vec![DType::F16, DType::F32]),
        Some(other) => return Err(CliError::bad(format!("--dtype '{other}': expected f16, f32 or both"))),
    };
    let backward_only: Option<Vec<CoopBackwardVariant>> = match &args.variants {
        Some(list) if args.backward => Some(
            list.split(',')
                .map(|v| {
                    CoopBackwardVariant::parse_valid(v)
                        .filter(|p| p.label() == v)
                        .ok_or_else(|| {
                            CliError::bad(format!(
                                "--variants: '{v}' is not a backward DMAXxBRxBC[n] variant (multiples of 16: DMAX \
                                 up to 128, BR up to 128 and at most 2 BC, BC up to 256; n: named)"
                            ))
                        })
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => None,
    };
    let only: Option<Vec<CoopVariant>> = match &args.variants {
        None => None,
        Some(_) if args.backward => None,
        Some(list) => Some(list.split(',').map(parse_variant).collect::<Result<_, _>>()?),
    };
    let mut key_splits: Vec<u32> = Vec::new();
    for n in args.key_splits.split(',') {
        let n = wgpu_attention::tune::parse_key_splits("--key-splits", n)?;
        if key_splits.contains(&n) {
            return Err(CliError::bad(format!("--key-splits: {n} is listed twice")));
        }
        key_splits.push(n);
    }
    let tilings: Option<Vec<FusedTiling>> = match &args.tilings {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(
                    |name| match wgpu_attention::kernels::flash::parse_tiling("--tilings", name) {
                        Ok(FusedTiling::Auto) => Err(CliError::bad("--tilings: name tilings; auto is none")),
                        other => other.map_err(CliError::from),
                    },
                )
                .collect::<Result<_, _>>()?,
        ),
    };
    let explicit_shapes = args
        .shape
        .iter()
        .map(|s| super::bench::parse_shape(s))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs: Vec<&Path> = args
        .json
        .iter()
        .map(PathBuf::as_path)
        .chain(table_path.as_deref())
        .collect();
    super::output::check_outputs_making_dirs(&outputs, false, table_path.as_deref())?;
    // The existing table is read first: a bad one (or a path that cannot be one) is
    // refused before any measuring. It is read again, under a lock, when written.
    if let Some(path) = &table_path {
        read_table(path)?;
    }
    let mut ctx = adapter.context()?;
    let f16 = ctx.capabilities().f16;
    let dtypes = match asked {
        None => vec![if f16 { DType::F16 } else { DType::F32 }],
        Some(d) if d.contains(&DType::F16) && !f16 => {
            return Err(CliError::bad("--dtype f16: the adapter has no SHADER_F16"))
        }
        Some(d) => d,
    };
    if args.emulate_coop {
        ctx.emulate_cooperative_matrix()?;
    }
    let gpu = !ctx.is_cpu_adapter();
    let shapes = if explicit_shapes.is_empty() {
        let defaults: &[&str] = if gpu {
            &["4,16,16,4096,4096,64", "4,16,16,4096,4096,128", "2,16,16,4096,4096,256"]
        } else {
            &["1,4,4,256,256,64", "1,4,4,256,256,128"]
        };
        defaults
            .iter()
            .map(|s| super::bench::parse_shape(s))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        explicit_shapes
    };
    let deadline = Deadline::new(args.deadline);
    if args.backward {
        let request = super::tune_backward::Request {
            deadline: &deadline,
            shapes: &shapes,
            dtypes: &dtypes,
            reps: args.reps,
            only: backward_only,
            json: args.json.clone(),
        };
        return super::tune_backward::run(&mut ctx, &request);
    }
    let asked = Asked {
        tilings: tilings.as_deref(),
        variants: only.as_deref(),
        key_splits: &key_splits,
    };
    let (jobs, notes) = plan(&ctx, &shapes, &dtypes, &asked)?;
    let pinned = ctx.policy().coop_tuned.clone();
    let mut rows = Vec::new();
    for note in &notes {
        write_stdout(format_args!("{note}"))?;
    }
    write_stdout(format_args!(
        "{:<28} {:<5} {:<10} {:<10} {:>10} {:>10}  check",
        "shape (B,Hq,Hkv,Lq,Lk,D,Dv)", "dtype", "tiling", "variant", "median ms", "GFLOP/s"
    ))?;
    // The timed problem's inputs, drawn and uploaded once per shape and dtype (not once
    // per candidate: ~100M random numbers at a GPU's shapes), one set kept at a time.
    let mut inputs: Option<TimedInputs> = None;
    for job in jobs {
        if deadline.passed(rows.len())? {
            break;
        }
        let Job {
            shape,
            dtype,
            tiling,
            pin,
            splits,
        } = job;
        match pin {
            Some(Pin::Coop(v)) => ctx.use_coop_variants(vec![v]),
            Some(Pin::MicroLanes(lanes)) => ctx.use_micro_lanes(Some(lanes))?,
            None => {}
        }
        ctx.use_key_splits(splits)?;
        let row = measure(&ctx, shape, dtype, tiling, pin, args.reps, &mut inputs);
        ctx.use_coop_variants(pinned.clone());
        ctx.use_micro_lanes(None)?;
        ctx.use_key_splits(1)?;
        let row = Row {
            key_splits: splits,
            ..row?
        };
        write_stdout(format_args!(
            "{:<28} {:<5} {:<10} {:<10} {:>10} {:>10}  {}",
            shape_label(&row.shape),
            row.dtype.name(),
            row.tiling,
            variant_column(&row),
            row.median_ms.map_or("-".into(), |t| format!("{t:.3}")),
            row.gflops.map_or("-".into(), |g| format!("{g:.1}")),
            row.status
        ))?;
        rows.push(row);
    }

    let winners = coop_winners(&rows);
    for (v, gf) in &winners {
        write_stdout(format_args!(
            "winner, tensor cores, head dims up to {}: {} ({gf:.1} GFLOP/s{})",
            v.dmax,
            v.label(),
            if ctx.capabilities().coop_emulated {
                ", emulated"
            } else {
                ""
            }
        ))?;
    }
    let entries: Vec<TuneEntry> = winners
        .iter()
        .map(|(v, _)| TuneEntry::for_adapter(ctx.adapter_info(), *v))
        .collect();
    let mut files = Vec::new();
    if let Some(path) = &args.json {
        let device = ctx.device();
        let doc = json!({
            "schema": SCHEMA,
            "tool_version": env!("CARGO_PKG_VERSION"),
            "adapter": adapter_json(ctx.adapter_info(), device.features(), &device.limits(), &ctx.capabilities().cooperative_matrix),
            "emulated_coop": ctx.capabilities().coop_emulated,
            "reps": args.reps,
            "flops": "4*B*Hq*Lq*Lk*D when Dv = D (2*B*Hq*Lq*Lk*(D+Dv))",
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "winners": winners.iter().map(|(v, gf)| json!({"tiling": "coop", "variant": v.label(), "dmax": v.dmax, "gflops": gf})).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::bad(e.to_string()))?;
        files.push((path.clone(), text.into_bytes()));
    }
    let wrong: Vec<String> = rows
        .iter()
        .filter(|r| r.status.starts_with("WRONG"))
        .map(|r| {
            format!(
                "{} {} {}",
                shape_label(&r.shape),
                r.tiling,
                r.variant.map_or(String::new(), Pin::label)
            )
        })
        .collect();
    write_all(&files)?;
    for (path, _) in &files {
        eprintln!("wrote {}", path.display());
    }
    // A table is written only from a run where every candidate was right.
    if let Some(path) = table_path.as_ref().filter(|_| wrong.is_empty()) {
        merge_into_table(path, &entries)?;
        eprintln!("wrote {}", path.display());
    }
    if !wrong.is_empty() {
        return Err(CliError::Failed(format!(
            "wrong results from: {} (no tuning table written)",
            wrong.join("; ")
        )));
    }
    Ok(())
}

/// The table at `path` as text (empty where there is none yet), refused unless it is a
/// small regular file that parses.
fn read_table(path: &Path) -> Result<String, CliError> {
    let text = read_table_text(path)?.unwrap_or_default();
    TuneTable::parse(&path.display().to_string(), &text)?;
    Ok(text)
}

/// Sets `entries` in the table at `path`, keeping its other lines (comments included).
/// The read, merge and write happen under an exclusive lock on a file beside the
/// table, so two `tune` runs ending together both land (each re-reads what the other
/// wrote) instead of the later one's rewrite dropping the earlier one's entries.
fn merge_into_table(path: &Path, entries: &[TuneEntry]) -> Result<(), CliError> {
    // The user table's directory may not exist yet on a fresh machine. It is made only
    // now, when there is a table to write: a run refused or failed leaves none behind.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::create_dir_all(dir).map_err(|e| CliError::bad(format!("cannot create {}: {e}", dir.display())))?;
    }
    // Beside the file itself, so that two links to one table share a lock.
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lock_path = real.with_file_name(format!(".{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| CliError::bad(format!("cannot open the table's lock {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| CliError::bad(format!("cannot lock {}: {e}", lock_path.display())))?;
    let text = read_table(path)?;
    let merged = TuneTable::merged_text(&path.display().to_string(), &text, entries)?;
    write_all(&[(path, merged.into_bytes())])
    // The lock is released when `lock` is dropped, after the rename.
}

/// The tilings the adapter runs for this problem: for tensor cores every variant of the
/// head-dim class that holds it, for the micro-tile tiling every lane count its
/// subgroups allow.
fn candidates(ctx: &Context, shape: &AttentionShape) -> Vec<(FusedTiling, Option<Pin>)> {
    let caps = ctx.capabilities();
    let mut out = Vec::new();
    for s in FUSED_TILINGS.iter().filter(|s| s.unmet("", caps).is_none()) {
        if s.tiling == FusedTiling::Micro {
            // The most lanes the adapter allows, ignoring a pin.
            let most = micro_lanes(caps, &wgpu_attention::Policy::default());
            for lanes in [1, 8, 16].into_iter().filter(|&l| l <= most) {
                out.push((s.tiling, Some(Pin::MicroLanes(lanes))));
            }
            continue;
        }
        if s.tiling != FusedTiling::Coop {
            out.push((s.tiling, None));
            continue;
        }
        let need = shape.head_dim.max(shape.head_dim_v) as u32;
        let Some(class) = [64, 128, 256].into_iter().find(|&c| need <= c) else {
            continue;
        };
        let sg = caps.coop_subgroup_size().unwrap_or(32);
        for v in coop_candidates(class, sg, caps.max_workgroup_storage, caps.max_invocations) {
            out.push((s.tiling, Some(Pin::Coop(v))));
        }
    }
    out
}

/// One `--variants` entry: a forward variant exactly as [`CoopVariant::label`] writes
/// it (so `r16`, which parses as one band, and `064x16x16` are refused, not read as
/// something else), one or two bands per subgroup (`r32`), as `tune` builds them.
fn parse_variant(text: &str) -> Result<CoopVariant, CliError> {
    CoopVariant::parse_valid(text)
        .filter(|v| v.label() == text && v.bands <= 2)
        .ok_or_else(|| {
            CliError::bad(format!(
                "--variants: '{text}' is not a DMAXxBRxBC[r32][d][n] variant (multiples of 16: DMAX up \
                 to 256, BR up to 128 and at most 2 BC, BC up to 256; r32: two bands per subgroup, \
                 d: K and V from storage, n: named fragments)"
            ))
        })
}

/// What `--tilings`, `--variants` and `--key-splits` ask for.
struct Asked<'a> {
    tilings: Option<&'a [FusedTiling]>,
    variants: Option<&'a [CoopVariant]>,
    key_splits: &'a [u32],
}

/// One candidate to check and time: a tiling with its pin, at a shape, dtype and the
/// number of key ranges it runs in.
struct Job {
    shape: AttentionShape,
    dtype: DType,
    tiling: FusedTiling,
    pin: Option<Pin>,
    splits: u32,
}

/// Every candidate `tune` will measure, in order, and notes for the user (a key-split
/// count that runs as fewer ranges at some shape). Refused, before anything is measured,
/// where a tiling, variant or key-split count asked for would run nowhere: a run that
/// measures nothing of what was asked must not look like one that did.
fn plan(
    ctx: &Context,
    shapes: &[AttentionShape],
    dtypes: &[DType],
    asked: &Asked,
) -> Result<(Vec<Job>, Vec<String>), CliError> {
    let caps = ctx.capabilities();
    let coop_hint = |tiling: FusedTiling| {
        if tiling == FusedTiling::Coop && !caps.coop_emulated {
            "; --emulate-coop emulates them"
        } else {
            ""
        }
    };
    let coop_unmet = spec(FusedTiling::Coop).and_then(|s| s.unmet(&ctx.adapter_info().name, caps));
    for &tiling in asked.tilings.unwrap_or_default() {
        if let Some(why) = spec(tiling).and_then(|s| s.unmet(&ctx.adapter_info().name, caps)) {
            return Err(CliError::bad(format!(
                "--tilings {}: {why}{}",
                spec(tiling).map_or("?", |s| s.name),
                coop_hint(tiling)
            )));
        }
    }
    if asked.variants.is_some() {
        if let Some(why) = &coop_unmet {
            return Err(CliError::bad(format!(
                "--variants names tensor-core variants: {why}{}",
                coop_hint(FusedTiling::Coop)
            )));
        }
        if asked.tilings.is_some_and(|t| !t.contains(&FusedTiling::Coop)) {
            return Err(CliError::bad(
                "--variants names tensor-core variants, but --tilings leaves out coop",
            ));
        }
    }
    let mut jobs = Vec::new();
    let mut notes = Vec::new();
    for shape in shapes {
        // The counts that run at this shape, each once: a count asked for that runs as
        // fewer ranges here is measured (and labelled) as what runs.
        let mut splits: Vec<u32> = Vec::new();
        for &n in asked.key_splits {
            let ran = splits_run(caps, shape, n);
            if ran != n {
                let also = if splits.contains(&ran) || asked.key_splits.contains(&ran) {
                    ", measured once"
                } else {
                    ""
                };
                notes.push(format!(
                    "{}: --key-splits {n} runs as {ran} (key splits are whole 64-key tiles; Lk {}){also}",
                    shape_label(shape),
                    shape.len_k
                ));
            }
            if !splits.contains(&ran) {
                splits.push(ran);
            }
        }
        for &dtype in dtypes {
            for (tiling, pin) in candidates(ctx, shape) {
                let tiling_asked = asked.tilings.is_none_or(|t| t.contains(&tiling));
                let variant_asked = match (asked.variants, pin.and_then(Pin::coop)) {
                    (Some(only), Some(v)) => only.contains(&v),
                    _ => true,
                };
                if !(tiling_asked && variant_asked) {
                    continue;
                }
                for &n in &splits {
                    let served = match pin.and_then(Pin::coop) {
                        Some(v) if v.direct => direct_serves_plain(&v, shape, dtype, n),
                        _ => true,
                    };
                    if served {
                        jobs.push(Job {
                            shape: *shape,
                            dtype,
                            tiling,
                            pin,
                            splits: n,
                        });
                    }
                }
            }
        }
    }
    for &tiling in asked.tilings.unwrap_or_default() {
        if !jobs.iter().any(|j| j.tiling == tiling) {
            return Err(CliError::bad(format!(
                "--tilings {}: runs no --shape on this adapter (tensor cores take head dims up to 256)",
                spec(tiling).map_or("?", |s| s.name)
            )));
        }
    }
    for &v in asked.variants.unwrap_or_default() {
        if !jobs.iter().any(|j| j.pin == Some(Pin::Coop(v))) {
            return Err(CliError::bad(format!(
                "--variants {}: {}",
                v.label(),
                why_not_run(ctx, v, shapes, dtypes)
            )));
        }
    }
    for &n in asked.key_splits {
        if !jobs.iter().any(|j| j.splits == n) {
            let runs: Vec<String> = shapes
                .iter()
                .map(|s| format!("{} at Lk {}", splits_run(caps, s, n), s.len_k))
                .collect();
            return Err(CliError::bad(format!(
                "--key-splits {n}: no --shape runs in {n} key ranges (key splits are whole 64-key tiles, and \
                 none where the merge would not fit: it runs as {})",
                runs.join(", ")
            )));
        }
    }
    if jobs.is_empty() {
        return Err(CliError::bad(
            "nothing to measure: no candidate runs these shapes on this adapter",
        ));
    }
    Ok((jobs, notes))
}

/// Why a tensor-core variant asked for runs on none of the shapes and dtypes.
fn why_not_run(ctx: &Context, v: CoopVariant, shapes: &[AttentionShape], dtypes: &[DType]) -> String {
    let caps = ctx.capabilities();
    let class_of = |s: &AttentionShape| {
        let need = s.head_dim.max(s.head_dim_v) as u32;
        [64, 128, 256].into_iter().find(|&c| need <= c)
    };
    if ![64, 128, 256].contains(&v.dmax) {
        return "tune times tensor-core variants of DMAX 64, 128 or 256 (the head-dim classes)".into();
    }
    if !shapes.iter().any(|s| class_of(s) == Some(v.dmax)) {
        let lowest = if v.dmax == 64 { 1 } else { v.dmax / 2 + 1 };
        return format!(
            "it serves head dims of {} to {} (the class of DMAX {}), and no --shape has them",
            lowest, v.dmax, v.dmax
        );
    }
    let sg = caps.coop_subgroup_size().unwrap_or(32);
    if coop_forms(v.dmax, sg, caps.max_workgroup_storage, caps.max_invocations).contains(&v)
        && !coop_candidates(v.dmax, sg, caps.max_workgroup_storage, caps.max_invocations).contains(&v)
    {
        return "a GPU compiler spills its registers to memory (RDNA3 through `isa`: docs/isa.md), so tune no longer \
                offers it"
            .into();
    }
    if !coop_candidates(v.dmax, sg, caps.max_workgroup_storage, caps.max_invocations).contains(&v) {
        return format!(
            "it does not fit this adapter ({} bytes of workgroup memory, {} invocations, subgroups of {sg})",
            caps.max_workgroup_storage, caps.max_invocations
        );
    }
    if v.direct {
        let dtypes: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
        return format!(
            "a direct variant runs itself only on f16 problems with D = Dv = {} and Lk a multiple of {} \
             (and split keys only where {} divides 64); no --shape at --dtype {} is one",
            v.dmax,
            v.bc,
            v.bc,
            dtypes.join(",")
        );
    }
    "it runs on no --shape".into()
}

/// The key ranges a fused attention of `shape` runs in when `asked` are pinned: whole
/// 64-key tiles each (fewer ranges where Lk is short), and one where the merge's grid
/// or state would not fit. The library's rule (the attention plan; docs/design.md,
/// "Key splits"), repeated here so that a row names what ran.
fn splits_run(caps: &wgpu_attention::Capabilities, shape: &AttentionShape, asked: u32) -> u32 {
    if asked <= 1 {
        return 1;
    }
    let rows = (shape.batch_heads() as u64).saturating_mul(shape.len_q as u64);
    let merge_fits = rows.div_ceil(64) <= u64::from(caps.max_workgroups_per_dim)
        && rows.saturating_mul(4).saturating_mul(shape.head_dim_v as u64) <= caps.max_storage_binding;
    if !merge_fits || shape.len_k == 0 {
        return 1;
    }
    let per = shape.len_k.div_ceil(asked as usize).next_multiple_of(64);
    shape.len_k.div_ceil(per) as u32
}

/// Whether a direct coop variant runs itself (not its staged twin) on tune's plain
/// problems of `shape`: f16, head dims its DMAX, and key tiles at multiples of its BC,
/// key splits included (which start at multiples of 64 keys; kernels::flash's
/// `direct_serves` for the rule).
fn direct_serves_plain(v: &CoopVariant, shape: &AttentionShape, dtype: DType, splits: u32) -> bool {
    let bc = v.bc as usize;
    dtype == DType::F16
        && shape.head_dim == v.dmax as usize
        && shape.head_dim_v == v.dmax as usize
        && shape.len_k.is_multiple_of(bc)
        && (splits <= 1 || 64 % bc == 0)
}

/// The table's variant column: the pin, and `/kN` for N key splits.
fn variant_column(row: &Row) -> String {
    let pin = row.variant.map_or("-".into(), Pin::label);
    match row.key_splits {
        1 => pin,
        n => format!("{pin}/k{n}"),
    }
}

/// Options for one candidate: f32 on tensor cores runs at precision medium.
fn options(tiling: FusedTiling, dtype: DType) -> AttentionOptions {
    let f16_products = spec(tiling).is_some_and(|s| s.f16_products);
    AttentionOptions {
        kernel: KernelChoice::Fused,
        tiling,
        precision: if f16_products && dtype == DType::F32 {
            Precision::Medium
        } else {
            Precision::Highest
        },
        ..Default::default()
    }
}

/// A timed problem's inputs and the shape and dtype they are for.
type TimedInputs = ((AttentionShape, DType), [wgpu_attention::Tensor; 3]);

/// Checks one candidate on a small problem with the shape's head dims and GQA ratio
/// (causal, several tiles, ragged ends), then times it on the shape, with the inputs in
/// `inputs` where they are for this shape and dtype (else made there).
fn measure(
    ctx: &Context,
    shape: AttentionShape,
    dtype: DType,
    tiling: FusedTiling,
    variant: Option<Pin>,
    reps: usize,
    inputs: &mut Option<TimedInputs>,
) -> Result<Row, CliError> {
    let name = spec(tiling).map_or("auto", |s| s.name);
    let mut row = Row {
        shape,
        dtype,
        tiling: name,
        variant,
        key_splits: 1,
        status: String::new(),
        median_ms: None,
        gflops: None,
    };
    let group = shape.heads_q / shape.heads_kv.max(1);
    // A ragged key count where it can be; a direct coop variant needs whole key tiles
    // (192 is a multiple of each BC) to run itself rather than its staged twin.
    let direct = variant.and_then(Pin::coop).is_some_and(|v| v.direct);
    let small = AttentionShape::new(
        1,
        2 * group,
        2,
        shape.len_q.min(67),
        shape.len_k.min(if direct { 192 } else { 197 }),
        shape.head_dim,
        shape.head_dim_v,
    );
    let case = CheckCase {
        shape: small,
        options: AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            ..options(tiling, dtype)
        },
        dtype,
        layout: Layout::Bhsd,
        seed: 38,
        range: 1.0,
    };
    match run_case(ctx, &case) {
        Ok(outcome) if outcome.passed => {}
        Ok(outcome) => {
            row.status = format!("WRONG (seed {}): {}", case.seed, outcome.summary());
            return Ok(row);
        }
        Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. } | Error::Unsupported { .. })) => {
            row.status = format!("refused: {e}");
            return Ok(row);
        }
        Err(e) => return Err(e.into()),
    }
    if inputs.as_ref().is_none_or(|(key, _)| *key != (shape, dtype)) {
        *inputs = None; // the previous shape's memory goes before the next is taken
        match bench_inputs(ctx, &shape, dtype) {
            Ok(tensors) => *inputs = Some(((shape, dtype), tensors)),
            Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. })) => {
                row.status = format!("refused: {e}");
                return Ok(row);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let Some((_, [q, k, v])) = inputs.as_ref() else {
        return Err(CliError::bad("tune lost its timed inputs (a bug: please report it)"));
    };
    let opts = options(tiling, dtype);
    let timing = time_gpu(ctx, reps, |encoder| {
        encode_sdpa(ctx, encoder, q, k, v, &opts).map(|_| ())
    })?;
    row.median_ms = Some(timing.median.as_secs_f64() * 1e3);
    row.gflops = Some(gflops(shape.flops(false), timing.median));
    row.status = "ok".into();
    Ok(row)
}

/// Per head-dim class, the tensor-core variant with the highest mean GFLOP/s over the
/// class's checked rows (f16 rows where there are any; variants wrong anywhere left
/// out), and that mean.
fn coop_winners(rows: &[Row]) -> Vec<(CoopVariant, f64)> {
    // Key splits are the context's, not the variant's: winners come from unsplit rows.
    let scored: Vec<Scored<CoopVariant>> = rows
        .iter()
        .filter(|r| r.key_splits == 1)
        .filter_map(|r| {
            r.variant.and_then(Pin::coop).map(|v| Scored {
                variant: v,
                class: v.dmax,
                dtype: r.dtype,
                status: &r.status,
                gflops: r.gflops,
            })
        })
        .collect();
    winners(&scored)
}
