//! Multi-head attention weights from `.safetensors` files, in PyTorch's or Hugging
//! Face's naming. Every tensor is checked; a missing or misshaped one is an error that
//! names it, with the shape found and the shape expected.

use super::config::MhaConfig;
use super::weights::{MhaWeights, NormWeights, Projection};
use crate::error::{Error, Result};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

/// Which naming scheme a file used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightNaming {
    /// `nn.MultiheadAttention` with `kdim == vdim == embed_dim`: `in_proj_weight`
    /// `[3E, E]`, `in_proj_bias`, `out_proj.weight`, `out_proj.bias`.
    PyTorchPacked,
    /// `nn.MultiheadAttention` with other `kdim`/`vdim`: `q_proj_weight`,
    /// `k_proj_weight`, `v_proj_weight`, `in_proj_bias`, `out_proj.*`.
    PyTorchSeparate,
    /// `q_proj.weight`, `k_proj.weight`, `v_proj.weight`, `o_proj.weight`, each with an
    /// optional `.bias`.
    HuggingFace,
}

/// What a weights file holds: the layer's sizes (no post-norm: the caller decides
/// whether to apply the norm tensors, when there are any) and its weights.
#[derive(Clone, Debug)]
pub struct LoadedMha {
    /// Sizes read from the tensors' shapes; `bias` set if any projection has one,
    /// `post_norm` always `None`.
    pub config: MhaConfig,
    /// The projections, and the LayerNorm if the file has one (see [`load_safetensors`]).
    pub weights: MhaWeights,
    /// The naming scheme the file's tensors follow.
    pub naming: WeightNaming,
    /// The full name of the LayerNorm's weight tensor, where the file has one
    /// (`norm.weight` or `norm1.weight`, after the prefix): a caller that leaves the norm out can say which tensors it ignores.
    pub norm_tensor: Option<String>,
}

/// Where a layer file keeps the LayerNorm that follows attention, relative to the
/// layer's prefix: this crate's own name, and PyTorch's `nn.TransformerEncoderLayer` /
/// `TransformerDecoderLayer` (`norm1`, applied to `x + self_attn(x)` when
/// `norm_first=False`). Hugging Face's decoder layers' `post_attention_layernorm` is
/// not one: it is a (usually bias-less RMS) norm before the MLP of a pre-norm layer, so
/// applying it as this layer's post-norm would compute something else.
const NORM_NAMES: [&str; 2] = ["norm", "norm1"];

/// Reads multi-head attention weights from the bytes of a `.safetensors` file. Tensor
/// names start with `prefix` (e.g. `"encoder.layers.0."`); the attention's own tensors
/// may sit under `prefix` itself or under `prefix + "self_attn."`, as PyTorch's
/// `nn.TransformerEncoderLayer` and Hugging Face layers store them, so a whole layer's
/// `state_dict` loads as saved. A LayerNorm (`weight` and `bias`) is read from
/// `norm.*` (beside the attention's tensors, or after `prefix`) or `norm1.*` after
/// `prefix`; [`LoadedMha::norm_tensor`] names the one found. `num_heads` cannot be read from the file, nor can `num_kv_heads` under
/// PyTorch naming (it must equal `num_heads` there); with Hugging Face naming it is
/// inferred when `None`. f32, f16, bf16 and f64 tensors are accepted and converted to
/// f32.
pub fn load_safetensors(
    bytes: &[u8],
    num_heads: usize,
    num_kv_heads: Option<usize>,
    prefix: &str,
) -> Result<LoadedMha> {
    if num_heads == 0 || num_kv_heads == Some(0) {
        return Err(Error::invalid("num_heads", "head counts must be at least 1"));
    }
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| Error::invalid("weights file", e.to_string()))?;
    // The safetensors crate keeps the last of two entries of one name, silently.
    if let Some(name) = duplicate_name(bytes) {
        return Err(Error::invalid(
            "weights file",
            format!("the header lists '{name}' twice; which one is meant is ambiguous"),
        ));
    }
    // The attention's tensors: after the prefix, or in the layer's `self_attn.` module.
    let nested = format!("{prefix}self_attn.");
    let attention_prefix = if has_attention(&tensors, prefix) || !has_attention(&tensors, &nested) {
        prefix
    } else {
        nested.as_str()
    };
    let file = File {
        tensors: &tensors,
        prefix: attention_prefix,
    };
    let naming = if file.has("in_proj_weight") {
        WeightNaming::PyTorchPacked
    } else if file.has("q_proj_weight") {
        WeightNaming::PyTorchSeparate
    } else if file.has("q_proj.weight") {
        WeightNaming::HuggingFace
    } else {
        let mut names = file.tensors.names();
        names.sort();
        let shown: Vec<String> = names.iter().take(8).map(|s| s.to_string()).collect();
        return Err(Error::invalid(
            "weights file",
            format!(
                "found none of '{prefix}in_proj_weight', '{prefix}q_proj_weight', '{prefix}q_proj.weight' \
                 (is the prefix right?); the file has {} tensors: {}{}",
                names.len(),
                shown.join(", "),
                if names.len() > shown.len() { ", ..." } else { "" }
            ),
        ));
    };
    if num_heads == 0 {
        return Err(Error::invalid("num_heads", "must be at least 1"));
    }
    let (mut config, weights) = match naming {
        WeightNaming::PyTorchPacked | WeightNaming::PyTorchSeparate => {
            if num_kv_heads.is_some_and(|g| g != num_heads) {
                return Err(Error::invalid(
                    "num_kv_heads",
                    "PyTorch's nn.MultiheadAttention has as many key/value heads as query heads",
                ));
            }
            pytorch(&file, naming, num_heads)?
        }
        WeightNaming::HuggingFace => hugging_face(&file, num_heads, num_kv_heads)?,
    };
    config.bias = [&weights.q, &weights.k, &weights.v, &weights.o]
        .iter()
        .any(|p| p.bias.is_some());
    // The norm: beside the attention's tensors (this crate's own files), else in the
    // layer (PyTorch's and Hugging Face's layer modules).
    let layer = File {
        tensors: &tensors,
        prefix,
    };
    let mut norm = None;
    let candidates = std::iter::once((&file, "norm")).chain(NORM_NAMES.iter().map(|&n| (&layer, n)));
    for (place, name) in candidates {
        if let Some(weight) = place.optional(&format!("{name}.weight"), &[config.embed_dim])? {
            let bias = place.required(&format!("{name}.bias"), &[config.embed_dim])?;
            norm = Some((NormWeights { weight, bias }, place.full(&format!("{name}.weight"))));
            break;
        }
    }
    let (norm, norm_tensor) = norm.map_or((None, None), |(n, name)| (Some(n), Some(name)));
    let weights = MhaWeights { norm, ..weights };
    weights.check(&config)?;
    Ok(LoadedMha {
        config,
        weights,
        naming,
        norm_tensor,
    })
}

