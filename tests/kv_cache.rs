//! `KvCache` (issue 14 §1): rows appended in place, bit for bit, across layouts and
//! dtypes; ragged appends; overflow refused with nothing changed; growth keeps every
//! row; attention over the cache equals attention over the concatenated rows with
//! positions aligned to each batch element's own length.

use crate::common;
use wgpu_attention::check::{alibi_slopes, ErrorStats, Rng, Tolerance};
use wgpu_attention::reference::attention;
use wgpu_attention::KvCacheConfig;
use wgpu_attention::{
    relayout, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Error, KernelChoice, KvCache, Layout,
    Tensor, Window,
};

const B: usize = 3;
const HKV: usize = 2;
const D: usize = 16;
const DV: usize = 8;

/// Host copy of what each batch element should hold: rows of [Hkv, len, dim], BHSD.
struct Expected {
    k: Vec<Vec<Vec<f32>>>, // [b][h] -> rows concatenated
    v: Vec<Vec<Vec<f32>>>,
}

impl Expected {
    fn new() -> Self {
        Expected {
            k: vec![vec![Vec::new(); HKV]; B],
            v: vec![vec![Vec::new(); HKV]; B],
        }
    }

    fn push(&mut self, k: &[f32], v: &[f32], n: usize, counts: &[u32]) {
        for b in 0..B {
            for h in 0..HKV {
                let rows = counts[b] as usize;
                self.k[b][h].extend_from_slice(&k[(b * HKV + h) * n * D..][..rows * D]);
                self.v[b][h].extend_from_slice(&v[(b * HKV + h) * n * DV..][..rows * DV]);
            }
        }
    }
}

fn rounded(dtype: DType, x: Vec<f32>) -> Vec<f32> {
    match dtype {
        DType::F32 => x,
        DType::F16 => x.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
    }
}

/// Draws n new rows (BHSD on the host), uploads them in `layout`, appends `counts`.
fn append(
    ctx: &Context,
    cache: &mut KvCache,
    expected: &mut Expected,
    rng: &mut Rng,
    (n, counts, layout, dtype): (usize, &[u32], Layout, DType),
) -> Result<(), Error> {
    let k = rounded(dtype, rng.vec(B * HKV * n * D, -1.0, 1.0));
    let v = rounded(dtype, rng.vec(B * HKV * n * DV, -1.0, 1.0));
    let upload = |data: &[f32], dim| {
        let shape = [B, HKV, n, dim];
        Tensor::from_f32_as(ctx, shape, layout, dtype, &relayout(data, shape, Layout::Bhsd, layout)).expect("upload")
    };
    cache.append_rows(ctx, &upload(&k, D), &upload(&v, DV), counts)?;
    expected.push(&k, &v, n, counts);
    Ok(())
}

/// The cache's held rows, read back, equal the expected ones exactly; rows past a
/// length are still zero.
fn assert_holds(ctx: &Context, cache: &KvCache, expected: &Expected) {
    let cap = cache.capacity();
    for (tensor, want, dim) in [(cache.keys(), &expected.k, D), (cache.values(), &expected.v, DV)] {
        let shape = [B, HKV, cap, dim];
        let got = relayout(
            &tensor.to_f32_vec(ctx).expect("read back"),
            shape,
            tensor.layout(),
            Layout::Bhsd,
        );
        for b in 0..B {
            let len = cache.lengths()[b] as usize;
            for h in 0..HKV {
                let head = &got[(b * HKV + h) * cap * dim..][..cap * dim];
                assert_eq!(&head[..len * dim], &want[b][h][..], "b {b} h {h}: held rows differ");
                assert!(
                    head[len * dim..].iter().all(|&x| x == 0.0),
                    "b {b} h {h}: rows past the length were written"
                );
            }
        }
    }
}

