//! What a caller can ask of one attention call: scale, masks, kernel path, extra outputs.

use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Which keys a query may see under a causal mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CausalAlignment {
    /// Query `i` sees keys `j <= i` (PyTorch `is_causal=True`).
    TopLeft,
    /// Query `i` sees keys `j <= i + Lk - Lq` (flash-attn; the last query sees every key,
    /// as when decoding against a KV cache).
    BottomRight,
}

impl CausalAlignment {
    /// Offset `o` such that query `i` sees keys `j <= i + o`.
    pub fn offset(self, len_q: usize, len_k: usize) -> i64 {
        match self {
            CausalAlignment::TopLeft => 0,
            CausalAlignment::BottomRight => len_k as i64 - len_q as i64,
        }
    }
}

/// A sliding window around each query's aligned position p(i) (flash-attn's
/// `window_size`): query `i` sees keys `p(i) − left ≤ j ≤ p(i) + right`; `None` leaves
/// that side unbounded. p(i) is `i + Lk − Lq`, or `i` under a top-left causal mask
/// ([`AttentionOptions::query_position_offset`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// Keys visible before `p(i)`, in positions; `None` = unbounded.
    pub left: Option<usize>,
    /// Keys visible after `p(i)`, in positions; `None` = unbounded (`Some(0)` with
    /// `left` gives a causal sliding window).
    pub right: Option<usize>,
}

impl Window {
    /// Parses `LEFT,RIGHT` as flash-attn spells it: a negative side is unbounded.
    pub fn parse(what: &str, text: &str) -> Result<Self> {
        let side = |x: &str| -> Result<Option<usize>> {
            let n: i64 = x.trim().parse().map_err(|_| {
                Error::invalid(
                    what,
                    format!("'{}' is not an integer (LEFT,RIGHT; -1 = unbounded)", x.trim()),
                )
            })?;
            Ok(usize::try_from(n).ok())
        };
        match text.split(',').collect::<Vec<_>>()[..] {
            [left, right] => Ok(Window {
                left: side(left)?,
                right: side(right)?,
            }),
            _ => Err(Error::invalid(
                what,
                format!("'{text}' is not LEFT,RIGHT (e.g. 1024,0)"),
            )),
        }
    }
}

/// `LEFT,RIGHT` as [`Window::parse`] reads it (-1 for an unbounded side).
impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |x: Option<usize>| x.map_or("-1".to_string(), |n| n.to_string());
        write!(f, "{},{}", side(self.left), side(self.right))
    }
}

/// Values of an explicit mask tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum MaskValues {
    /// `true` = may attend (PyTorch SDPA convention).
    Bool(Vec<bool>),
    /// Added to the scaled scores; `-inf` masks the position.
    Additive(Vec<f32>),
}

/// An explicit mask broadcastable to `[B, Hq, Lq, Lk]`, stored in C order.
#[derive(Clone, Debug, PartialEq)]
pub struct Mask {
    shape: [usize; 4],
    values: MaskValues,
}

impl Mask {
    /// A boolean mask (`true` = may attend) with NumPy-style shape of rank 1 to 4.
    pub fn boolean(shape: &[usize], values: Vec<bool>) -> Result<Self> {
        Self::new(shape, values.len(), MaskValues::Bool(values))
    }

