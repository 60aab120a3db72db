//! Edge cases every GPU path must get right: huge logits, NaN/inf at masked positions,
//! key lengths of 0 and Lk, causal with Lq != Lk in both alignments, agreement of the
//! fused and materialized paths.

use crate::common;
use wgpu_attention::check::{random_bool_mask, random_qkv, run_case_with, CheckCase, Rng};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::kernels::loop_budget;
use wgpu_attention::{
    sdpa, AttentionOptions, AttentionShape, CausalAlignment, DType, Error, FusedTiling, KernelChoice, Layout, Mask,
    Tensor,
};

/// The paths this adapter can run: the materialized one and every registered fused
/// tiling whose needs it meets (say, subgroups of >= 8 lanes).
fn paths(ctx: &wgpu_attention::Context) -> Vec<(KernelChoice, FusedTiling)> {
    let fused = FUSED_TILINGS.iter().map(|s| (KernelChoice::Fused, s.tiling));
    std::iter::once((KernelChoice::Materialized, FusedTiling::Auto))
        .chain(fused)
        .filter(|&(k, t)| k == KernelChoice::Materialized || ctx.fused_config(t).is_ok())
        .collect()
}

fn case(shape: AttentionShape, options: AttentionOptions, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options,
        dtype: DType::F32,
        layout: Layout::Bhsd,
        seed,
        range: 1.0,
    }
}

fn on_every_path(mut c: CheckCase) {
    let Some(ctx) = common::ctx() else { return };
    for (kernel, tiling) in paths(ctx) {
        c.options.kernel = kernel;
        c.options.tiling = tiling;
        c.options.need_weights = true;
        common::assert_case(ctx, &c);
    }
}

#[test]
fn logits_of_magnitude_1e3_stay_exact() {
    // |scores| reach ~1e3: without the max subtraction exp() overflows, and a wrong
    // rescale in the online softmax shows up at once.
    let mut c = case(
        AttentionShape::new(1, 2, 2, 37, 150, 64, 32),
        AttentionOptions::default(),
        11,
    );
    c.range = 40.0;
    on_every_path(c);
}

/// Weights, outputs and lse at logits of about `magnitude`, on every path and dtype,
/// against the f64 reference with the weights bound of `Tolerance::weights_bound`
/// (weights that are nearly 0 or 1, as at such logits, must be exact).
fn weights_exact_at_logits(magnitude: f32, seed: u64) {
    let Some(ctx) = common::ctx() else { return };
    // Uniform q, k in [-r, r), D = 32: a score's standard deviation is r^2 / 3.
    let range = (3.0 * magnitude).sqrt();
    let options = AttentionOptions {
        key_lengths: Some(vec![150, 61]),
        ..Default::default()
    };
    let mut dtypes = vec![DType::F32];
    if ctx.capabilities().f16 {
        dtypes.push(DType::F16);
    }
    for dtype in dtypes {
        let mut c = case(AttentionShape::new(2, 2, 1, 37, 150, 32, 24), options.clone(), seed);
        c.range = range;
        c.dtype = dtype;
        on_every_path(c);
    }
}

#[test]
fn weights_are_exact_at_logits_of_1e3() {
    weights_exact_at_logits(1e3, 31);
}

#[test]
fn weights_are_exact_at_logits_of_1e4() {
    weights_exact_at_logits(1e4, 32);
}

#[test]
fn nan_and_inf_at_masked_keys_never_contribute() {
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 2, 1, 19, 23, 16, 16);
    let lens = vec![17, 9];
    // Key 3 is masked for everyone by an explicit mask; keys past each length by padding.
    let mut visible = vec![true; s.len_k];
    visible[3] = false;
    let options = AttentionOptions {
        key_lengths: Some(lens.clone()),
        mask: Some(Mask::boolean(&[1, 1, 1, s.len_k], visible).expect("valid mask")),
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    let c = case(s, options, 12);
    let [q, mut k, v] = random_qkv(&c);
    for b in 0..s.batch {
        for j in 0..s.len_k {
            if j == 3 || j >= lens[b] as usize {
                let poison = if j % 2 == 0 { f32::NAN } else { f32::INFINITY };
                k[(b * s.len_k + j) * s.head_dim..][..s.head_dim].fill(poison);
            }
        }
    }
    for (kernel, tiling) in paths(ctx) {
        let mut c = c.clone();
        c.options.kernel = kernel;
        c.options.tiling = tiling;
        c.options.need_weights = true;
        let outcome = run_case_with(ctx, &c, &q, &k, &v).expect("runs");
        assert!(outcome.passed, "{kernel:?}/{tiling:?}: {}", outcome.summary());
    }
}

