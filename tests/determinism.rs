//! Determinism (issue 13 §3): the same inputs give the same bits on the same adapter,
//! across calls, across contexts and across processes, on every path. Every kernel
//! fixes its accumulation order (no atomics, no order that depends on scheduling), so
//! this is expected to hold everywhere; docs/design.md says so.

use crate::common;
use common::cli::{bin, scratch, write_npy};
use common::{dtypes, paths};
use wgpu_attention::check::Rng;
use wgpu_attention::kernels::flash;
use wgpu_attention::{sdpa, AttentionOptions, AttentionOutput, CausalAlignment, Context, Layout, Tensor};

fn bits(ctx: &Context, out: &AttentionOutput) -> Vec<Vec<u32>> {
    [Some(&out.out), out.lse.as_ref(), out.weights.as_ref()]
        .into_iter()
        .flatten()
        .map(|t| {
            t.to_f32_vec(ctx)
                .expect("read back")
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn every_path_gives_the_same_bits_across_calls_and_contexts() {
    let Some(ctx) = common::ctx() else { return };
    let other = Context::new().expect("a second context on the same adapter");
    let (b, hq, hkv, lq, lk, d) = (2, 4, 2, 5, 300, 24);
    for dtype in dtypes(ctx) {
        let seed = 141 + dtype as u64;
        let mut rng = Rng::new(seed);
        let mut data = |shape: [usize; 4]| rng.vec(shape.iter().product(), -2.0, 2.0);
        let (q, k, v) = (data([b, hq, lq, d]), data([b, hkv, lk, d]), data([b, hkv, lk, d]));
        for (kernel, tiling) in paths(ctx) {
            let options = AttentionOptions {
                kernel,
                tiling,
                causal: Some(CausalAlignment::BottomRight),
                key_lengths: Some(vec![300, 173]),
                need_lse: true,
                need_weights: true,
                ..Default::default()
            };
            let run = |ctx: &Context| {
                let up =
                    |shape, data: &[f32]| Tensor::from_f32_as(ctx, shape, Layout::Bhsd, dtype, data).expect("upload");
                let out = sdpa(
                    ctx,
                    &up([b, hq, lq, d], &q),
                    &up([b, hkv, lk, d], &k),
                    &up([b, hkv, lk, d], &v),
                    &options,
                )
                .unwrap_or_else(|e| panic!("seed {seed} {kernel:?}/{tiling:?}: {e}"));
                bits(ctx, &out)
            };
            let first = run(ctx);
            assert_eq!(first.len(), 3, "output, lse and weights");
            assert!(
                run(ctx) == first,
                "seed {seed} {dtype:?} {kernel:?}/{tiling:?}: a second call differs"
            );
            assert!(
                run(&other) == first,
                "seed {seed} {dtype:?} {kernel:?}/{tiling:?}: another context differs"
            );
        }
    }
}

#[test]
fn every_path_gives_the_same_bytes_across_processes() {
    let Some(ctx) = common::ctx() else { return };
    let dir = scratch("determinism");
    let mut rng = Rng::new(142);
    write_npy(&dir.join("q.npy"), &[1, 4, 3, 16], &rng.vec(4 * 3 * 16, -2.0, 2.0));
    write_npy(
        &dir.join("k.npy"),
        &[1, 2, 1200, 16],
        &rng.vec(2 * 1200 * 16, -2.0, 2.0),
    );
    write_npy(
        &dir.join("v.npy"),
        &[1, 2, 1200, 16],
        &rng.vec(2 * 1200 * 16, -2.0, 2.0),
    );
    let mut choices: Vec<(&str, &str)> = vec![("materialized", "auto"), ("decode", "auto")];
    for spec in flash::FUSED_TILINGS
        .iter()
        .filter(|s| ctx.fused_config(s.tiling).is_ok())
    {
        choices.push(("fused", spec.name));
    }
    for (kernel, tiling) in choices {
        let output = |name: &str| {
            let status = bin()
                .current_dir(&dir)
                .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", name])
                .args(["--causal", "bottom-right", "--kernel", kernel, "--tiling", tiling])
                .status()
                .expect("runs");
            assert!(status.success(), "{kernel}/{tiling}: {status}");
            std::fs::read(dir.join(name)).expect("output written")
        };
        assert!(
            output("a.npy") == output("b.npy"),
            "{kernel}/{tiling}: two processes wrote different outputs"
        );
    }
}
