//! What the benchmarks time, apart from how (`bench`, native only): the named suites
//! of problems, their FLOP and byte counts, and their seeded inputs. The web bench page
//! (`web/bench.html`) times the same problems in a browser.

use crate::check::Rng;
use crate::options::{AttentionOptions, CausalAlignment, KernelChoice, Precision, Window};
use crate::problem::AttentionShape;
use crate::tensor::DType;

/// A named list of problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// About a minute on lavapipe.
    Quick,
    /// The L = 2048 shapes and friends.
    Standard,
    /// Standard plus long sequences for the fused path, up to L = 32768.
    Long,
}

impl Suite {
    pub fn parse(name: &str) -> Option<Suite> {
        match name {
            "quick" => Some(Suite::Quick),
            "standard" => Some(Suite::Standard),
            "long" => Some(Suite::Long),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Suite::Quick => "quick",
            Suite::Standard => "standard",
            Suite::Long => "long",
        }
    }

    /// The suite's problems; f16 ones only where `f16` is available.
    pub fn cases(self, f16: bool) -> Vec<BenchCase> {
        let mut out = Vec::new();
        let mut add = |shape: AttentionShape, dtypes: &[DType]| {
            for &dtype in dtypes {
                // Causal only where Lq = Lk, where "half the FLOPs" is the true count.
                for causal in [false, true] {
                    if !causal || shape.len_q == shape.len_k {
                        out.push(BenchCase {
                            shape,
                            causal,
                            window: None,
                            dtype,
                            precision: Precision::Highest,
                        });
                    }
                }
            }
        };
        let f32_f16: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
        match self {
            Suite::Quick => {
                add(AttentionShape::new(1, 8, 8, 512, 512, 64, 64), f32_f16);
                add(AttentionShape::new(2, 8, 2, 256, 256, 64, 64), &[DType::F32]);
                add(AttentionShape::new(1, 4, 4, 64, 1024, 128, 128), &[DType::F32]);
            }
            Suite::Standard | Suite::Long => {
                add(AttentionShape::new(1, 8, 8, 1024, 1024, 64, 64), f32_f16);
                add(AttentionShape::new(1, 8, 8, 2048, 2048, 64, 64), f32_f16);
                add(AttentionShape::new(2, 16, 4, 1024, 1024, 64, 64), &[DType::F32]);
                add(AttentionShape::new(1, 8, 8, 512, 512, 128, 128), &[DType::F32]);
            }
        }
        if self == Suite::Long {
            for len in [8192, 32768] {
                out.push(BenchCase {
                    shape: AttentionShape::new(1, 1, 1, len, len, 64, 64),
                    causal: false,
                    window: None,
                    dtype: DType::F32,
                    precision: Precision::Highest,
                });
            }
        }
        out
    }
}

/// One problem of a suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchCase {
    pub shape: AttentionShape,
    /// Causal with top-left alignment.
    pub causal: bool,
    /// A sliding window (with `causal`, around the top-left-aligned position).
    pub window: Option<Window>,
    pub dtype: DType,
    /// Whether f32 inputs may be multiplied in f16 (tensor cores).
    pub precision: Precision,
}

impl BenchCase {
    /// Attention FLOPs: 2·B·Hq·Lq·Lk·(D + Dv), i.e. 4·B·Hq·Lq·Lk·D when Dv = D; halved
    /// for causal; with a window, 2·B·Hq·(D + Dv) per visible (query, key) pair, counted.
    pub fn flops(&self) -> f64 {
        let s = &self.shape;
        match self.window {
            None => s.flops(self.causal),
            Some(window) => {
                let options = self.options(KernelChoice::Auto);
                let offset = options.query_position_offset(s.len_q, s.len_k);
                let right = if self.causal { Some(0) } else { window.right };
                let pairs: u64 = (0..s.len_q as i64)
                    .map(|i| {
                        let pos = i + offset;
                        let start = window.left.map_or(0, |l| (pos - l as i64).max(0));
                        let end = right.map_or(s.len_k as i64, |r| (pos + r as i64 + 1).min(s.len_k as i64));
                        (end - start).max(0) as u64
                    })
                    .sum();
                2.0 * s.batch_heads() as f64 * pairs as f64 * (s.head_dim + s.head_dim_v) as f64
            }
        }
    }

