//! The padded-sentence example users expect from the seed documents (seed 003): two
//! sentences of token ids with pad id 0, embedded with sinusoidal positions, through one
//! multi-head self-attention layer with post-norm, with a pad mask built from the ids.
//! The CLI's `demo` and the web demo page (`web/demo.html`) both run this one copy, on
//! the GPU and against the CPU reference, and draw the per-head weights.

use crate::check::Rng;
use crate::context::Context;
use crate::error::Result;
use crate::mha::reference::multi_head_attention;
use crate::mha::PostNorm;
use crate::options::{key_mask_from_tokens, AttentionOptions};
use crate::{DType, HeadWeights, Inputs, MhaConfig, MhaOptions, MhaWeights, MultiHeadAttention, Tensor};

/// The label of a padding token.
pub const PAD: &str = "<pad>";

/// The example's inputs and layer.
pub struct PaddedSentences {
    /// `[batch, seq]` token ids, row-major; 0 is the pad id.
    pub tokens: Vec<i64>,
    pub batch: usize,
    pub seq: usize,
    pub d_model: usize,
    pub heads: usize,
    pub vocab: usize,
    /// Embedded inputs `[batch, seq, d_model]`.
    pub x: Vec<f32>,
    pub config: MhaConfig,
    pub weights: MhaWeights,
    pub options: MhaOptions,
}

/// What the layer gave on the GPU, measured against the CPU reference.
pub struct SentenceResult {
    /// `[batch, seq, d_model]`.
    pub out: Vec<f32>,
    /// Per-head attention weights `[batch, heads, seq, seq]`.
    pub weights: Vec<f32>,
    pub out_error: f64,
    pub weights_error: f64,
    /// The largest weight any query gives a pad key (must be exactly 0).
    pub pad_weight: f32,
}

/// Bounds the example is held to: f32 layers of width 512 (output) and five-key softmax
/// rows (weights).
pub const OUT_BOUND: f64 = 1e-4;
pub const WEIGHTS_BOUND: f64 = 1e-5;

impl PaddedSentences {
    /// Seed 003's sentences `[[5,2,1,0,0],[1,3,1,4,0]]`, vocab 10, d_model 512, 8 heads;
    /// seeded embeddings (unit variance, as `nn.Embedding`'s N(0, 1)) and Xavier weights.
    pub fn new() -> Result<Self> {
        let tokens = vec![5, 2, 1, 0, 0, 1, 3, 1, 4, 0];
        let (batch, seq, d_model, heads, vocab) = (2, 5, 512, 8, 10);
        let mut rng = Rng::new(3);
        let table = rng.vec(vocab * d_model, -3f32.sqrt(), 3f32.sqrt());
        let x = tokens
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
        let options = MhaOptions {
            attention: AttentionOptions {
                mask: Some(key_mask_from_tokens(&tokens, batch, 0)?),
                ..Default::default()
            },
            weights: HeadWeights::PerHead,
        };
        Ok(PaddedSentences {
            tokens,
            batch,
            seq,
            d_model,
            heads,
            vocab,
            x,
            config,
            weights,
            options,
        })
    }

    /// Sentence `b`'s tokens as axis labels (`tok5`, and [`PAD`] for padding).
    pub fn words(&self, b: usize) -> Vec<String> {
        self.tokens[b * self.seq..(b + 1) * self.seq]
            .iter()
            .map(|&t| if t == 0 { PAD.into() } else { format!("tok{t}") })
            .collect()
    }

    /// Runs the layer on `ctx` and the CPU reference.
    pub async fn run_async(&self, ctx: &Context) -> Result<SentenceResult> {
        let layer = MultiHeadAttention::new(ctx, self.config.clone(), &self.weights, DType::F32)?;
        let input = Tensor::from_f32_async(
            ctx,
            [self.batch, 1, self.seq, self.d_model],
            crate::Layout::Bhsd,
            &self.x,
        )
        .await?;
        let result = layer
            .forward_async(ctx, Inputs::SelfAttention(&input), &self.options)
            .await?;
        let out = result.out.to_f32_vec_async(ctx).await?;
        let weights = match &result.weights {
            Some(w) => w.to_f32_vec_async(ctx).await?,
            None => return Err(crate::Error::invalid("the example's layer", "returned no weights")),
        };
        let x = &self.x[..];
        let want = multi_head_attention(
            &self.config,
            &self.weights,
            [x, x, x],
            [self.batch, self.seq, self.seq],
            &self.options.attention,
        )?;
        let max_err = |got: &[f32], want: &[f64]| {
            if got.len() != want.len() {
                return f64::INFINITY;
            }
            got.iter()
                .zip(want)
                .map(|(&g, &w)| (f64::from(g) - w).abs())
                .fold(0.0, f64::max)
        };
        let plane = self.seq * self.seq;
        let pad_weight = weights
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.tokens[(i / (self.heads * plane)) * self.seq + i % self.seq] == 0)
            .map(|(_, w)| w.abs())
            .fold(0.0f32, f32::max);
        Ok(SentenceResult {
            out_error: max_err(&out, &want.out),
            weights_error: max_err(&weights, &want.weights),
            out,
            weights,
            pad_weight,
        })
    }

    /// [`Self::run_async`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(&self, ctx: &Context) -> Result<SentenceResult> {
        pollster::block_on(self.run_async(ctx))
    }
}

impl SentenceResult {
    /// Whether the GPU agreed with the reference within the bounds and gave pad keys
    /// exactly zero weight.
    pub fn passed(&self) -> bool {
        self.out_error <= OUT_BOUND && self.weights_error <= WEIGHTS_BOUND && self.pad_weight == 0.0
    }
}

/// The sinusoidal positional encoding of "Attention Is All You Need".
fn positional_encoding(pos: usize, i: usize, d_model: usize) -> f32 {
    let angle = pos as f64 / 10000f64.powf((i - i % 2) as f64 / d_model as f64);
    (if i.is_multiple_of(2) { angle.sin() } else { angle.cos() }) as f32
}
