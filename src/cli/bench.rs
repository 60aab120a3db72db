//! `bench`: attention problems on the chosen adapter, as a table, with a matmul
//! roofline probe measured in the same run.

use super::{AdapterArgs, CliError};
use wgpu_attention::bench::{gflops, time_attention, time_matmul};
use wgpu_attention::{resolve_kernel, AttentionOptions, AttentionShape, CausalAlignment, DType, KernelChoice};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// B,Hq,Hkv,Lq,Lk,D[,Dv] (repeatable); default: the (1, 8, 8, 2048, 2048, 64).
    #[arg(long)]
    shape: Vec<String>,
    /// Also run each shape causal (top-left).
    #[arg(long)]
    causal: bool,
    /// Kernels to run: fused, materialized or both.
    #[arg(long, default_value = "both")]
    kernel: String,
    /// Timed repetitions after warm-up.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Size of the n x n x n matmul probe.
    #[arg(long, default_value_t = 1024)]
    probe: usize,
}

fn parse_shape(s: &str) -> Result<AttentionShape, CliError> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::bad(format!("--shape '{s}': {e}")))?;
    if v.len() != 6 && v.len() != 7 {
        return Err(CliError::bad(format!("--shape '{s}': expected B,Hq,Hkv,Lq,Lk,D[,Dv]")));
    }
    Ok(AttentionShape {
        batch: v[0],
        heads_q: v[1],
        heads_kv: v[2],
        len_q: v[3],
        len_k: v[4],
        head_dim: v[5],
        head_dim_v: *v.get(6).unwrap_or(&v[5]),
    })
}

pub fn run(adapter: &AdapterArgs, args: &BenchArgs) -> Result<(), CliError> {
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}), driver {} {}",
        info.name, info.backend, info.device_type, info.driver, info.driver_info
    );
    println!("timing: wall clock around submit + wait, after warm-up; first call (compile) separate");
    let (probe, probe_flops) = time_matmul(&ctx, args.probe, args.reps)?;
    let probe_gf = gflops(probe_flops, probe.median);
    println!(
        "probe: matmul {0}x{0}x{0} f32: {1:.2} ms median, {2:.1} GFLOP/s",
        args.probe,
        probe.median.as_secs_f64() * 1e3,
        probe_gf
    );
    let shapes = if args.shape.is_empty() {
        vec![parse_shape("1,8,8,2048,2048,64")?]
    } else {
        args.shape.iter().map(|s| parse_shape(s)).collect::<Result<_, _>>()?
    };
    let kernels: Vec<KernelChoice> = match args.kernel.as_str() {
        "fused" => vec![KernelChoice::Fused],
        "materialized" => vec![KernelChoice::Materialized],
        "both" => vec![KernelChoice::Fused, KernelChoice::Materialized],
        other => {
            return Err(CliError::bad(format!(
                "--kernel '{other}': expected fused, materialized or both"
            )))
        }
    };
    println!(
        "{:<28} {:<10} {:<20} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}",
        "shape B,Hq,Hkv,Lq,Lk,D,Dv",
        "mask",
        "kernel",
        "first ms",
        "median ms",
        "min ms",
        "max ms",
        "GFLOP/s",
        "% probe"
    );
    for shape in &shapes {
        let causal_opts: &[Option<CausalAlignment>] = if args.causal {
            &[None, Some(CausalAlignment::TopLeft)]
        } else {
            &[None]
        };
        for &causal in causal_opts {
            for &kernel in &kernels {
                let options = AttentionOptions {
                    causal,
                    kernel,
                    ..Default::default()
                };
                let name = resolve_kernel(&ctx, &options)?.name();
                let t = time_attention(&ctx, shape, &options, DType::F32, args.reps)?;
                let gf = gflops(shape.flops(causal.is_some()), t.median);
                println!(
                    "{:<28} {:<10} {:<20} {:>10.1} {:>10.2} {:>10.2} {:>10.2} {:>9.2} {:>7.0}%",
                    format!(
                        "{},{},{},{},{},{},{}",
                        shape.batch,
                        shape.heads_q,
                        shape.heads_kv,
                        shape.len_q,
                        shape.len_k,
                        shape.head_dim,
                        shape.head_dim_v
                    ),
                    if causal.is_some() { "causal" } else { "none" },
                    name,
                    t.first.as_secs_f64() * 1e3,
                    t.median.as_secs_f64() * 1e3,
                    t.min.as_secs_f64() * 1e3,
                    t.max.as_secs_f64() * 1e3,
                    gf,
                    100.0 * gf / probe_gf
                );
            }
        }
    }
    println!("GFLOP/s count 4·B·Hq·Lq·Lk·D (with D+Dv), halved for causal.");
    Ok(())
}
