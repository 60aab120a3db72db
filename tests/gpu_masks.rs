//! Sliding windows, ALiBi and soft-capping (issue 14 §4) on every GPU path against the
//! f64 reference: mixed with causal masks, key lengths and explicit masks, across
//! dispatches that resume under a loop cap, and in the split-K decode kernel. The
//! standard grid (`gpu_grid.rs`, `check`) mixes them in too; these are the cases it
//! cannot reach.

use crate::common;
use common::{dtypes, paths};
use wgpu_attention::check::{alibi_slopes, random_additive_mask, random_qkv, run_case_with, CheckCase, Rng};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::kernels::loop_budget;
use wgpu_attention::{
    sdpa, AttentionOptions, AttentionShape, CausalAlignment, DType, Error, KernelChoice, Layout, Tensor, Window,
};

fn case(shape: AttentionShape, options: AttentionOptions, dtype: DType, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options,
        dtype,
        layout: Layout::Bhsd,
        seed,
        range: 1.0,
    }
}

#[test]
fn keys_outside_the_window_never_contribute_on_every_path() {
    // NaN in every K row left of each row's window: a kernel that scored them unmasked
    // (or skipped a visible tile) fails. Rows of one workgroup see different windows, so
    // tiles straddle window edges.
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 4, 2, 70, 333, 24, 24);
    let left = 45;
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        window: Some(Window {
            left: Some(left),
            right: None,
        }),
        alibi_slopes: Some(alibi_slopes(s.heads_q)),
        softcap: Some(2.5),
        need_weights: true,
        ..Default::default()
    };
    let first_visible = s.len_k - s.len_q - left; // row 0's p(0) - left
    for (n, dtype) in dtypes(ctx).into_iter().enumerate() {
        let seed = 700 + n as u64;
        let c = case(s, options.clone(), dtype, seed);
        let [q, mut k, v] = random_qkv(&c);
        for bh in 0..s.batch * s.heads_kv {
            for j in 0..first_visible {
                k[(bh * s.len_k + j) * s.head_dim..][..s.head_dim].fill(f32::NAN);
            }
        }
        for (kernel, tiling) in paths(ctx) {
            let mut c = c.clone();
            c.options.kernel = kernel;
            c.options.tiling = tiling;
            let outcome = run_case_with(ctx, &c, &q, &k, &v).expect("runs");
            assert!(
                outcome.passed,
                "seed {seed} {dtype:?} {kernel:?}/{tiling:?}: {}",
                outcome.summary()
            );
        }
    }
}

#[test]
fn windows_alibi_and_softcap_survive_resumed_dispatches() {
    // As gpu_special's split-dispatch test: D = 256 under a forced loop cap cuts 3000
    // keys into several dispatches (a window open on the right does not bound the keys
    // a block walks), so a row's first and last visible keys lie in different ranges,
    // and whole ranges lie left of some rows' windows.
    let Some(ctx) = common::short_ranges_ctx() else { return };
    let shape = AttentionShape::new(1, 2, 1, 37, 3000, 256, 256);
    let mut rng = Rng::new(31);
    for spec in FUSED_TILINGS.iter().filter(|s| ctx.fused_config(s.tiling).is_ok()) {
        let config = ctx.fused_config(spec.tiling).expect("filtered");
        let cap = ctx.loop_cap().expect("capped_ctx has a loop cap");
        let per_dispatch = loop_budget::keys_per_dispatch(&config, &shape, cap, ctx.capabilities(), ctx.policy());
        // Rows see keys from about 1560 (window) to 2900 (key length): a range boundary
        // must fall inside.
        assert!(
            per_dispatch.is_some_and(|keys| (1600..2900).any(|j| j % keys == 0)),
            "{}: {per_dispatch:?}",
            spec.name
        );
        for dtype in dtypes(ctx) {
            let options = AttentionOptions {
                kernel: KernelChoice::Fused,
                tiling: spec.tiling,
                window: Some(Window {
                    left: Some(1400),
                    right: None,
                }),
                alibi_slopes: Some(vec![0.01, 0.002]),
                softcap: Some(rng.uniform(1.0, 4.0)),
                mask: Some(random_additive_mask(&mut rng, [1, 2, 1, 3000])),
                key_lengths: Some(vec![2900]),
                ..Default::default()
            };
            let mut c = case(shape, options, dtype, 32);
            c.range = 2.0;
            common::assert_case(ctx, &c);
        }
    }
}

