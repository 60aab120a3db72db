//! `mha`: a multi-head attention layer (weights from `.safetensors`) on `.npy` inputs.

use super::run::{check_finite_output, parse_precision, parse_tiling, DTypeArg, KernelArg, MaskArgs};
use super::{input, npy, output};
use super::{AdapterArgs, CliError};
use std::path::{Path, PathBuf};
use wgpu_attention::kernels::matmul::LinearTiling;
use wgpu_attention::key_mask_from_tokens;
use wgpu_attention::mha::{load_safetensors, PostNorm};
use wgpu_attention::{
    Context, DType, FusedTiling, HeadWeights, Inputs, MhaOptions, MhaWeights, MultiHeadAttention, Precision, Tensor,
};

#[derive(clap::Args)]
pub struct MhaArgs {
    /// Layer weights: PyTorch nn.MultiheadAttention names (in_proj_weight, out_proj.*, or
    /// q/k/v_proj_weight) or Hugging Face names (q/k/v/o_proj.weight and .bias).
    #[arg(long)]
    weights: PathBuf,
    /// Query heads.
    #[arg(long)]
    num_heads: usize,
    /// Key/value heads (GQA/MQA; Hugging Face names only; default: read from k_proj.weight).
    #[arg(long)]
    num_kv_heads: Option<usize>,
    /// Prefix of the layer's tensor names, e.g. "encoder.layers.0.self_attn.".
    #[arg(long, default_value = "")]
    prefix: String,
    /// Query sequence [B, Lq, E], float32 or float16. Also key and value unless given.
    #[arg(long)]
    query: PathBuf,
    /// Key sequence [B, Lk, kdim] (cross-attention; needs --value).
    #[arg(long, requires = "value")]
    key: Option<PathBuf>,
    /// Value sequence [B, Lk, vdim] (needs --key).
    #[arg(long, requires = "key")]
    value: Option<PathBuf>,
    #[command(flatten)]
    masks: MaskArgs,
    /// Key token ids [B, Lk] (int32/int64): keys equal to --pad-id are masked.
    #[arg(long, requires = "pad_id", conflicts_with_all = ["key_lengths", "mask"])]
    tokens: Option<PathBuf>,
    /// The padding token id for --tokens.
    #[arg(long, requires = "tokens", allow_hyphen_values = true)]
    pad_id: Option<i64>,
    /// Apply LayerNorm(attention output + query) with the file's norm (norm.* or
    /// norm1.*, as PyTorch's TransformerEncoderLayer applies norm1).
    #[arg(long, conflicts_with = "ignore_norm")]
    post_norm: bool,
    /// Run without the norm the file holds (a file with one is refused otherwise).
    #[arg(long)]
    ignore_norm: bool,
    /// LayerNorm epsilon.
    #[arg(long, default_value_t = 1e-5, requires = "post_norm")]
    norm_eps: f32,
    /// Compute precision.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    #[arg(long, value_enum, default_value = "auto")]
    kernel: KernelArg,
    /// Tile configuration of the fused kernel: auto, or a tiling `info` lists.
    #[arg(long, default_value = "auto", value_parser = parse_tiling)]
    tiling: FusedTiling,
    /// Whether f32 inputs may be multiplied in f16 on tensor cores (projections and
    /// attention): highest (never), high or medium. f16 inputs always may.
    #[arg(long, default_value = "highest", value_parser = parse_precision)]
    precision: Precision,
    /// Output file [B, Lq, E] (float32).
    #[arg(long)]
    out: PathBuf,
    /// Also write the attention weights, averaged over heads [B, Lq, Lk].
    #[arg(long)]
    weights_out: Option<PathBuf>,
    /// With --weights-out: per head instead, [B, H, Lq, Lk].
    #[arg(long, requires = "weights_out")]
    per_head: bool,
}

/// Every array of a layer's weights, named.
fn weight_arrays(w: &MhaWeights) -> impl Iterator<Item = (&'static str, &[f32])> {
    let projections = [("q", &w.q), ("k", &w.k), ("v", &w.v), ("o", &w.o)];
    let norm = w
        .norm
        .iter()
        .flat_map(|n| [("norm weight", &n.weight[..]), ("norm bias", &n.bias[..])]);
    projections
        .into_iter()
        .flat_map(|(name, p)| std::iter::once((name, &p.weight[..])).chain(p.bias.iter().map(move |b| (name, &b[..]))))
        .chain(norm)
}

/// A `[B, S, width]` float array uploaded as a sequence tensor (in f16, only if every
/// value is within f16's range). Returns whether every value is finite.
fn load_sequence(
    ctx: &Context,
    path: &Path,
    width: usize,
    what: &str,
    dtype: DType,
    f16_why: Option<&str>,
) -> Result<(Tensor, bool), CliError> {
    let a = npy::read_float(path)?;
    if let Some(why) = f16_why {
        npy::check_f16_range(path, &a.data, why)?;
    }
    let finite = a.data.iter().all(|x| x.is_finite());
    match a.shape.as_slice() {
        &[b, s, w] if w == width && b > 0 && s > 0 => Ok((Tensor::sequence(ctx, [b, s, w], dtype, &a.data)?, finite)),
        _ => Err(CliError::bad(format!(
            "{}: the {what} must have shape [B, S, {width}] (the layer's width), got {:?}",
            path.display(),
            a.shape
        ))),
    }
}