    /// An additive float mask with NumPy-style shape of rank 1 to 4.
    pub fn additive(shape: &[usize], values: Vec<f32>) -> Result<Self> {
        if values.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
            return Err(Error::invalid(
                "additive mask",
                "contains NaN or +inf; use -inf to mask a position",
            ));
        }
        Self::new(shape, values.len(), MaskValues::Additive(values))
    }

    fn new(shape: &[usize], len: usize, values: MaskValues) -> Result<Self> {
        if shape.is_empty() || shape.len() > 4 {
            return Err(Error::shape("mask rank", "1 to 4 dimensions", shape.len()));
        }
        let mut full = [1usize; 4];
        full[4 - shape.len()..].copy_from_slice(shape);
        let count = crate::error::checked_product("mask shape", &full)?;
        if count != len {
            return Err(Error::shape(format!("mask values for shape {shape:?}"), count, len));
        }
        Ok(Mask { shape: full, values })
    }

    /// Shape padded on the left to rank 4.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The values, in C order over [`Mask::shape`].
    pub fn values(&self) -> &MaskValues {
        &self.values
    }

    /// The mask of keys `start .. start + len` of a key axis of `total_keys`: its
    /// columns there, or the mask itself where it broadcasts over keys (last dim 1).
    /// For attention over a block of the keys (`sdpa_sharded`, ring attention).
    pub fn key_columns(&self, start: usize, len: usize, total_keys: usize) -> Result<Mask> {
        let [a, b, c, keys] = self.shape;
        if keys == 1 {
            return Ok(self.clone());
        }
        if keys != total_keys || start + len > keys {
            return Err(Error::shape(
                format!("mask key columns {start} .. {} (of {total_keys} keys)", start + len),
                format!("a last dim of {total_keys} or 1"),
                keys,
            ));
        }
        let rows = a * b * c;
        let cut = |row: usize| row * keys + start..row * keys + start + len;
        let values = match &self.values {
            MaskValues::Bool(v) => MaskValues::Bool((0..rows).flat_map(|r| v[cut(r)].iter().copied()).collect()),
            MaskValues::Additive(v) => {
                MaskValues::Additive((0..rows).flat_map(|r| v[cut(r)].iter().copied()).collect())
            }
        };
        Ok(Mask {
            shape: [a, b, c, len],
            values,
        })
    }

    /// Checks the mask broadcasts to `[b, hq, lq, lk]`.
    pub fn check_broadcast(&self, target: [usize; 4]) -> Result<()> {
        for (axis, (&m, &t)) in self.shape.iter().zip(target.iter()).enumerate() {
            if m != 1 && m != t {
                return Err(Error::shape(
                    format!("mask (axis {axis} of [B, Hq, Lq, Lk])"),
                    format!("1 or {t} to broadcast to {target:?}"),
                    format!("{m} (mask shape {:?})", self.shape),
                ));
            }
        }
        Ok(())
    }

    /// Element strides for indexing `[b, h, i, j]`, with 0 on broadcast axes.
    pub fn broadcast_strides(&self) -> [usize; 4] {
        let s = self.shape;
        let dense = [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1];
        let mut out = [0; 4];
        for axis in 0..4 {
            out[axis] = if s[axis] == 1 { 0 } else { dense[axis] };
        }
        out
    }

    /// `None` if the position is masked, else the additive bias (0 for bool masks).
    pub fn bias_at(&self, b: usize, h: usize, i: usize, j: usize) -> Option<f32> {
        let st = self.broadcast_strides();
        let idx = b * st[0] + h * st[1] + i * st[2] + j * st[3];
        match &self.values {
            MaskValues::Bool(v) => v[idx].then_some(0.0),
            MaskValues::Additive(v) => (v[idx] != f32::NEG_INFINITY).then_some(v[idx]),
        }
    }
}

/// Which GPU path computes the attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    /// The best path for the request: split-K decode for at most 16 query rows per kv
    /// head against 1024 keys or more, else the fused kernel.
    #[default]
    Auto,
    /// One pass, online softmax, never stores the score matrix.
    Fused,
    /// Three kernels (scores, softmax, weights x V) through a score buffer.
    Materialized,
    /// Split-K decode (FlashDecoding): the key range of each (batch, kv head) split
    /// across workgroups, then a combine pass; for few query rows and many keys.
    Decode,
}

