//! Host-side weights of a multi-head attention layer, in PyTorch's `nn.Linear` layout.

use super::config::MhaConfig;
use crate::error::{Error, Result};
use crate::reference::rng::Rng;

/// One linear projection `y = x · Wᵀ + b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// `[out_features, in_features]`, row-major.
    pub weight: Vec<f32>,
    /// `[out_features]`, if the projection has a bias.
    pub bias: Option<Vec<f32>>,
    /// Rows of `weight`: the width of `y`.
    pub out_features: usize,
    /// Columns of `weight`: the width of `x`.
    pub in_features: usize,
}

/// LayerNorm scale and shift, `[E]` each.
#[derive(Clone, Debug, PartialEq)]
pub struct NormWeights {
    /// The scale `gamma` (PyTorch's `norm.weight`), `[E]`.
    pub weight: Vec<f32>,
    /// The shift `beta` (PyTorch's `norm.bias`), `[E]`.
    pub bias: Vec<f32>,
}

/// The four projections of a multi-head attention layer and its optional LayerNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct MhaWeights {
    /// `[E, E]`.
    pub q: Projection,
    /// `[kv_width, kdim]`.
    pub k: Projection,
    /// `[kv_width, vdim]`.
    pub v: Projection,
    /// `[E, E]`.
    pub o: Projection,
    /// The post-norm's LayerNorm, applied only when the config has a `post_norm`.
    pub norm: Option<NormWeights>,
}

impl Projection {
    /// Xavier-uniform weights (bound `sqrt(6 / (fan_in + fan_out))`), zero bias, as
    /// PyTorch initialises `nn.MultiheadAttention`'s projections.
    fn xavier_uniform(rng: &mut Rng, out_features: usize, in_features: usize, bias: bool) -> Self {
        let bound = (6.0 / (in_features + out_features) as f64).sqrt() as f32;
        Projection {
            weight: rng.vec(out_features * in_features, -bound, bound),
            bias: bias.then(|| vec![0.0; out_features]),
            out_features,
            in_features,
        }
    }

    /// Checks the sizes against what the layer expects of the projection `name`.
    fn check(&self, name: &str, out_features: usize, in_features: usize) -> Result<()> {
        let expected = format!("[{out_features}, {in_features}]");
        if (self.out_features, self.in_features) != (out_features, in_features)
            || self.weight.len() != out_features * in_features
        {
            return Err(Error::shape(
                format!("{name} projection weight"),
                expected,
                format!(
                    "[{}, {}] ({} values)",
                    self.out_features,
                    self.in_features,
                    self.weight.len()
                ),
            ));
        }
        if let Some(bias) = &self.bias {
            if bias.len() != out_features {
                return Err(Error::shape(
                    format!("{name} projection bias"),
                    format!("[{out_features}]"),
                    format!("[{}]", bias.len()),
                ));
            }
        }
        Ok(())
    }
}

impl MhaWeights {
    /// Seeded random weights for `config`: Xavier-uniform projections with zero biases
    /// (when `config.bias`), and LayerNorm weight 1, bias 0 (when `config.post_norm`).
    /// PyTorch applies Xavier to its packed `[3E, E]` in-projection as one matrix and
    /// Kaiming to the output projection; here each projection gets its own bound.
    pub fn xavier_uniform(config: &MhaConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let (e, kv) = (config.embed_dim, config.kv_width());
        Ok(MhaWeights {
            q: Projection::xavier_uniform(&mut rng, e, e, config.bias),
            k: Projection::xavier_uniform(&mut rng, kv, config.kdim, config.bias),
            v: Projection::xavier_uniform(&mut rng, kv, config.vdim, config.bias),
            o: Projection::xavier_uniform(&mut rng, e, e, config.bias),
            norm: config.post_norm.map(|_| NormWeights {
                weight: vec![1.0; e],
                bias: vec![0.0; e],
            }),
        })
    }

    /// Checks every tensor's size against `config`.
    pub fn check(&self, config: &MhaConfig) -> Result<()> {
        config.validate()?;
        let (e, kv) = (config.embed_dim, config.kv_width());
        self.q.check("query", e, e)?;
        self.k.check("key", kv, config.kdim)?;
        self.v.check("value", kv, config.vdim)?;
        self.o.check("output", e, e)?;
        match (&self.norm, config.post_norm) {
            (None, Some(_)) => Err(Error::invalid(
                "post-norm",
                "the config asks for a LayerNorm but the weights have none (norm.weight, norm.bias)",
            )),
            (Some(norm), _) if norm.weight.len() != e || norm.bias.len() != e => Err(Error::shape(
                "LayerNorm weight and bias",
                format!("[{e}] each"),
                format!("[{}] and [{}]", norm.weight.len(), norm.bias.len()),
            )),
            _ => Ok(()),
        }
    }
}
