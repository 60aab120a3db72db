//! A KV cache's texel mirror (docs/design.md, "KV cache"): split-K decode reading K
//! and V from the mirror gives the same bits as reading them from the buffers (the
//! same kernel and accumulation order, only the loads differ), after ragged appends,
//! growth, clearing and a mirror rebuilt from held rows; in f32 and f16, both layouts,
//! every way the subgroup design reads a row (16 bytes, 8 bytes, picked out of two
//! words); and across texture layers, on a device whose 2D textures are small.

use crate::common;
use wgpu_attention::check::Rng;
use wgpu_attention::kernels::decode::DecodeDesign;
use wgpu_attention::kernels::kv_texels::TexelGrid;
use wgpu_attention::{AttentionOptions, Context, DType, FusedTiling, KernelChoice, KvCache, Layout, Tensor};
use wgpu_attention::{KvCacheConfig, PagedKvConfig};

const B: usize = 3;
const HKV: usize = 2;
const HQ: usize = 4;

/// Whether decode on `ctx` takes the subgroup design, which alone reads a mirror; if
/// so, a new cache must keep one.
fn mirrors(ctx: &Context) -> bool {
    let subgroup =
        DecodeDesign::for_context(ctx, ctx.policy(), FusedTiling::Auto).expect("a design") == DecodeDesign::Subgroup;
    if !subgroup {
        // The texel mirror serves the subgroup decode design only; lavapipe takes it.
        common::skip_lacking(ctx, "the subgroup decode design (texel mirrors)", true);
    }
    subgroup
}

/// Two caches fed the same rows, one with its texel mirror and one without.
struct Pair {
    mirrored: KvCache,
    plain: KvCache,
    d: usize,
    dv: usize,
    dtype: DType,
}

impl Pair {
    fn new(ctx: &Context, capacity: usize, (d, dv): (usize, usize), layout: Layout, dtype: DType) -> Pair {
        let new = || {
            KvCache::new(
                ctx,
                KvCacheConfig {
                    batch: B,
                    heads_kv: HKV,
                    capacity,
                    head_dim: d,
                    head_dim_v: dv,
                    layout,
                    dtype,
                },
            )
            .expect("cache")
        };
        let mirrored = new();
        let mut plain = new();
        assert!(
            mirrored.has_texel_mirror(),
            "a new cache on a subgroup-decode adapter keeps a mirror"
        );
        plain.set_texel_mirror(ctx, false).expect("drops");
        assert!(!plain.has_texel_mirror());
        Pair {
            mirrored,
            plain,
            d,
            dv,
            dtype,
        }
    }

    fn append(&mut self, ctx: &Context, rng: &mut Rng, n: usize, counts: &[u32]) {
        self.append_drawn(ctx, rng, n, counts, None);
    }

    /// Appends `n` rows, the first `counts[b]` of them to element b, drawn at random or
    /// all `value`.
    fn append_drawn(&mut self, ctx: &Context, rng: &mut Rng, n: usize, counts: &[u32], value: Option<f32>) {
        let upload = |rng: &mut Rng, dim: usize| {
            let data = match value {
                Some(x) => vec![x; B * HKV * n * dim],
                None => rng.vec(B * HKV * n * dim, -2.0, 2.0),
            };
            Tensor::from_f32_as(ctx, [B, HKV, n, dim], Layout::Bhsd, self.dtype, &data).expect("upload")
        };
        let (k, v) = (upload(rng, self.d), upload(rng, self.dv));
        for cache in [&mut self.mirrored, &mut self.plain] {
            cache.append_rows(ctx, &k, &v, counts).expect("fits");
        }
    }

