//! Paged KV (issue 14 §3): attention through a block table equals attention over the
//! gathered keys bit for bit on every path (the kernels walk the same keys in the same
//! order; only the addresses differ); `PagedKvCache` writes rows through the table,
//! shares one pool between sequences of different lengths, frees and reuses pages,
//! refuses what does not fit without changing anything, and attends like `KvCache`.

use crate::common;
use common::paged::{PagedInputs, HKV, PAGE};
use common::{dtypes, paths};
use wgpu_attention::check::{alibi_slopes, ErrorStats, Rng, Tolerance};
use wgpu_attention::reference::attention;
use wgpu_attention::PagedKvConfig;
use wgpu_attention::{
    sdpa_paged, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Error, KernelChoice, Layout,
    PageTable, PagedKvCache, SequenceId, Tensor, Window,
};

const HQ: usize = 4;
const D: usize = common::paged::D;
const DV: usize = common::paged::DV;

#[test]
fn paged_attention_equals_contiguous_attention_bit_for_bit_on_every_path() {
    let Some(ctx) = common::ctx() else { return };
    let (batch, per_sequence, pages) = (3, 7, 25);
    let lk = per_sequence * PAGE;
    for dtype in dtypes(ctx) {
        let seed = 71 + dtype as u64;
        let mut rng = Rng::new(seed);
        let paged = PagedInputs::new(ctx, dtype, &mut rng, (batch, per_sequence, pages));
        let variants = [
            // Whole rows of pages, nothing masked.
            AttentionOptions::default(),
            // Lengths that end inside a page, and an empty sequence.
            AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                key_lengths: Some(vec![lk as u32, 13, 0]),
                align_to_key_lengths: true,
                need_weights: true,
                ..Default::default()
            },
            AttentionOptions {
                key_lengths: Some(vec![29, lk as u32, 1]),
                window: Some(Window {
                    left: Some(11),
                    right: Some(2),
                }),
                alibi_slopes: Some(alibi_slopes(HQ)),
                softcap: Some(3.0),
                ..Default::default()
            },
        ];
        for (kernel, tiling) in paths(ctx) {
            for lq in [1, 3] {
                let q = common::rounded(dtype, rng.vec(batch * HQ * lq * D, -1.0, 1.0));
                let q = Tensor::from_f32_as(ctx, [batch, HQ, lq, D], Layout::Bhsd, dtype, &q).expect("upload");
                for (n, variant) in variants.iter().enumerate() {
                    let options = AttentionOptions {
                        kernel,
                        tiling,
                        need_lse: true,
                        ..variant.clone()
                    };
                    let what = format!("seed {seed} {dtype:?} {kernel:?}/{tiling:?} Lq {lq} variant {n}");
                    paged.assert_same(ctx, &q, &options, &what);
                }
            }
        }
    }
}

#[test]
fn bad_tables_and_pools_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let upload = |shape: [usize; 4]| {
        let n = shape.iter().product::<usize>();
        Tensor::from_f32(ctx, shape, Layout::Bhsd, &vec![0.25; n]).expect("upload")
    };
    let q = upload([2, HQ, 1, D]);
    let (kp, vp) = (upload([4, HKV, PAGE, D]), upload([4, HKV, PAGE, DV]));
    let run = |table: &PageTable, k: &Tensor, v: &Tensor| sdpa_paged(ctx, &q, k, v, table, &Default::default());
    let err = run(&PageTable::new(2, 2, vec![0, 1, 2, 4]).expect("table"), &kp, &vp).expect_err("page 4 of 4");
    assert!(
        matches!(&err, Error::Invalid { .. }) && err.to_string().contains("names page 4"),
        "{err}"
    );
    let err = run(&PageTable::new(3, 1, vec![0, 1, 2]).expect("table"), &kp, &vp).expect_err("3 rows for batch 2");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let other_pages = upload([4, HKV, PAGE + 1, DV]);
    let err = run(&PageTable::new(2, 1, vec![0, 1]).expect("table"), &kp, &other_pages).expect_err("page sizes");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert!(PageTable::new(2, 2, vec![0, 1, 2]).is_err(), "3 entries for 2 x 2");
    assert!(PageTable::new(0, 2, vec![]).is_err(), "an empty table");
    // f16 pages of an odd number of elements cannot be cleared by buffer clears.
    let odd = PagedKvCache::new(
        ctx,
        PagedKvConfig {
            pages: 4,
            page_size: 5,
            heads_kv: 1,
            head_dim: 3,
            head_dim_v: 3,
            layout: Layout::Bshd,
            dtype: wgpu_attention::DType::F16,
        },
    );
    assert!(matches!(odd, Err(Error::Unsupported { .. })), "{:?}", odd.err());
    assert!(PagedKvCache::new(
        ctx,
        PagedKvConfig {
            pages: 4,
            page_size: 5,
            heads_kv: 1,
            head_dim: 3,
            head_dim_v: 3,
            layout: Layout::Bshd,
            dtype: wgpu_attention::DType::F32
        }
    )
    .is_ok());
    // Pools attention could never read.
    for (heads, d, what) in [
        (0, D, "no heads"),
        (HKV, 512, "head dim past 256"),
        (HKV, 0, "head dim 0"),
    ] {
        let pool = PagedKvCache::new(
            ctx,
            PagedKvConfig {
                pages: 4,
                page_size: PAGE,
                heads_kv: heads,
                head_dim: d,
                head_dim_v: DV,
                layout: Layout::Bshd,
                dtype: DType::F32,
            },
        );
        assert!(
            matches!(pool, Err(Error::Unsupported { .. })),
            "{what}: {:?}",
            pool.err()
        );
    }
}

