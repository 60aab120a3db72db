//! One differential test over every backward path a user can reach (issue 64), as
//! `nonfinite_paths.rs` is for the forward: the materialized backward and the fused
//! passes in each `BackwardTiling` the adapter runs (subgroup, rows in the run-time
//! kernels and in a GPU's head-dim classes, blocked, and the tensor-core tiling emulated), f32 and f16, all
//! on the same inputs holding NaN, ±inf, huge and subnormal values and a fully masked
//! batch element. Each runs the user's call, `sdpa` (with its lse) then
//! `sdpa_backward`, and must give the f64 reference gradients: NaN where they are NaN,
//! the same infinities, the same finite numbers within the backward bound
//! (`check::backward_rel_bound` times `check::backward_magnitudes`, over the finite
//! values) elsewhere (`check::ErrorStats`).

use crate::common;
use wgpu_attention::check::{backward_magnitudes, backward_rel_bound, ErrorStats, Rng};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::reference::{attention, attention_backward};
use wgpu_attention::{
    backward_tiling, rows_for, sdpa, sdpa_backward, AttentionOptions, AttentionShape, BackwardTiling, Context, DType,
    FusedTiling, KernelChoice, Layout, Precision, Tensor, ROWS_32, ROWS_64, ROWS_64_WG,
};

const SEED: u64 = 6410;

/// B 2, Hq 2 over Hkv 1 (GQA: dK and dV add two heads), 5 query rows, 70 keys (past a
/// 64-key block or tile, so walks go on into a second), D 16 (whole 16-byte words in
/// both dtypes).
fn shape() -> AttentionShape {
    with_dims(16)
}

/// [`shape`] at head dims `d` (a GPU's `rows` classes: lanes per row grow with them).
fn with_dims(d: usize) -> AttentionShape {
    AttentionShape::new(2, 2, 1, 5, 70, d, d)
}

/// Inputs with something planted, and the key lengths to run them with.
struct Planted {
    what: &'static str,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
    key_lengths: Vec<u32>,
}

/// Plants something in (q, k, v, dO).
type Edit<'a> = dyn Fn(&mut [f32], &mut [f32], &mut [f32], &mut [f32]) + 'a;

/// Every planted input set, from one random draw (f16-rounded for f16: NaN and the
/// infinities stay what they are, subnormals of f32 become 0).
fn planted(dtype: DType, s: AttentionShape) -> Vec<Planted> {
    let mut rng = Rng::new(SEED);
    let round = |x| common::rounded(dtype, x);
    let q0 = rng.vec(s.batch * s.heads_q * s.len_q * s.head_dim, -1.0, 1.0);
    let k0 = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim, -1.0, 1.0);
    let v0 = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim_v, -1.0, 1.0);
    let do0 = rng.vec(s.batch * s.heads_q * s.len_q * s.head_dim_v, -1.0, 1.0);
    let qi = |p| common::bhsd_index(s.heads_q, s.len_q, s.head_dim, p);
    let ki = |p| common::bhsd_index(s.heads_kv, s.len_k, s.head_dim, p);
    let vi = |p| common::bhsd_index(s.heads_kv, s.len_k, s.head_dim_v, p);
    let oi = |p| common::bhsd_index(s.heads_q, s.len_q, s.head_dim_v, p);
    // Keys 0..70 of element 0, 0..61 of element 1.
    let lengths = vec![70, 61];
    let plant = |what, edit: &Edit<'_>, key_lengths: &Vec<u32>| {
        let (mut q, mut k, mut v, mut d_out) = (q0.clone(), k0.clone(), v0.clone(), do0.clone());
        edit(&mut q, &mut k, &mut v, &mut d_out);
        Planted {
            what,
            q: round(q),
            k: round(k),
            v: round(v),
            d_out: round(d_out),
            key_lengths: key_lengths.clone(),
        }
    };
    vec![
        plant(
            "NaN in a query row (of the element with keys past its length)",
            &|q, _, _, _| q[qi((1, 1, 2, 3))] = f32::NAN,
            &lengths,
        ),
        plant(
            "NaN in a key every row sees",
            &|_, k, _, _| k[ki((1, 0, 40, 5))] = f32::NAN,
            &lengths,
        ),
        plant(
            "+inf in a value",
            &|_, _, v, _| v[vi((0, 0, 66, 2))] = f32::INFINITY,
            &lengths,
        ),
        plant(
            "-inf in a value",
            &|_, _, v, _| v[vi((1, 0, 3, 7))] = f32::NEG_INFINITY,
            &lengths,
        ),
        plant(
            "NaN in a row of dO (likewise)",
            &|_, _, _, d_out| d_out[oi((1, 1, 4, 9))] = f32::NAN,
            &lengths,
        ),
        plant(
            "huge keys (scores near 1e3: one key takes each row)",
            &|_, k, _, _| {
                let half = k.len() / 2;
                k[..half].iter_mut().for_each(|x| *x *= 250.0);
            },
            &lengths,
        ),
        plant(
            "subnormal queries, values and dO",
            &|q, _, v, d_out| {
                let half = q.len() / 2;
                q[half..].iter_mut().for_each(|x| *x *= 1e-39);
                v[..64].iter_mut().for_each(|x| *x *= 1e-39);
                d_out[..16].iter_mut().for_each(|x| *x *= 1e-39);
            },
            &lengths,
        ),
        plant(
            "a fully masked element, NaN in its keys and past the other's length",
            &|_, k, v, _| {
                k[ki((0, 0, 20, 4))] = f32::NAN;
                v[vi((0, 0, 9, 1))] = f32::INFINITY;
                k[ki((1, 0, 65, 0))] = f32::NAN;
                v[vi((1, 0, 68, 3))] = f32::NAN;
            },
            &vec![0, 61],
        ),
    ]
}