    /// Decode over both caches gives the same bits.
    fn assert_same_decode(&self, ctx: &Context, rng: &mut Rng, what: &str) {
        let q = rng.vec(B * HQ * self.d, -1.0, 1.0);
        let q = Tensor::from_f32_as(ctx, [B, HQ, 1, self.d], Layout::Bhsd, self.dtype, &q).expect("upload");
        let options = AttentionOptions {
            kernel: KernelChoice::Decode,
            need_lse: true,
            ..Default::default()
        };
        let read = |cache: &KvCache| {
            let out = cache.attend(ctx, &q, &options).expect("attends");
            (
                out.out.to_f32_vec(ctx).expect("read back"),
                out.lse.expect("asked for").to_f32_vec(ctx).expect("read back"),
            )
        };
        let (mirrored, plain) = (read(&self.mirrored), read(&self.plain));
        let bits = |x: &(Vec<f32>, Vec<f32>)| -> Vec<u32> { x.0.iter().chain(&x.1).map(|v| v.to_bits()).collect() };
        // With no rows held every output is zero, rightly.
        let held = self.mirrored.lengths().iter().any(|&n| n > 0);
        assert!(
            !held || mirrored.0.iter().any(|&x| x != 0.0),
            "{what}: decode gave only zeros, so the comparison proves nothing"
        );
        if let Some(i) = bits(&mirrored).iter().zip(bits(&plain)).position(|(a, b)| *a != b) {
            panic!("{what}: decode from the texel mirror differs from the buffers' at value {i}");
        }
    }
}

#[test]
fn decode_from_the_texel_mirror_equals_decode_from_the_buffers_bit_for_bit() {
    let Some(ctx) = common::ctx() else { return };
    if !mirrors(ctx) {
        return;
    }
    // Head dims: 16 bytes a load in both dtypes; 8 bytes a load in f16 (4 elements),
    // 16 in f32; elements picked out of two words.
    for (dims, dtypes) in [
        ((16, 8), &[DType::F32, DType::F16][..]),
        ((20, 12), &[DType::F16, DType::F32][..]),
        ((13, 7), &[DType::F32, DType::F16][..]),
    ] {
        for &dtype in dtypes {
            if dtype == DType::F16 && !ctx.capabilities().f16 {
                continue;
            }
            for layout in [Layout::Bhsd, Layout::Bshd] {
                let seed =
                    7100 + dims.0 as u64 * 10 + u64::from(dtype == DType::F16) * 2 + u64::from(layout == Layout::Bshd);
                let what = |step: &str| format!("seed {seed}, dims {dims:?} {dtype:?} {layout:?}, {step}");
                let mut rng = Rng::new(seed);
                let mut pair = Pair::new(ctx, 700, dims, layout, dtype);
                // Ragged: one element long, one empty, one short.
                pair.append(ctx, &mut rng, 500, &[500, 0, 37]);
                pair.assert_same_decode(ctx, &mut rng, &what("after a ragged append"));
                pair.append(ctx, &mut rng, 1, &[1, 1, 1]);
                pair.assert_same_decode(ctx, &mut rng, &what("after one more row each"));
                for cache in [&mut pair.mirrored, &mut pair.plain] {
                    cache.grow(ctx, 1300).expect("grows");
                }
                assert!(pair.mirrored.has_texel_mirror() && !pair.plain.has_texel_mirror());
                pair.append(ctx, &mut rng, 600, &[600, 300, 5]);
                pair.assert_same_decode(ctx, &mut rng, &what("after growing and appending"));
                // A mirror built from the rows held gives the same bits too.
                pair.plain.set_texel_mirror(ctx, true).expect("builds");
                pair.assert_same_decode(ctx, &mut rng, &what("with a mirror rebuilt from held rows"));
                pair.plain.set_texel_mirror(ctx, false).expect("drops");
                for cache in [&mut pair.mirrored, &mut pair.plain] {
                    cache.clear(ctx).expect("clears");
                }
                pair.append(ctx, &mut rng, 300, &[3, 300, 1]);
                pair.assert_same_decode(ctx, &mut rng, &what("after clearing"));
            }
        }
    }
}

/// A context on the default adapter whose 2D textures are at most 64 texels a side, so
/// a mirror of a few hundred KiB spans several layers of 64 x 64 texels.
fn small_textures() -> Option<Context> {
    use wgpu_attention::wgpu::Features;
    common::ctx_with_limits(Features::SHADER_F16 | Features::SUBGROUP, |limits| {
        limits.max_texture_dimension_2d = 64;
    })
}