#[test]
fn a_window_bounded_on_both_sides_runs_in_one_dispatch_within_the_cap() {
    // 6000 keys at D = 256 would take several dispatches under the cap, but a causal
    // window of 900 bounds every block's walk to about 1000 keys, so the host issues
    // one dispatch (attention.rs, window_walk). On Mesa 22.3, whose driver really stops
    // loops at the cap, a kernel that walked more keys than that would be wrong here.
    let Some(ctx) = common::capped_ctx() else { return };
    let shape = AttentionShape::new(1, 2, 2, 300, 6000, 256, 256);
    for spec in FUSED_TILINGS.iter().filter(|s| ctx.fused_config(s.tiling).is_ok()) {
        let options = AttentionOptions {
            kernel: KernelChoice::Fused,
            tiling: spec.tiling,
            causal: Some(CausalAlignment::BottomRight),
            window: Some(Window {
                left: Some(900),
                right: Some(5),
            }),
            alibi_slopes: Some(alibi_slopes(2)),
            ..Default::default()
        };
        common::assert_case(ctx, &case(shape, options, DType::F32, 33));
    }
}

#[test]
fn decode_with_windows_alibi_softcap_and_every_other_mask() {
    let Some(ctx) = common::ctx() else { return };
    let mut seed = 800;
    // GQA groups of 4, one and three query rows, key lengths 0 and 1 in the batch, 1100
    // keys (not a multiple of the tile or of any split).
    for (lq, window) in [
        (
            1,
            Window {
                left: Some(300),
                right: None,
            },
        ),
        (
            3,
            Window {
                left: Some(64),
                right: Some(0),
            },
        ),
        (
            3,
            Window {
                left: None,
                right: Some(2),
            },
        ),
    ] {
        let shape = AttentionShape::new(3, 8, 2, lq, 1100, 64, 48);
        for (dtype, tiling) in dtypes(ctx)
            .into_iter()
            .flat_map(|d| common::decode_designs(ctx).into_iter().map(move |t| (d, t)))
        {
            seed += 1;
            let mut rng = Rng::new(seed);
            let options = AttentionOptions {
                kernel: KernelChoice::Decode,
                tiling,
                window: Some(window),
                alibi_slopes: Some(alibi_slopes(8)),
                softcap: Some(rng.uniform(0.5, 3.0)),
                key_lengths: Some(vec![0, 1, 900]),
                mask: Some(random_additive_mask(&mut rng, [3, 1, 1, 1100])),
                need_weights: seed % 2 == 0,
                ..Default::default()
            };
            let mut c = case(shape, options, dtype, seed);
            c.range = 3.0;
            eprintln!("decode ({tiling:?}) Lq {lq} {window:?} {dtype:?} (seed {seed})");
            common::assert_case(ctx, &c);
        }
    }
}

#[test]
fn softcap_bounds_large_logits_on_every_path() {
    // Inputs in [-4, 4) at D = 32 give scaled scores of standard deviation about 5
    // (up to about 16 over 200 keys), capped at 5: the cap reshapes every row's
    // weights, which every path must reproduce.
    let Some(ctx) = common::ctx() else { return };
    let shape = AttentionShape::new(1, 2, 2, 9, 200, 32, 32);
    for (kernel, tiling) in paths(ctx) {
        let options = AttentionOptions {
            kernel,
            tiling,
            softcap: Some(5.0),
            causal: Some(CausalAlignment::TopLeft),
            need_weights: true,
            ..Default::default()
        };
        let mut c = case(shape, options, DType::F32, 900);
        c.range = 4.0;
        common::assert_case(ctx, &c);
    }
}

#[test]
fn bad_alibi_window_and_softcap_inputs_are_refused_before_any_work() {
    let Some(ctx) = common::ctx() else { return };
    let shape = [1, 2, 5, 8];
    let t = |shape| Tensor::from_f32(ctx, shape, Layout::Bhsd, &vec![0.5; 80]).expect("upload");
    let (q, k, v) = (t(shape), t(shape), t(shape));
    let refused = |options: AttentionOptions| match sdpa(ctx, &q, &k, &v, &options) {
        Err(e @ (Error::Shape { .. } | Error::Invalid { .. } | Error::Unsupported { .. })) => e.to_string(),
        other => panic!("{options:?} gave {other:?}"),
    };
    let message = refused(AttentionOptions {
        alibi_slopes: Some(vec![0.5]),
        ..Default::default()
    });
    assert!(message.contains("ALiBi slopes"), "{message}");
    let message = refused(AttentionOptions {
        alibi_slopes: Some(vec![0.5, f32::NAN]),
        ..Default::default()
    });
    assert!(message.contains("not finite"), "{message}");
    let message = refused(AttentionOptions {
        softcap: Some(-1.0),
        ..Default::default()
    });
    assert!(message.contains("softcap"), "{message}");
}
