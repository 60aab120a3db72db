//! The backward pass (issue 39) against the f64 reference gradients with the bound of
//! docs/design.md ("Backward", `check::run_backward_case`): random shapes and every
//! option with a gradient meaning, GQA, both layouts, f32 and f16, long ranges split
//! under a loop cap, and bitwise repeatability.

use crate::common;

use wgpu_attention::check::{random_additive_mask, random_bool_mask, run_backward_case, CheckCase, Rng};
use wgpu_attention::{
    backward_tiling, sdpa, sdpa_backward, AttentionOptions, AttentionShape, BackwardTiling, CausalAlignment, Context,
    DType, FusedTiling, KernelChoice, Layout, Precision, Tensor, Window,
};

fn assert_passes(ctx: &Context, case: CheckCase) {
    let outcome = run_backward_case(ctx, &case).unwrap_or_else(|e| panic!("seed {}: {e}", case.seed));
    assert!(
        outcome.passed,
        "seed {} {:?} {:?} {:?} {:?}: {}",
        case.seed,
        case.shape,
        case.dtype,
        case.layout,
        case.options,
        outcome.summary()
    );
}

fn case(shape: AttentionShape, options: AttentionOptions, dtype: DType, layout: Layout, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options,
        dtype,
        layout,
        seed,
        range: 1.0,
    }
}

#[test]
fn gradients_match_the_reference_across_shapes_options_and_dtypes() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(390);
    let shapes = [
        AttentionShape::new(1, 2, 2, 9, 13, 8, 8),
        AttentionShape::new(2, 4, 2, 17, 6, 12, 20),
        AttentionShape::new(1, 3, 1, 1, 33, 64, 32),
        AttentionShape::new(1, 1, 1, 40, 1, 5, 3),
    ];
    let mut seed = 3900;
    for s in shapes {
        for variant in 0..6 {
            seed += 1;
            let [b, hq, lq, lk] = [s.batch, s.heads_q, s.len_q, s.len_k];
            let options = match variant {
                0 => AttentionOptions::default(),
                1 => AttentionOptions {
                    causal: Some(if seed % 2 == 0 {
                        CausalAlignment::TopLeft
                    } else {
                        CausalAlignment::BottomRight
                    }),
                    key_lengths: Some((0..b).map(|i| (lk - i.min(lk - 1)) as u32).collect()),
                    ..Default::default()
                },
                2 => AttentionOptions {
                    mask: Some(random_bool_mask(&mut rng, [b, 1, lq, lk])),
                    scale: Some(0.3),
                    ..Default::default()
                },
                3 => AttentionOptions {
                    mask: Some(random_additive_mask(&mut rng, [1, hq, 1, lk])),
                    softcap: Some(1.5),
                    ..Default::default()
                },
                4 => AttentionOptions {
                    window: Some(Window {
                        left: Some(3),
                        right: Some(1),
                    }),
                    alibi_slopes: Some((0..hq).map(|h| 0.5 / (h + 1) as f32).collect()),
                    ..Default::default()
                },
                _ => AttentionOptions {
                    // Key length 0 for the first batch element: rows with no visible
                    // key get zero gradients.
                    key_lengths: Some((0..b).map(|i| if i == 0 { 0 } else { lk as u32 }).collect()),
                    align_to_key_lengths: seed % 2 == 0,
                    ..Default::default()
                },
            };
            let dtype = if seed % 3 == 0 { DType::F16 } else { DType::F32 };
            let layout = if seed % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            assert_passes(ctx, case(s, options, dtype, layout, seed));
        }
    }
}