#[test]
fn a_mirror_spanning_several_texture_layers_reads_every_row() {
    let Some(ctx) = small_textures() else { return };
    if !mirrors(&ctx) {
        return;
    }
    let grid = TexelGrid::for_context(&ctx);
    assert_eq!((grid.width(), grid.rows), (64, 64));
    let seed = 7200;
    let mut rng = Rng::new(seed);
    // K: 3 x 2 x 1100 rows of 16 f32, 26,400 words: 6.4 layers of 4096 texels.
    let mut pair = Pair::new(&ctx, 1100, (16, 16), Layout::Bhsd, DType::F32);
    pair.append(&ctx, &mut rng, 1100, &[1100, 900, 1050]);
    pair.assert_same_decode(&ctx, &mut rng, &format!("seed {seed}, 64 x 64 texel layers"));
}

/// `check`'s `decode/kv-cache` variant over the whole grid: every mask and option the
/// grid mixes, read from a cache (through its mirror here), against the reference.
#[test]
fn the_check_grid_read_from_a_kv_cache_meets_the_reference() {
    let Some(ctx) = common::ctx() else { return };
    if !mirrors(ctx) {
        return;
    }
    let cache_variants = wgpu_attention::check::variants(ctx.capabilities().f16)
        .into_iter()
        .filter(|v| v.kv == wgpu_attention::check::KvSource::Cache);
    let mut ran = 0;
    for variant in cache_variants {
        for case in wgpu_attention::check::standard_grid(wgpu_attention::check::DEFAULT_SEED) {
            let case = variant.apply(&case);
            let what = format!(
                "{} (seed {}): {}",
                variant.label,
                case.seed,
                wgpu_attention::check::describe(&case)
            );
            let outcome = variant
                .run(ctx, &case)
                .unwrap_or_else(|e| panic!("{what}: failed to run: {e}"));
            assert!(
                outcome.kernel.contains("texel mirror"),
                "{what}: ran {}, not from the mirror",
                outcome.kernel
            );
            assert!(outcome.passed, "{what}: {}", outcome.summary());
            ran += 1;
        }
    }
    assert!(ran > 0, "no decode/kv-cache variant in check");
}