    /// Compulsory traffic: Q, K, V read once and O written once.
    pub fn compulsory_bytes(&self) -> f64 {
        let s = &self.shape;
        let elements = s.batch
            * (s.heads_q * s.len_q * (s.head_dim + s.head_dim_v) + s.heads_kv * s.len_k * (s.head_dim + s.head_dim_v));
        (elements * self.dtype.size()) as f64
    }

    /// [`BenchCase::compulsory_bytes`] with K and V as int8 codes and one f32 scale per
    /// row of each (an int8 KV cache).
    pub fn compulsory_bytes_int8_kv(&self) -> f64 {
        let s = &self.shape;
        let q_and_out = s.batch * s.heads_q * s.len_q * (s.head_dim + s.head_dim_v) * self.dtype.size();
        let kv = s.batch * s.heads_kv * s.len_k * (s.head_dim + s.head_dim_v + 2 * 4);
        (q_and_out + kv) as f64
    }

    /// `none`, `causal-top-left`, and `+window=LEFT,RIGHT` (-1: unbounded) after either.
    pub fn mask_name(&self) -> String {
        let base = if self.causal { "causal-top-left" } else { "none" };
        match self.window {
            None => base.to_string(),
            Some(w) => format!("{base}+window={w}"),
        }
    }

    pub fn options(&self, kernel: KernelChoice) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal.then_some(CausalAlignment::TopLeft),
            window: self.window,
            kernel,
            precision: self.precision,
            ..Default::default()
        }
    }
}

/// Seeded random q, k, v for a benchmark shape (BHSD).
pub fn bench_data(shape: &AttentionShape) -> [Vec<f32>; 3] {
    let mut rng = Rng::new(1);
    let mut make = |h: usize, l: usize, d: usize| rng.vec(shape.batch * h * l * d, -1.0, 1.0);
    [
        make(shape.heads_q, shape.len_q, shape.head_dim),
        make(shape.heads_kv, shape.len_k, shape.head_dim),
        make(shape.heads_kv, shape.len_k, shape.head_dim_v),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(len_q: usize, len_k: usize, causal: bool, window: Option<Window>) -> BenchCase {
        BenchCase {
            shape: AttentionShape::new(1, 1, 1, len_q, len_k, 1, 1),
            causal,
            window,
            dtype: DType::F32,
            precision: Precision::Highest,
        }
    }

    #[test]
    fn window_flops_count_the_visible_pairs() {
        // Per pair: 2 · (D + Dv) = 4 FLOPs. Causal window (2, 0) on 5 x 5: rows see 1, 2,
        // 3, 3, 3 keys.
        let w = |left, right| Some(Window { left, right });
        assert_eq!(case(5, 5, true, w(Some(2), Some(0))).flops(), 4.0 * 12.0);
        // No causal, 2 x 5: p(i) = i + 3; window (1, 1) sees keys 2..=4 and 3..=4.
        assert_eq!(case(2, 5, false, w(Some(1), Some(1))).flops(), 4.0 * 5.0);
        // Unbounded on both sides: every pair, as without a window.
        assert_eq!(
            case(3, 7, false, w(None, None)).flops(),
            case(3, 7, false, None).flops()
        );
        assert_eq!(
            case(5, 5, true, w(Some(2), Some(0))).mask_name(),
            "causal-top-left+window=2,0"
        );
        assert_eq!(case(5, 5, false, w(None, Some(3))).mask_name(), "none+window=-1,3");
    }
}