/// One backward path: a context, the options that reach it, and its name.
struct Path<'a> {
    ctx: &'a Context,
    label: String,
    options: AttentionOptions,
    shape: AttentionShape,
}

/// The fused paths of `ctx` for `dtype`: one per backward tiling its forward tilings
/// lead to (each through the first forward tiling that does).
fn fused_paths<'a>(ctx: &'a Context, prefix: &str, dtype: DType) -> Vec<(Path<'a>, BackwardTiling)> {
    let s = shape();
    let mut seen: Vec<BackwardTiling> = Vec::new();
    let mut paths = Vec::new();
    for spec in FUSED_TILINGS.iter() {
        let options = AttentionOptions {
            kernel: KernelChoice::Fused,
            tiling: spec.tiling,
            ..Default::default()
        };
        let Ok(tiling) = backward_tiling(ctx, dtype, &options, &s) else {
            continue;
        };
        if seen.contains(&tiling) {
            continue;
        }
        seen.push(tiling);
        paths.push((
            Path {
                ctx,
                label: format!("{prefix}{} (via {})", tiling.name(), spec.name),
                shape: s,
                options,
            },
            tiling,
        ));
    }
    paths
}

/// Runs `path` on every planted set in `dtype` and returns the failures, one line each.
fn run_path(path: &Path<'_>, dtype: DType) -> Vec<String> {
    let (ctx, s) = (path.ctx, path.shape);
    let mut failures = Vec::new();
    for p in planted(dtype, s) {
        let label = format!("{} {dtype:?} / {}", path.label, p.what);
        let options = AttentionOptions {
            key_lengths: Some(p.key_lengths.clone()),
            ..path.options.clone()
        };
        let want = attention_backward(&p.q, &p.k, &p.v, &p.d_out, &s, &options).expect("reference");
        let forward = attention(&p.q, &p.k, &p.v, &s, &options).expect("reference forward");
        let magnitudes = backward_magnitudes([&p.q, &p.k, &p.v, &p.d_out], &s, &options).expect("magnitudes");
        let bound = backward_rel_bound(dtype, Precision::Highest, &s, &forward);
        let got = (|| -> wgpu_attention::Result<[Vec<f32>; 3]> {
            let up = |x: &[f32], heads, rows, dim| {
                Tensor::from_f32_as(ctx, [s.batch, heads, rows, dim], Layout::Bhsd, dtype, x)
            };
            let q = up(&p.q, s.heads_q, s.len_q, s.head_dim)?;
            let k = up(&p.k, s.heads_kv, s.len_k, s.head_dim)?;
            let v = up(&p.v, s.heads_kv, s.len_k, s.head_dim_v)?;
            let d_out = up(&p.d_out, s.heads_q, s.len_q, s.head_dim_v)?;
            // The user's call: the forward with its lse, then the backward.
            let f = sdpa(
                ctx,
                &q,
                &k,
                &v,
                &AttentionOptions {
                    need_lse: true,
                    ..options.clone()
                },
            )?;
            let lse = f.lse.as_ref().expect("lse asked for");
            let g = sdpa_backward(ctx, &q, &k, &v, &f.out, lse, &d_out, &options)?;
            Ok([g.dq.to_f32_vec(ctx)?, g.dk.to_f32_vec(ctx)?, g.dv.to_f32_vec(ctx)?])
        })();
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                failures.push(format!("{label}: error {e}"));
                continue;
            }
        };
        let wants = [&want.dq, &want.dk, &want.dv];
        for (n, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let stats = ErrorStats::of(&got[n], wants[n]);
            let limit = bound * magnitudes[n];
            if !stats.passes(limit) {
                failures.push(format!(
                    "{label}: {name} {stats:?} (bound {limit:e}){}",
                    first_mismatch(&got[n], wants[n])
                ));
            }
        }
    }
    failures
}

