//! One differential test over every path a user can reach (issue 64): each fused tiling
//! the adapter has (and a GPU's variants of `shared`), each split-K decode design, the
//! materialized path, key splits, the KV cache, and an int8 cache read in the kernel
//! and dequantized, all on the same inputs holding NaN, ±inf, huge and subnormal
//! values and fully masked rows. Each must give the f64 reference's answer: NaN where
//! it gives NaN, the same infinities, the same finite numbers within the path's bound
//! elsewhere (`check::ErrorStats`), output and log-sum-exp alike.

use crate::common;
use wgpu_attention::check::{variants, CheckCase, ErrorStats, Rng, Tolerance, Variant};
use wgpu_attention::kernels::decode::DecodeDesign;
use wgpu_attention::reference::{attention, int8};
use wgpu_attention::{
    AttentionOptions, AttentionShape, Context, DType, KernelChoice, KvCacheConfig, Layout, QuantizedKvCache, Tensor,
};

const SEED: u64 = 6400;

/// B 2, Hq 4 over Hkv 2 (GQA), 3 query rows (decode takes them), 150 keys (three
/// 64-key tiles: key splits split them), head dims of whole 16-byte words (the lanes
/// decode design and the texel mirrors serve them).
fn shape() -> AttentionShape {
    AttentionShape::new(2, 4, 2, 3, 150, 16, 16)
}

/// Inputs with something planted, and the key lengths to run them with.
struct Planted {
    what: &'static str,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    key_lengths: Vec<u32>,
}

/// Plants something in (q, k, v).
type Edit<'a> = dyn Fn(&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>) + 'a;

/// Every planted input set, from one random draw (f16-rounded for f16: NaN and the
/// infinities stay what they are, subnormals of f32 become 0).
fn planted(dtype: DType) -> Vec<Planted> {
    let s = shape();
    let mut rng = Rng::new(SEED);
    let round = |x| common::rounded(dtype, x);
    let q0 = rng.vec(s.batch * s.heads_q * s.len_q * s.head_dim, -1.0, 1.0);
    let k0 = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim, -1.0, 1.0);
    let v0 = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim_v, -1.0, 1.0);
    let qi = |p| common::bhsd_index(s.heads_q, s.len_q, s.head_dim, p);
    let ki = |p| common::bhsd_index(s.heads_kv, s.len_k, s.head_dim, p);
    let vi = |p| common::bhsd_index(s.heads_kv, s.len_k, s.head_dim_v, p);
    // Keys 0..150 of element 0, 0..131 of element 1.
    let lengths = vec![150, 131];
    let plant = |what, edit: &Edit<'_>, key_lengths: &Vec<u32>| {
        let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
        edit(&mut q, &mut k, &mut v);
        Planted {
            what,
            q: round(q),
            k: round(k),
            v: round(v),
            key_lengths: key_lengths.clone(),
        }
    };
    vec![
        plant(
            "NaN in a query row",
            &|q, _, _| q[qi((0, 1, 1, 3))] = f32::NAN,
            &lengths,
        ),
        plant(
            "NaN in a key every row sees",
            &|_, k, _| k[ki((1, 0, 40, 5))] = f32::NAN,
            &lengths,
        ),
        plant(
            "+inf in a value",
            &|_, _, v| v[vi((0, 1, 100, 2))] = f32::INFINITY,
            &lengths,
        ),
        plant(
            "-inf in a value",
            &|_, _, v| v[vi((1, 0, 3, 7))] = f32::NEG_INFINITY,
            &lengths,
        ),
        plant(
            "-inf in a key",
            &|_, k, _| k[ki((0, 0, 7, 0))] = f32::NEG_INFINITY,
            &lengths,
        ),
        plant(
            "+inf in a query row",
            &|q, _, _| q[qi((1, 3, 0, 1))] = f32::INFINITY,
            &lengths,
        ),
        plant(
            "huge keys (scores near 1e3: one key takes each row)",
            &|_, k, _| {
                let half = k.len() / 2;
                k[..half].iter_mut().for_each(|x| *x *= 250.0);
            },
            &lengths,
        ),
        plant(
            "subnormal queries and values",
            &|q, _, v| {
                let half = q.len() / 2;
                q[half..].iter_mut().for_each(|x| *x *= 1e-39);
                v[..64].iter_mut().for_each(|x| *x *= 1e-39);
            },
            &lengths,
        ),
        plant(
            "a fully masked element, NaN in its keys and past the other's length",
            &|_, k, v| {
                k[ki((0, 1, 20, 4))] = f32::NAN;
                v[vi((0, 0, 9, 1))] = f32::INFINITY;
                k[ki((1, 1, 140, 0))] = f32::NAN;
                v[vi((1, 0, 145, 3))] = f32::NAN;
            },
            &vec![0, 131],
        ),
    ]
}

fn case(p: &Planted, dtype: DType) -> CheckCase {
    CheckCase {
        shape: shape(),
        options: AttentionOptions {
            key_lengths: Some(p.key_lengths.clone()),
            ..Default::default()
        },
        dtype,
        layout: Layout::Bhsd,
        seed: SEED,
        range: 1.0,
    }
}

/// Runs every variant of `variants` the context can run on every planted set, and
/// returns the failures, one line each.
fn run_variants(ctx: &Context, label: &str, variants: &[Variant]) -> Vec<String> {
    let mut failures = Vec::new();
    for variant in variants {
        if let Some(why) = variant.unmet(ctx) {
            eprintln!("nonfinite: {label}{} not run: {why}", variant.label);
            continue;
        }
        for p in planted(variant.dtype) {
            let case = variant.apply(&case(&p, variant.dtype));
            match variant.run_with(ctx, &case, &p.q, &p.k, &p.v) {
                Ok(outcome) if outcome.passed => {}
                Ok(outcome) => failures.push(format!("{label}{} / {}: {}", variant.label, p.what, outcome.summary())),
                Err(e) => failures.push(format!("{label}{} / {}: error {e}", variant.label, p.what)),
            }
        }
    }
    failures
}

