//! Split-K decode (`--kernel decode`) against the f64 reference: few query rows, key
//! ranges cut into splits that a combine pass merges. Every mask, GQA, f16, lengths 0
//! and 1 in a batch, Lk not a multiple of the split or the tile, many splits.

mod common;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, run_case, CheckCase, Rng};
use wgpu_attention::kernels::decode;
use wgpu_attention::{
    resolve_kernel, AttentionOptions, AttentionShape, CausalAlignment, DType, FusedTiling, KernelChoice, Layout,
    ResolvedKernel, Window,
};

fn decode_case(shape: AttentionShape, options: AttentionOptions, dtype: DType, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options: AttentionOptions {
            kernel: KernelChoice::Decode,
            ..options
        },
        dtype,
        layout: Layout::Bhsd,
        seed,
        range: 1.0,
    }
}

#[test]
fn decode_matches_the_reference_with_every_mask() {
    let Some(ctx) = common::ctx() else { return };
    let mut seed = 300;
    // 1000 keys: not a multiple of the 64-key tile nor of any split; key lengths 0 and 1
    // in the batch (a row that sees nothing is zeros with lse -inf).
    for (lq, hq, hkv) in [(1, 4, 2), (3, 8, 2), (16, 2, 2), (5, 3, 1)] {
        let shape = AttentionShape::new(3, hq, hkv, lq, 1000, 40, 24);
        let mut rng = Rng::new(seed);
        let masks: Vec<(&str, AttentionOptions)> = vec![
            ("none", AttentionOptions::default()),
            (
                "key lengths 0, 1, 700",
                AttentionOptions {
                    key_lengths: Some(vec![0, 1, 700]),
                    ..Default::default()
                },
            ),
            (
                "window 100,3 (no other rule)",
                AttentionOptions {
                    window: Some(Window {
                        left: Some(100),
                        right: Some(3),
                    }),
                    ..Default::default()
                },
            ),
            (
                "causal top-left",
                AttentionOptions {
                    causal: Some(CausalAlignment::TopLeft),
                    ..Default::default()
                },
            ),
            (
                "causal bottom-right + key lengths",
                AttentionOptions {
                    causal: Some(CausalAlignment::BottomRight),
                    key_lengths: Some(vec![1000, 513, 64]),
                    ..Default::default()
                },
            ),
            (
                "bool mask per head",
                AttentionOptions {
                    mask: Some(random_bool_mask(&mut rng, [3, hq, lq, 1000])),
                    ..Default::default()
                },
            ),
            (
                "additive mask, weights",
                AttentionOptions {
                    mask: Some(random_additive_mask(&mut rng, [1, 1, lq, 1000])),
                    need_weights: true,
                    ..Default::default()
                },
            ),
        ];
        for (what, options) in masks {
            for dtype in [DType::F32, DType::F16] {
                if dtype == DType::F16 && !ctx.capabilities().f16 {
                    continue;
                }
                for tiling in common::decode_designs(ctx) {
                    seed += 1;
                    eprintln!("decode ({tiling:?}) {shape:?} {what} {dtype:?} (seed {seed})");
                    let options = AttentionOptions {
                        tiling,
                        ..options.clone()
                    };
                    common::assert_case(ctx, &decode_case(shape, options, dtype, seed));
                }
            }
        }
    }
}

#[test]
fn decode_covers_head_dims_layouts_and_lengths() {
    let Some(ctx) = common::ctx() else { return };
    // Head dims that the subgroup design reads 16 bytes at a time in both dtypes, in
    // f32 only (36, 20: 4 f32 but not 8 f16 to a load) and in neither (3, 5); Dv past
    // a whole chunk of loads (200).
    for (i, (lk, d, dv)) in [
        (1, 8, 8),
        (65, 3, 5),
        (300, 256, 256),
        (2000, 128, 64),
        (129, 96, 200),
        (97, 36, 20),
    ]
    .into_iter()
    .enumerate()
    {
        let shape = AttentionShape::new(2, 4, 1, 2, lk, d, dv);
        for dtype in [DType::F32, DType::F16] {
            if dtype == DType::F16 && !ctx.capabilities().f16 {
                continue;
            }
            for tiling in common::decode_designs(ctx) {
                let options = AttentionOptions {
                    tiling,
                    ..Default::default()
                };
                let mut c = decode_case(shape, options, dtype, 400 + i as u64);
                c.layout = if i % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
                eprintln!("decode ({tiling:?}) {shape:?} {dtype:?}");
                common::assert_case(ctx, &c);
                let outcome = run_case(ctx, &c).expect("runs");
                assert_eq!(outcome.kernel, "decode", "the case ran another path");
            }
        }
    }
}

