//! Many sequences of different lengths in one pool of fixed-size pages (vLLM-style):
//! pages are handed to sequences as they grow and come back when a sequence ends.
//!
//! `cargo run --release --example paged`

use wgpu_attention::{AttentionOptions, Context, DType, Layout, PagedKvCache, PagedKvConfig, Tensor};

fn main() -> wgpu_attention::Result<()> {
    // First, before any thread: keeps Mesa's Vulkan layer quiet on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    let ctx = Context::new()?;
    let (hkv, hq, d) = (2, 4, 32);
    let mut pool = PagedKvCache::new(
        &ctx,
        PagedKvConfig {
            pages: 64,
            page_size: 16,
            heads_kv: hkv,
            head_dim: d,
            head_dim_v: d,
            layout: Layout::Bshd, // vLLM's [pages, page_size, Hkv, D]
            dtype: DType::F32,
        },
    )?;
    let data = |n: usize, seed: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.07 + seed).cos()).collect() };
    let rows = |seqs: usize, n: usize, seed: f32| {
        Tensor::from_f32(&ctx, [seqs, hkv, n, d], Layout::Bhsd, &data(seqs * hkv * n * d, seed))
    };

    // Two prompts of 37 and 5 rows: one ragged append, the first `counts[i]` rows each.
    let (a, b) = (pool.add_sequence(), pool.add_sequence());
    pool.append_rows(&ctx, &[a, b], &rows(2, 37, 0.0)?, &rows(2, 37, 1.0)?, &[37, 5])?;
    println!(
        "lengths {} and {}, {} pages free",
        pool.len(a)?,
        pool.len(b)?,
        pool.free_pages()
    );

    // One decode step for both: one new row each, then attention of one query row.
    pool.append(&ctx, &[a, b], &rows(2, 1, 2.0)?, &rows(2, 1, 3.0)?)?;
    let q = Tensor::from_f32(&ctx, [2, hq, 1, d], Layout::Bhsd, &data(2 * hq * d, 4.0))?;
    let out = pool.attend(&ctx, &[a, b], &q, &AttentionOptions::default())?;
    println!("attention of one token each: {:?}", out.out.shape());

    // Sequence b ends: its pages are free for the next one.
    pool.remove_sequence(b)?;
    let c = pool.add_sequence();
    pool.append(&ctx, &[c], &rows(1, 20, 5.0)?, &rows(1, 20, 6.0)?)?;
    println!(
        "b removed, c holds {} rows, {} pages free",
        pool.len(c)?,
        pool.free_pages()
    );
    Ok(())
}