#[test]
fn every_backward_tiling_matches_the_reference() {
    // The adapter's own pick (the subgroup tiling on lavapipe, for head dims up to 64
    // and up to 128), the rows tiling (forced through the forward's registers tiling),
    // the blocked one (through the forward's shared tiling: lavapipe's 32 KiB take its
    // 16-row variant at D 64, 8-row at D 128, and rows past that) and the materialized
    // path, on masks that reach every rule of both dK/dV orientations.
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(3994);
    let shapes = [
        AttentionShape::new(2, 4, 2, 37, 45, 24, 40),
        AttentionShape::new(1, 2, 1, 21, 70, 100, 72),
        AttentionShape::new(1, 2, 2, 33, 19, 136, 136),
    ];
    let mut seed = 39940;
    for s in shapes {
        let paths = [
            (KernelChoice::Auto, FusedTiling::Auto),
            (KernelChoice::Auto, FusedTiling::Registers),
            (KernelChoice::Auto, FusedTiling::Shared),
            (KernelChoice::Materialized, FusedTiling::Auto),
        ];
        for (kernel, tiling) in paths {
            for variant in 0..3 {
                seed += 1;
                let [b, hq, lq, lk] = [s.batch, s.heads_q, s.len_q, s.len_k];
                let options = match variant {
                    0 => AttentionOptions {
                        causal: Some(CausalAlignment::BottomRight),
                        key_lengths: Some((0..b).map(|i| (lk - 3 * i) as u32).collect()),
                        ..Default::default()
                    },
                    1 => AttentionOptions {
                        mask: Some(random_bool_mask(&mut rng, [b, hq, lq, lk])),
                        softcap: Some(2.0),
                        alibi_slopes: Some((0..hq).map(|h| 0.25 / (h + 1) as f32).collect()),
                        ..Default::default()
                    },
                    _ => AttentionOptions {
                        window: Some(Window {
                            left: Some(5),
                            right: Some(2),
                        }),
                        mask: Some(random_additive_mask(&mut rng, [1, 1, lq, lk])),
                        ..Default::default()
                    },
                };
                let options = AttentionOptions {
                    kernel,
                    tiling,
                    ..options
                };
                let dtype = if seed % 2 == 0 { DType::F16 } else { DType::F32 };
                let layout = if seed % 3 == 0 { Layout::Bshd } else { Layout::Bhsd };
                assert_passes(ctx, case(s, options, dtype, layout, seed));
            }
        }
    }
}

#[test]
fn f32_below_highest_precision_takes_f16_tiles_in_the_blocked_tiling() {
    // Through the forward's shared tiling: f32 inputs at precision medium get the
    // blocked tiling's f16 tiles (f16's tile sizes) where the adapter has f16, within
    // the bound for products rounded to f16; at highest, or without f16, f32 tiles.
    let Some(ctx) = common::ctx() else { return };
    let f16 = ctx.capabilities().f16;
    let mut rng = Rng::new(3995);
    let shapes = [
        AttentionShape::new(2, 4, 2, 45, 38, 64, 48),
        AttentionShape::new(1, 2, 1, 29, 70, 100, 128),
        AttentionShape::new(1, 2, 2, 21, 19, 136, 200),
    ];
    let mut seed = 39950;
    for s in shapes {
        for precision in [Precision::Medium, Precision::Highest] {
            seed += 1;
            let options = AttentionOptions {
                tiling: FusedTiling::Shared,
                precision,
                causal: Some(CausalAlignment::BottomRight),
                mask: Some(random_additive_mask(&mut rng, [1, s.heads_q, s.len_q, s.len_k])),
                softcap: Some(3.0),
                ..Default::default()
            };
            let tiling = backward_tiling(ctx, DType::F32, &options, &s).expect("tiling");
            match tiling {
                BackwardTiling::Blocked(v) => {
                    assert_eq!(v.half_tiles, f16 && precision == Precision::Medium, "{s:?}")
                }
                other if (precision == Precision::Highest || !f16) && s.head_dim > 128 => {
                    assert_eq!(other, BackwardTiling::Rows, "f32 tiles at D 256: rows")
                }
                other => panic!("{s:?} {precision:?}: {other:?}, not blocked"),
            }
            assert_passes(ctx, case(s, options, DType::F32, Layout::Bshd, seed));
        }
    }
}