#[test]
fn appends_write_rows_in_place_bit_for_bit() {
    let Some(ctx) = common::ctx() else { return };
    for (cache_layout, rows_layout) in [(Layout::Bhsd, Layout::Bshd), (Layout::Bshd, Layout::Bhsd)] {
        for dtype in [DType::F32, DType::F16] {
            if dtype == DType::F16 && !ctx.capabilities().f16 {
                continue;
            }
            let mut rng = Rng::new(61);
            let mut cache = KvCache::new(
                ctx,
                KvCacheConfig {
                    batch: B,
                    heads_kv: HKV,
                    capacity: 40,
                    head_dim: D,
                    head_dim_v: DV,
                    layout: cache_layout,
                    dtype,
                },
            )
            .expect("cache");
            let mut expected = Expected::new();
            // A prompt for everyone, a ragged chunk, then one token each.
            for (n, counts) in [(12, vec![12, 12, 12]), (9, vec![9, 0, 4]), (1, vec![1, 1, 1])] {
                append(
                    ctx,
                    &mut cache,
                    &mut expected,
                    &mut rng,
                    (n, &counts, rows_layout, dtype),
                )
                .expect("fits");
            }
            assert_eq!(cache.lengths(), &[22, 13, 17]);
            assert_holds(ctx, &cache, &expected);
        }
    }
}

#[test]
fn overflow_is_refused_and_changes_nothing_until_grown() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(62);
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: B,
            heads_kv: HKV,
            capacity: 8,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    let mut expected = Expected::new();
    let rows = |n, counts: &'static [u32]| (n, counts, Layout::Bhsd, DType::F32);
    append(ctx, &mut cache, &mut expected, &mut rng, rows(6, &[6, 2, 5])).expect("fits");
    // `append` records rows in `expected` only when the cache took them.
    let err = append(ctx, &mut cache, &mut expected, &mut rng, rows(4, &[2, 3, 4])).expect_err("element 2 overflows");
    assert!(
        matches!(&err, Error::CapacityExceeded { what, .. } if what.contains("batch element 2") && what.contains("grow")),
        "{err}"
    );
    assert_eq!(cache.lengths(), &[6, 2, 5], "a refused append changed the lengths");
    assert_holds(ctx, &cache, &expected);
    assert!(
        cache.grow(ctx, 5).is_err(),
        "growing below a held length must be refused"
    );
    cache.grow(ctx, 12).expect("grows");
    assert_eq!(cache.capacity(), 12);
    assert_holds(ctx, &cache, &expected);
    append(ctx, &mut cache, &mut expected, &mut rng, rows(4, &[2, 3, 4])).expect("fits now");
    assert_holds(ctx, &cache, &expected);
    // Wrong shapes and dtypes are refused before anything is written.
    let wrong = Tensor::from_f32(ctx, [B, HKV + 1, 1, D], Layout::Bhsd, &vec![0.5; B * (HKV + 1) * D]).expect("upload");
    let v_ok = Tensor::from_f32(ctx, [B, HKV, 1, DV], Layout::Bhsd, &[0.5; B * HKV * DV]).expect("upload");
    assert!(matches!(cache.append(ctx, &wrong, &v_ok), Err(Error::Shape { .. })));
    assert_eq!(cache.lengths(), &[8, 5, 9]);
    // Clearing zeroes the rows too, not only the lengths: stale rows past a length
    // could hold infinities, and masked value rows must be finite.
    cache.clear(ctx).expect("clears");
    assert_eq!(cache.lengths(), &[0, 0, 0]);
    assert_holds(ctx, &cache, &Expected::new());
}

#[test]
fn attention_after_clear_never_sees_the_forgotten_rows() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 66;
    let mut rng = Rng::new(seed);
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: B,
            heads_kv: HKV,
            capacity: 8,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    // Rows of infinities, forgotten, then one finite row each: the infinities now sit
    // past the lengths, where kernels load (and mask) whole blocks of rows.
    let inf = |dim| {
        Tensor::from_f32(
            ctx,
            [B, HKV, 8, dim],
            Layout::Bhsd,
            &vec![f32::INFINITY; B * HKV * 8 * dim],
        )
    };
    cache
        .append(ctx, &inf(D).expect("upload"), &inf(DV).expect("upload"))
        .expect("fits");
    cache.clear(ctx).expect("clears");
    let mut expected = Expected::new();
    append(
        ctx,
        &mut cache,
        &mut expected,
        &mut rng,
        (1, &[1, 1, 1], Layout::Bhsd, DType::F32),
    )
    .expect("fits");
    let hq = 2 * HKV;
    let q = Tensor::from_f32(ctx, [B, hq, 1, D], Layout::Bhsd, &rng.vec(B * hq * D, -1.0, 1.0)).expect("upload");
    for kernel in [KernelChoice::Fused, KernelChoice::Decode, KernelChoice::Materialized] {
        let options = AttentionOptions {
            kernel,
            ..Default::default()
        };
        let out = cache.attend(ctx, &q, &options).expect("attends");
        let got = out.out.to_f32_vec(ctx).expect("read back");
        // One key each: the output is its value row, for every query head of the group.
        for b in 0..B {
            for h in 0..hq {
                let row = &got[(b * hq + h) * DV..][..DV];
                assert_eq!(row, &expected.v[b][h / 2][..], "seed {seed} {kernel:?}: b {b} h {h}");
            }
        }
    }
}

