//! The shape of one attention problem and the checks every path runs before any work.

use crate::error::{checked_product, Error, Result};
use crate::options::AttentionOptions;

/// Largest head dimension (`D` and `Dv`) the kernels accept.
pub const MAX_HEAD_DIM: usize = 256;

/// Largest `Lq + Lk` with a sliding window or ALiBi: positions and their distances
/// stay within an i32 in the kernels.
pub const MAX_POSITIONS: usize = 1 << 30;

/// Largest ALiBi bias `|slope| · distance` accepted: far inside f32's range (3.4e38),
/// so that the bias plus any finite scaled score stays finite.
pub const MAX_ALIBI_BIAS: f64 = 1e30;

/// Sizes of one attention problem, in BHSD terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    /// Batch size `B`, shared by q, k and v.
    pub batch: usize,
    /// Query heads `Hq`: q's and the output's H axis.
    pub heads_q: usize,
    /// Key/value heads `Hkv`: k's and v's H axis; `Hq` is a multiple of it (GQA/MQA when
    /// smaller).
    pub heads_kv: usize,
    /// Query length `Lq`: q's and the output's S axis.
    pub len_q: usize,
    /// Key length `Lk`: k's and v's S axis (the padded length where per-batch key
    /// lengths are given).
    pub len_k: usize,
    /// Head dimension `D` of q and k.
    pub head_dim: usize,
    /// Head dimension `Dv` of v and the output.
    pub head_dim_v: usize,
}

impl AttentionShape {
    /// A shape from its seven sizes, in the order of the struct's fields.
    pub const fn new(
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        len_q: usize,
        len_k: usize,
        head_dim: usize,
        head_dim_v: usize,
    ) -> Self {
        AttentionShape {
            batch,
            heads_q,
            heads_kv,
            len_q,
            len_k,
            head_dim,
            head_dim_v,
        }
    }

