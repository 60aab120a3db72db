//! Split-K decode (`--kernel decode`) against the f64 reference: few query rows, key
//! ranges cut into splits that a combine pass merges. Every mask, GQA, f16, lengths 0
//! and 1 in a batch, Lk not a multiple of the split or the tile, many splits.

use crate::common;
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
    let design = decode::DecodeDesign::for_context(&ctx, ctx.policy(), FusedTiling::Auto).expect("a design");
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
    let design = decode::DecodeDesign::for_context(ctx, ctx.policy(), FusedTiling::Auto).expect("a design");
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
    match decode::DecodeDesign::for_context(&ctx, ctx.policy(), FusedTiling::Auto) {
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
    if decode::DecodeDesign::for_context(&ctx, ctx.policy(), FusedTiling::Auto).is_err() {
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

/// Issue 64 item 1: a NaN in a visible key makes every query row of its head that sees
/// the key NaN, in the output and the lse, on every decode design and dtype, from
/// tensors and from a KV cache, as the reference gives it; a NaN in a value row makes
/// only its column NaN; rows that do not see either stay finite and right; a fully
/// masked row stays zeros with lse -inf. The combine pass once dropped a split whose
/// lse was NaN (`total != 0.0` is false for NaN) and wrote zeros for the whole head.
#[test]
fn a_nan_key_or_value_gives_nan_where_the_reference_does_on_every_design() {
    use wgpu_attention::check::{ErrorStats, Tolerance};
    use wgpu_attention::{reference, sdpa, KvCache, KvCacheConfig, Tensor};
    let Some(shared) = common::ctx() else { return };
    let mut lanes_ctx = wgpu_attention::Context::new().expect("a second context");
    lanes_ctx.use_decode_design(Some(decode::DecodeDesign::Lanes));
    let lanes = decode::DecodeDesign::for_context(&lanes_ctx, lanes_ctx.policy(), FusedTiling::Auto).is_ok();
    // Three batch elements, the last of length 0 (a fully masked row); 600 keys make
    // three splits of 256; causal, so row 0 of each head sees keys up to 598 only.
    let (b, hq, hkv, lq, lk, d, dv) = (3, 4, 2, 2, 600, 16, 16);
    let shape = AttentionShape::new(b, hq, hkv, lq, lk, d, dv);
    let options = AttentionOptions {
        kernel: KernelChoice::Decode,
        causal: Some(CausalAlignment::BottomRight),
        key_lengths: Some(vec![600, 600, 0]),
        align_to_key_lengths: true,
        need_lse: true,
        ..Default::default()
    };
    let mut runs: Vec<(&wgpu_attention::Context, FusedTiling, &str)> = common::decode_designs(shared)
        .into_iter()
        .map(|t| (shared, t, "tensors"))
        .collect();
    if lanes {
        runs.push((&lanes_ctx, FusedTiling::Auto, "tensors"));
    } else if common::is_vulkan_lavapipe(shared) {
        common::skip_or_fail("the lanes design needs a fixed subgroup size");
    }
    runs.push((shared, FusedTiling::Auto, "a KV cache"));
    for (n, dtype) in common::dtypes(shared).into_iter().enumerate() {
        let seed = 6400 + n as u64;
        let mut rng = Rng::new(seed);
        let round = |x: Vec<f32>| -> Vec<f32> {
            match dtype {
                DType::F32 => x,
                DType::F16 => x.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
            }
        };
        let q = round(rng.vec(b * hq * lq * d, -1.0, 1.0));
        let clean_k = round(rng.vec(b * hkv * lk * d, -1.0, 1.0));
        let clean_v = round(rng.vec(b * hkv * lk * dv, -1.0, 1.0));
        let (mut k, mut v) = (clean_k.clone(), clean_v.clone());
        // Element 0, kv head 0: key 100 seen by both rows of query heads 0 and 1 (in the
        // first split). Element 1, kv head 1: key 599 (the last split), seen by row 1 of
        // query heads 2 and 3 only. Element 0, kv head 1: value 300's column 5. Element
        // 2: a NaN key past its length 0.
        let row = |bi: usize, h: usize, j: usize| (bi * hkv + h) * lk + j;
        k[row(0, 0, 100) * d + 7] = f32::NAN;
        k[row(1, 1, 599) * d] = f32::NAN;
        v[row(0, 1, 300) * dv + 5] = f32::NAN;
        k[row(2, 0, 10) * d..][..d].fill(f32::NAN);
        let want = reference::attention(&q, &k, &v, &shape, &options).expect("reference");
        let clean = reference::attention(&q, &clean_k, &clean_v, &shape, &options).expect("reference");
        let out_nans = want.out.iter().filter(|x| x.is_nan()).count();
        let lse_nans = want.lse.iter().filter(|x| x.is_nan()).count();
        // Rows (0, 0..2, 0..2) and (1, 2..4, 1) in full, and column 5 of (0, 2..4, 0..2).
        assert_eq!(
            (out_nans, lse_nans),
            (6 * dv + 4, 6),
            "seed {seed}: the reference's NaN"
        );
        let rounding = if dtype == DType::F16 {
            clean.max_abs_value * 2f64.powi(-11)
        } else {
            0.0
        };
        let bound = Tolerance::F32.bound(&shape, &clean, 0.0) + rounding;
        let lse_bound = Tolerance::lse_bound(&shape, &clean);
        for &(ctx, tiling, source) in &runs {
            let upload =
                |x: &[f32], s: [usize; 4]| Tensor::from_f32_as(ctx, s, Layout::Bhsd, dtype, x).expect("upload");
            let qt = upload(&q, [b, hq, lq, d]);
            let (kt, vt) = (upload(&k, [b, hkv, lk, d]), upload(&v, [b, hkv, lk, dv]));
            let options = AttentionOptions {
                tiling,
                ..options.clone()
            };
            let what = format!(
                "seed {seed} {dtype:?} {:?} from {source}",
                decode::DecodeDesign::for_context(ctx, ctx.policy(), tiling)
            );
            eprintln!("{what}");
            let result = if source == "tensors" {
                sdpa(ctx, &qt, &kt, &vt, &options).expect("runs")
            } else {
                let config = KvCacheConfig {
                    batch: b,
                    heads_kv: hkv,
                    capacity: lk,
                    head_dim: d,
                    head_dim_v: dv,
                    layout: Layout::Bhsd,
                    dtype,
                };
                let mut cache = KvCache::new(ctx, config).expect("cache");
                cache.append_rows(ctx, &kt, &vt, &[600, 600, 0]).expect("append");
                let options = AttentionOptions {
                    key_lengths: None,
                    ..options.clone()
                };
                cache.attend(ctx, &qt, &options).expect("attends")
            };
            let got = result.out.to_f32_vec(ctx).expect("read out");
            let lse = result.lse.expect("lse asked for").to_f32_vec(ctx).expect("read lse");
            for (name, got, want, clean, bound) in [
                ("out", &got, &want.out, &clean.out, bound),
                ("lse", &lse, &want.lse, &clean.lse, lse_bound),
            ] {
                let want_nan: Vec<bool> = want.iter().map(|x| x.is_nan()).collect();
                let wrong: Vec<usize> = (0..want.len())
                    .filter(|&e| got.get(e).is_none_or(|g| g.is_nan() != want_nan[e]))
                    .collect();
                assert!(
                    wrong.is_empty(),
                    "{what}: {name} is NaN where the reference is not, or the other way round, at {} elements, first {:?} ({:?} against {})",
                    wrong.len(),
                    wrong.first(),
                    wrong.first().and_then(|&e| got.get(e)),
                    wrong.first().map_or(0.0, |&e| want[e]),
                );
                // Elsewhere the clean inputs' answer (zeros and -inf at the empty rows).
                let (finite_got, finite_want): (Vec<f32>, Vec<f64>) = got
                    .iter()
                    .zip(clean)
                    .zip(&want_nan)
                    .filter(|(_, &nan)| !nan)
                    .map(|((&g, &w), _)| (g, w))
                    .unzip();
                let stats = ErrorStats::of(&finite_got, &finite_want);
                assert!(stats.passes(bound), "{what}: {name} {stats:?} (bound {bound:e})");
            }
            let empty = &got[2 * hq * lq * dv..];
            assert!(empty.iter().all(|&x| x == 0.0), "{what}: a fully masked row is zeros");
        }
    }
}