#[test]
fn appends_from_another_context_or_to_no_sequence_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let other = Context::new().expect("a second context on the same adapter");
    let mut cache = PagedKvCache::new(
        ctx,
        PagedKvConfig {
            pages: 4,
            page_size: PAGE,
            heads_kv: HKV,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bhsd,
            dtype: DType::F32,
        },
    )
    .expect("pool");
    let id = cache.add_sequence();
    let mut rng = Rng::new(73);
    let mut rows =
        |c: &Context, dim| Tensor::from_f32(c, [1, HKV, 1, dim], Layout::Bhsd, &rng.vec(HKV * dim, -1.0, 1.0));
    let (k, v) = (rows(&other, D).expect("upload"), rows(&other, DV).expect("upload"));
    // Another device's rows, and this pool appended to through another device (whose
    // page clears would name a foreign buffer).
    assert!(matches!(cache.append(ctx, &[id], &k, &v), Err(Error::Invalid { .. })));
    assert!(matches!(
        cache.append(&other, &[id], &k, &v),
        Err(Error::Invalid { .. })
    ));
    assert_eq!(
        (cache.len(id).expect("live"), cache.free_pages()),
        (0, 4),
        "a refused append changed the pool"
    );
    let err = cache.append_rows(ctx, &[], &k, &v, &[]).expect_err("no sequences");
    assert!(err.to_string().contains("none given"), "{err}");
    let err = cache.table(&[]).expect_err("no sequences");
    assert!(err.to_string().contains("none given"), "{err}");
}

/// Host copy of what each sequence holds: rows of [Hkv, len, dim] per head, BHSD.
#[derive(Clone, Default)]
struct Held {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Draws `n` rows for each of `ids`, appends the first `counts[i]` to sequence `ids[i]`
/// and to `held[i]` (only when the cache took them).
fn append(
    ctx: &Context,
    cache: &mut PagedKvCache,
    held: &mut [Held],
    rng: &mut Rng,
    ids: &[SequenceId],
    n: usize,
    counts: &[u32],
) -> Result<(), Error> {
    let s = ids.len();
    let k = rng.vec(s * HKV * n * D, -1.0, 1.0);
    let v = rng.vec(s * HKV * n * DV, -1.0, 1.0);
    let upload = |data: &[f32], dim| Tensor::from_f32(ctx, [s, HKV, n, dim], Layout::Bhsd, data).expect("upload");
    cache.append_rows(ctx, ids, &upload(&k, D), &upload(&v, DV), counts)?;
    for (i, held) in held.iter_mut().enumerate() {
        held.k.resize(HKV, Vec::new());
        held.v.resize(HKV, Vec::new());
        for h in 0..HKV {
            let rows = counts[i] as usize;
            held.k[h].extend_from_slice(&k[(i * HKV + h) * n * D..][..rows * D]);
            held.v[h].extend_from_slice(&v[(i * HKV + h) * n * DV..][..rows * DV]);
        }
    }
    Ok(())
}

/// Attention of random queries against sequences `ids` through the cache, each batch
/// element against the f64 reference over exactly the rows it holds.
fn assert_attends(ctx: &Context, cache: &PagedKvCache, ids: &[SequenceId], held: &[&Held], seed: u64) {
    let lq = 2;
    let s = ids.len();
    let mut rng = Rng::new(seed);
    let q = rng.vec(s * HQ * lq * D, -1.0, 1.0);
    let qt = Tensor::from_f32(ctx, [s, HQ, lq, D], Layout::Bhsd, &q).expect("upload");
    for kernel in [KernelChoice::Fused, KernelChoice::Decode] {
        let options = AttentionOptions {
            kernel,
            causal: Some(CausalAlignment::BottomRight),
            ..Default::default()
        };
        let out = cache
            .attend(ctx, ids, &qt, &options)
            .expect("attends")
            .out
            .to_f32_vec(ctx)
            .expect("read back");
        for (b, held) in held.iter().enumerate() {
            let len = cache.len(ids[b]).expect("live");
            let plane = HQ * lq * DV;
            let got = &out[b * plane..][..plane];
            let shape = AttentionShape::new(1, HQ, HKV, lq, len, D, DV);
            let want = attention(
                &q[b * HQ * lq * D..][..HQ * lq * D],
                &held.k.concat(),
                &held.v.concat(),
                &shape,
                &options,
            )
            .expect("reference");
            let bound = Tolerance::F32.bound(&shape, &want, 0.0);
            let stats = ErrorStats::of(got, &want.out);
            assert!(
                stats.passes(bound),
                "seed {seed} {kernel:?} element {b}: {stats:?} (bound {bound:e})"
            );
        }
    }
}

#[test]
fn sequences_share_one_pool_and_reuse_freed_pages() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(72);
    let mut cache = PagedKvCache::new(
        ctx,
        PagedKvConfig {
            pages: 12,
            page_size: PAGE,
            heads_kv: HKV,
            head_dim: D,
            head_dim_v: DV,
            layout: Layout::Bshd,
            dtype: DType::F32,
        },
    )
    .expect("pool");
    let ids: Vec<SequenceId> = (0..3).map(|_| cache.add_sequence()).collect();
    let mut held = vec![Held::default(); 3];
    // Ragged prompts (7, 12 and 3 rows: 2 + 3 + 1 pages), then a token each twice.
    append(ctx, &mut cache, &mut held, &mut rng, &ids, 12, &[7, 12, 3]).expect("fits");
    for _ in 0..2 {
        append(ctx, &mut cache, &mut held, &mut rng, &ids, 1, &[1, 1, 1]).expect("fits");
    }
    let lens: Vec<usize> = ids.iter().map(|&id| cache.len(id).expect("live")).collect();
    assert_eq!(lens, [9, 14, 5]);
    assert_eq!(cache.free_pages(), 12 - (2 + 3 + 1));
    assert_attends(ctx, &cache, &ids, &held.iter().collect::<Vec<_>>(), 720);