#[test]
fn head_dims_up_to_128_with_key_ranges_in_both_dtypes() {
    // Head dims past 64 (the subgroup tiling's D 128 class on CPU adapters), every
    // visible-key-range rule, GQA included.
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 4, 2, 40, 50, 128, 96);
    let mut seed = 39960;
    for dtype in [DType::F32, DType::F16] {
        for causal in [CausalAlignment::TopLeft, CausalAlignment::BottomRight] {
            seed += 1;
            let options = AttentionOptions {
                causal: Some(causal),
                key_lengths: Some(vec![50, 37]),
                window: Some(Window {
                    left: Some(20),
                    right: None,
                }),
                ..Default::default()
            };
            let layout = if seed % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            assert_passes(ctx, case(s, options, dtype, layout, seed));
        }
    }
}

#[test]
fn random_whole_word_problems_with_key_ranges() {
    // Head dims of whole 16-byte words up to 128 with only visible key ranges as masks,
    // drawn at random: ragged and tiny lengths, GQA, both layouts and dtypes, every
    // key-range rule.
    let Some(ctx) = common::ctx() else { return };
    let seed = 39970;
    let mut rng = Rng::new(seed);
    for i in 0..12 {
        let dtype = if i % 2 == 0 { DType::F32 } else { DType::F16 };
        let word = if dtype == DType::F32 { 4 } else { 8 };
        let dim = |rng: &mut Rng| word * (1 + rng.below(128 / word));
        let hk = 1 + rng.below(2);
        let s = AttentionShape::new(
            1 + rng.below(2),
            hk * (1 + rng.below(3)),
            hk,
            1 + rng.below(70),
            1 + rng.below(70),
            dim(&mut rng),
            dim(&mut rng),
        );
        let lk = s.len_k;
        let options = AttentionOptions {
            causal: match rng.below(3) {
                0 => None,
                1 => Some(CausalAlignment::TopLeft),
                _ => Some(CausalAlignment::BottomRight),
            },
            key_lengths: (rng.below(2) == 0).then(|| (0..s.batch).map(|_| rng.below(lk + 1) as u32).collect()),
            window: (rng.below(2) == 0).then(|| Window {
                left: Some(rng.below(20)),
                right: (rng.below(2) == 0).then(|| rng.below(5)),
            }),
            ..Default::default()
        };
        let layout = if rng.below(2) == 0 { Layout::Bshd } else { Layout::Bhsd };
        assert_passes(ctx, case(s, options, dtype, layout, seed + i));
    }
}

#[test]
fn long_ranges_split_under_a_loop_cap_give_the_same_gradients() {
    // Both walks split into several dispatches that add to the previous sums.
    let Some(ctx) = common::capped_ctx() else { return };
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    let s = AttentionShape::new(1, 4, 2, 300, 280, 64, 64);
    assert_passes(ctx, case(s, options.clone(), DType::F32, Layout::Bhsd, 3990));
    // The blocked tiling (through the forward's shared one) walks tiles of 16 keys or
    // rows here, a few hundred iterations each: a cap of its own splits it.
    let mut short = Context::new().expect("a second context on the same adapter");
    short.limit_loop_iterations(BLOCKED_CAP);
    let options = AttentionOptions {
        tiling: FusedTiling::Shared,
        ..options
    };
    assert_passes(&short, case(s, options, DType::F32, Layout::Bhsd, 3992));
}

/// Cuts the blocked tiling's walks over 300 rows and 280 keys into several dispatches.
const BLOCKED_CAP: u64 = 1_500;

