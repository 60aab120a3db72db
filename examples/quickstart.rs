//! Scaled dot-product attention with a causal mask, padding and the attention weights.
//!
//! `cargo run --release --example quickstart` (any adapter: a GPU, or lavapipe).

use wgpu_attention::{sdpa, AttentionOptions, CausalAlignment, Context, Layout, Tensor};

fn main() -> wgpu_attention::Result<()> {
    // First, before any thread: keeps Mesa's Vulkan layer quiet on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    let ctx = Context::new()?; // the adapter from WGPU_BACKEND / WGPU_ADAPTER_NAME, else wgpu's default
    println!("adapter: {}", ctx.adapter_info().name);

    // Two sequences, 4 query heads sharing 2 key/value heads (GQA), 6 positions, D = 8.
    let (b, hq, hkv, len, d) = (2, 4, 2, 6, 8);
    let data = |n: usize, seed: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect() };
    let q = Tensor::from_f32(&ctx, [b, hq, len, d], Layout::Bhsd, &data(b * hq * len * d, 0.0))?;
    let k = Tensor::from_f32(&ctx, [b, hkv, len, d], Layout::Bhsd, &data(b * hkv * len * d, 1.0))?;
    let v = Tensor::from_f32(&ctx, [b, hkv, len, d], Layout::Bhsd, &data(b * hkv * len * d, 2.0))?;

    let options = AttentionOptions {
        causal: Some(CausalAlignment::TopLeft), // query i sees keys j <= i (PyTorch's is_causal)
        key_lengths: Some(vec![6, 4]),          // the second sequence is padded after 4 keys
        need_weights: true,                     // also return the [B, Hq, Lq, Lk] weights
        ..Default::default()
    };
    let result = sdpa(&ctx, &q, &k, &v, &options)?;
    let out = result.out.to_f32_vec(&ctx)?; // [B, Hq, Lq, D], in q's layout
    println!("output {:?}: first row {:?}", result.out.shape(), &out[..d]);

    if let Some(weights) = &result.weights {
        let w = weights.to_f32_vec(&ctx)?;
        // Sequence 1, head 0, the last query: keys 4 and 5 are padding, so weight 0.
        let row = &w[(hq * len + (len - 1)) * len..][..len];
        println!("weights of sequence 1, head 0, last query: {row:.3?}");
        assert!(row[4] == 0.0 && row[5] == 0.0);
    }
    Ok(())
}
