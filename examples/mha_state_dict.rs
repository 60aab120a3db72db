//! A multi-head attention layer from a PyTorch `state_dict` saved as safetensors, run on
//! the GPU and compared with PyTorch's own output.
//!
//! In Python (what made `tests/fixtures/torch_mha/postnorm.safetensors`, see its README):
//!
//! ```python
//! from safetensors.torch import save_file
//! save_file(layer.state_dict(), "layer.safetensors")  # an nn.TransformerEncoderLayer,
//!                                                     # nn.MultiheadAttention or HF layer
//! ```
//!
//! `cargo run --release --example mha_state_dict [FILE PREFIX HEADS]`; without
//! arguments, the repository's PyTorch fixture.

use wgpu_attention::{
    load_safetensors, Context, DType, HeadWeights, Inputs, MhaOptions, MultiHeadAttention, PostNorm, Tensor,
};

fn main() -> wgpu_attention::Result<()> {
    // First, before any thread: keeps Mesa's Vulkan layer quiet on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch_mha");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, prefix, heads) = match args.as_slice() {
        [path, prefix, heads] => (path.clone(), prefix.clone(), heads.parse().unwrap_or(1)),
        _ => (
            format!("{fixtures}/postnorm.safetensors"),
            "encoder.layers.0.".into(),
            3,
        ),
    };

    let bytes = std::fs::read(&path)?; // std::io::Error converts into the crate's Error
    let mut loaded = load_safetensors(&bytes, heads, None, &prefix)?;
    if let Some(norm) = &loaded.norm_tensor {
        // PyTorch's layer applies it after attention: LayerNorm(attention + x).
        println!("post-attention norm: {norm}");
        loaded.config.post_norm = Some(PostNorm::default());
    }
    let config = loaded.config.clone();
    println!(
        "{path}: {:?} naming, E = {}, {} heads",
        loaded.naming, config.embed_dim, config.num_heads
    );

    let ctx = Context::new()?;
    let layer = MultiHeadAttention::new(&ctx, config.clone(), &loaded.weights, DType::F32)?;
    // The fixture's input and PyTorch's output (else a made-up input of 2 x 6 tokens).
    let (x, expected) = if args.is_empty() {
        (
            read_npy(&format!("{fixtures}/postnorm_query.npy")),
            Some(read_npy(&format!("{fixtures}/postnorm_out.npy"))),
        )
    } else {
        let n = 2 * 6 * config.embed_dim;
        ((0..n).map(|i| (i as f32 * 0.1).sin()).collect(), None)
    };
    let seq = x.len() / (2 * config.embed_dim);
    let x = Tensor::sequence(&ctx, [2, seq, config.embed_dim], DType::F32, &x)?;
    let options = MhaOptions {
        weights: HeadWeights::PerHead,
        attention: wgpu_attention::AttentionOptions {
            // The fixture's layer was run with a causal mask.
            causal: args.is_empty().then_some(wgpu_attention::CausalAlignment::TopLeft),
            ..Default::default()
        },
    };
    let result = layer.forward(&ctx, Inputs::SelfAttention(&x), &options)?;
    let out = result.out.to_f32_vec(&ctx)?; // [B, S, E]
    println!("output [B, S, E] = [2, {seq}, {}]", config.embed_dim);
    if let Some(expected) = expected {
        let diff = out
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!("largest difference from PyTorch: {diff:.2e}");
        assert!(diff < 2e-5, "differs from PyTorch by {diff}");
    }
    Ok(())
}

/// A float32 `.npy` file's data (npyz is a dev-dependency of this crate).
fn read_npy(path: &str) -> Vec<f32> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file)).unwrap_or_else(|e| panic!("{path}: {e}"));
    npy.into_vec().unwrap_or_else(|e| panic!("{path}: {e}"))
}
