//! Sizes of a multi-head attention layer.

use crate::error::{Error, Result};
use crate::problem::MAX_HEAD_DIM;

/// The shape of a [`MultiHeadAttention`](super::MultiHeadAttention) layer, as
/// PyTorch's `nn.MultiheadAttention` (plus grouped-query attention and a post-norm).
#[derive(Clone, Debug, PartialEq)]
pub struct MhaConfig {
    /// Model width `E`: query input, attention output and layer output width.
    pub embed_dim: usize,
    /// Query heads `H`; the head dim is `E / H`.
    pub num_heads: usize,
    /// Key/value heads `G` (GQA/MQA); query head `h` uses kv head `h / (H / G)`.
    pub num_kv_heads: usize,
    /// Width of the key input (cross-attention); `E` for self-attention.
    pub kdim: usize,
    /// Width of the value input; `E` for self-attention.
    pub vdim: usize,
    /// Whether randomly initialised projections get biases (loaded weights say
    /// themselves which biases they have).
    pub bias: bool,
    /// `LayerNorm(attention output + query)` after the output projection.
    pub post_norm: Option<PostNorm>,
    /// Rotary position embeddings applied to the projected queries and keys of every
    /// head before attention, query row `i` and key row `j` at positions `i` and `j`
    /// (Hugging Face LLaMA-style layers, whose `position_ids` count from 0 in each
    /// sequence; [`crate::rotary`]).
    pub rotary: Option<crate::rotary::Rotary>,
}

/// The LayerNorm of a post-norm block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PostNorm {
    /// Added to the variance before its square root, as `nn.LayerNorm`'s `eps`.
    pub eps: f32,
}

impl Default for PostNorm {
    /// PyTorch's default epsilon.
    fn default() -> Self {
        PostNorm { eps: 1e-5 }
    }
}

impl MhaConfig {
    /// Self-attention with `num_heads` heads of `embed_dim / num_heads`, biases, no norm.
    pub fn new(embed_dim: usize, num_heads: usize) -> Self {
        MhaConfig {
            embed_dim,
            num_heads,
            num_kv_heads: num_heads,
            kdim: embed_dim,
            vdim: embed_dim,
            bias: true,
            post_norm: None,
            rotary: None,
        }
    }

    /// Head dimension `E / H` (of queries, keys and values alike).
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads.max(1)
    }

    /// Width of the projected keys and values, `G · E / H`.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim()
    }

    /// Whether the query, key and value projections all read `E`-wide inputs, so that
    /// one packed `[E + 2·kv_width, E]` weight (and, for self-attention, one GEMM)
    /// serves all three.
    pub fn packs_projections(&self) -> bool {
        self.kdim == self.embed_dim && self.vdim == self.embed_dim
    }

    /// Checks the sizes fit together and the kernels' limits.
    pub fn validate(&self) -> Result<()> {
        let sizes = format!(
            "embed_dim {}, num_heads {}, num_kv_heads {}, kdim {}, vdim {}",
            self.embed_dim, self.num_heads, self.num_kv_heads, self.kdim, self.vdim
        );
        let bad = |rule: &str| Error::invalid("multi-head attention config", format!("{sizes}: {rule}"));
        if [self.embed_dim, self.num_heads, self.num_kv_heads, self.kdim, self.vdim].contains(&0) {
            return Err(bad("every size must be at least 1"));
        }
        if !self.embed_dim.is_multiple_of(self.num_heads) {
            return Err(bad("embed_dim must be a multiple of num_heads"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad("num_heads must be a multiple of num_kv_heads"));
        }
        if self.head_dim() > MAX_HEAD_DIM {
            return Err(bad(&format!(
                "the head dim embed_dim / num_heads must be at most {MAX_HEAD_DIM}"
            )));
        }
        if let Some(rotary) = &self.rotary {
            rotary.check(self.head_dim())?;
        }
        if let Some(norm) = self.post_norm {
            if !(norm.eps.is_finite() && norm.eps > 0.0) {
                return Err(bad(&format!(
                    "the LayerNorm eps must be positive and finite, got {}",
                    norm.eps
                )));
            }
        }
        Ok(())
    }
}