/// Where a result first disagrees with the reference about being finite, and how.
fn first_mismatch(got: &[f32], want: &[f64]) -> String {
    let differs = |(g, w): &(f64, f64)| {
        g.is_finite() != w.is_finite() || (!w.is_finite() && g != w && !(g.is_nan() && w.is_nan()))
    };
    let pairs = got.iter().zip(want).map(|(&g, &w)| (f64::from(g), w));
    let bad: Vec<usize> = pairs.enumerate().filter(|(_, p)| differs(p)).map(|(i, _)| i).collect();
    match bad.first() {
        Some(&i) => format!(
            "; first non-finite mismatch at [{i}]: {} against {} ({} such, last at {})",
            got[i],
            want[i],
            bad.len(),
            bad[bad.len() - 1]
        ),
        None => String::new(),
    }
}

#[test]
fn every_backward_path_gives_the_references_gradients_on_non_finite_inputs() {
    let Some(ctx) = common::ctx() else { return };
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    for dtype in common::dtypes(ctx) {
        let mut paths = vec![Path {
            ctx,
            label: "materialized".into(),
            shape: shape(),
            options: AttentionOptions {
                kernel: KernelChoice::Materialized,
                ..Default::default()
            },
        }];
        paths.extend(fused_paths(ctx, "", dtype).into_iter().map(|(path, _)| path));
        for path in &paths {
            let start = std::time::Instant::now();
            failures.extend(run_path(path, dtype));
            ran.push(format!("{} {dtype:?} ({:.1?})", path.label, start.elapsed()));
        }
    }

    // A GPU's `rows` head-dim classes (in registers), on lavapipe too: D 16 on one lane
    // per row, D 40 on two whose partial sums subgroup shuffles add, and through
    // workgroup memory where the subgroups are forgotten (f32 only at D 40: cold
    // compiles).
    let mut gpu = common::own_ctx().expect("a second context");
    gpu.use_gpu_variants();
    let mut no_subgroups = common::own_ctx().expect("a third context");
    no_subgroups.use_gpu_variants();
    no_subgroups.use_no_subgroups();
    let lanes_fit = gpu.capabilities().subgroups.is_some_and(|(min, _)| min >= 2);
    let mut classes = vec![(&gpu, "rows [32]", 16, ROWS_32, common::dtypes(&gpu))];
    if lanes_fit {
        classes.push((&gpu, "rows [64]", 40, ROWS_64, vec![DType::F32]));
    }
    classes.push((&no_subgroups, "rows [64 wg]", 40, ROWS_64_WG, vec![DType::F32]));
    for (ctx, name, d, class, dtypes) in classes {
        let s = with_dims(d);
        let (kernels, _) = rows_for(d, ctx.capabilities());
        assert_eq!((kernels.dq, kernels.dkdv), (class.dq, class.dkdv), "{name}");
        for dtype in dtypes {
            let options = AttentionOptions {
                kernel: KernelChoice::Fused,
                tiling: FusedTiling::Registers,
                ..Default::default()
            };
            assert_eq!(
                backward_tiling(ctx, dtype, &options, &s).expect("a tiling"),
                BackwardTiling::Rows
            );
            let path = Path {
                ctx,
                label: format!("GPU variants: {name}"),
                options,
                shape: s,
            };
            let start = std::time::Instant::now();
            failures.extend(run_path(&path, dtype));
            ran.push(format!("{} {dtype:?} ({:.1?})", path.label, start.elapsed()));
        }
    }

    // The tensor-core tiling, emulated where the adapter has no tensor cores (f16: one
    // pair of pipelines, whose cold compiles are slow).
    if let Some(emulating) = common::emulating_ctx() {
        let coop: Vec<Path<'_>> = fused_paths(&emulating, "emulated: ", DType::F16)
            .into_iter()
            .filter(|(_, tiling)| matches!(tiling, BackwardTiling::Coop(..)))
            .map(|(path, _)| path)
            .collect();
        assert_eq!(coop.len(), 1, "the coop backward tiling, emulated");
        for path in &coop {
            let start = std::time::Instant::now();
            failures.extend(run_path(path, DType::F16));
            ran.push(format!("{} F16 ({:.1?})", path.label, start.elapsed()));
        }
    }

    eprintln!("nonfinite backward ran: {}", ran.join(", "));
    assert!(
        failures.is_empty(),
        "seed {SEED}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