/// A paged pool with its mirror and one without, fed the same rows: decode over both
/// gives the same bits, also once a page that held infinities (a removed sequence's)
/// is handed to another sequence that fills only part of it. Without the mirror's copy
/// of every cleared page, the infinities would stay in the mirror past that
/// sequence's length and decode from it would be NaN.
#[test]
fn a_paged_pool_and_its_mirror_give_the_same_decode_after_pages_are_reused() {
    use wgpu_attention::PagedKvCache;
    let Some(ctx) = common::ctx() else { return };
    if !mirrors(ctx) {
        return;
    }
    const PAGE: usize = 16;
    let (d, dv) = (20, 12);
    for dtype in [DType::F32, DType::F16] {
        if dtype == DType::F16 && !ctx.capabilities().f16 {
            continue;
        }
        let seed = 7300 + u64::from(dtype == DType::F16);
        let what = |step: &str| format!("seed {seed}, paged {dtype:?}, {step}");
        let mut rng = Rng::new(seed);
        let new = || {
            PagedKvCache::new(
                ctx,
                PagedKvConfig {
                    pages: 40,
                    page_size: PAGE,
                    heads_kv: HKV,
                    head_dim: d,
                    head_dim_v: dv,
                    layout: Layout::Bshd,
                    dtype,
                },
            )
            .expect("pool")
        };
        let mut pools = [new(), new()];
        assert!(
            pools[0].has_texel_mirror(),
            "a new pool on a subgroup-decode adapter keeps a mirror"
        );
        pools[1].set_texel_mirror(ctx, false).expect("drops");
        let upload = |rng: &mut Rng, n: usize, rows: usize, dim: usize, value: Option<f32>| {
            let data = match value {
                Some(x) => vec![x; n * HKV * rows * dim],
                None => rng.vec(n * HKV * rows * dim, -2.0, 2.0),
            };
            Tensor::from_f32_as(ctx, [n, HKV, rows, dim], Layout::Bhsd, dtype, &data).expect("upload")
        };
        // Every pool gets the same sequence ids: they are handed out in order.
        let ids: Vec<_> = pools.iter_mut().map(|p| [p.add_sequence(), p.add_sequence()]).collect();
        let (k, v) = (upload(&mut rng, 2, 70, d, None), upload(&mut rng, 2, 70, dv, None));
        for (pool, ids) in pools.iter_mut().zip(&ids) {
            pool.append_rows(ctx, ids, &k, &v, &[70, 33]).expect("fits");
        }
        // A third sequence filled with infinities takes pages, then is removed.
        let (k_inf, v_inf) = (
            upload(&mut rng, 1, 3 * PAGE, d, Some(f32::INFINITY)),
            upload(&mut rng, 1, 3 * PAGE, dv, Some(f32::INFINITY)),
        );
        for pool in &mut pools {
            let doomed = pool.add_sequence();
            pool.append(ctx, &[doomed], &k_inf, &v_inf).expect("fits");
            pool.remove_sequence(doomed).expect("held");
        }
        // The first two grow into the freed pages, each only partly.
        let (k, v) = (upload(&mut rng, 2, 21, d, None), upload(&mut rng, 2, 21, dv, None));
        for (pool, ids) in pools.iter_mut().zip(&ids) {
            pool.append_rows(ctx, ids, &k, &v, &[5, 21]).expect("fits");
        }
        let decode = |pool: &PagedKvCache, ids: &[wgpu_attention::SequenceId], q: &Tensor| {
            let options = AttentionOptions {
                kernel: KernelChoice::Decode,
                need_lse: true,
                ..Default::default()
            };
            let out = pool.attend(ctx, ids, q, &options).expect("attends");
            let mut values = out.out.to_f32_vec(ctx).expect("read back");
            values.extend(out.lse.expect("asked for").to_f32_vec(ctx).expect("read back"));
            values
        };
        let check = |rng: &mut Rng, pools: &[PagedKvCache; 2], step: &str| {
            let q = rng.vec(2 * HQ * d, -1.0, 1.0);
            let q = Tensor::from_f32_as(ctx, [2, HQ, 1, d], Layout::Bhsd, dtype, &q).expect("upload");
            let (mirrored, plain) = (decode(&pools[0], &ids[0], &q), decode(&pools[1], &ids[1], &q));
            assert!(
                plain.iter().all(|x| x.is_finite() || *x == f32::NEG_INFINITY),
                "{}: the plain pool's decode is not finite",
                what(step)
            );
            let differs = mirrored
                .iter()
                .zip(&plain)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            if let Some(i) = differs {
                panic!(
                    "{}: decode from the mirror differs at value {i}: {} against {}",
                    what(step),
                    mirrored[i],
                    plain[i]
                );
            }
        };
        check(&mut rng, &pools, "after pages that held infinities were reused");
        // A mirror built from the whole pool gives the same bits too.
        pools[1].set_texel_mirror(ctx, true).expect("builds");
        check(&mut rng, &pools, "with the second pool's mirror built from the pool");
    }
}

/// `clear` zeroes the mirror along with the buffers: rows of infinities, cleared, then
/// a few finite rows; decode from the mirror equals decode from the buffers. Were the
/// mirror left holding the infinities, the masked rows past each length would give
/// NaN.
#[test]
fn a_cleared_cache_forgets_its_rows_in_the_mirror_too() {
    let Some(ctx) = common::ctx() else { return };
    if !mirrors(ctx) {
        return;
    }
    let seed = 7400;
    let mut rng = Rng::new(seed);
    let mut pair = Pair::new(ctx, 400, (16, 8), Layout::Bhsd, DType::F32);
    let infinite = |n: usize, dim: usize| {
        Tensor::from_f32_as(
            ctx,
            [B, HKV, n, dim],
            Layout::Bhsd,
            DType::F32,
            &vec![f32::INFINITY; B * HKV * n * dim],
        )
        .expect("upload")
    };
    let (k, v) = (infinite(400, 16), infinite(400, 8));
    for cache in [&mut pair.mirrored, &mut pair.plain] {
        cache.append(ctx, &k, &v).expect("fits");
        cache.clear(ctx).expect("clears");
    }
    assert!(pair.mirrored.has_texel_mirror(), "clear keeps the mirror");
    pair.append(ctx, &mut rng, 40, &[40, 3, 17]);
    pair.assert_same_decode(
        ctx,
        &mut rng,
        &format!("seed {seed}, after clearing rows of infinities"),
    );
}

