//! `WGPU_ATTENTION_TILING` is read once, when a context is made (issue 17 §2): a typo
//! is one clear error from `Context::new`, not a failure at whichever later call first
//! picks a tiling, and changing the variable later does not change a live context.
//! `WGPU_ATTENTION_SUBGROUPS=off` makes the device without subgroups. In a binary of
//! their own, as they set process-wide variables (one at a time: `ENV`).

mod common;
use std::sync::Mutex;
use wgpu_attention::check::{run_case, standard_grid, DEFAULT_SEED};
use wgpu_attention::{Context, Error, FusedTiling, KernelChoice};

/// Held while a test's variables are set: every `Context::new` reads them all.
static ENV: Mutex<()> = Mutex::new(());

#[test]
fn the_tiling_variable_is_parsed_when_the_context_is_made() {
    if common::ctx().is_none() {
        return;
    }
    let _env = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    std::env::set_var("WGPU_ATTENTION_TILING", "registrs");
    let err = Context::new().expect_err("a misspelt tiling");
    assert!(
        matches!(&err, Error::Invalid { what, reason } if what == "WGPU_ATTENTION_TILING" && reason.contains("registers")),
        "{err}"
    );
    std::env::set_var("WGPU_ATTENTION_TILING", "registers");
    let ctx = Context::new().expect("a known tiling");
    std::env::set_var("WGPU_ATTENTION_TILING", "nonsense");
    assert_eq!(
        ctx.default_fused_tiling(false).expect("read at creation"),
        FusedTiling::Registers
    );
    // Set but empty is refused as every variable refuses it (issue 64 item 8: it meant
    // auto), not taken for unset.
    std::env::set_var("WGPU_ATTENTION_TILING", "");
    let err = Context::new().expect_err("an empty tiling");
    assert!(
        matches!(&err, Error::Invalid { what, reason } if what == "WGPU_ATTENTION_TILING" && reason.contains("empty")),
        "{err}"
    );
    std::env::remove_var("WGPU_ATTENTION_TILING");
}

#[test]
fn subgroups_off_makes_the_device_without_them_and_the_kernels_follow() {
    // The device is made without SUBGROUP, so the capabilities say none and a GPU's
    // `shared` at D 128 takes the class that sums its lanes through workgroup memory
    // (forced here on lavapipe with the GPU variants), which gives the reference's
    // answer. A value other than on/off is refused, naming the variable.
    if common::ctx().is_none() {
        return;
    }
    let _env = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    std::env::set_var("WGPU_ATTENTION_SUBGROUPS", "no");
    let err = Context::new().expect_err("neither on nor off");
    assert!(
        matches!(&err, Error::Invalid { what, .. } if what == "WGPU_ATTENTION_SUBGROUPS"),
        "{err}"
    );
    std::env::set_var("WGPU_ATTENTION_SUBGROUPS", "off");
    let made = Context::new();
    std::env::remove_var("WGPU_ATTENTION_SUBGROUPS");
    let mut ctx = made.expect("a context without subgroups");
    assert!(!ctx.policy().subgroups);
    assert_eq!(ctx.capabilities().subgroups, None);
    assert!(!ctx.capabilities().subgroup_barrier);
    ctx.use_gpu_variants();
    let case = standard_grid(DEFAULT_SEED)
        .into_iter()
        .find(|c| (65..=128).contains(&c.shape.head_dim.max(c.shape.head_dim_v)))
        .expect("a grid case in the 128 class");
    let (d, dv) = (case.shape.head_dim as u32, case.shape.head_dim_v as u32);
    let (kernel, _) = wgpu_attention::kernels::flash::shared_for(d, dv, ctx.capabilities());
    assert_eq!(kernel, wgpu_attention::kernels::flash::SHARED_128_WG);
    let mut case = case;
    case.options.kernel = KernelChoice::Fused;
    case.options.tiling = FusedTiling::Shared;
    let outcome = run_case(&ctx, &case).expect("runs");
    assert!(outcome.passed, "seed {}: {}", case.seed, outcome.summary());
}