/// Tile configuration of the fused kernel. Each is described once in
/// [`crate::kernels::flash::FUSED_TILINGS`] (name, needs, when it is picked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FusedTiling {
    /// Chosen from the adapter (see [`crate::Context::default_fused_tiling`]), or from the
    /// `WGPU_ATTENTION_TILING` environment variable (a tiling's name, read when the
    /// context is made).
    #[default]
    Auto,
    /// Each invocation streams K/V straight from storage; no barriers. For CPU adapters.
    Registers,
    /// K/V tiles are staged in 16 KiB of workgroup memory between barriers, one
    /// query row per invocation. For GPUs with little workgroup memory.
    Shared,
    /// FlashAttention-2 blocks: Q, K/V and probability tiles in workgroup memory,
    /// register micro-tiles of scores and outputs. The pick of CPU adapters without
    /// subgroups (llvmpipe GL); needs 32 KiB of workgroup memory.
    Blocked,
    /// For CPU adapters with subgroups of at least 8 lanes (lavapipe); needs
    /// `SUBGROUP`. Where K/V rows are whole 16-byte words, K and V are read as texel
    /// fetches by a kernel that spreads keys across the lanes; elsewhere each K/V
    /// element is loaded by one lane and broadcast to the subgroup.
    Subgroup,
    /// Tensor cores: the blocked shape with Q·Kᵀ and P·V as 16x16 f16
    /// cooperative-matrix products accumulated in f32. Needs
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`; f16 inputs, or f32 at [`Precision::Medium`].
    Coop,
    /// Full-precision f32 on the register-blocked GEMM pattern: FlashAttention-2 blocks
    /// of 64 rows and 64 keys, 4x4 score and 4x(D/16) output micro-tiles per invocation
    /// from double-buffered slabs of Qᵀ, Kᵀ and V in 32 KiB of workgroup memory. For
    /// GPUs without tensor cores (or f32 at [`Precision::Highest`]).
    Micro,
}

/// How precisely f32 inputs are multiplied, as PyTorch's
/// `torch.set_float32_matmul_precision` (docs/design.md, "Precision"). f16 inputs use
/// tensor cores wherever the adapter has them, whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 products and sums: f32 inputs never take the tensor-core paths.
    #[default]
    Highest,
    /// Reserved for a faster path that keeps more than f16's precision; today the same
    /// as `Medium`.
    High,
    /// f32 inputs may be rounded to f16 for the products (tensor cores; and the GPU
    /// backward's `blocked` tiling, whose tiles then hold f16), with f32 accumulation
    /// and an f32 softmax. Values beyond f16's range (|x| > 65504) then
    /// become infinities: the library does not scan inputs that already live on the GPU,
    /// so keep q, k and v inside it (the CLI refuses files that are not).
    Medium,
}

impl Precision {
    /// The name as PyTorch spells it: `"highest"`, `"high"` or `"medium"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Highest => "highest",
            Precision::High => "high",
            Precision::Medium => "medium",
        }
    }

    /// Parses `highest`, `high` or `medium` (as PyTorch spells them).
    pub fn parse(what: &str, name: &str) -> Result<Self> {
        match name.trim().to_lowercase().as_str() {
            "highest" => Ok(Precision::Highest),
            "high" => Ok(Precision::High),
            "medium" => Ok(Precision::Medium),
            other => Err(Error::invalid(
                what,
                format!("'{other}' is not one of highest, high, medium"),
            )),
        }
    }

    /// Whether inputs of `dtype` may be multiplied in f16 at this precision.
    pub fn allows_f16_products(self, dtype: crate::tensor::DType) -> bool {
        dtype == crate::tensor::DType::F16 || self != Precision::Highest
    }
}

/// Options for one scaled dot-product attention call.
#[derive(Clone, Debug, Default)]
pub struct AttentionOptions {
    /// Multiplies `Q Kᵀ`; defaults to `1/sqrt(D)`.
    pub scale: Option<f32>,
    /// Causal mask and its alignment.
    pub causal: Option<CausalAlignment>,
    /// Valid key count per batch element (keys `j >= len[b]` are masked).
    pub key_lengths: Option<Vec<u32>>,
    /// Explicit mask, broadcastable to `[B, Hq, Lq, Lk]`.
    pub mask: Option<Mask>,
    /// Sliding window around each query's aligned position; keys outside it are masked
    /// and their tiles skipped.
    pub window: Option<Window>,
    /// ALiBi: one slope per query head (`[Hq]`); `−slope · |p(i) − j|` is added to
    /// the scaled score.
    pub alibi_slopes: Option<Vec<f32>>,
    /// Soft-capping (Gemma 2): the scaled score `s` becomes `cap · tanh(s / cap)`
    /// before ALiBi, the additive mask and the masks.
    pub softcap: Option<f32>,
    /// Measure bottom-right positions from each batch element's key length instead of
    /// `Lk`: query `i` of batch element `b` sits at `len[b] − Lq + i`, for the causal
    /// mask, the window and ALiBi alike (a KV cache whose sequences have different
    /// lengths; flash-attn's `cache_seqlens`). Needs `key_lengths`; no effect under a
    /// top-left causal mask.
    pub align_to_key_lengths: bool,
    /// Query `i`'s aligned position `p(i) = i + offset` on this call's keys, for the
    /// causal mask, the window and ALiBi, in place of the causal alignment's offset:
    /// attention over a partition of the keys that starts at global key `o`, whose
    /// queries sit at `i + g` on the global axis (`g`: `Lk − Lq` bottom-right, 0
    /// top-left), takes `g − o` (then [`crate::merge_attentions`] combines the
    /// partitions). The causal mask, if any, still applies (keys past `p(i)`); its
    /// alignment is then unused. Not with `align_to_key_lengths`.
    pub position_offset: Option<i64>,
    /// Which kernel path to use.
    pub kernel: KernelChoice,
    /// Tiling of the fused kernel.
    pub tiling: FusedTiling,
    /// Whether f32 inputs may be multiplied in f16 on tensor cores.
    pub precision: Precision,
    /// Also return the attention weights `[B, Hq, Lq, Lk]` (f32, BHSD).
    pub need_weights: bool,
    /// With `need_weights`: return them averaged over the query heads, `[B, 1, Lq, Lk]`
    /// (PyTorch's `average_attn_weights=True`), summed chunk by chunk so the per-head
    /// weights are never held whole.
    pub average_weights: bool,
    /// Also return the log-sum-exp per row `[B, Hq, Lq]` (f32).
    pub need_lse: bool,
    /// Layout of the output; defaults to the layout of `q`.
    pub output_layout: Option<Layout>,
}