#[test]
fn blocked_walks_past_the_drivers_own_loop_cap_split_where_they_must() {
    // The blocked tiling's iteration counts (kernels::backward_blocked) must bound what
    // the driver counts: under Mesa 22's own cap (65535) a dQ walk over 32000 keys and
    // a dK/dV walk over 32000 rows (2000 tiles of 16) split into several dispatches; a
    // count too low would let the driver cut a walk short (a count a quarter of this
    // one fails here on Mesa 22.3; half of it still passes). Few owned rows (or keys)
    // keep the problems cheap. Without a cap they run whole.
    let Some(ctx) = common::ctx() else { return };
    let options = AttentionOptions {
        tiling: FusedTiling::Shared,
        ..Default::default()
    };
    let cases = [
        AttentionShape::new(1, 1, 1, 16, 32_000, 64, 64),
        AttentionShape::new(1, 1, 1, 32_000, 16, 64, 64),
    ];
    for (i, s) in cases.into_iter().enumerate() {
        assert!(matches!(
            backward_tiling(ctx, DType::F32, &options, &s).expect("tiling"),
            BackwardTiling::Blocked(_)
        ));
        assert_passes(ctx, case(s, options.clone(), DType::F32, Layout::Bhsd, 3996 + i as u64));
    }
}

#[test]
fn gradients_repeat_bit_for_bit() {
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 4, 2, 50, 70, 32, 32);
    let mut rng = Rng::new(3991);
    let mut upload = |shape: [usize; 4]| {
        let data = rng.vec(shape.iter().product(), -1.0, 1.0);
        Tensor::from_f32(ctx, shape, Layout::Bhsd, &data).expect("upload")
    };
    let q = upload([2, 4, 50, 32]);
    let k = upload([2, 2, 70, 32]);
    let v = upload([2, 2, 70, 32]);
    let d_out = upload([2, 4, 50, 32]);
    // The adapter's tiling, and the blocked one (through the forward's shared tiling).
    for tiling in [FusedTiling::Auto, FusedTiling::Shared] {
        let options = AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            need_lse: true,
            tiling,
            ..Default::default()
        };
        let forward = sdpa(ctx, &q, &k, &v, &options).expect("forward");
        let lse = forward.lse.expect("lse");
        let run = || {
            let g = sdpa_backward(ctx, &q, &k, &v, &forward.out, &lse, &d_out, &options).expect("backward");
            [&g.dq, &g.dk, &g.dv].map(|t| t.to_f32_vec(ctx).expect("read"))
        };
        let first = run();
        assert!(first.iter().flatten().any(|&x| x != 0.0), "{s:?} {tiling:?}: all zero");
        for _ in 0..3 {
            let again = run();
            for (a, b) in first.iter().zip(&again) {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{tiling:?}");
            }
        }
    }
}

#[test]
fn keys_past_a_key_length_may_hold_nan_without_spreading_it() {
    // A KV buffer's unused rows may hold anything; masked keys must add nothing.
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(1, 2, 1, 5, 8, 4, 4);
    let mut rng = Rng::new(3993);
    let q = rng.vec(2 * 5 * 4, -1.0, 1.0);
    let mut k = rng.vec(8 * 4, -1.0, 1.0);
    let mut v = rng.vec(8 * 4, -1.0, 1.0);
    let d_out = rng.vec(2 * 5 * 4, -1.0, 1.0);
    for x in k[5 * 4..].iter_mut().chain(v[5 * 4..].iter_mut()) {
        *x = f32::NAN;
    }
    let upload = |data: &[f32], shape| Tensor::from_f32(ctx, shape, Layout::Bhsd, data).expect("upload");
    let (qt, kt, vt, dt) = (
        upload(&q, [1, 2, 5, 4]),
        upload(&k, [1, 1, 8, 4]),
        upload(&v, [1, 1, 8, 4]),
        upload(&d_out, [1, 2, 5, 4]),
    );
    // Every backward tiling the adapter has: its own, rows (through the forward's
    // registers tiling) and blocked (through shared); and the materialized backward.
    let paths = [
        (KernelChoice::Fused, FusedTiling::Auto),
        (KernelChoice::Fused, FusedTiling::Registers),
        (KernelChoice::Fused, FusedTiling::Shared),
        (KernelChoice::Materialized, FusedTiling::Auto),
    ];
    for (kernel, tiling) in paths {
        let options = AttentionOptions {
            key_lengths: Some(vec![5]),
            need_lse: true,
            kernel,
            tiling,
            ..Default::default()
        };
        // The forward on the GPU too, whose output the NaN must not reach either.
        let forward = sdpa(ctx, &qt, &kt, &vt, &options).expect("forward");
        let lse = forward.lse.as_ref().expect("lse");
        let g = sdpa_backward(ctx, &qt, &kt, &vt, &forward.out, lse, &dt, &options).expect("backward");
        let want = wgpu_attention::reference::attention_backward(&q, &k, &v, &d_out, &s, &options).expect("reference");
        for (name, t, w) in [
            ("dq", &g.dq, &want.dq),
            ("dk", &g.dk, &want.dk),
            ("dv", &g.dv, &want.dv),
        ] {
            let got = t.to_f32_vec(ctx).expect("read");
            for (i, (a, b)) in got.iter().zip(w).enumerate() {
                assert!(
                    a.is_finite() && (f64::from(*a) - b).abs() <= 1e-5,
                    "{kernel:?}/{tiling:?} {name}[{i}]: {a} against {b}"
                );
            }
        }
    }
}