#[test]
fn every_path_gives_the_references_answer_on_non_finite_inputs() {
    let Some(ctx) = common::ctx() else { return };
    let f16 = ctx.capabilities().f16;
    let all = variants(f16);
    let mut failures = run_variants(ctx, "", &all);

    // Fused attention over key splits (partial results merged by their lse).
    let fused: Vec<Variant> = all
        .iter()
        .filter(|v| v.kernel == KernelChoice::Fused)
        .cloned()
        .collect();
    let mut split = common::own_ctx().expect("a second context");
    split.use_key_splits(3).expect("a valid count");
    failures.extend(run_variants(&split, "key splits 3: ", &fused));

    // A GPU's variants (`shared`'s head-dim classes, in registers).
    let mut gpu = common::own_ctx().expect("a third context");
    gpu.use_gpu_variants();
    let shared: Vec<Variant> = fused
        .iter()
        .filter(|v| v.label.starts_with("fused/shared"))
        .cloned()
        .collect();
    failures.extend(run_variants(&gpu, "GPU variants: ", &shared));

    // The lanes decode design where the adapter decodes with another (pinned).
    let decode: Vec<Variant> = all
        .iter()
        .filter(|v| v.label.starts_with("decode/lanes"))
        .cloned()
        .collect();
    let mut lanes = common::own_ctx().expect("a fourth context");
    lanes.use_decode_design(Some(DecodeDesign::Lanes));
    failures.extend(run_variants(&lanes, "pinned: ", &decode));

    // The tensor-core kernel, emulated where the adapter has no tensor cores (f16: one
    // pipeline, cold compiles of it are slow).
    if let Some(emulating) = common::emulating_ctx() {
        let coop: Vec<Variant> = fused.iter().filter(|v| v.label == "fused/coop f16").cloned().collect();
        assert_eq!(coop.len(), 1, "the coop f16 variant");
        failures.extend(run_variants(&emulating, "emulated: ", &coop));
    }

    assert!(
        failures.is_empty(),
        "seed {SEED}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn int8_caches_give_the_references_answer_on_non_finite_inputs() {
    // The reference attends the values the codes stand for (reference::int8: a row
    // holding NaN or an infinity is NaN throughout), read in the kernel (split-K
    // decode's lanes design, where the adapter has it) and dequantized first (fused).
    let Some(ctx) = common::ctx() else { return };
    let s = shape();
    let mut failures = Vec::new();
    for dtype in common::dtypes(ctx) {
        for p in planted(dtype) {
            let config = KvCacheConfig {
                batch: s.batch,
                heads_kv: s.heads_kv,
                capacity: s.len_k,
                head_dim: s.head_dim,
                head_dim_v: s.head_dim_v,
                layout: Layout::Bhsd,
                dtype,
            };
            let mut cache = QuantizedKvCache::new(ctx, config).expect("cache");
            let up = |x: &[f32], heads, rows, dim| {
                Tensor::from_f32_as(ctx, [s.batch, heads, rows, dim], Layout::Bhsd, dtype, x).expect("upload")
            };
            let (k, v) = (
                up(&p.k, s.heads_kv, s.len_k, s.head_dim),
                up(&p.v, s.heads_kv, s.len_k, s.head_dim_v),
            );
            cache.append_rows(ctx, &k, &v, &p.key_lengths).expect("append");
            let q = up(&p.q, s.heads_q, s.len_q, s.head_dim);
            let (kc, ks) = int8::quantize_rows(&p.k, s.head_dim);
            let (vc, vs) = int8::quantize_rows(&p.v, s.head_dim_v);
            let options = AttentionOptions {
                key_lengths: Some(p.key_lengths.clone()),
                need_lse: true,
                ..Default::default()
            };
            // An f16 cache dequantizes to f16 values.
            let values = |codes: &[i8], scales: &[f32], dim| -> Vec<f32> {
                let values = int8::dequantize_rows(codes, scales, dim);
                match dtype {
                    DType::F32 => values,
                    DType::F16 => values.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
                }
            };
            let want = attention(
                &p.q,
                &values(&kc, &ks, s.head_dim),
                &values(&vc, &vs, s.head_dim_v),
                &s,
                &options,
            )
            .expect("reference");
            let rounding = if dtype == DType::F16 {
                want.max_abs_value * 2f64.powi(-11)
            } else {
                0.0
            };
            let bound = Tolerance::F32.bound(&s, &want, 0.0) + rounding;
            for kernel in [KernelChoice::Auto, KernelChoice::Fused] {
                let attend = AttentionOptions {
                    kernel,
                    need_lse: true,
                    ..Default::default()
                };
                let label = format!("int8 {dtype:?} {kernel:?} / {}", p.what);
                let got = match cache.attend(ctx, &q, &attend) {
                    Ok(got) => got,
                    Err(e) => {
                        failures.push(format!("{label}: error {e}"));
                        continue;
                    }
                };
                let out = ErrorStats::of(&got.out.to_f32_vec(ctx).expect("read out"), &want.out);
                let lse = got
                    .lse
                    .as_ref()
                    .map(|t| t.to_f32_vec(ctx).expect("read lse"))
                    .unwrap_or_default();
                let lse = ErrorStats::of(&lse, &want.lse);
                if !out.passes(bound) || !lse.passes(Tolerance::lse_bound(&s, &want)) {
                    failures.push(format!("{label}: out {out:?} (bound {bound:e}), lse {lse:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed {SEED}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
