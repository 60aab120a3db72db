//! Property test: random shapes, layouts, dtypes, masks, options and paths agree with
//! the reference. Every option is drawn (causal alignments, key lengths and
//! `align_to_key_lengths`, bool and additive masks of every broadcast, sliding windows,
//! ALiBi, soft-capping, a scale, the weights (averaged or not), the output layout), in
//! f32 and f16, on every path: materialized, each registered fused tiling (the
//! tensor-core one through its emulation, `Context::emulate_cooperative_matrix`) and
//! split-K decode in both designs.
//!
//! Cases the adapter cannot run (f16 without SHADER_F16, a tiling whose needs it does
//! not meet) are counted, not silently dropped: the test fails if more than
//! [`MAX_FILTERED_SHARE`] of them did not run (on lavapipe through Vulkan, CI's adapter,
//! if any did not), and says so where the adapter lacks f16 or subgroups.
//!
//! A second test draws the same way for the backward pass (issue 39): every path's
//! backward (the fused tilings', the materialized one) against the f64 reference
//! gradients.
//!
//! The run draws from one seed, printed on failure: `WGPU_ATTENTION_TEST_SEED=<seed>`
//! draws the same cases again.

use crate::common;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, CheckCase, Rng};
use wgpu_attention::kernels::decode::DecodeDesign;
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{
    AttentionOptions, AttentionShape, CausalAlignment, Context, DType, FusedTiling, KernelChoice, Layout, Precision,
    Window,
};

/// The largest share of drawn cases that may go unrun for want of a capability.
const MAX_FILTERED_SHARE: f64 = 0.25;

/// Cases per run: lavapipe is a CPU, and each case checks against an f64 reference.
const CASES: u32 = 48;

/// A path: the materialized kernels, a fused tiling, or split-K decode in one design
/// (`Registers` asks for the tiled design, `Subgroup` for the subgroup one).
#[derive(Clone, Copy, Debug)]
enum Path {
    Materialized,
    Fused(FusedTiling),
    Decode(FusedTiling),
}

fn paths() -> Vec<Path> {
    let mut paths = vec![Path::Materialized];
    paths.extend(FUSED_TILINGS.iter().map(|s| Path::Fused(s.tiling)));
    paths.extend([
        Path::Decode(FusedTiling::Registers),
        Path::Decode(FusedTiling::Subgroup),
    ]);
    paths
}

/// The option draws, as small integers and flags that shrink towards the plain case.
#[derive(Clone, Debug)]
struct Draw {
    sizes: (usize, usize, usize, usize, usize, usize, usize),
    path: usize,
    f16: bool,
    bshd: bool,
    causal: u8,
    mask: u8,
    key_lengths: bool,
    align: bool,
    window: u8,
    alibi: u8,
    softcap: bool,
    scale: bool,
    weights: u8,
    output_layout: u8,
    /// 0: no position offset; else one drawn around the alignments' (below, inside, past).
    offset: u8,
    seed: u64,
}

fn arb_draw() -> impl Strategy<Value = Draw> {
    (
        (
            1usize..3,
            1usize..4,
            1usize..3,
            1usize..300,
            1usize..300,
            1usize..140,
            1usize..140,
        ),
        (0..paths().len(), any::<bool>(), any::<bool>(), 0u8..3, 0u8..5),
        (
            any::<bool>(),
            any::<bool>(),
            0u8..4,
            0u8..3,
            any::<bool>(),
            any::<bool>(),
        ),
        (0u8..3, 0u8..3, 0u8..4, any::<u64>()),
    )
        .prop_map(
            |(
                sizes,
                (path, f16, bshd, causal, mask),
                (key_lengths, align, window, alibi, softcap, scale),
                (weights, output_layout, offset, seed),
            )| Draw {
                sizes,
                path,
                f16,
                bshd,
                causal,
                mask,
                key_lengths,
                align,
                window,
                alibi,
                softcap,
                scale,
                weights,
                output_layout,
                offset,
                seed,
            },
        )
}

