//! Rotary position embeddings as the kernels take them: the embedding ([`Rotary`]: its
//! pairs, angles and f64 rotation, which the host's cos/sin tables and the reference
//! use) and the rotation kernel (`rotary.wgsl`). `crate::rotary` encodes it; the KV
//! append kernel rotates rows with the same tables as it writes them.

use crate::error::{Error, Result};
use crate::gpu::Text;
use crate::kernels::Kernel;

const SOURCE: &str = include_str!("../../shaders/rotary.wgsl");

/// The rotation kernel.
pub const KERNEL: Kernel = Kernel {
    file: "rotary.wgsl",
    source: Text::Static(SOURCE),
    entry: "rotary",
    slots: &[],
    preludes: &[super::ROTARY_COMMON],
    variant: Text::Static(""),
};

/// How a rotation pairs the rotated elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RotaryStyle {
    /// Element `i` with `i + dim/2` (GPT-NeoX, Hugging Face's `rotate_half`, LLaMA).
    #[default]
    NeoX,
    /// Element `2i` with `2i + 1` (GPT-J, the original RoFormer).
    GptJ,
}

/// A rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rotary {
    /// The frequency base (10000 in most models).
    pub theta: f64,
    /// Rotated elements of each head (even, at most the head dim; the rest pass).
    pub dim: usize,
    /// The pairing.
    pub style: RotaryStyle,
    /// Positions are divided by this (linear position interpolation; 1 = none).
    pub scaling: f64,
}

impl Rotary {
    /// NeoX pairing over `dim` elements, theta 10000, no scaling.
    pub fn new(dim: usize) -> Self {
        Rotary {
            theta: 10000.0,
            dim,
            style: RotaryStyle::NeoX,
            scaling: 1.0,
        }
    }

    /// Refuses an embedding that does not fit heads of `head_dim`.
    pub fn check(&self, head_dim: usize) -> Result<()> {
        if self.dim == 0 || !self.dim.is_multiple_of(2) || self.dim > head_dim {
            return Err(Error::invalid(
                "rotary dim",
                format!("{} is not an even number from 2 to the head dim {head_dim}", self.dim),
            ));
        }
        for (what, x) in [("rotary theta", self.theta), ("rotary scaling", self.scaling)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(Error::invalid(what, format!("{x} is not a finite number above 0")));
            }
        }
        Ok(())
    }

    /// The elements pair `i` rotates, by the style's pairing.
    pub fn pair(&self, i: usize) -> (usize, usize) {
        match self.style {
            RotaryStyle::NeoX => (i, i + self.dim / 2),
            RotaryStyle::GptJ => (2 * i, 2 * i + 1),
        }
    }

    /// The angle of pair `i` at `position`, in f64.
    pub fn angle(&self, position: u32, i: usize) -> f64 {
        let inv_freq = self.theta.powf(-2.0 * i as f64 / self.dim as f64);
        f64::from(position) / self.scaling * inv_freq
    }

    /// `(cos, sin)` of every pair at each of `positions`, rows of `dim / 2`.
    pub fn table(&self, positions: &[u32]) -> Vec<[f32; 2]> {
        self.table_for(positions, false)
    }

    /// [`Rotary::table`], or with `inverse` that of the opposite angles (sin negated):
    /// the transpose of the rotation, which carries a gradient back through it.
    pub(crate) fn table_for(&self, positions: &[u32], inverse: bool) -> Vec<[f32; 2]> {
        let sign = if inverse { -1.0 } else { 1.0 };
        positions
            .iter()
            .flat_map(|&p| {
                (0..self.dim / 2).map(move |i| {
                    let a = self.angle(p, i);
                    [a.cos() as f32, (sign * a.sin()) as f32]
                })
            })
            .collect()
    }

    /// The rotation of one head row `x` (its head dim long) at `position`, in f64: the
    /// reference the kernel is checked against.
    pub fn rotate_row(&self, x: &[f32], position: u32) -> Vec<f64> {
        self.rotate_row64(&x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), position)
    }

    /// [`Rotary::rotate_row`] of an f64 row (the multi-head layer's reference).
    pub fn rotate_row64(&self, x: &[f64], position: u32) -> Vec<f64> {
        self.turn_row64(x, position, 1.0)
    }

    /// The inverse (transposed) rotation of an f64 row: a gradient carried back
    /// through [`Rotary::rotate_row64`].
    pub fn unrotate_row64(&self, x: &[f64], position: u32) -> Vec<f64> {
        self.turn_row64(x, position, -1.0)
    }

    fn turn_row64(&self, x: &[f64], position: u32, sign: f64) -> Vec<f64> {
        let mut out = x.to_vec();
        for i in 0..self.dim / 2 {
            let (a, b) = self.pair(i);
            let (c, s) = (self.angle(position, i).cos(), sign * self.angle(position, i).sin());
            let (xa, xb) = (x[a], x[b]);
            out[a] = xa * c - xb * s;
            out[b] = xb * c + xa * s;
        }
        out
    }
}

/// The rotation kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
