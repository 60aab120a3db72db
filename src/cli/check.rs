//! `check`: every kernel variant against the CPU reference over a fixed grid.

use super::{AdapterArgs, CliError};
use wgpu_attention::check::{run_case, standard_grid, CheckCase};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{DType, FusedTiling, KernelChoice, Precision};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Seed of the random inputs (printed with every failure).
    #[arg(long, default_value_t = 0x5EED_0001)]
    seed: u64,
}

/// One kernel variant `check` runs.
pub struct Variant {
    pub label: String,
    pub kernel: KernelChoice,
    pub tiling: FusedTiling,
    pub dtype: DType,
    pub precision: Precision,
}

/// Every kernel variant: the materialized path and each registered fused tiling, in f32
/// and (where the adapter has it) f16. Tilings that multiply in f16 (tensor cores) run
/// their f32 variant at precision medium.
pub fn variants(f16: bool) -> Vec<Variant> {
    let dtypes: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
    let mut v = Vec::new();
    for &dtype in dtypes {
        v.push(Variant {
            label: format!("materialized {}", dtype.name()),
            kernel: KernelChoice::Materialized,
            tiling: FusedTiling::Auto,
            dtype,
            precision: Precision::Highest,
        });
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

pub fn run(adapter: &AdapterArgs, args: &CheckArgs) -> Result<(), CliError> {
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    println!("adapter: {} ({:?}, {:?})", info.name, info.backend, info.device_type);
    if !ctx.capabilities().f16 {
        println!("f16 variants skipped: adapter lacks SHADER_F16");
    }
    println!(
        "{:<20} {:<58} {:>10} {:>10}  result",
        "variant", "case", "max err", "bound"
    );
    let (mut passed, mut failed) = (0, 0);
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
            continue;
        }
        for mut case in standard_grid(args.seed) {
            case.options.kernel = kernel;
            case.options.tiling = tiling;
            case.options.precision = precision;
            case.dtype = dtype;
            let outcome = run_case(&ctx, &case)?;
            let ok = outcome.passed;
            if ok {
                passed += 1;
            } else {
                failed += 1;
            }
            println!(
                "{label:<20} {:<58} {:>10.2e} {:>10.2e}  {}",
                describe(&case),
                outcome.out.max_abs,
                outcome.bound,
                if ok {
                    "ok".to_string()
                } else {
                    format!("FAIL (seed {}): {}", case.seed, outcome.summary())
                }
            );
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        return Err(CliError::Failed(format!(
            "{failed} case(s) differ from the CPU reference"
        )));
    }
    Ok(())
}