fn pytorch(file: &File, naming: WeightNaming, num_heads: usize) -> Result<(MhaConfig, MhaWeights)> {
    let (e, q, k, v) = if naming == WeightNaming::PyTorchPacked {
        let e = file.dim("in_proj_weight", 1)?;
        let packed = file.required("in_proj_weight", &[3 * e, e])?;
        let third = |i: usize| packed[i * e * e..(i + 1) * e * e].to_vec();
        (e, third(0), third(1), third(2))
    } else {
        let e = file.dim("q_proj_weight", 0)?;
        (
            e,
            file.required("q_proj_weight", &[e, e])?,
            file.required("k_proj_weight", &[e, file.dim("k_proj_weight", 1)?])?,
            file.required("v_proj_weight", &[e, file.dim("v_proj_weight", 1)?])?,
        )
    };
    let (kdim, vdim) = (k.len() / e, v.len() / e);
    let biases = file.optional("in_proj_bias", &[3 * e])?;
    let bias = |i: usize| biases.as_ref().map(|b| b[i * e..(i + 1) * e].to_vec());
    let config = MhaConfig {
        kdim,
        vdim,
        ..MhaConfig::new(e, num_heads)
    };
    let weights = MhaWeights {
        q: projection(q, bias(0), e, e),
        k: projection(k, bias(1), e, kdim),
        v: projection(v, bias(2), e, vdim),
        o: projection(
            file.required("out_proj.weight", &[e, e])?,
            file.optional("out_proj.bias", &[e])?,
            e,
            e,
        ),
        norm: None,
    };
    Ok((config, weights))
}

fn hugging_face(file: &File, num_heads: usize, num_kv_heads: Option<usize>) -> Result<(MhaConfig, MhaWeights)> {
    let e = file.dim("q_proj.weight", 1)?;
    let q = file.required("q_proj.weight", &[e, e])?;
    if !e.is_multiple_of(num_heads) {
        return Err(Error::invalid(
            "num_heads",
            format!("embed_dim {e} (from q_proj.weight) is not a multiple of {num_heads} heads"),
        ));
    }
    let head_dim = e / num_heads;
    let (kdim, vdim) = (file.dim("k_proj.weight", 1)?, file.dim("v_proj.weight", 1)?);
    let kv_width = match num_kv_heads {
        Some(g) => g.checked_mul(head_dim).ok_or_else(|| {
            Error::invalid(
                "num_kv_heads",
                format!("{g} heads of {head_dim} overflow the address space"),
            )
        })?,
        None => file.dim("k_proj.weight", 0)?,
    };
    if !kv_width.is_multiple_of(head_dim) || kv_width == 0 {
        return Err(Error::invalid(
            "k_proj.weight",
            format!("{kv_width} rows are not a whole number of heads of {head_dim}"),
        ));
    }
    let config = MhaConfig {
        num_kv_heads: kv_width / head_dim,
        kdim,
        vdim,
        ..MhaConfig::new(e, num_heads)
    };
    let linear = |name: &str, out: usize, inp: usize| -> Result<Projection> {
        Ok(projection(
            file.required(&format!("{name}.weight"), &[out, inp])?,
            file.optional(&format!("{name}.bias"), &[out])?,
            out,
            inp,
        ))
    };
    let weights = MhaWeights {
        q: projection(q, file.optional("q_proj.bias", &[e])?, e, e),
        k: linear("k_proj", kv_width, kdim)?,
        v: linear("v_proj", kv_width, vdim)?,
        o: linear("o_proj", e, e)?,
        norm: None,
    };
    Ok((config, weights))
}

