//! Fused attention split into disjoint key ranges (`Context::use_key_splits`), each in
//! dispatches of its own and merged by log-sum-exp: the fixed grid of awkward shapes and
//! masks on every fused tiling the adapter runs, against the CPU reference.

use crate::common;
use wgpu_attention::check::{run_case, standard_grid, CheckCase};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{
    sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice, Layout, Tensor,
};

#[test]
fn split_keys_match_the_reference_on_every_fused_tiling() {
    let Some(shared) = common::ctx() else { return };
    let mut ctx = Context::new().expect("a second context on the test adapter");
    // Three splits: 64-key tiles each, so most grid shapes get one to three of them.
    ctx.use_key_splits(3).expect("a valid count");
    let dtypes: &[DType] = if shared.capabilities().f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    for spec in FUSED_TILINGS.iter().filter(|s| ctx.fused_config(s.tiling).is_ok()) {
        for &dtype in dtypes {
            for mut case in standard_grid(wgpu_attention::check::DEFAULT_SEED) {
                case.options.kernel = KernelChoice::Fused;
                case.options.tiling = spec.tiling;
                case.dtype = dtype;
                let outcome = run_case(&ctx, &case).unwrap_or_else(|e| panic!("{} {case:?}: {e}", spec.name));
                assert!(
                    outcome.passed,
                    "{} {} (seed {}) {:?}: {}",
                    spec.name,
                    dtype.name(),
                    case.seed,
                    case.shape,
                    outcome.summary()
                );
            }
        }
    }
}

#[test]
fn a_long_causal_problem_splits_into_its_ranges_and_merges_its_lse() {
    let Some(_) = common::ctx() else { return };
    let mut ctx = Context::new().expect("a second context on the test adapter");
    let case = CheckCase {
        shape: AttentionShape::new(1, 2, 1, 40, 1000, 32, 32),
        options: AttentionOptions {
            kernel: KernelChoice::Fused,
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some(vec![931]),
            need_lse: true,
            ..Default::default()
        },
        dtype: DType::F32,
        layout: Layout::Bshd,
        seed: 5301,
        range: 2.0,
    };
    let [q, k, v] = wgpu_attention::check::random_qkv(&case);
    let upload = |ctx: &Context, x: &[f32], heads: usize, len: usize| {
        Tensor::from_f32_as(ctx, [1, heads, len, 32], Layout::Bshd, DType::F32, x).expect("upload")
    };
    let mut results = Vec::new();
    for splits in [1, 4] {
        ctx.use_key_splits(splits).expect("a valid count");
        let (qt, kt, vt) = (
            upload(&ctx, &q, 2, 40),
            upload(&ctx, &k, 1, 1000),
            upload(&ctx, &v, 1, 1000),
        );
        let out = sdpa(&ctx, &qt, &kt, &vt, &case.options).expect("runs");
        let lse = out.lse.expect("lse").to_f32_vec(&ctx).expect("lse");
        results.push((out.out.to_f32_vec(&ctx).expect("out"), lse));
        // And each is right against the reference.
        let outcome = run_case(&ctx, &case).expect("runs");
        assert!(outcome.passed, "{splits} splits: {}", outcome.summary());
    }
    // The merge of four ranges gives the one range's output and lse within f32 rounding.
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()));
    assert!(close(&results[1].0, &results[0].0), "outputs differ");
    assert!(close(&results[1].1, &results[0].1), "lses differ");
    assert!(ctx.use_key_splits(0).is_err() && ctx.use_key_splits(17).is_err());
}