#[test]
fn caches_attention_could_not_read_are_refused_at_construction() {
    let Some(ctx) = common::ctx() else { return };
    let new = |b, h, d, dv, dtype| {
        KvCache::new(
            ctx,
            KvCacheConfig {
                batch: b,
                heads_kv: h,
                capacity: 8,
                head_dim: d,
                head_dim_v: dv,
                layout: Layout::Bhsd,
                dtype,
            },
        )
    };
    for (b, h, d, dv, what) in [
        (0, HKV, D, DV, "no batch elements"),
        (B, 0, D, DV, "no heads"),
        (B, HKV, 0, DV, "head dim 0"),
        (B, HKV, D, 257, "value head dim past 256"),
        (B, HKV, 512, DV, "head dim past 256"),
    ] {
        let err = new(b, h, d, dv, DType::F32).err();
        assert!(matches!(err, Some(Error::Unsupported { .. })), "{what}: {err:?}");
    }
    assert!(new(B, HKV, 256, 256, DType::F32).is_ok(), "head dim 256 is attendable");
    if !ctx.capabilities().f16 {
        let err = new(B, HKV, D, DV, DType::F16).err();
        assert!(
            matches!(err, Some(Error::MissingFeature { .. })),
            "f16 without SHADER_F16: {err:?}"
        );
    }
}

#[test]
fn rows_or_a_cache_from_another_context_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let other = Context::new().expect("a second context on the same adapter");
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: B,
            heads_kv: HKV,
            capacity: 8,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    let mut rng = Rng::new(64);
    let k = Tensor::from_f32(&other, [B, HKV, 1, D], Layout::Bhsd, &rng.vec(B * HKV * D, -1.0, 1.0)).expect("upload");
    let v = Tensor::from_f32(ctx, [B, HKV, 1, DV], Layout::Bhsd, &rng.vec(B * HKV * DV, -1.0, 1.0)).expect("upload");
    assert!(matches!(cache.append(ctx, &k, &v), Err(Error::Invalid { .. })));
    // The cache's own context is checked too, before anything is recorded.
    assert!(matches!(cache.clear(&other), Err(Error::Invalid { .. })));
    assert_eq!(cache.lengths(), &[0, 0, 0]);
}

#[test]
fn appends_over_more_pairs_than_one_grid_axis_holds_fit_one_call() {
    let Some(ctx) = common::ctx() else { return };
    // 70,000 (batch, head) pairs: past the 65,535 workgroups of one grid axis.
    let (b, h) = (35_000, 2);
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: b,
            heads_kv: h,
            capacity: 2,
            head_dim: 1,
            head_dim_v: 1,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    let seed = 65;
    let mut rng = Rng::new(seed);
    let (k, v) = (rng.vec(b * h, -1.0, 1.0), rng.vec(b * h, -1.0, 1.0));
    let upload = |data: &[f32]| Tensor::from_f32(ctx, [b, h, 1, 1], Layout::Bhsd, data).expect("upload");
    cache.append(ctx, &upload(&k), &upload(&v)).expect("fits");
    for (tensor, want) in [(cache.keys(), &k), (cache.values(), &v)] {
        let got = tensor.to_f32_vec(ctx).expect("read back"); // [b, h, 2, 1]
        for pair in 0..b * h {
            assert_eq!(got[2 * pair], want[pair], "seed {seed}: pair {pair}, row 0");
            assert_eq!(got[2 * pair + 1], 0.0, "seed {seed}: pair {pair}, row 1 was written");
        }
    }
}

