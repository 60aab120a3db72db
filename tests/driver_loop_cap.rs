//! The loop cap, observed rather than assumed. A context on a CPU adapter probes how many
//! loop iterations one invocation may run (`kernels::loop_probe`); the kernels' loop
//! budgets follow `Context::loop_cap`. This test runs the probe's loop at several lengths
//! and checks that the count stops exactly at the context's cap (or never, without one),
//! and pins what was measured per driver: Mesa 22's llvmpipe stops at 65535, Mesa 25's
//! does not stop. A Mesa release that moves the cap fails here first.

use crate::common;
use wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP;
use wgpu_attention::kernels::loop_probe::{trips, PROBE_TRIPS};

#[test]
fn loops_stop_exactly_at_the_contexts_loop_cap() {
    let Some(ctx) = common::ctx() else { return };
    let info = ctx.adapter_info();
    let driver = format!("{} / {} / {}", info.name, info.driver, info.driver_info);
    let cap = ctx.loop_cap();
    eprintln!("{driver}: loop cap {cap:?}");
    let cap32 = LLVMPIPE_LOOP_CAP as u32;
    for n in [1000, cap32, cap32 + 1, 3 * cap32, PROBE_TRIPS] {
        let ran = trips(ctx.device(), ctx.queue(), n).expect("the probe runs");
        let expected = cap.map_or(n, |c| n.min(c as u32));
        assert_eq!(
            ran, expected,
            "{driver}: a loop of {n} trips ran {ran} (loop cap {cap:?})"
        );
    }
    if info.driver_info.contains("Mesa 22.") && info.name.contains("llvmpipe") {
        assert_eq!(cap, Some(LLVMPIPE_LOOP_CAP), "{driver}");
    }
    if info.driver_info.contains("Mesa 25.") {
        assert_eq!(cap, None, "{driver}: measured without a cap on Mesa 25.0.7");
    }
}

#[test]
fn a_forced_cap_only_ever_lowers_the_drivers() {
    let Some(shared) = common::ctx() else { return };
    let mut ctx = wgpu_attention::Context::new().expect("a second context");
    assert_eq!(ctx.loop_cap(), shared.loop_cap(), "the probe gives the same cap twice");
    ctx.limit_loop_iterations(u64::MAX);
    assert_eq!(ctx.loop_cap(), Some(shared.loop_cap().unwrap_or(u64::MAX)));
    ctx.limit_loop_iterations(1000);
    assert_eq!(ctx.loop_cap(), Some(1000));
    ctx.limit_loop_iterations(5000);
    assert_eq!(ctx.loop_cap(), Some(1000), "raised a forced cap");
}

#[test]
fn every_tiling_is_exact_at_its_loop_budget() {
    // On a driver that caps loops (Mesa 22's llvmpipe), one dispatch walking exactly
    // the most keys a tiling's iteration model allows must still be exact: a model that
    // undercounts some loop lets the driver cut the kernel short there, and the result
    // is wrong. One more block of 4 keys must exceed the cap (the bound is tight).
    use wgpu_attention::check::CheckCase;
    use wgpu_attention::kernels::flash::FUSED_TILINGS;
    use wgpu_attention::kernels::loop_budget::{fused_iterations, keys_per_dispatch};
    use wgpu_attention::{AttentionOptions, AttentionShape, DType, KernelChoice, Layout};
    let Some(ctx) = common::ctx() else { return };
    let Some(cap) = ctx.loop_cap() else {
        // Mesa 25's lavapipe and GPUs run loops to the end; Mesa 22's caps them.
        common::skip_lacking(ctx, "a loop cap", mesa_caps_loops(ctx));
        return;
    };
    for spec in FUSED_TILINGS.iter().filter(|s| ctx.fused_config(s.tiling).is_ok()) {
        let config = ctx.fused_config(spec.tiling).expect("filtered");
        // D 16: the texel kernel's own model bounds the subgroup tiling there.
        for d in [16, 64, 256] {
            let unbounded = AttentionShape::new(1, 2, 1, 33, 1 << 20, d, d);
            let most = keys_per_dispatch(&config, &unbounded, cap, ctx.capabilities(), ctx.policy())
                .expect("a block of keys fits");
            let at = AttentionShape {
                len_k: most,
                ..unbounded
            };
            let past = AttentionShape {
                len_k: most + 4,
                ..unbounded
            };
            let (caps, policy) = (ctx.capabilities(), ctx.policy());
            assert!(
                fused_iterations(&config, &at, caps, policy) <= cap
                    && fused_iterations(&config, &past, caps, policy) > cap
            );
            let case = CheckCase {
                shape: at,
                options: AttentionOptions {
                    kernel: KernelChoice::Fused,
                    tiling: spec.tiling,
                    // Every score transformed: the subgroup tiling then runs its masking
                    // loop at every block, its worst case.
                    softcap: Some(20.0),
                    ..Default::default()
                },
                dtype: DType::F32,
                layout: Layout::Bhsd,
                seed: 91 + d as u64,
                range: 1.0,
            };
            eprintln!("{}: D {d}, {most} keys in one dispatch", spec.name);
            common::assert_case(ctx, &case);
        }
    }
}

#[test]
fn decode_is_exact_at_its_loop_budget() {
    // The split-K decode kernel's iteration model, as the fused tilings' above: splits of
    // exactly the most keys the model allows, in its worst case (8-row blocks, Dv 256:
    // every column slot; D 2, read element by element: the tiles design's load4 runs its
    // tail loop at every key), so an undercounted
    // loop would let the driver cut them short.
    // 256 query heads on one kv head make 32 row blocks, a CPU adapter's target, so one
    // split per block.
    use wgpu_attention::check::CheckCase;
    use wgpu_attention::kernels::decode::{choose_split, DecodeDesign, TILE};
    use wgpu_attention::{AttentionOptions, AttentionShape, DType, KernelChoice, Layout};
    let Some(ctx) = common::ctx() else { return };
    let Some(cap) = ctx.loop_cap() else {
        // Mesa 25's lavapipe and GPUs run loops to the end; Mesa 22's caps them.
        common::skip_lacking(ctx, "a loop cap", mesa_caps_loops(ctx));
        return;
    };
    let dtype = if ctx.capabilities().f16 { DType::F16 } else { DType::F32 };
    let unbounded = AttentionShape::new(1, 256, 1, 1, 1 << 20, 2, 256);
    for tiling in common::decode_designs(ctx) {
        let design = DecodeDesign::for_context(ctx, ctx.policy(), tiling).expect("a design");
        let mut fit = TILE;
        while design.iterations(&unbounded, fit + TILE) <= cap {
            fit += TILE;
        }
        let at = AttentionShape {
            len_k: fit,
            ..unbounded
        };
        let split = choose_split(ctx, design, &at, at.len_k).expect("splits");
        assert_eq!((split.splits, split.split_keys), (1, fit), "one split at the budget");
        let case = CheckCase {
            shape: at,
            options: AttentionOptions {
                kernel: KernelChoice::Decode,
                tiling,
                softcap: Some(20.0),
                ..Default::default()
            },
            dtype,
            layout: Layout::Bhsd,
            seed: 4711,
            range: 1.0,
        };
        eprintln!("decode ({}): D 2, Dv 256, {fit} keys in one split", design.name());
        common::assert_case(ctx, &case);
    }
}

/// Whether this adapter's driver caps loops: Mesa's llvmpipe up to 22.x.
fn mesa_caps_loops(ctx: &wgpu_attention::Context) -> bool {
    ctx.capabilities().mesa_version.is_some_and(|(major, _)| major <= 22)
}
