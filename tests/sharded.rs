//! `sdpa_sharded` (issue 41 item 2): keys split across two contexts (two devices on
//! the default adapter: separate wgpu devices, whose tensors cannot mix), each shard
//! attending on its own, the partials merged on one; equals one call over all keys on
//! one context, for the rules measured on the whole key axis.

use crate::common;

use wgpu_attention::check::{random_additive_mask, random_bool_mask, Rng, Tolerance};
use wgpu_attention::{
    sdpa, sdpa_sharded, AttentionOptions, AttentionShape, CausalAlignment, Context, Error, KeyShard, Layout, Tensor,
    Window,
};

fn upload(ctx: &Context, data: &[f32], shape: [usize; 4]) -> Tensor {
    Tensor::from_f32(ctx, shape, Layout::Bhsd, data).expect("upload")
}

/// Rows `a .. b` of the third axis of a BHSD `[b, h, s, d]` array.
fn seq_rows(data: &[f32], [b, h, s, d]: [usize; 4], (lo, hi): (usize, usize)) -> Vec<f32> {
    (0..b * h)
        .flat_map(|bh| data[(bh * s + lo) * d..(bh * s + hi) * d].iter().copied())
        .collect()
}

#[test]
fn keys_sharded_over_two_contexts_equal_one_call() {
    let Some(first) = common::ctx() else { return };
    let second = common::own_ctx().expect("a second context");
    let s = AttentionShape::new(2, 4, 2, 19, 90, 32, 24);
    let mut seed = 4120;
    let rules = [
        AttentionOptions::default(),
        AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some(vec![90, 41]),
            ..Default::default()
        },
        AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            window: Some(Window {
                left: Some(30),
                right: None,
            }),
            alibi_slopes: Some(wgpu_attention::check::alibi_slopes(4)),
            ..Default::default()
        },
        // Explicit masks span the whole key axis; each shard takes its columns.
        AttentionOptions {
            mask: Some(random_bool_mask(&mut Rng::new(4130), [2, 1, 19, 90])),
            ..Default::default()
        },
        AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            mask: Some(random_additive_mask(&mut Rng::new(4131), [1, 4, 19, 90])),
            ..Default::default()
        },
        // One that broadcasts over keys (a row mask) goes to every shard whole.
        AttentionOptions {
            mask: Some(random_bool_mask(&mut Rng::new(4132), [2, 4, 19, 1])),
            ..Default::default()
        },
    ];
    for options in rules {
        for cut in [1, 45, 89] {
            seed += 1;
            let mut rng = Rng::new(seed);
            let q = rng.vec(s.batch * s.heads_q * s.len_q * s.head_dim, -1.0, 1.0);
            let k = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim, -1.0, 1.0);
            let v = rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim_v, -1.0, 1.0);
            let q_shape = [s.batch, s.heads_q, s.len_q, s.head_dim];
            let k_shape = [s.batch, s.heads_kv, s.len_k, s.head_dim];
            let v_shape = [s.batch, s.heads_kv, s.len_k, s.head_dim_v];
            let part = |ctx: &Context, (a, b): (usize, usize)| {
                (
                    upload(
                        ctx,
                        &seq_rows(&k, k_shape, (a, b)),
                        [s.batch, s.heads_kv, b - a, s.head_dim],
                    ),
                    upload(
                        ctx,
                        &seq_rows(&v, v_shape, (a, b)),
                        [s.batch, s.heads_kv, b - a, s.head_dim_v],
                    ),
                )
            };
            let (q1, q2) = (upload(first, &q, q_shape), upload(&second, &q, q_shape));
            let (k1, v1) = part(first, (0, cut));
            let (k2, v2) = part(&second, (cut, s.len_k));
            let shards = [
                KeyShard {
                    ctx: first,
                    q: &q1,
                    k: &k1,
                    v: &v1,
                    key_offset: 0,
                },
                KeyShard {
                    ctx: &second,
                    q: &q2,
                    k: &k2,
                    v: &v2,
                    key_offset: cut,
                },
            ];
            let merged = sdpa_sharded(first, &shards, s.len_k, &options).expect("sharded");
            let got = merged.out.to_f32_vec(first).expect("read");
            let whole = sdpa(
                first,
                &q1,
                &upload(first, &k, k_shape),
                &upload(first, &v, v_shape),
                &options,
            )
            .expect("one call")
            .out
            .to_f32_vec(first)
            .expect("read");
            let want = wgpu_attention::reference::attention(&q, &k, &v, &s, &options).expect("reference");
            // Each partial within the forward's bound, the merge weights moved by at most
            // twice the lse bound (tests/merge_attentions.rs).
            let bound = Tolerance::F32.bound(&s, &want, 0.0) + 4.0 * Tolerance::lse_bound(&s, &want);
            for (name, values) in [("sharded", &got), ("one call", &whole)] {
                let err = values
                    .iter()
                    .zip(&want.out)
                    .map(|(a, b)| (f64::from(*a) - b).abs())
                    .fold(0.0f64, f64::max);
                assert!(
                    err <= bound,
                    "seed {seed} cut {cut} {options:?}: {name} error {err:.3e} > {bound:.3e}"
                );
            }
        }
    }
}

#[test]
fn shards_that_do_not_tile_the_keys_or_ask_for_weights_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let t = |shape: [usize; 4]| upload(ctx, &vec![0.5; shape.iter().product()], shape);
    let (q, k, v) = (t([1, 1, 2, 4]), t([1, 1, 3, 4]), t([1, 1, 3, 4]));
    let shard = KeyShard {
        ctx,
        q: &q,
        k: &k,
        v: &v,
        key_offset: 0,
    };
    let shard_at = |key_offset: usize| KeyShard {
        ctx,
        q: &q,
        k: &k,
        v: &v,
        key_offset,
    };
    let options = AttentionOptions::default();
    for (n, result) in [
        sdpa_sharded(ctx, &[], 3, &options),
        sdpa_sharded(ctx, std::slice::from_ref(&shard), 4, &options),
        sdpa_sharded(
            ctx,
            std::slice::from_ref(&shard),
            3,
            &AttentionOptions {
                need_weights: true,
                ..Default::default()
            },
        ),
        // Two shards at key offset 0 whose lengths add up to the total: they overlap
        // (keys 0 .. 3 twice, 3 .. 6 never) and must not merge into a wrong answer.
        sdpa_sharded(ctx, &[shard_at(0), shard_at(0)], 6, &options),
        // A gap and an overlap that cancel out in the sum.
        sdpa_sharded(ctx, &[shard_at(0), shard_at(4)], 6, &options),
        // A mask whose key axis is not the whole one.
        sdpa_sharded(
            ctx,
            std::slice::from_ref(&shard),
            3,
            &AttentionOptions {
                mask: Some(wgpu_attention::Mask::boolean(&[1, 1, 2, 2], vec![true; 4]).expect("mask")),
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        match result {
            Err(Error::Invalid { .. } | Error::Unsupported { .. } | Error::Shape { .. }) => {}
            other => panic!("case {n}: expected a refusal, got {other:?}"),
        }
    }
}