#[test]
fn attention_over_the_cache_equals_attention_over_the_concatenated_rows() {
    let Some(ctx) = common::ctx() else { return };
    let hq = 4;
    let mut rng = Rng::new(63);
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            batch: B,
            heads_kv: HKV,
            capacity: 1200,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bshd,
            dtype: DType::F32,
        },
    )
    .expect("cache");
    let mut expected = Expected::new();
    // Lengths 1100, 0 and 37: a long sequence (split-K decode for Lq = 1), an empty one
    // (zeros), and a short one with fewer keys than some windows.
    for (n, counts) in [(1000, vec![1000, 0, 30]), (100, vec![100, 0, 7])] {
        append(
            ctx,
            &mut cache,
            &mut expected,
            &mut rng,
            (n, &counts, Layout::Bhsd, DType::F32),
        )
        .expect("fits");
    }
    let cases: Vec<(usize, KernelChoice, AttentionOptions)> = vec![
        (1, KernelChoice::Auto, AttentionOptions::default()),
        (
            1,
            KernelChoice::Decode,
            AttentionOptions {
                window: Some(Window {
                    left: Some(300),
                    right: None,
                }),
                alibi_slopes: Some(alibi_slopes(hq)),
                ..Default::default()
            },
        ),
        (
            5,
            KernelChoice::Fused,
            AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                window: Some(Window {
                    left: Some(20),
                    right: Some(0),
                }),
                softcap: Some(2.0),
                ..Default::default()
            },
        ),
        (
            5,
            KernelChoice::Materialized,
            AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                alibi_slopes: Some(alibi_slopes(hq)),
                need_weights: true,
                ..Default::default()
            },
        ),
    ];
    for (n, (lq, kernel, options)) in cases.into_iter().enumerate() {
        let seed = 630 + n as u64;
        let mut rng = Rng::new(seed);
        let q = rng.vec(B * hq * lq * D, -1.0, 1.0);
        let qt = Tensor::from_f32(ctx, [B, hq, lq, D], Layout::Bhsd, &q).expect("upload");
        let options = AttentionOptions { kernel, ..options };
        let got = cache.attend(ctx, &qt, &options).expect("attends");
        let out = got.out.to_f32_vec(ctx).expect("read back");
        // The one-submission form gives the same bits.
        let (_, read) = cache.attend_read(ctx, &qt, &options).expect("attends and reads");
        assert!(
            read.len() == out.len() && read.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
            "seed {seed}: attend_read differs from attend then a read"
        );
        // The reference per batch element, over exactly the rows it holds.
        for b in 0..B {
            let len = cache.lengths()[b] as usize;
            let plane = hq * lq * DV;
            let got_b = &out[b * plane..][..plane];
            if len == 0 {
                assert!(
                    got_b.iter().all(|&x| x == 0.0),
                    "seed {seed}: empty element {b} not zeros"
                );
                continue;
            }
            let shape = AttentionShape::new(1, hq, HKV, lq, len, D, DV);
            let k: Vec<f32> = expected.k[b].concat();
            let v: Vec<f32> = expected.v[b].concat();
            let want = attention(&q[b * hq * lq * D..][..hq * lq * D], &k, &v, &shape, &options).expect("reference");
            let bound = Tolerance::F32.bound(&shape, &want, 0.0);
            let stats = ErrorStats::of(got_b, &want.out);
            assert!(
                stats.passes(bound),
                "seed {seed} {kernel:?} Lq {lq} element {b}: {stats:?} (bound {bound:e})"
            );
        }
    }
    // The cache supplies the key lengths.
    let q = Tensor::from_f32(ctx, [B, hq, 1, D], Layout::Bhsd, &vec![0.5; B * hq * D]).expect("upload");
    let with_lengths = AttentionOptions {
        key_lengths: Some(vec![1, 1, 1]),
        ..Default::default()
    };
    assert!(matches!(
        cache.attend(ctx, &q, &with_lengths),
        Err(Error::Invalid { .. })
    ));
}
