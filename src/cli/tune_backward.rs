//! `tune --backward`: every tensor-core backward variant that fits the adapter
//! (`kernels::backward_coop::candidates`: rows per workgroup, walked tile, arrayed or
//! named), over a list of shapes: each checked against the f64 reference gradients on a
//! small causal problem of the shape's head dims, then timed as the backward pass of a
//! fused forward (FLOPs counted as FlashAttention-2 does, 2.5 times the forward's). A
//! table on stdout, the fastest per head-dim class, and `--json`. No tuning table: the
//! picker's backward variants are fixed until a GPU has timed these
//! (docs/design.md, "Named backward").

use super::output::write_all;
use super::tune_scoring::{self, shape_label, Deadline, Scored};
use super::{write_stdout, CliError};
use serde_json::json;
use std::path::PathBuf;
use wgpu_attention::bench::{bench_inputs, gflops, time_gpu};
use wgpu_attention::check::{run_backward_case, CheckCase};
use wgpu_attention::kernels::backward_coop::{candidates, CoopBackwardVariant};
use wgpu_attention::report::adapter_json;
use wgpu_attention::{
    backward_tiling, encode_sdpa_backward, sdpa, AttentionOptions, AttentionShape, BackwardTiling, CausalAlignment,
    Context, DType, Error, FusedTiling, KernelChoice, Layout, Precision,
};

/// Version tag of the JSON `tune --backward` writes.
pub const SCHEMA: &str = "wgpu-attention-tune-backward/1";

/// One measured candidate.
struct Row {
    shape: AttentionShape,
    dtype: DType,
    variant: CoopBackwardVariant,
    /// `ok`, or why not (a failed check, a refused limit).
    status: String,
    median_ms: Option<f64>,
    gflops: Option<f64>,
}

/// What `tune --backward` was asked for.
pub struct Request<'a> {
    /// When to start no more candidates (`--deadline`).
    pub deadline: &'a Deadline,
    pub shapes: &'a [AttentionShape],
    pub dtypes: &'a [DType],
    pub reps: usize,
    /// Only these variants (`--variants`), where they fit.
    pub only: Option<Vec<CoopBackwardVariant>>,
    pub json: Option<PathBuf>,
}

pub fn run(ctx: &mut Context, request: &Request) -> Result<(), CliError> {
    let Some(sg) = ctx.capabilities().coop_subgroup_size() else {
        return Err(CliError::bad(
            "tune --backward: the adapter has no tensor cores (cooperative matrices with a fixed subgroup size); \
             --emulate-coop emulates them",
        ));
    };
    write_stdout(format_args!(
        "{:<28} {:<5} {:<10} {:<10} {:>10} {:>10}  check",
        "shape (B,Hq,Hkv,Lq,Lk,D,Dv)", "dtype", "tiling", "variant", "median ms", "GFLOP/s"
    ))?;
    let mut rows = Vec::new();
    'candidates: for &shape in request.shapes {
        let dims = shape.head_dim.max(shape.head_dim_v) as u32;
        let Some(class) = [32, 64, 128].into_iter().find(|&c| dims <= c) else {
            write_stdout(format_args!(
                "{}: head dims past 128 have no tensor-core backward",
                shape_label(&shape)
            ))?;
            continue;
        };
        let caps = ctx.capabilities();
        let (bytes, invocations) = (caps.max_workgroup_storage, caps.max_invocations);
        let variants: Vec<CoopBackwardVariant> = match &request.only {
            None => candidates(class, sg, bytes, invocations),
            Some(only) => {
                // Asked for by name: each that runs this shape, and a line for each that cannot.
                let (fit, not): (Vec<_>, Vec<_>) =
                    only.iter().copied().partition(|v| v.fits(dims, sg, bytes, invocations));
                for v in not {
                    write_stdout(format_args!(
                        "{}: {} does not fit these head dims on this adapter",
                        shape_label(&shape),
                        v.label()
                    ))?;
                }
                fit
            }
        };
        for &dtype in request.dtypes {
            for &variant in &variants {
                if request.deadline.passed(rows.len())? {
                    break 'candidates;
                }
                ctx.use_coop_backward_variant(Some(variant));
                let row = measure(ctx, shape, dtype, variant, request.reps);
                ctx.use_coop_backward_variant(None);
                write_stdout(format_args!(
                    "{:<28} {:<5} {:<10} {:<10} {:>10} {:>10}  {}",
                    shape_label(&row.shape),
                    row.dtype.name(),
                    "coop-bwd",
                    row.variant.label(),
                    row.median_ms.map_or("-".into(), |t| format!("{t:.3}")),
                    row.gflops.map_or("-".into(), |g| format!("{g:.1}")),
                    row.status
                ))?;
                rows.push(row);
            }
        }
    }
    let winners = winners(&rows);
    for (v, gf) in &winners {
        write_stdout(format_args!(
            "winner, tensor-core backward, head dims up to {}: {} ({gf:.1} GFLOP/s{})",
            v.dmax,
            v.label(),
            if ctx.capabilities().coop_emulated {
                ", emulated"
            } else {
                ""
            }
        ))?;
    }
    if let Some(path) = &request.json {
        let device = ctx.device();
        let doc = json!({
            "schema": SCHEMA,
            "tool_version": env!("CARGO_PKG_VERSION"),
            "adapter": adapter_json(ctx.adapter_info(), device.features(), &device.limits(), &ctx.capabilities().cooperative_matrix),
            "emulated_coop": ctx.capabilities().coop_emulated,
            "reps": request.reps,
            "flops": "2.5 x the forward's 4*B*Hq*Lq*Lk*D (Dv = D)",
            "rows": rows.iter().map(|r| json!({
                "shape": [r.shape.batch, r.shape.heads_q, r.shape.heads_kv, r.shape.len_q,
                          r.shape.len_k, r.shape.head_dim, r.shape.head_dim_v],
                "dtype": r.dtype.name(),
                "variant": r.variant.label(),
                "status": r.status,
                "median_ms": r.median_ms,
                "gflops": r.gflops,
            })).collect::<Vec<_>>(),
            "winners": winners.iter().map(|(v, gf)| json!({"variant": v.label(), "dmax": v.dmax, "gflops": gf})).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::bad(e.to_string()))?;
        write_all(&[(path.clone(), text.into_bytes())])?;
        eprintln!("wrote {}", path.display());
    }
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| r.status.starts_with("WRONG") || r.status.starts_with("failed"))
        .map(|r| format!("{} {}", shape_label(&r.shape), r.variant.label()))
        .collect();
    if !bad.is_empty() {
        return Err(CliError::Failed(format!(
            "wrong gradients or failures from: {}",
            bad.join("; ")
        )));
    }
    Ok(())
}