pub fn run(adapter: &AdapterArgs, args: &MhaArgs) -> Result<(), CliError> {
    let outputs: Vec<&std::path::Path> = std::iter::once(&args.out)
        .chain(&args.weights_out)
        .map(|p| p.as_path())
        .collect();
    output::check_outputs(&outputs, true)?;
    let bytes = input::read_safetensors(&args.weights)?;
    let mut loaded = load_safetensors(&bytes, args.num_heads, args.num_kv_heads, &args.prefix)
        .map_err(|e| CliError::bad(format!("{}: {e}", args.weights.display())))?;
    match (&loaded.norm_tensor, args.post_norm, args.ignore_norm) {
        (Some(name), false, false) => {
            return Err(CliError::bad(format!(
                "{}: the file holds a post-attention LayerNorm ({name}), which this run would leave out: \
                 pass --post-norm to apply it (as the layer it came from does) or --ignore-norm to run without",
                args.weights.display()
            )))
        }
        (None, true, _) => {
            return Err(CliError::bad(format!(
                "{}: --post-norm, but the file holds no norm weights (looked for norm.weight and norm1.weight \
                 after the prefix '{}')",
                args.weights.display(),
                args.prefix
            )))
        }
        _ => {}
    }
    if args.post_norm {
        loaded.config.post_norm = Some(PostNorm { eps: args.norm_eps });
    }
    let config = loaded.config.clone();
    let dtype = args.dtype.into();
    let ctx = adapter.context()?;
    // f16 storage, or f16 products (tensor cores at --precision medium) in the GEMMs or
    // the attention: values past f16's range would turn into infinities silently.
    let tensor_cores = ctx.linear_tiling_for(DType::F32, args.precision) == LinearTiling::Coop
        || ctx
            .fused_config_for(args.tiling, DType::F32, args.precision)
            .is_ok_and(|c| c.spec().f16_products);
    let f16_why = if dtype == DType::F16 {
        Some("--dtype f16")
    } else if tensor_cores {
        Some("--precision medium on this adapter's tensor cores")
    } else {
        None
    };
    if let Some(why) = f16_why {
        for (name, w) in weight_arrays(&loaded.weights) {
            npy::check_f16_range(&args.weights, w, &format!("{why} (tensor {name})"))?;
        }
    }
    let layer = MultiHeadAttention::new(&ctx, config.clone(), &loaded.weights, dtype)?;
    let (query, mut inputs_finite) = load_sequence(&ctx, &args.query, config.embed_dim, "query", dtype, f16_why)?;
    let kv = match (&args.key, &args.value) {
        (Some(k), Some(v)) => {
            let (key, key_finite) = load_sequence(&ctx, k, config.kdim, "key", dtype, f16_why)?;
            let (value, value_finite) = load_sequence(&ctx, v, config.vdim, "value", dtype, f16_why)?;
            inputs_finite &= key_finite && value_finite;
            Some((key, value))
        }
        _ => None,
    };
    let inputs = match &kv {
        Some((key, value)) => Inputs::Cross {
            query: &query,
            key,
            value,
        },
        None => Inputs::SelfAttention(&query),
    };
    let [batch, _, len_q, _] = query.shape();
    let len_k = kv.as_ref().map_or(len_q, |(k, _)| k.shape()[2]);
    let mut attention = args.masks.options(batch)?;
    if let (Some(path), Some(pad_id)) = (&args.tokens, args.pad_id) {
        let t = npy::read_int(path)?;
        if t.shape != [batch, len_k] {
            return Err(CliError::bad(format!(
                "{}: token ids must have shape [{batch}, {len_k}] (batch, keys), got {:?}",
                path.display(),
                t.shape
            )));
        }
        attention.mask = Some(key_mask_from_tokens(&t.data, batch, pad_id)?);
    }
    attention.kernel = args.kernel.into();
    attention.tiling = args.tiling;
    attention.precision = args.precision;
    let weights = match (&args.weights_out, args.per_head) {
        (None, _) => HeadWeights::None,
        (Some(_), false) => HeadWeights::Averaged,
        (Some(_), true) => HeadWeights::PerHead,
    };
    let result = layer.forward(&ctx, inputs, &MhaOptions { attention, weights })?;

    let e = config.embed_dim;
    let out = result.out.to_f32_vec(&ctx)?;
    let weights_finite = weight_arrays(&loaded.weights).all(|(_, w)| w.iter().all(|x| x.is_finite()));
    check_finite_output(&out, inputs_finite && weights_finite)?;
    let mut files = vec![(args.out.as_path(), npy::encode_f32(&[batch, len_q, e], &out)?)];
    if let (Some(path), Some(w)) = (&args.weights_out, &result.weights) {
        let shape = w.shape();
        let shape: &[usize] = if args.per_head {
            &shape
        } else {
            &[shape[0], shape[2], shape[3]]
        };
        files.push((path.as_path(), npy::encode_f32(shape, &w.to_f32_vec(&ctx)?)?));
    }
    output::write_all(&files)
}