#[test]
fn many_splits_merge_exactly() {
    // A forced loop cap makes every split short (a few tiles), so 5000 keys take dozens
    // of splits; rising scores make later splits dominate, so the merge's rescaling
    // matters.
    let Some(shared) = common::ctx() else { return };
    let mut ctx = wgpu_attention::Context::new().expect("a second context");
    ctx.limit_loop_iterations(16_000);
    let shape = AttentionShape::new(1, 4, 2, 1, 5000, 64, 64);
    let design = decode::DecodeDesign::for_context(&ctx, FusedTiling::Auto).expect("a design");
    let split = decode::choose_split(&ctx, design, &shape, shape.len_k).expect("fits");
    assert!(split.splits >= 16, "{split:?}");
    assert!(design.iterations(&shape, split.split_keys) <= 16_000, "{split:?}");
    for (i, dtype) in [DType::F32, DType::F16].into_iter().enumerate() {
        if dtype == DType::F16 && !shared.capabilities().f16 {
            continue;
        }
        let options = AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some(vec![4097]),
            ..Default::default()
        };
        common::assert_case(&ctx, &decode_case(shape, options, dtype, 500 + i as u64));
    }
}

#[test]
fn splits_cover_only_keys_some_row_can_see() {
    // A KV cache of 32768 rows holding 1000: the splits cut 1000 keys, not the capacity.
    let Some(ctx) = common::ctx() else { return };
    let shape = AttentionShape::new(1, 8, 2, 1, 32768, 64, 64);
    let design = decode::DecodeDesign::for_context(ctx, FusedTiling::Auto).expect("a design");
    let whole = decode::choose_split(ctx, design, &shape, shape.len_k).expect("fits");
    let held = decode::choose_split(ctx, design, &shape, 1000).expect("fits");
    assert_eq!(held.keys, 1000);
    assert!(held.splits * held.split_keys >= 1000, "{held:?} misses keys");
    assert!(held.split_keys < whole.split_keys, "{held:?} vs {whole:?}");
    assert!(held.split_keys <= 1000usize.next_multiple_of(decode::TILE), "{held:?}");
}

#[test]
fn auto_takes_decode_for_few_rows_and_many_keys() {
    let Some(ctx) = common::ctx() else { return };
    let auto = AttentionOptions::default();
    let pick = |shape: AttentionShape| resolve_kernel(ctx, DType::F32, &auto, &shape).expect("resolves");
    assert_eq!(
        pick(AttentionShape::new(1, 32, 8, 1, 32768, 128, 128)),
        ResolvedKernel::Decode
    );
    assert_eq!(
        pick(AttentionShape::new(2, 8, 8, 16, 1024, 64, 64)),
        ResolvedKernel::Decode
    );
    assert!(matches!(
        pick(AttentionShape::new(1, 8, 8, 1, 512, 64, 64)),
        ResolvedKernel::Fused(_)
    ));
    assert!(matches!(
        pick(AttentionShape::new(1, 8, 8, 64, 4096, 64, 64)),
        ResolvedKernel::Fused(_)
    ));
    // An explicit tiling asks for the fused kernel.
    let tiled = AttentionOptions {
        tiling: wgpu_attention::FusedTiling::Registers,
        ..Default::default()
    };
    let shape = AttentionShape::new(1, 32, 8, 1, 32768, 128, 128);
    assert!(matches!(
        resolve_kernel(ctx, DType::F32, &tiled, &shape),
        Ok(ResolvedKernel::Fused(_))
    ));
}

