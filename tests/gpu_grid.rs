//! The fixed grid of awkward shapes and masks, on every kernel path, against the CPU
//! reference.

use crate::common;
use wgpu_attention::check::standard_grid;
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{DType, FusedTiling, KernelChoice};

fn run_grid(kernel: KernelChoice, tiling: FusedTiling, dtype: DType) {
    let Some(ctx) = common::ctx() else { return };
    if dtype == DType::F16 && !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "SHADER_F16 (the f16 grid)", true);
        return;
    }
    if let Err(e) = ctx.fused_config(tiling) {
        // Tensor cores only a GPU has (tests/gpu_coop_emulated.rs runs their kernel).
        common::skip_lacking(
            ctx,
            &format!("the {tiling:?} tiling ({e})"),
            tiling != FusedTiling::Coop,
        );
        return;
    }
    for mut case in standard_grid(wgpu_attention::check::DEFAULT_SEED) {
        case.options.kernel = kernel;
        case.options.tiling = tiling;
        case.dtype = dtype;
        common::assert_case(ctx, &case);
    }
}

#[test]
fn materialized_f32() {
    run_grid(KernelChoice::Materialized, FusedTiling::Auto, DType::F32);
}

#[test]
fn materialized_f16() {
    run_grid(KernelChoice::Materialized, FusedTiling::Auto, DType::F16);
}

/// Every registered fused tiling the adapter can run (the others skip with a message).
#[test]
fn every_fused_tiling_f32() {
    for spec in &FUSED_TILINGS {
        eprintln!("grid: fused/{} f32", spec.name);
        run_grid(KernelChoice::Fused, spec.tiling, DType::F32);
    }
}

#[test]
fn every_fused_tiling_f16() {
    for spec in &FUSED_TILINGS {
        eprintln!("grid: fused/{} f16", spec.name);
        run_grid(KernelChoice::Fused, spec.tiling, DType::F16);
    }
}

#[test]
fn shared_in_its_gpu_variants_f32_and_f16() {
    // A GPU gets `shared`'s head-dim classes, each row's state in registers
    // (kernels::flash::shared_for): D <= 64 one lane per row, 128 and 256 two and four
    // (subgroup shuffles; lavapipe's 8-lane subgroups take them). A CPU adapter gets
    // the run-time kernel, which the grid above runs. Here the GPU variants, on every
    // grid case.
    use wgpu_attention::kernels::flash::{shared_for, SHARED_128, SHARED_256, SHARED_64};
    let Some(mut ctx) = common::own_ctx() else { return };
    if ctx.capabilities().subgroups.is_none_or(|(min, _)| min < 4) {
        common::skip_lacking(&ctx, "SUBGROUP with 4 lanes (shared's split rows)", true);
        return;
    }
    ctx.use_gpu_variants();
    for dtype in common::dtypes(&ctx) {
        let mut served = [0; 3];
        for mut case in standard_grid(wgpu_attention::check::DEFAULT_SEED) {
            let (d, dv) = (case.shape.head_dim as u32, case.shape.head_dim_v as u32);
            let (kernel, lanes) = shared_for(d, dv, ctx.capabilities());
            let (expected, class) = match d.max(dv) {
                0..=64 => ((SHARED_64, 1), 0),
                65..=128 => ((SHARED_128, 2), 1),
                _ => ((SHARED_256, 4), 2),
            };
            assert_eq!((kernel, lanes), expected, "D {d}, Dv {dv}");
            served[class] += 1;
            case.options.kernel = KernelChoice::Fused;
            case.options.tiling = FusedTiling::Shared;
            case.dtype = dtype;
            common::assert_case(&ctx, &case);
        }
        assert!(served.iter().all(|&n| n >= 1), "grid cases per class: {served:?}");
    }
}

#[test]
fn shared_on_a_gpu_without_subgroups() {
    // A GPU without subgroups (WebGPU without the `subgroups` feature, GL) gets
    // `shared`'s 128 and 256 classes with the row lanes' sums through workgroup memory
    // (kernels::flash::shared_for), taken from the K/V tile. Here on lavapipe with its
    // subgroups forgotten: every grid case of those classes, one dtype per class
    // (alternating, as each class compiles cold in CI).
    use wgpu_attention::kernels::flash::{shared_for, SHARED_128_WG, SHARED_256_WG, SHARED_64};
    let Some(mut ctx) = common::own_ctx() else { return };
    ctx.use_gpu_variants();
    ctx.use_no_subgroups();
    let f16 = ctx.capabilities().f16;
    let mut served = [0; 2];
    for mut case in standard_grid(wgpu_attention::check::DEFAULT_SEED) {
        let (d, dv) = (case.shape.head_dim as u32, case.shape.head_dim_v as u32);
        let (kernel, lanes) = shared_for(d, dv, ctx.capabilities());
        let (expected, class) = match d.max(dv) {
            0..=64 => {
                assert_eq!((kernel, lanes), (SHARED_64, 1), "D {d}, Dv {dv}");
                continue;
            }
            65..=128 => ((SHARED_128_WG, 2), 0),
            _ => ((SHARED_256_WG, 4), 1),
        };
        assert_eq!((kernel, lanes), expected, "D {d}, Dv {dv}");
        served[class] += 1;
        case.options.kernel = KernelChoice::Fused;
        case.options.tiling = FusedTiling::Shared;
        case.dtype = if class == 1 && f16 { DType::F16 } else { DType::F32 };
        common::assert_case(&ctx, &case);
    }
    assert!(served.iter().all(|&n| n >= 1), "grid cases per class: {served:?}");
}