/// The options of `rows_gpu_classes`' `variant`: masks reaching every rule between
/// them (causal and key lengths; a bool mask, soft cap and ALiBi; a window and an
/// additive mask), with the forward's registers tiling, which gets the `rows` backward.
fn rows_class_options(rng: &mut Rng, s: &AttentionShape, variant: usize) -> AttentionOptions {
    let [b, hq, lq, lk] = [s.batch, s.heads_q, s.len_q, s.len_k];
    let options = match variant {
        0 => AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some((0..b).map(|i| (lk - 3 * i) as u32).collect()),
            ..Default::default()
        },
        1 => AttentionOptions {
            mask: Some(random_bool_mask(rng, [b, hq, lq, lk])),
            softcap: Some(2.0),
            alibi_slopes: Some((0..hq).map(|h| 0.25 / (h + 1) as f32).collect()),
            ..Default::default()
        },
        _ => AttentionOptions {
            window: Some(Window {
                left: Some(5),
                right: Some(2),
            }),
            mask: Some(random_additive_mask(rng, [1, 1, lq, lk])),
            ..Default::default()
        },
    };
    AttentionOptions {
        kernel: KernelChoice::Fused,
        tiling: FusedTiling::Registers,
        ..options
    }
}

/// One shape per `rows` head-dim class (D <= 32, 64, 128, 256) and the class and lanes
/// `rows_for` must give it on a GPU with subgroups (`subgroups`) or without.
fn rows_class_shapes(subgroups: bool) -> [(AttentionShape, wgpu_attention::PassKernels, u32); 4] {
    use wgpu_attention::{ROWS_128, ROWS_128_WG, ROWS_256, ROWS_256_WG, ROWS_32, ROWS_64, ROWS_64_WG};
    let pick = |shuffled, in_workgroup| if subgroups { shuffled } else { in_workgroup };
    [
        (AttentionShape::new(2, 4, 2, 13, 21, 8, 20), ROWS_32, 1),
        (
            AttentionShape::new(1, 2, 1, 37, 45, 24, 40),
            pick(ROWS_64, ROWS_64_WG),
            2,
        ),
        (
            AttentionShape::new(1, 2, 2, 21, 70, 100, 72),
            pick(ROWS_128, ROWS_128_WG),
            4,
        ),
        (
            AttentionShape::new(1, 2, 1, 19, 33, 136, 256),
            pick(ROWS_256, ROWS_256_WG),
            8,
        ),
    ]
}