impl AttentionOptions {
    /// `o` such that query `i`'s aligned position is `p(i) = i + o`, the position the
    /// window and ALiBi measure from (docs/design.md, "Masks"): `position_offset` if
    /// set, else the causal mask's alignment if there is one, else bottom-right
    /// (`Lk − Lq`), as flash-attn.
    pub fn query_position_offset(&self, len_q: usize, len_k: usize) -> i64 {
        self.position_offset
            .unwrap_or_else(|| self.causal.unwrap_or(CausalAlignment::BottomRight).offset(len_q, len_k))
    }

    /// Whether positions come from the key lengths ([`Self::align_to_key_lengths`] and
    /// a bottom-right alignment).
    pub fn aligns_to_key_lengths(&self) -> bool {
        self.align_to_key_lengths && self.causal != Some(CausalAlignment::TopLeft)
    }

    /// Query `i`'s aligned position `p(i)` in batch element `b` (docs/design.md,
    /// "Masks"): the causal boundary and the origin of the window and ALiBi distances.
    pub fn query_position(&self, len_q: usize, len_k: usize, b: usize, i: usize) -> i64 {
        match (&self.key_lengths, self.aligns_to_key_lengths()) {
            (Some(lens), true) => i as i64 + i64::from(lens[b]) - len_q as i64,
            _ => i as i64 + self.query_position_offset(len_q, len_k),
        }
    }
}

/// Builds per-batch key lengths from token ids `[B, S]` (C order), for padding at the end.
///
/// Returns an error if a pad token is followed by a real token in some row; use
/// [`key_mask_from_tokens`] for such interior padding.
pub fn key_lengths_from_tokens(tokens: &[i64], batch: usize, pad_id: i64) -> Result<Vec<u32>> {
    let seq = token_row_len(tokens, batch)?;
    let mut lengths = Vec::with_capacity(batch);
    for (b, row) in tokens.chunks(seq.max(1)).take(batch).enumerate() {
        let len = row.iter().position(|&t| t == pad_id).unwrap_or(seq);
        if let Some(j) = row[len..].iter().position(|&t| t != pad_id) {
            return Err(Error::invalid(
                "token ids for key lengths",
                format!(
                    "row {b} has a real token at position {} after padding at {len}; use a key mask instead",
                    len + j
                ),
            ));
        }
        lengths.push(len as u32);
    }
    Ok(lengths)
}

/// Builds a boolean key mask `[B, 1, 1, S]` (`true` = real token) from token ids `[B, S]`.
pub fn key_mask_from_tokens(tokens: &[i64], batch: usize, pad_id: i64) -> Result<Mask> {
    let seq = token_row_len(tokens, batch)?;
    let values = tokens.iter().map(|&t| t != pad_id).collect();
    Mask::boolean(&[batch, 1, 1, seq], values)
}

fn token_row_len(tokens: &[i64], batch: usize) -> Result<usize> {
    if batch == 0 || !tokens.len().is_multiple_of(batch) {
        return Err(Error::shape(
            "token ids",
            format!("a multiple of batch size {batch}"),
            tokens.len(),
        ));
    }
    Ok(tokens.len() / batch)
}