fn projection(weight: Vec<f32>, bias: Option<Vec<f32>>, out_features: usize, in_features: usize) -> Projection {
    Projection {
        weight,
        bias,
        out_features,
        in_features,
    }
}

/// Whether `prefix` is followed by the tensors of any naming scheme.
fn has_attention(tensors: &SafeTensors, prefix: &str) -> bool {
    ["in_proj_weight", "q_proj_weight", "q_proj.weight"]
        .iter()
        .any(|name| tensors.tensor(&format!("{prefix}{name}")).is_ok())
}

/// A parsed file and the prefix of the tensor names looked up in it.
struct File<'a> {
    tensors: &'a SafeTensors<'a>,
    prefix: &'a str,
}

impl File<'_> {
    fn full(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.tensor(&self.full(name)).is_ok()
    }

    /// Size `axis` of a rank-2 tensor that must exist.
    fn dim(&self, name: &str, axis: usize) -> Result<usize> {
        let full = self.full(name);
        let view = self
            .tensors
            .tensor(&full)
            .map_err(|_| Error::invalid(format!("weights tensor '{full}'"), "missing from the file"))?;
        match view.shape() {
            // Sizes are validated before any arithmetic uses them (a zero embed dim
            // would divide by zero below).
            &[rows, cols] if rows == 0 || cols == 0 => Err(Error::shape(
                format!("weights tensor '{full}'"),
                "a matrix with no zero-sized dimension",
                format!("[{rows}, {cols}]"),
            )),
            &[rows, cols] => Ok([rows, cols][axis]),
            other => Err(Error::shape(
                format!("weights tensor '{full}'"),
                "a matrix [rows, cols]",
                format!("{other:?}"),
            )),
        }
    }

    fn required(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        self.optional(name, expected)?.ok_or_else(|| {
            Error::invalid(
                format!("weights tensor '{}'", self.full(name)),
                format!("missing from the file (expected shape {expected:?})"),
            )
        })
    }

    fn optional(&self, name: &str, expected: &[usize]) -> Result<Option<Vec<f32>>> {
        let full = self.full(name);
        let Ok(view) = self.tensors.tensor(&full) else {
            return Ok(None);
        };
        if view.shape() != expected {
            return Err(Error::shape(
                format!("weights tensor '{full}'"),
                format!("{expected:?}"),
                format!("{:?}", view.shape()),
            ));
        }
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
                .collect(),
            other => {
                return Err(Error::unsupported(
                    format!("dtype of weights tensor '{full}'"),
                    format!("{other:?}"),
                    "F32, F16, BF16, F64",
                ))
            }
        };
        Ok(Some(values))
    }
}

/// The first key that the JSON header of a `.safetensors` file (`bytes`, which the
/// safetensors crate has already parsed, so the header is valid JSON) holds twice at
/// its top level, with escapes decoded (`"a"` and `"\u0061"` are one name).
fn duplicate_name(bytes: &[u8]) -> Option<String> {
    let len = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = std::str::from_utf8(bytes.get(8..8usize.checked_add(len)?)?).ok()?;
    let mut chars = header.chars().peekable();
    let skip_space = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    };
    skip_space(&mut chars);
    if chars.next()? != '{' {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    loop {
        skip_space(&mut chars);
        match chars.next()? {
            '"' => {}
            _ => return None, // `}`: the end of the object
        }
        let key = json_string(&mut chars)?;
        if !seen.insert(key.clone()) {
            return Some(key);
        }
        skip_space(&mut chars);
        if chars.next()? != ':' {
            return None;
        }
        // The value: strings skipped whole, brackets counted, up to the `,` or `}`
        // that ends it at the top level.
        let mut depth = 0usize;
        loop {
            match chars.next()? {
                '"' => {
                    json_string(&mut chars)?;
                }
                '{' | '[' => depth += 1,
                '}' | ']' if depth > 0 => depth -= 1,
                '}' => return None,
                ',' if depth == 0 => break,
                _ => {}
            }
        }
    }
}

/// A JSON string's value, read after its opening quote up to and including the closing one.
fn json_string(chars: &mut std::iter::Peekable<std::str::Chars>) -> Option<String> {
    let mut out = String::new();
    let mut units: Vec<u16> = Vec::new();
    loop {
        let c = chars.next()?;
        if c == '\\' && chars.peek() == Some(&'u') {
            chars.next();
            let hex: String = chars.by_ref().take(4).collect();
            units.push(u16::from_str_radix(&hex, 16).ok()?);
            continue;
        }
        if !units.is_empty() {
            out.extend(char::decode_utf16(units.drain(..)).map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER)));
        }
        match c {
            '"' => return Some(out),
            '\\' => out.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                'b' => '\u{8}',
                'f' => '\u{c}',
                other => other, // `"`, `\\`, `/`
            }),
            c => out.push(c),
        }
    }
}
