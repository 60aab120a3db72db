//! `demo`: a small attention problem on the chosen adapter, checked against the CPU
//! reference, with timings; then seed 003's padded sentences through a multi-head
//! attention layer with post-norm, showing that pad keys get zero weight and drawing
//! the per-head weights.

use super::{viz, AdapterArgs, CliError};
use std::path::{Path, PathBuf};
use std::time::Instant;
use wgpu_attention::check::{run_case, CheckCase, Rng};
use wgpu_attention::heatmap::Labels;
use wgpu_attention::mha::reference::multi_head_attention;
use wgpu_attention::mha::PostNorm;
use wgpu_attention::options::key_mask_from_tokens;
use wgpu_attention::{
    AttentionOptions, AttentionShape, CausalAlignment, Context, DType, HeadWeights, Inputs, KernelChoice, Layout,
    MhaConfig, MhaOptions, MhaWeights, MultiHeadAttention, Tensor,
};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Where the seed 003 attention heatmaps go.
    #[arg(long, default_value = "wgpu-attention-demo")]
    heatmaps: PathBuf,
}

pub fn run(adapter: &AdapterArgs, args: &DemoArgs) -> Result<(), CliError> {
    let start = Instant::now();
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}), context in {:.0?}",
        info.name,
        info.backend,
        info.device_type,
        start.elapsed()
    );

    let shape = AttentionShape {
        batch: 2,
        heads_q: 4,
        heads_kv: 2,
        len_q: 128,
        len_k: 128,
        head_dim: 64,
        head_dim_v: 64,
    };
    println!(
        "problem: q [{}, {}, {}, {}], k/v [{}, {}, {}, {}] (GQA), causal top-left, f32",
        shape.batch,
        shape.heads_q,
        shape.len_q,
        shape.head_dim,
        shape.batch,
        shape.heads_kv,
        shape.len_k,
        shape.head_dim
    );
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        let case = CheckCase {
            shape,
            options: AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                kernel,
                ..Default::default()
            },
            dtype: DType::F32,
            layout: Layout::Bhsd,
            seed: 2026,
            range: 1.0,
        };
        let first = Instant::now();
        let outcome = run_case(&ctx, &case)?;
        let first = first.elapsed();
        let warm = Instant::now();
        run_case(&ctx, &case)?;
        let warm = warm.elapsed();
        println!(
            "  {:<20} max |gpu - cpu| = {:.2e} (bound {:.1e}) {}   first call {:.0?} (compiles pipelines), warm call {:.0?} (incl. upload, readback, CPU reference)",
            outcome.kernel,
            outcome.out.max_abs,
            outcome.bound,
            if outcome.passed { "ok" } else { "MISMATCH" },
            first,
            warm
        );
        if !outcome.passed {
            return Err(CliError::Failed(outcome.summary()));
        }
    }
    seed_003(&ctx, &args.heatmaps)
}