/// The case a draw describes, and its path.
fn case_of(d: &Draw) -> (CheckCase, Path) {
    let path = paths()[d.path];
    let (b, group, hkv, mut lq, mut lk, mut dim, mut dim_v) = d.sizes;
    let coop = matches!(path, Path::Fused(FusedTiling::Coop));
    if coop {
        // The emulation is slow, and its loops count against llvmpipe's cap.
        (lq, lk, dim, dim_v) = (1 + lq % 48, 1 + lk % 64, 1 + dim % 64, 1 + dim_v % 64);
    }
    let shape = AttentionShape {
        batch: b,
        heads_q: hkv * group,
        heads_kv: hkv,
        len_q: lq,
        len_k: lk,
        head_dim: dim,
        head_dim_v: dim_v,
    };
    let mut rng = Rng::new(d.seed);
    let (kernel, tiling) = match path {
        Path::Materialized => (KernelChoice::Materialized, FusedTiling::Auto),
        Path::Fused(t) => (KernelChoice::Fused, t),
        Path::Decode(t) => (KernelChoice::Decode, t),
    };
    let dtype = if d.f16 { DType::F16 } else { DType::F32 };
    let key_lengths = d
        .key_lengths
        .then(|| (0..b).map(|_| rng.below(lk + 1) as u32).collect::<Vec<u32>>());
    let options = AttentionOptions {
        causal: match d.causal {
            0 => None,
            1 => Some(CausalAlignment::TopLeft),
            _ => Some(CausalAlignment::BottomRight),
        },
        mask: match d.mask {
            0 => None,
            1 => Some(random_bool_mask(&mut rng, [b, 1, lq, lk])),
            2 => Some(random_additive_mask(&mut rng, [1, shape.heads_q, lq, lk])),
            3 => Some(random_bool_mask(&mut rng, [1, shape.heads_q, 1, lk])),
            _ => Some(random_additive_mask(&mut rng, [b, 1, 1, lk])),
        },
        // Positions from the key lengths need key lengths: drawn together, never
        // refused (and never with a position offset, which sets positions itself).
        align_to_key_lengths: d.align && key_lengths.is_some() && d.offset == 0,
        // A partition's view of the keys: queries before, among or past them.
        position_offset: match d.offset {
            0 => None,
            1 => Some(-(rng.below(lk + lq) as i64)),
            2 => Some(rng.below(lk + 1) as i64 - lq as i64),
            _ => Some((lk + rng.below(2 * lk + 2)) as i64),
        },
        key_lengths,
        window: match d.window {
            0 => None,
            1 => Some(Window {
                left: Some(rng.below(lk / 2 + 2)),
                right: Some(rng.below(lk / 4 + 2)),
            }),
            // Up to three times the keys: past Lq + Lk, which reaches every key unless a
            // position offset moved the queries further away.
            2 => Some(Window {
                left: Some(rng.below(3 * lk + 2)),
                right: None,
            }),
            _ => Some(Window {
                left: None,
                right: Some(rng.below(4)),
            }),
        },
        alibi_slopes: match d.alibi {
            0 => None,
            1 => Some(wgpu_attention::check::alibi_slopes(shape.heads_q)),
            _ => Some(rng.vec(shape.heads_q, -0.25, 1.0)),
        },
        softcap: d.softcap.then(|| rng.uniform(0.5, 30.0)),
        scale: d.scale.then(|| rng.uniform(0.05, 1.5)),
        need_weights: d.weights > 0,
        average_weights: d.weights == 2,
        output_layout: match d.output_layout {
            0 => None,
            1 => Some(Layout::Bhsd),
            _ => Some(Layout::Bshd),
        },
        kernel,
        tiling,
        // The tensor-core tiling takes f32 inputs at precision medium only.
        precision: if coop { Precision::Medium } else { Precision::Highest },
        ..Default::default()
    };
    let case = CheckCase {
        shape,
        options,
        dtype,
        layout: if d.bshd { Layout::Bshd } else { Layout::Bhsd },
        seed: d.seed,
        range: 1.0,
    };
    (case, path)
}

/// A context that emulates cooperative matrices, if this adapter can.
fn emulating() -> Option<&'static Context> {
    static EMULATING: OnceLock<Option<Context>> = OnceLock::new();
    EMULATING
        .get_or_init(|| {
            let mut ctx = common::own_ctx()?;
            ctx.limit_loop_iterations(wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP);
            ctx.emulate_cooperative_matrix().ok().map(|()| ctx)
        })
        .as_ref()
}