    /// Derives the problem from logical `[B, H, S, D]` shapes of q, k and v.
    pub fn from_qkv(q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> Result<Self> {
        let [b, hq, lq, d] = q;
        if k[0] != b || v[0] != b {
            return Err(Error::shape(
                "batch of k and v",
                format!("{b} (from q)"),
                format!("k {}, v {}", k[0], v[0]),
            ));
        }
        if v[1] != k[1] {
            return Err(Error::shape("heads of v", format!("{} (from k)", k[1]), v[1]));
        }
        if v[2] != k[2] {
            return Err(Error::shape("sequence length of v", format!("{} (from k)", k[2]), v[2]));
        }
        if k[3] != d {
            return Err(Error::shape("head dim of k", format!("{d} (from q)"), k[3]));
        }
        let shape = AttentionShape {
            batch: b,
            heads_q: hq,
            heads_kv: k[1],
            len_q: lq,
            len_k: k[2],
            head_dim: d,
            head_dim_v: v[3],
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Checks the sizes on their own: every axis at least 1 (and below 2^31), head
    /// dims 1 to [`MAX_HEAD_DIM`], element counts that fit in 64 bits, and query heads
    /// a multiple of key/value heads. Shapes built with [`AttentionShape::new`] or by
    /// hand must pass this before use; [`AttentionShape::from_qkv`] runs it.
    pub fn validate(&self) -> Result<()> {
        for (name, n) in [
            ("batch", self.batch),
            ("query heads", self.heads_q),
            ("key/value heads", self.heads_kv),
            ("query length", self.len_q),
            ("key length", self.len_k),
        ] {
            if n == 0 {
                return Err(Error::unsupported(name, 0, "at least 1"));
            }
            if n > u32::MAX as usize / 2 {
                return Err(Error::unsupported(name, n, "below 2^31"));
            }
        }
        for (name, n) in [("head dim D", self.head_dim), ("value head dim Dv", self.head_dim_v)] {
            if n == 0 || n > MAX_HEAD_DIM {
                return Err(Error::unsupported(name, n, format!("1 to {MAX_HEAD_DIM}")));
            }
        }
        // Every tensor's element count, and the weights', must fit in 64 bits: each axis
        // passing alone is not enough.
        let (b, hq, hk) = (self.batch, self.heads_q, self.heads_kv);
        let widest = self.head_dim.max(self.head_dim_v).max(self.len_k);
        checked_product("query-side tensor shape", &[b, hq, self.len_q, widest, 4])?;
        checked_product("key/value tensor shape", &[b, hk, self.len_k, widest, 4])?;
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::shape(
                "query heads (must be a multiple of key/value heads for GQA)",
                format!("a multiple of {}", self.heads_kv),
                self.heads_q,
            ));
        }
        Ok(())
    }

    /// Key/value head used by query head `h` (GQA/MQA).
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.heads_q / self.heads_kv)
    }

    /// Logical output shape `[B, Hq, Lq, Dv]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.batch, self.heads_q, self.len_q, self.head_dim_v]
    }

    /// Attention-weights shape `[B, Hq, Lq, Lk]`.
    pub fn weights_shape(&self) -> [usize; 4] {
        [self.batch, self.heads_q, self.len_q, self.len_k]
    }

    /// Number of (batch, query head) pairs.
    pub fn batch_heads(&self) -> usize {
        self.batch * self.heads_q
    }

    /// FLOPs of the two matrix products, `4·B·Hq·Lq·Lk·D`-style (with `D + Dv`), halved
    /// when causal as is customary (the exact count of visible pairs is not used).
    pub fn flops(&self, causal: bool) -> f64 {
        let f = 2.0
            * self.batch_heads() as f64
            * self.len_q as f64
            * self.len_k as f64
            * (self.head_dim + self.head_dim_v) as f64;
        if causal {
            f / 2.0
        } else {
            f
        }
    }

    /// The scale actually used: the option, else `1/sqrt(D)`.
    pub fn scale(&self, options: &AttentionOptions) -> f32 {
        options.scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Checks options against this shape: scale, key lengths, mask broadcast.
    pub fn check_options(&self, options: &AttentionOptions) -> Result<()> {
        // How far a set position offset moves queries from this call's keys (saturated:
        // anything past MAX_POSITIONS is refused below).
        let offset_magnitude = options.position_offset.map_or(0, |o| {
            usize::try_from(o.unsigned_abs())
                .unwrap_or(usize::MAX)
                .min(MAX_POSITIONS + 1)
        });
        if let Some(s) = options.scale {
            if !s.is_finite() {
                return Err(Error::invalid("scale", format!("{s} is not finite")));
            }
        }
        if let Some(lens) = &options.key_lengths {
            if lens.len() != self.batch {
                return Err(Error::shape(
                    "key lengths",
                    format!("{} entries (one per batch element)", self.batch),
                    lens.len(),
                ));
            }
            if let Some((b, &len)) = lens.iter().enumerate().find(|(_, &l)| l as usize > self.len_k) {
                return Err(Error::invalid(
                    "key lengths",
                    format!("entry {b} is {len}, larger than the key length {}", self.len_k),
                ));
            }
        }
        if let Some(mask) = &options.mask {
            mask.check_broadcast(self.weights_shape())?;
        }
        if let Some(slopes) = &options.alibi_slopes {
            if slopes.len() != self.heads_q {
                return Err(Error::shape(
                    "ALiBi slopes",
                    format!("{} entries (one per query head)", self.heads_q),
                    slopes.len(),
                ));
            }
            if let Some((h, x)) = slopes.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(Error::invalid("ALiBi slopes", format!("entry {h} is {x}, not finite")));
            }
            // The bias −slope·|p(i) − j| must stay far inside f32's range, or a
            // finite slope (−1e38) gives ±inf biases and NaN rows.
            let distance = (self.len_q + self.len_k) as f64 + offset_magnitude as f64;
            if let Some((h, x)) = slopes
                .iter()
                .enumerate()
                .find(|(_, x)| f64::from(x.abs()) * distance > MAX_ALIBI_BIAS)
            {
                return Err(Error::invalid(
                    "ALiBi slopes",
                    format!(
                        "entry {h} is {x:e}: over distances up to Lq + Lk = {distance} its bias would pass \
                         {MAX_ALIBI_BIAS:e} (keep |slope| · (Lq + Lk) at most that)"
                    ),
                ));
            }
        }
        if options.position_offset.is_some() && options.align_to_key_lengths {
            return Err(Error::invalid(
                "position_offset",
                "sets positions itself; it cannot be combined with align_to_key_lengths",
            ));
        }
        if options.align_to_key_lengths && options.key_lengths.is_none() {
            return Err(Error::invalid(
                "align_to_key_lengths",
                "needs key lengths to measure positions from",
            ));
        }
        if let Some(cap) = options.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(Error::invalid(
                    "softcap",
                    format!("{cap} is not a finite number above 0"),
                ));
            }
        }
        // The kernels measure positions p(i) − j in i32 (attention_common.wgsl).
        if let Some(offset) = options.position_offset {
            if self.len_q + self.len_k + offset_magnitude > MAX_POSITIONS {
                // Say the offset given, not the saturated magnitude (issue 55: 2^31 was
                // reported as 1073741837).
                return Err(Error::unsupported(
                    "query length + key length + |position_offset|",
                    format!("{} + {} + |{offset}|", self.len_q, self.len_k),
                    format!("at most {MAX_POSITIONS}"),
                ));
            }
        }
        if (options.window.is_some() || options.alibi_slopes.is_some()) && self.len_q + self.len_k > MAX_POSITIONS {
            return Err(Error::unsupported(
                "query length + key length with a window or ALiBi",
                self.len_q + self.len_k,
                format!("at most {MAX_POSITIONS}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_offset_too_far_is_reported_as_given() {
        // Issue 55: an offset of 2^31 was reported as its saturated magnitude.
        let shape = AttentionShape::new(1, 1, 1, 5, 8, 4, 4);
        for offset in [1i64 << 31, -(1i64 << 40)] {
            let options = AttentionOptions {
                position_offset: Some(offset),
                ..Default::default()
            };
            let e = shape.check_options(&options).expect_err("too far").to_string();
            assert!(e.contains(&format!("5 + 8 + |{offset}|")), "{e}");
        }
    }
}
