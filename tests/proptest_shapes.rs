//! Property test: random shapes, layouts, masks and paths agree with the reference.

mod common;
use proptest::prelude::*;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, CheckCase, Rng};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{AttentionOptions, AttentionShape, CausalAlignment, DType, FusedTiling, KernelChoice, Layout};

fn arb_case() -> impl Strategy<Value = CheckCase> {
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
        (
            0u8..3,
            0u8..3,
            any::<bool>(),
            0..=FUSED_TILINGS.len(),
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |((b, group, hkv, lq, lk, d, dv), (causal, mask, lens, path, bshd, f16, seed))| {
                let shape = AttentionShape {
                    batch: b,
                    heads_q: hkv * group,
                    heads_kv: hkv,
                    len_q: lq,
                    len_k: lk,
                    head_dim: d,
                    head_dim_v: dv,
                };
                let mut rng = Rng::new(seed);
                // Lengths span several tiles of every tiling, with ragged tails.
                let (kernel, tiling) = match path {
                    0 => (KernelChoice::Materialized, FusedTiling::Auto),
                    n => (KernelChoice::Fused, FUSED_TILINGS[n - 1].tiling),
                };
                let options = AttentionOptions {
                    causal: match causal {
                        0 => None,
                        1 => Some(CausalAlignment::TopLeft),
                        _ => Some(CausalAlignment::BottomRight),
                    },
                    mask: match mask {
                        0 => None,
                        1 => Some(random_bool_mask(&mut rng, [b, 1, lq, lk])),
                        _ => Some(random_additive_mask(&mut rng, [1, shape.heads_q, lq, lk])),
                    },
                    key_lengths: lens.then(|| (0..b).map(|_| rng.below(lk + 1) as u32).collect()),
                    kernel,
                    tiling,
                    need_weights: true,
                    ..Default::default()
                };
                CheckCase {
                    shape,
                    options,
                    dtype: if f16 { DType::F16 } else { DType::F32 },
                    layout: if bshd { Layout::Bshd } else { Layout::Bhsd },
                    seed,
                    range: 1.0,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_problems_match_the_reference(case in arb_case()) {
        if let Some(ctx) = common::ctx() {
            // Tilings and dtypes the adapter lacks (subgroups, f16) are skipped.
            let f16_ok = case.dtype == DType::F32 || ctx.capabilities().f16;
            if f16_ok && ctx.fused_config(case.options.tiling).is_ok() {
                common::assert_case(ctx, &case);
            }
        }
    }
}