/// Both `rows` walks split into dispatches of a few blocks (the D 128 class's loop
/// counts, kernels::loop_budget, under a cap of 2000 iterations), adding to what the
/// previous dispatch left.
fn assert_split_walks_pass(ctx: &mut Context, seed: u64) {
    ctx.limit_loop_iterations(2_000);
    let s = AttentionShape::new(1, 2, 1, 90, 80, 100, 100);
    let options = AttentionOptions {
        kernel: KernelChoice::Fused,
        tiling: FusedTiling::Registers,
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    assert_passes(ctx, case(s, options, DType::F32, Layout::Bhsd, seed));
}

#[test]
fn rows_in_its_gpu_classes_matches_the_reference() {
    // A GPU's `rows` backward (forced here through the forward's registers tiling) runs
    // a head-dim class whose arrays live in registers (backward::rows_for): each row or
    // key over 1, 2, 4 or 8 lanes whose partial dot products subgroup shuffles sum; a
    // CPU adapter the run-time kernels, which the tests above run. Here the GPU classes
    // on lavapipe (8-lane subgroups take them all), every class (f32 at 1 and 4 lanes,
    // f16 at 2 and 8), with masks reaching every rule, and (under a low loop cap) walks
    // split across dispatches that add to what the previous left.
    use wgpu_attention::rows_for;
    let Some(mut ctx) = common::own_ctx() else { return };
    if ctx.capabilities().subgroups.is_none_or(|(min, _)| min < 8) {
        common::skip_lacking(&ctx, "SUBGROUP with 8 lanes (rows' GPU classes)", true);
        return;
    }
    ctx.use_gpu_variants();
    let mut rng = Rng::new(3995);
    let mut seed = 39950;
    for (s, class, lanes) in rows_class_shapes(true) {
        let (kernels, got_lanes) = rows_for(s.head_dim.max(s.head_dim_v), ctx.capabilities());
        assert_eq!(
            (kernels.dq, kernels.dkdv, got_lanes),
            (class.dq, class.dkdv, lanes),
            "{s:?}"
        );
        for variant in 0..3 {
            seed += 1;
            let options = rows_class_options(&mut rng, &s, variant);
            let tiling = backward_tiling(&ctx, DType::F32, &options, &s).expect("a tiling");
            assert_eq!(tiling, BackwardTiling::Rows);
            // One dtype per class, alternating (each class's pipelines compile cold in
            // CI: both dtypes doubled the test's minutes on Mesa 25).
            let dtype = if lanes.ilog2() % 2 == 1 && ctx.capabilities().f16 {
                DType::F16
            } else {
                DType::F32
            };
            let layout = if seed % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            assert_passes(&ctx, case(s, options.clone(), dtype, layout, seed));
        }
    }
    assert_split_walks_pass(&mut ctx, 39959);
}

#[test]
fn rows_on_a_gpu_without_subgroups_matches_the_reference() {
    // A GPU without subgroups (WebGPU without the `subgroups` feature, GL) gets the
    // `rows` classes past one lane with the lanes' sums through workgroup memory
    // (backward::rows_for). Here on lavapipe with its subgroups forgotten: each such
    // class once, the mask variants and dtypes rotating, and a walk split under a loop
    // cap.
    use wgpu_attention::rows_for;
    let Some(mut ctx) = common::own_ctx() else { return };
    ctx.use_gpu_variants();
    ctx.use_no_subgroups();
    let f16 = ctx.capabilities().f16;
    let mut rng = Rng::new(3996);
    let mut seed = 39960;
    for (variant, (s, class, lanes)) in rows_class_shapes(false).into_iter().enumerate().skip(1) {
        let (kernels, got_lanes) = rows_for(s.head_dim.max(s.head_dim_v), ctx.capabilities());
        assert_eq!(
            (kernels.dq, kernels.dkdv, got_lanes),
            (class.dq, class.dkdv, lanes),
            "{s:?}"
        );
        seed += 1;
        let options = rows_class_options(&mut rng, &s, variant % 3);
        assert_eq!(
            backward_tiling(&ctx, DType::F32, &options, &s).expect("a tiling"),
            BackwardTiling::Rows
        );
        let dtype = if variant == 2 && f16 { DType::F16 } else { DType::F32 };
        let layout = if seed % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
        assert_passes(&ctx, case(s, options, dtype, layout, seed));
    }
    assert_split_walks_pass(&mut ctx, 39969);
}