/// What a random cache history does next (`random_histories_keep_the_mirror_equal_to_the_buffers`).
#[derive(Clone, Debug)]
enum Step {
    /// Rows for each element: its count is the given number modulo its free rows + 1.
    Append([u16; B]),
    /// More capacity, by 1 + the number modulo 100 rows.
    Grow(u16),
    /// Rows of infinities filling every element, then `clear`.
    FillWithInfinitiesAndClear,
    /// The plain cache builds a mirror from its rows (compared), then drops it.
    Rebuild,
}

fn arb_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => any::<[u16; B]>().prop_map(Step::Append),
        1 => any::<u16>().prop_map(Step::Grow),
        1 => Just(Step::FillWithInfinitiesAndClear),
        1 => Just(Step::Rebuild),
    ]
}

proptest::proptest! {
    // The saved seeds' file by path: inside the `it` binary proptest would look for it
    // beside tests/it/main.rs (and never find it).
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 12,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "tests/kv_texels.proptest-regressions"
        ))),
        ..Default::default()
    })]

    /// Random histories of appends, growth, clears and rebuilt mirrors, in every dtype,
    /// layout and way of reading rows (the head dims of the bit-for-bit test): after
    /// each step, decode from the mirror gives the buffers' bits.
    #[test]
    fn random_histories_keep_the_mirror_equal_to_the_buffers(
        seed in proptest::prelude::any::<u64>(),
        dims in 0usize..3,
        f16 in proptest::prelude::any::<bool>(),
        bshd in proptest::prelude::any::<bool>(),
        capacity in 20usize..200,
        steps in proptest::collection::vec(arb_step(), 1..6),
    ) {
        let Some(ctx) = common::ctx() else { return Ok(()) };
        let dtype = if f16 { DType::F16 } else { DType::F32 };
        if !mirrors(ctx) {
            return Ok(());
        }
        if f16 && !ctx.capabilities().f16 {
            common::skip_lacking(ctx, "SHADER_F16", true);
            return Ok(());
        }
        let dims = [(16, 8), (20, 12), (13, 7)][dims];
        let layout = if bshd { Layout::Bshd } else { Layout::Bhsd };
        let mut rng = Rng::new(seed);
        let mut pair = Pair::new(ctx, capacity, dims, layout, dtype);
        for (i, step) in steps.iter().enumerate() {
            let free: Vec<u32> = pair
                .mirrored
                .lengths()
                .iter()
                .map(|&n| pair.mirrored.capacity() as u32 - n)
                .collect();
            match step {
                Step::Append(picks) => {
                    let counts: Vec<u32> = picks.iter().zip(&free).map(|(&x, &f)| u32::from(x) % (f + 1)).collect();
                    let n = counts.iter().copied().max().unwrap_or(0).max(1) as usize;
                    pair.append(ctx, &mut rng, n, &counts);
                }
                Step::Grow(by) => {
                    let capacity = pair.mirrored.capacity() + 1 + usize::from(*by) % 100;
                    for cache in [&mut pair.mirrored, &mut pair.plain] {
                        cache.grow(ctx, capacity).expect("grows");
                    }
                }
                Step::FillWithInfinitiesAndClear => {
                    let n = free.iter().copied().max().unwrap_or(0).max(1) as usize;
                    pair.append_drawn(ctx, &mut rng, n, &free, Some(f32::INFINITY));
                    for cache in [&mut pair.mirrored, &mut pair.plain] {
                        cache.clear(ctx).expect("clears");
                    }
                }
                Step::Rebuild => {
                    pair.plain.set_texel_mirror(ctx, true).expect("builds");
                }
            }
            let what = format!("seed {seed}, dims {dims:?} {dtype:?} {layout:?}, step {i} {step:?} of {steps:?}");
            pair.assert_same_decode(ctx, &mut rng, &what);
            if matches!(step, Step::Rebuild) {
                pair.plain.set_texel_mirror(ctx, false).expect("drops");
            }
        }
    }
}