    // An append the free pages cannot hold changes nothing.
    let free = cache.free_pages();
    let err = append(ctx, &mut cache, &mut held[..2], &mut rng, &ids[..2], 20, &[20, 20]).expect_err("needs 8 pages");
    assert!(
        matches!(
            &err,
            Error::CapacityExceeded {
                requested: 8,
                max: 6,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(cache.free_pages(), free);
    assert_eq!(cache.len(ids[0]).expect("live"), 9);
    assert!(
        cache
            .append_rows(
                ctx,
                &[ids[0], ids[0]],
                &Tensor::from_f32(ctx, [2, HKV, 1, D], Layout::Bhsd, &[0.5; 2 * HKV * D]).expect("upload"),
                &Tensor::from_f32(ctx, [2, HKV, 1, DV], Layout::Bhsd, &[0.5; 2 * HKV * DV]).expect("upload"),
                &[1, 1]
            )
            .is_err(),
        "a sequence listed twice"
    );

    // Removing the longest sequence frees its pages for a new one, whose rows land in
    // pages another sequence wrote before; the others are untouched.
    let freed: Vec<u32> = cache.pages(ids[1]).expect("live").to_vec();
    cache.remove_sequence(ids[1]).expect("removes");
    assert!(cache.len(ids[1]).is_err(), "a removed sequence is gone");
    assert_eq!(cache.free_pages(), free + freed.len());
    let new = cache.add_sequence();
    let mut new_held = vec![Held::default()];
    append(ctx, &mut cache, &mut new_held, &mut rng, &[new], 11, &[11]).expect("fits");
    assert!(
        cache.pages(new).expect("live").iter().all(|p| freed.contains(p)),
        "freed pages are reused first"
    );
    // The new sequence took the removed one's slot; the removed id still names nothing.
    assert!(cache.len(ids[1]).is_err(), "a stale id names the sequence in its slot");
    assert!(
        cache.remove_sequence(ids[1]).is_err(),
        "a stale id removed another sequence"
    );
    // A reused page was cleared: the rows past the new sequence's 11 (its last page
    // holds rows 10..15) are zero, not the removed sequence's.
    let last_page = *cache.pages(new).expect("live").last().expect("3 pages") as usize;
    for (pool, dim) in [(cache.keys(), D), (cache.values(), DV)] {
        let data = pool.to_f32_vec(ctx).expect("read back"); // BSHD: [P, PAGE, HKV, dim]
        let page = &data[last_page * PAGE * HKV * dim..][..PAGE * HKV * dim];
        assert!(
            page[HKV * dim..].iter().all(|&x| x == 0.0),
            "rows past the length hold a removed sequence's values"
        );
        assert!(page[..HKV * dim].iter().any(|&x| x != 0.0), "row 10 was written");
    }
    let live = [ids[0], new, ids[2]];
    assert_attends(ctx, &cache, &live, &[&held[0], &new_held[0], &held[2]], 721);
}