/// Seed 003's example: two sentences of token ids (pad id 0) through a multi-head
/// attention layer with post-norm, on the GPU and on the CPU reference.
fn seed_003(ctx: &Context, heatmaps: &Path) -> Result<(), CliError> {
    let tokens: [i64; 10] = [5, 2, 1, 0, 0, 1, 3, 1, 4, 0];
    let (batch, seq, d_model, heads, vocab) = (2, 5, 512, 8, 10);
    println!(
        "\nseed 003: tokens [[5,2,1,0,0],[1,3,1,4,0]], pad id 0, vocab {vocab}, d_model {d_model}, {heads} heads of {}",
        d_model / heads
    );
    // Word embeddings (a seeded table with unit variance, as nn.Embedding's N(0, 1))
    // plus sinusoidal positional encodings.
    let mut rng = Rng::new(3);
    let table = rng.vec(vocab * d_model, -3f32.sqrt(), 3f32.sqrt());
    let x: Vec<f32> = tokens
        .iter()
        .enumerate()
        .flat_map(|(n, &token)| {
            let row = &table[token as usize * d_model..][..d_model];
            (0..d_model).map(move |i| row[i] + positional_encoding(n % seq, i, d_model))
        })
        .collect();
    let config = MhaConfig {
        post_norm: Some(PostNorm::default()),
        ..MhaConfig::new(d_model, heads)
    };
    let weights = MhaWeights::xavier_uniform(&config, 2026)?;
    let layer = MultiHeadAttention::new(ctx, config.clone(), &weights, DType::F32)?;
    let mask = key_mask_from_tokens(&tokens, batch, 0)?;
    let options = MhaOptions {
        attention: AttentionOptions {
            mask: Some(mask),
            ..Default::default()
        },
        weights: HeadWeights::PerHead,
    };
    let input = Tensor::sequence(ctx, [batch, seq, d_model], DType::F32, &x)?;
    let result = layer.forward(ctx, Inputs::SelfAttention(&input), &options)?;
    let out = result.out.to_f32_vec(ctx)?;
    let per_head = result
        .weights
        .as_ref()
        .ok_or_else(|| CliError::Failed("the layer returned no weights".into()))?;
    let w = per_head.to_f32_vec(ctx)?;
    let want = multi_head_attention(&config, &weights, [&x, &x, &x], [batch, seq, seq], &options.attention)?;
    let max_err = |got: &[f32], want: &[f64]| {
        got.iter()
            .zip(want)
            .map(|(&g, &w)| (f64::from(g) - w).abs())
            .fold(0.0, f64::max)
    };
    let (out_err, w_err) = (max_err(&out, &want.out), max_err(&w, &want.weights));
    println!(
        "  output [{batch}, {seq}, {d_model}]: max |gpu - cpu| = {out_err:.2e}; weights {:?}: max |gpu - cpu| = {w_err:.2e}",
        per_head.shape()
    );
    // Pad keys (sentence 0: keys 3 and 4; sentence 1: key 4) get weight exactly 0.
    let pad_weight = (0..batch * heads * seq * seq)
        .filter(|&i| tokens[(i / (heads * seq * seq)) * seq + i % seq] == 0)
        .map(|i| w[i].abs())
        .fold(0.0f32, f32::max);
    println!("  largest weight on a pad key, over every head and query: {pad_weight}");
    println!("  sentence 0, head 0:");
    for i in 0..seq {
        let row: Vec<String> = w[i * seq..(i + 1) * seq].iter().map(|w| format!("{w:.3}")).collect();
        println!("    query {i}: [{}]", row.join(", "));
    }
    if out_err > 1e-4 || w_err > 1e-5 || pad_weight != 0.0 {
        return Err(CliError::Failed(format!(
            "seed 003 layer: output error {out_err:.2e}, weights error {w_err:.2e}, pad weight {pad_weight}"
        )));
    }
    // Heatmaps per sentence, labelled with its tokens.
    let mut files = Vec::new();
    let plane = heads * seq * seq;
    for (b, sentence) in tokens.chunks(seq).enumerate() {
        let words: Vec<String> = sentence
            .iter()
            .map(|&t| if t == 0 { "<pad>".into() } else { format!("tok{t}") })
            .collect();
        let labels = Labels {
            queries: Some(words.clone()),
            keys: Some(words),
        };
        let data = &w[b * plane..(b + 1) * plane];
        let prefix = format!("seed003_sentence{b}");
        files.extend(viz::render_files(
            [1, heads, seq, seq],
            data,
            &labels,
            heatmaps,
            &prefix,
        )?);
    }
    viz::write_images(heatmaps, &files)
}

/// The sinusoidal positional encoding of "Attention Is All You Need".
fn positional_encoding(pos: usize, i: usize, d_model: usize) -> f32 {
    let angle = pos as f64 / 10000f64.powf((i - i % 2) as f64 / d_model as f64);
    (if i.is_multiple_of(2) { angle.sin() } else { angle.cos() }) as f32
}