/// The forward's options for a candidate: fused on tensor cores (f32 at precision
/// medium), with its lse.
fn options(dtype: DType) -> AttentionOptions {
    AttentionOptions {
        kernel: KernelChoice::Fused,
        tiling: FusedTiling::Coop,
        precision: if dtype == DType::F32 {
            Precision::Medium
        } else {
            Precision::Highest
        },
        need_lse: true,
        ..Default::default()
    }
}

/// Checks the pinned variant on a small problem of the shape's head dims, then times
/// its backward pass at the shape. Any error is the row's (`failed: ..`): one variant
/// that does not build loses no other row.
fn measure(ctx: &Context, shape: AttentionShape, dtype: DType, variant: CoopBackwardVariant, reps: usize) -> Row {
    let mut row = Row {
        shape,
        dtype,
        variant,
        status: String::new(),
        median_ms: None,
        gflops: None,
    };
    match checked_and_timed(ctx, shape, dtype, variant, reps) {
        Ok(Outcome::Timed(ms, gf)) => {
            row.median_ms = Some(ms);
            row.gflops = Some(gf);
            row.status = "ok".into();
        }
        Ok(Outcome::Not(why)) => row.status = why,
        Err(e @ (Error::LimitExceeded { .. } | Error::CapacityExceeded { .. } | Error::Unsupported { .. })) => {
            row.status = format!("refused: {e}");
        }
        Err(e) => row.status = format!("failed: {e}"),
    }
    row
}

/// What became of a candidate: timed (median ms, GFLOP/s), or not (why).
enum Outcome {
    Timed(f64, f64),
    Not(String),
}

/// The work of [`measure`], its errors the caller's to word.
fn checked_and_timed(
    ctx: &Context,
    shape: AttentionShape,
    dtype: DType,
    variant: CoopBackwardVariant,
    reps: usize,
) -> wgpu_attention::Result<Outcome> {
    let opts = options(dtype);
    // The pin is passed over where it does not fit: a row must time the variant it names.
    match backward_tiling(ctx, dtype, &opts, &shape)? {
        BackwardTiling::Coop(v, _) if v == variant => {}
        other => return Ok(Outcome::Not(format!("not run: the backward takes {}", other.name()))),
    }
    let group = shape.heads_q / shape.heads_kv.max(1);
    let small = AttentionShape::new(
        1,
        2 * group,
        2,
        shape.len_q.min(67),
        shape.len_k.min(97),
        shape.head_dim,
        shape.head_dim_v,
    );
    let case = CheckCase {
        shape: small,
        options: AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            ..opts.clone()
        },
        dtype,
        layout: Layout::Bhsd,
        seed: 52,
        range: 1.0,
    };
    let outcome = run_backward_case(ctx, &case)?;
    if !outcome.passed {
        return Ok(Outcome::Not(format!(
            "WRONG (seed {}): {}",
            case.seed,
            outcome.summary()
        )));
    }
    let [q, k, v] = bench_inputs(ctx, &shape, dtype)?;
    let forward = sdpa(ctx, &q, &k, &v, &opts)?;
    let lse = forward
        .lse
        .as_ref()
        .ok_or_else(|| Error::invalid("tune --backward", "the forward gave no lse"))?;
    // dO: the output itself (the timing does not depend on its values).
    let timing = time_gpu(ctx, reps, |encoder| {
        encode_sdpa_backward(ctx, encoder, &q, &k, &v, &forward.out, lse, &forward.out, &opts).map(|_| ())
    })?;
    Ok(Outcome::Timed(
        timing.median.as_secs_f64() * 1e3,
        gflops(2.5 * shape.flops(false), timing.median),
    ))
}

/// Per head-dim class, the variant with the highest mean GFLOP/s over its checked rows
/// (tune's rule: f16 rows where there are any; variants wrong anywhere left out).
fn winners(rows: &[Row]) -> Vec<(CoopBackwardVariant, f64)> {
    let scored: Vec<Scored<CoopBackwardVariant>> = rows
        .iter()
        .map(|r| Scored {
            variant: r.variant,
            class: r.variant.dmax,
            dtype: r.dtype,
            status: &r.status,
            gflops: r.gflops,
        })
        .collect();
    tune_scoring::winners(&scored)
}