/// NaN and inf in the K and V rows past each batch's key length (a KV buffer's unused
/// rows may hold anything), on every path, dtype and a prefill and a decode shape
/// (whole 16-byte rows, so that the texel kernels serve them where they run).
#[test]
fn nan_and_inf_in_k_and_v_rows_past_a_key_length_never_reach_the_output() {
    let Some(ctx) = common::ctx() else { return };
    let mut failures = Vec::new();
    let mut seed = 14;
    for shape in [
        AttentionShape::new(3, 2, 1, 19, 40, 16, 16),
        AttentionShape::new(3, 4, 2, 1, 40, 16, 8),
    ] {
        let lens = vec![17, 0, 9];
        for dtype in common::dtypes(ctx) {
            seed += 1;
            let options = AttentionOptions {
                key_lengths: Some(lens.clone()),
                ..Default::default()
            };
            let mut c = case(shape, options, seed);
            c.dtype = dtype;
            let [q, mut k, mut v] = random_qkv(&c);
            for (b, &len) in lens.iter().enumerate() {
                for h in 0..shape.heads_kv {
                    for j in len as usize..shape.len_k {
                        let poison = if j % 2 == 0 { f32::NAN } else { f32::INFINITY };
                        let row = (b * shape.heads_kv + h) * shape.len_k + j;
                        k[row * shape.head_dim..][..shape.head_dim].fill(poison);
                        v[row * shape.head_dim_v..][..shape.head_dim_v].fill(-poison);
                    }
                }
            }
            for (kernel, tiling) in common::paths(ctx) {
                let mut c = c.clone();
                c.options.kernel = kernel;
                c.options.tiling = tiling;
                let outcome = run_case_with(ctx, &c, &q, &k, &v).expect("runs");
                if !outcome.passed {
                    failures.push(format!(
                        "{shape:?} {dtype:?} {kernel:?}/{tiling:?} (seed {seed}): {}",
                        outcome.summary()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn key_lengths_of_zero_and_full() {
    let options = AttentionOptions {
        key_lengths: Some(vec![0, 41, 5]),
        ..Default::default()
    };
    on_every_path(case(AttentionShape::new(3, 2, 2, 13, 41, 24, 24), options, 13));
}

#[test]
fn causal_with_unequal_lengths_both_ways_and_both_alignments() {
    let mut seed = 20;
    for (lq, lk) in [(29, 11), (11, 29), (1, 33), (33, 1)] {
        for align in [CausalAlignment::TopLeft, CausalAlignment::BottomRight] {
            let options = AttentionOptions {
                causal: Some(align),
                ..Default::default()
            };
            seed += 1;
            on_every_path(case(AttentionShape::new(1, 3, 1, lq, lk, 20, 12), options, seed));
        }
    }
}

#[test]
fn scale_and_output_layout_are_honoured() {
    let options = AttentionOptions {
        scale: Some(0.37),
        output_layout: Some(Layout::Bshd),
        ..Default::default()
    };
    on_every_path(case(AttentionShape::new(2, 4, 2, 21, 30, 33, 17), options, 30));
}

#[test]
fn fused_and_materialized_agree_closely() {
    let Some(ctx) = common::ctx() else { return };
    let c = case(
        AttentionShape::new(2, 4, 4, 70, 90, 64, 64),
        AttentionOptions::default(),
        40,
    );
    let [q, k, v] = random_qkv(&c);
    let upload = |data: &[f32], dims| Tensor::from_f32(ctx, dims, Layout::Bhsd, data).expect("upload");
    let (qt, kt, vt) = (
        upload(&q, [2, 4, 70, 64]),
        upload(&k, [2, 4, 90, 64]),
        upload(&v, [2, 4, 90, 64]),
    );
    let outputs: Vec<Vec<f32>> = paths(ctx)
        .into_iter()
        .map(|(kernel, tiling)| {
            let options = AttentionOptions {
                kernel,
                tiling,
                ..Default::default()
            };
            let r = sdpa(ctx, &qt, &kt, &vt, &options).expect("runs");
            r.out.to_f32_vec(ctx).expect("readback")
        })
        .collect();
    for other in &outputs[1..] {
        let max = outputs[0]
            .iter()
            .zip(other)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max < 2e-6, "fused vs materialized differ by {max}");
    }
    // And every path agrees with the f64 reference within the f32 tolerance (two
    // paths could agree with each other and both be wrong).
    let want = wgpu_attention::reference::attention(&q, &k, &v, &c.shape, &c.options).expect("reference");
    let bound = wgpu_attention::check::Tolerance::F32.bound(&c.shape, &want, 0.0);
    for ((kernel, tiling), got) in paths(ctx).into_iter().zip(&outputs) {
        let stats = wgpu_attention::check::ErrorStats::of(got, &want.out);
        assert!(
            stats.passes(bound),
            "{kernel:?}/{tiling:?}: {stats:?} (bound {bound:e})"
        );
    }
}

/// Keys whose scores rise along the sequence, so every key block raises the running
/// maximum and rescales the accumulator (the most loop iterations per block).
fn rising_scores(shape: &AttentionShape, seed: u64) -> [Vec<f32>; 3] {
    let mut rng = Rng::new(seed);
    let q = rng.vec(shape.len_q * shape.head_dim, 0.5, 1.0);
    let mut k = Vec::with_capacity(shape.len_k * shape.head_dim);
    for j in 0..shape.len_k {
        let ramp = (j + 1) as f32 / shape.len_k as f32;
        k.extend(rng.vec(shape.head_dim, 0.9, 1.0).into_iter().map(|x| x * ramp));
    }
    let v = rng.vec(shape.len_k * shape.head_dim_v, -1.0, 1.0);
    [q, k, v]
}

#[test]
fn long_key_sequences_are_exact_on_every_fused_path() {
    // Under a loop cap (Mesa 22's llvmpipe: 65535 iterations per invocation; here a
    // shorter one, forced on every adapter) the fused kernels split 32768 keys across
    // dispatches, each resuming from the previous one's output and lse. Rising scores
    // rescale the accumulator at every block and make every later range raise the
    // running maximum.
    let Some(ctx) = common::short_ranges_ctx() else { return };
    let seed = 19;
    for (kernel, tiling) in paths(ctx).into_iter().filter(|&(k, _)| k == KernelChoice::Fused) {
        let options = AttentionOptions {
            kernel,
            tiling,
            ..Default::default()
        };
        let c = case(AttentionShape::new(1, 1, 1, 8, 32768, 64, 64), options, seed);
        let [q, k, v] = rising_scores(&c.shape, seed);
        let outcome = run_case_with(ctx, &c, &q, &k, &v).expect("runs");
        assert!(outcome.passed, "seed {seed}: {tiling:?}: {}", outcome.summary());
    }
}

#[test]
fn key_ranges_split_across_dispatches_keep_every_mask() {
    // D = 256 gives the shortest key range per dispatch under a loop cap (forced on
    // every adapter; the subgroup tiling walks about 2400 keys per dispatch, the others
    // fewer), so 3000 keys take several dispatches: rows whose causal end or key length
    // falls in an earlier range, rows with nothing visible in a range, and an explicit
    // mask must all survive the resume.
    let Some(ctx) = common::short_ranges_ctx() else { return };
    let seed = 23;
    let shape = AttentionShape::new(2, 2, 1, 37, 3000, 256, 256);
    let mut rng = Rng::new(seed);
    for (kernel, tiling) in paths(ctx).into_iter().filter(|&(k, _)| k == KernelChoice::Fused) {
        let config = ctx.fused_config(tiling).expect("listed by paths");
        let cap = ctx.loop_cap().expect("capped_ctx has a loop cap");
        let per_dispatch = loop_budget::keys_per_dispatch(&config, &shape, cap, ctx.capabilities(), ctx.policy());
        assert!(
            per_dispatch.is_some_and(|keys| keys < shape.len_k),
            "{tiling:?}: {per_dispatch:?} keys per dispatch would not split {} keys",
            shape.len_k
        );
        for dtype in [DType::F32, DType::F16] {
            if dtype == DType::F16 && !ctx.capabilities().f16 {
                continue;
            }
            let options = AttentionOptions {
                kernel,
                tiling,
                causal: Some(CausalAlignment::BottomRight),
                key_lengths: Some(vec![3000, 1700]),
                mask: Some(random_bool_mask(&mut rng, [1, 1, 37, 3000])),
                need_weights: true,
                ..Default::default()
            };
            let mut c = case(shape, options, seed);
            c.dtype = dtype;
            common::assert_case(ctx, &c);
        }
    }
}

#[test]
fn materialized_path_is_exact_or_refused_on_llvmpipe() {
    // The materialized softmax walks a row of scores in one invocation and cannot be
    // split: on llvmpipe the longest row within the loop cap must be exact and one block
    // more refused. Elsewhere 32768 keys exceed no such limit (the score matrix of one
    // head, 8 x 32768 f32, is small).
    let Some(ctx) = common::ctx() else { return };
    let seed = 29;
    let options = AttentionOptions {
        kernel: KernelChoice::Materialized,
        ..Default::default()
    };
    let iterations = |len_k| loop_budget::materialized_iterations(&AttentionShape::new(1, 1, 1, 8, len_k, 64, 64));
    let longest = if let Some(cap) = ctx.loop_cap() {
        (4..=32768)
            .step_by(4)
            .take_while(|&l| iterations(l) <= cap)
            .last()
            .expect("a short row fits")
    } else {
        32768
    };
    let mut c = case(AttentionShape::new(1, 1, 1, 8, longest, 64, 64), options, seed);
    let [q, k, v] = rising_scores(&c.shape, seed);
    let outcome = run_case_with(ctx, &c, &q, &k, &v).expect("runs");
    assert!(outcome.passed, "seed {seed}: {longest} keys: {}", outcome.summary());
    if ctx.loop_cap().is_some() {
        c.shape.len_k = longest + 4;
        let [q, k, v] = rising_scores(&c.shape, seed);
        match run_case_with(ctx, &c, &q, &k, &v) {
            Err(Error::LimitExceeded { limit, .. }) => assert!(limit.contains("loop iterations"), "{limit}"),
            other => panic!(
                "{} keys on llvmpipe: expected LimitExceeded, got {other:?}",
                longest + 4
            ),
        }
    }
}

#[test]
fn kernels_compiled_without_runtime_checks_give_the_reference_answer() {
    // Context::use_runtime_checks (WGPU_ATTENTION_RUNTIME_CHECKS=unchecked): modules from
    // create_shader_module_trusted, with no loop counter and no bounds checks
    // (docs/design.md, "Runtime checks"). The adapter's fused path and the materialized
    // one, causal with key lengths (one of them short), against the f64 reference.
    let Some(mut ctx) = common::own_ctx() else { return };
    ctx.use_runtime_checks(wgpu_attention::RuntimeChecks {
        loop_bounding: false,
        bounds_checks: false,
    });
    assert_eq!(ctx.runtime_checks().label(), "unchecked");
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        let options = AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some(vec![45, 7]),
            kernel,
            ..Default::default()
        };
        common::assert_case(&ctx, &case(AttentionShape::new(2, 2, 1, 19, 45, 32, 24), options, 4401));
    }
}
