//! Limits checked against the work actually recorded (issue 17 §1.4, §1.6, §3): a
//! device requested with lowered limits, so these refusals run on every adapter, not
//! only where the real limits are small. Each case was a wgpu validation error (or
//! worse) before the guards; each must now be `LimitExceeded`, and the context keeps
//! working.

use crate::common;
use wgpu_attention::{sdpa, AttentionOptions, Context, DType, Error, FusedTiling, KernelChoice, Layout, Tensor};

/// A context on the default adapter whose device has these lowered limits.
fn lowered(binding: u64, workgroups: u32) -> Option<Context> {
    common::ctx_with_limits(wgpu_attention::wgpu::Features::SHADER_F16, |limits| {
        limits.max_storage_buffer_binding_size = binding;
        limits.max_compute_workgroups_per_dimension = workgroups;
    })
}

fn upload(ctx: &Context, shape: [usize; 4], dtype: DType) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32_as(ctx, shape, Layout::Bhsd, dtype, &vec![0.25; n]).expect("upload")
}

fn assert_limit(result: Result<wgpu_attention::AttentionOutput, Error>, limit_name: &str) {
    match result {
        Err(Error::LimitExceeded { limit, .. }) if limit == limit_name => {}
        Err(e) => panic!("expected LimitExceeded on {limit_name}, got {e}"),
        Ok(_) => panic!("expected LimitExceeded on {limit_name}, got a result"),
    }
}

#[test]
fn the_lse_binding_is_checked_when_it_outgrows_the_output() {
    // f16 with D = Dv = 1: q and the output take 2 bytes per row, the lse 4.
    let Some(ctx) = lowered(1 << 20, 65535) else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(&ctx, "SHADER_F16", true);
        return;
    }
    let rows = 300_000;
    let q = upload(&ctx, [1, 1, rows, 1], DType::F16);
    let (k, v) = (
        upload(&ctx, [1, 1, 8, 1], DType::F16),
        upload(&ctx, [1, 1, 8, 1], DType::F16),
    );
    assert_limit(
        sdpa(&ctx, &q, &k, &v, &AttentionOptions::default()),
        "max_storage_buffer_binding_size",
    );
    let q = upload(&ctx, [1, 1, 16, 1], DType::F16);
    sdpa(&ctx, &q, &k, &v, &AttentionOptions::default()).expect("a small call still works");
}

#[test]
fn every_dispatch_grid_is_checked() {
    // 256 workgroups per axis and 5000 query rows: the planner's estimate (one
    // workgroup per 32 rows) passes, but the registers tiling dispatches one per 16
    // rows (313): the recorded grid is what gets checked. Every other path either runs
    // or refuses the same way; none may end in a wgpu error.
    let Some(ctx) = lowered(1 << 27, 256) else { return };
    let q = upload(&ctx, [1, 1, 5000, 8], DType::F32);
    let (k, v) = (
        upload(&ctx, [1, 1, 40, 8], DType::F32),
        upload(&ctx, [1, 1, 40, 8], DType::F32),
    );
    let registers = AttentionOptions {
        kernel: KernelChoice::Fused,
        tiling: FusedTiling::Registers,
        ..Default::default()
    };
    assert_limit(
        sdpa(&ctx, &q, &k, &v, &registers),
        "max_compute_workgroups_per_dimension",
    );
    for spec in wgpu_attention::kernels::flash::FUSED_TILINGS.iter() {
        let options = AttentionOptions {
            kernel: KernelChoice::Fused,
            tiling: spec.tiling,
            ..Default::default()
        };
        match sdpa(&ctx, &q, &k, &v, &options) {
            Ok(out) => assert!(
                out.out
                    .to_f32_vec(&ctx)
                    .expect("read back")
                    .iter()
                    .all(|x| (x - 0.25).abs() < 1e-6),
                "{}: wrong output",
                spec.name
            ),
            Err(Error::LimitExceeded { .. } | Error::MissingFeature { .. }) => {}
            Err(e) => panic!("{}: {e}", spec.name),
        }
    }
    let q = upload(&ctx, [1, 1, 100, 8], DType::F32);
    sdpa(&ctx, &q, &k, &v, &AttentionOptions::default()).expect("a small call still works");
}

#[test]
fn the_backward_pass_refuses_a_device_with_webgpus_eight_storage_buffers() {
    let Some(ctx) = common::ctx_with_limits(wgpu_attention::wgpu::Features::empty(), |limits| {
        limits.max_storage_buffers_per_shader_stage = 8;
    }) else {
        return;
    };
    let q = upload(&ctx, [1, 1, 4, 8], DType::F32);
    let (k, v) = (
        upload(&ctx, [1, 1, 4, 8], DType::F32),
        upload(&ctx, [1, 1, 4, 8], DType::F32),
    );
    let options = AttentionOptions {
        need_lse: true,
        ..Default::default()
    };
    let forward = sdpa(&ctx, &q, &k, &v, &options).expect("the forward fits 8");
    let lse = forward.lse.expect("lse");
    match wgpu_attention::sdpa_backward(&ctx, &q, &k, &v, &forward.out, &lse, &forward.out, &options) {
        Err(Error::LimitExceeded { limit, .. }) => assert_eq!(limit, "max_storage_buffers_per_shader_stage"),
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
}

#[test]
fn the_backward_pass_splits_more_heads_than_a_dispatch_holds() {
    // 3 workgroups per axis: 2 x 4 query heads (2 x 2 kv heads) take three and two
    // dispatches per pass, each from its own first pair; the gradients must be the
    // reference's in both tilings the adapter has.
    let features = wgpu_attention::wgpu::Features::SHADER_F16 | wgpu_attention::wgpu::Features::SUBGROUP;
    let Some(ctx) = common::ctx_with_limits(features, |limits| limits.max_compute_workgroups_per_dimension = 3) else {
        return;
    };
    let shape = wgpu_attention::AttentionShape::new(2, 4, 2, 40, 50, 16, 24);
    for (tiling, seed) in [(FusedTiling::Auto, 3995), (FusedTiling::Registers, 3996)] {
        let case = wgpu_attention::check::CheckCase {
            shape,
            options: AttentionOptions {
                tiling,
                causal: Some(wgpu_attention::CausalAlignment::BottomRight),
                ..Default::default()
            },
            dtype: DType::F32,
            layout: Layout::Bshd,
            seed,
            range: 1.0,
        };
        let outcome = wgpu_attention::check::run_backward_case(&ctx, &case)
            .unwrap_or_else(|e| panic!("seed {seed} {tiling:?}: {e}"));
        assert!(outcome.passed, "seed {seed} {tiling:?}: {}", outcome.summary());
    }
}
