//! Generating tokens against a KV cache: a prompt appended once, then one new key/value
//! row and one query row per step. The cache is f16 where the adapter has f16 (half the
//! memory and bandwidth), fed from f32 data with `Tensor::from_f32_as`.
//!
//! `cargo run --release --example decode_loop`

use std::time::Instant;
use wgpu_attention::{AttentionOptions, Context, DType, KvCache, KvCacheConfig, Layout, Tensor};

fn main() -> wgpu_attention::Result<()> {
    // First, before any thread: keeps Mesa's Vulkan layer quiet on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    let ctx = Context::new()?;
    let dtype = if ctx.capabilities().f16 { DType::F16 } else { DType::F32 };
    // One layer of a model with 8 query heads sharing 2 key/value heads (GQA), D = 64.
    let (batch, hq, hkv, d, prompt) = (2, 8, 2, 64, 48);
    let mut cache = KvCache::new(
        &ctx,
        KvCacheConfig {
            batch,
            heads_kv: hkv,
            capacity: 256,
            head_dim: d,
            head_dim_v: d,
            layout: Layout::Bhsd,
            dtype,
        },
    )?;
    // What a model's projections would give, as f32 on the host.
    let rows = |n: usize, heads: usize, seed: f32| -> Vec<f32> {
        (0..batch * heads * n * d)
            .map(|i| (i as f32 * 0.013 + seed).sin())
            .collect()
    };
    let upload = |heads: usize, n: usize, data: &[f32]| {
        Tensor::from_f32_as(&ctx, [batch, heads, n, d], Layout::Bhsd, dtype, data)
    };

    // The prompt: every batch element gets all its rows.
    cache.append(
        &ctx,
        &upload(hkv, prompt, &rows(prompt, hkv, 0.0))?,
        &upload(hkv, prompt, &rows(prompt, hkv, 1.0))?,
    )?;
    println!(
        "{} cache, prompt of {prompt} rows: lengths {:?}",
        dtype.name(),
        cache.lengths()
    );

    let options = AttentionOptions::default(); // positions align to each sequence's length
    let started = Instant::now();
    let steps = 16;
    for step in 0..steps {
        let seed = 2.0 + step as f32;
        cache.append(
            &ctx,
            &upload(hkv, 1, &rows(1, hkv, seed))?,
            &upload(hkv, 1, &rows(1, hkv, -seed))?,
        )?;
        // One query row per sequence; output and readback in one submission.
        let (_, out) = cache.attend_read(&ctx, &upload(hq, 1, &rows(1, hq, seed * 0.5))?, &options)?;
        if step == steps - 1 {
            println!(
                "step {step}: output [B, Hq, 1, D] = {} values, first {:.4}",
                out.len(),
                out[0]
            );
        }
    }
    let ms = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
    println!(
        "{steps} steps, {ms:.2} ms a step on {}; lengths {:?}",
        ctx.adapter_info().name,
        cache.lengths()
    );
    Ok(())
}