/// The context to run a case on, or why this adapter cannot run it.
fn context_for(ctx: &'static Context, case: &CheckCase, path: Path) -> Result<&'static Context, String> {
    if case.dtype == DType::F16 && !ctx.capabilities().f16 {
        return Err("f16 without SHADER_F16".into());
    }
    match path {
        Path::Materialized => Ok(ctx),
        Path::Fused(FusedTiling::Coop) => {
            emulating().ok_or_else(|| "the coop tiling without cooperative-matrix emulation".to_string())
        }
        Path::Fused(t) => ctx.fused_config(t).map(|_| ctx).map_err(|e| e.to_string()),
        Path::Decode(t) => DecodeDesign::for_context(ctx, ctx.policy(), t)
            .map(|_| ctx)
            .map_err(|e| e.to_string()),
    }
}

/// The seed of this run: `WGPU_ATTENTION_TEST_SEED`, else drawn from the clock.
fn run_seed() -> u64 {
    match std::env::var("WGPU_ATTENTION_TEST_SEED") {
        Ok(s) => s.trim().parse().expect("WGPU_ATTENTION_TEST_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    }
}

#[test]
fn random_problems_match_the_reference() {
    let Some(ctx) = common::ctx() else { return };
    let seed = run_seed();
    eprintln!("random_problems_match_the_reference: WGPU_ATTENTION_TEST_SEED={seed}");
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: CASES,
        // Failures are reported with the run's seed instead.
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    let (ran, filtered) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let reasons = std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let result = runner.run(&arb_draw(), |draw| {
        let (case, path) = case_of(&draw);
        match context_for(ctx, &case, path) {
            Ok(on) => {
                ran.fetch_add(1, Ordering::Relaxed);
                let outcome = wgpu_attention::check::run_case(on, &case)
                    .map_err(|e| TestCaseError::fail(format!("{path:?}: the case was refused or failed: {e}")))?;
                if !outcome.passed {
                    return Err(TestCaseError::fail(format!(
                        "{path:?} differs from the reference: {}",
                        outcome.summary()
                    )));
                }
            }
            Err(why) => {
                filtered.fetch_add(1, Ordering::Relaxed);
                *reasons.lock().expect("reasons").entry(why).or_default() += 1;
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, draw)) => {
            let (case, path) = case_of(&draw);
            panic!(
                "WGPU_ATTENTION_TEST_SEED={seed}: {why}\n{path:?} {:?} {:?} {:?}\noptions: {:?}\ndraw: {draw:?}",
                case.shape, case.dtype, case.layout, case.options
            );
        }
        Err(e) => panic!("WGPU_ATTENTION_TEST_SEED={seed}: {e}"),
    }
    let (ran, filtered) = (ran.into_inner(), filtered.into_inner());
    let reasons = reasons.into_inner().expect("reasons");
    let share = filtered as f64 / (ran + filtered).max(1) as f64;
    eprintln!("ran {ran} cases, filtered out {filtered} ({reasons:?})");
    assert!(ran > 0, "WGPU_ATTENTION_TEST_SEED={seed}: no case ran ({reasons:?})");
    if common::is_vulkan_lavapipe(ctx) {
        // lavapipe has f16, 8-lane subgroups of a fixed size and so every path.
        assert_eq!(
            filtered, 0,
            "WGPU_ATTENTION_TEST_SEED={seed}: lavapipe left cases unrun: {reasons:?}"
        );
    }
    if share > MAX_FILTERED_SHARE {
        let caps = ctx.capabilities();
        assert!(
            !caps.f16 || caps.subgroups.is_none(),
            "WGPU_ATTENTION_TEST_SEED={seed}: {filtered} of {} cases did not run ({reasons:?}), more than {}%",
            ran + filtered,
            MAX_FILTERED_SHARE * 100.0
        );
        // llvmpipe GL: no f16 and no subgroups leave half the draws unrun.
        common::skip_lacking(
            ctx,
            &format!(
                "f16 or subgroups: {filtered} of {} cases did not run ({reasons:?})",
                ran + filtered
            ),
            true,
        );
    }
}

/// Cases per run of the backward test (each runs the forward and the backward, and the
/// reference of both).
const BACKWARD_CASES: u32 = 24;

#[test]
fn random_backward_problems_match_the_reference() {
    let Some(ctx) = common::ctx() else { return };
    let seed = run_seed();
    eprintln!("random_backward_problems_match_the_reference: WGPU_ATTENTION_TEST_SEED={seed}");
    // Other draws than the forward test's from the same seed.
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&(seed ^ 0xBAC4).to_le_bytes());
    let config = Config {
        cases: BACKWARD_CASES,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes));
    // Up to 120 rows and keys: the materialized backward walks a row of the score
    // matrix per head-dim element, within Mesa 22's loop cap.
    let backward_case = |draw: &Draw| {
        let mut draw = draw.clone();
        draw.sizes.3 = 1 + draw.sizes.3 % 120;
        draw.sizes.4 = 1 + draw.sizes.4 % 120;
        case_of(&draw)
    };
    let ran = AtomicUsize::new(0);
    let result = runner.run(&arb_draw(), |draw| {
        let (case, path) = backward_case(&draw);
        let Ok(on) = context_for(ctx, &case, path) else {
            return Ok(());
        };
        ran.fetch_add(1, Ordering::Relaxed);
        let outcome = wgpu_attention::check::run_backward_case(on, &case)
            .map_err(|e| TestCaseError::fail(format!("{path:?}: the backward was refused or failed: {e}")))?;
        if !outcome.passed {
            return Err(TestCaseError::fail(format!(
                "{path:?}: backward differs from the reference: {}",
                outcome.summary()
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        let detail = match &e {
            TestError::Fail(_, draw) => {
                let (case, path) = backward_case(draw);
                format!(
                    "\n{path:?} {:?} {:?} {:?}\noptions: {:?}",
                    case.shape, case.dtype, case.layout, case.options
                )
            }
            TestError::Abort(_) => String::new(),
        };
        panic!("WGPU_ATTENTION_TEST_SEED={seed}: {e}{detail}");
    }
    assert!(
        ran.into_inner() > 0,
        "WGPU_ATTENTION_TEST_SEED={seed}: no backward case ran"
    );
}