#[test]
fn the_lanes_design_matches_the_reference() {
    // The GPU design (one subgroup per workgroup, key groups of 8 or 16 lanes reading
    // 16-byte words), pinned on whatever adapter runs the tests: on lavapipe's 8-lane
    // subgroups it takes groups of 4 lanes, two to a subgroup, so the groups' merge
    // runs here as on 32-lane GPUs.
    let Some(shared) = common::ctx() else { return };
    let mut ctx = wgpu_attention::Context::new().expect("a second context");
    ctx.use_decode_design(Some(decode::DecodeDesign::Lanes));
    match decode::DecodeDesign::for_context(&ctx, FusedTiling::Auto) {
        Ok(design) => assert_eq!(design, decode::DecodeDesign::Lanes),
        Err(e) => {
            common::skip_or_fail(&format!("the lanes design needs a fixed subgroup size: {e}"));
            return;
        }
    }
    let mut seed = 700;
    // GQA 4 (one block), 8 rows of a kv head (two blocks), MQA with 3 rows (a block
    // with a row past its end); head dims of both classes, and 40, which f16 cannot
    // read in whole 16-byte words (Tiles runs it, on the same splits).
    for (shape, what) in [
        (AttentionShape::new(2, 8, 2, 1, 700, 64, 64), "GQA 4"),
        (AttentionShape::new(1, 4, 1, 2, 300, 128, 128), "two row blocks"),
        (AttentionShape::new(2, 3, 1, 1, 1000, 40, 40), "MQA, D 40"),
        (AttentionShape::new(1, 2, 2, 1, 129, 128, 64), "Dv 64"),
    ] {
        let mut rng = Rng::new(seed);
        let masks = [
            AttentionOptions::default(),
            AttentionOptions {
                key_lengths: Some((0..shape.batch).map(|b| [shape.len_k as u32 - 1, 1][b % 2]).collect()),
                causal: Some(CausalAlignment::BottomRight),
                ..Default::default()
            },
            AttentionOptions {
                window: Some(Window {
                    left: Some(90),
                    right: Some(0),
                }),
                ..Default::default()
            },
            AttentionOptions {
                mask: Some(random_bool_mask(
                    &mut rng,
                    [shape.batch, shape.heads_q, shape.len_q, shape.len_k],
                )),
                softcap: Some(5.0),
                ..Default::default()
            },
        ];
        for (m, options) in masks.into_iter().enumerate() {
            for dtype in [DType::F32, DType::F16] {
                if dtype == DType::F16 && !shared.capabilities().f16 {
                    continue;
                }
                seed += 1;
                eprintln!("decode (lanes) {what} {shape:?} mask {m} {dtype:?} (seed {seed})");
                let case = decode_case(shape, options.clone(), dtype, seed);
                common::assert_case(&ctx, &case);
                assert_eq!(run_case(&ctx, &case).expect("runs").kernel, "decode");
            }
        }
    }
}

#[test]
fn the_lanes_design_reads_paged_keys_as_the_gathered_ones_bit_for_bit() {
    // Pages of 5 rows (a step's keys straddle pages), f32 rows of 20 and 12 elements:
    // whole 16-byte words, so the lanes design reads them through the block table.
    use common::paged::{PagedInputs, D};
    use wgpu_attention::{Layout, Tensor};
    let Some(_) = common::ctx() else { return };
    let mut ctx = wgpu_attention::Context::new().expect("a second context");
    ctx.use_decode_design(Some(decode::DecodeDesign::Lanes));
    if decode::DecodeDesign::for_context(&ctx, FusedTiling::Auto).is_err() {
        common::skip_or_fail("the lanes design needs a fixed subgroup size");
        return;
    }
    let mut rng = Rng::new(78);
    let (batch, heads_q) = (3, 8);
    let paged = PagedInputs::new(&ctx, DType::F32, &mut rng, (batch, 60, 200));
    let q = Tensor::from_f32(
        &ctx,
        [batch, heads_q, 1, D],
        Layout::Bhsd,
        &rng.vec(batch * heads_q * D, -1.0, 1.0),
    )
    .expect("upload");
    let options = AttentionOptions {
        kernel: KernelChoice::Decode,
        causal: Some(CausalAlignment::BottomRight),
        key_lengths: Some(vec![297, 140, 3]),
        align_to_key_lengths: true,
        need_lse: true,
        ..Default::default()
    };
    paged.assert_same(&ctx, &q, &options, "seed 78 decode/lanes");
}
