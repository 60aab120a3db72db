//! The JavaScript API's computations: `attention` on typed arrays and `mha` with
//! weights from a `.safetensors` buffer. Each reads its request, runs the library's
//! async entry point and returns plain vectors; `lib.rs` turns them into JS values.

use crate::request::{Data, Request};
use half::f16;
use wgpu_attention::key_mask_from_tokens;
use wgpu_attention::mha::{load_safetensors, PostNorm};
use wgpu_attention::{
    sdpa_read_async, AttentionOptions, Context, DType, Error, HeadWeights, Inputs, Layout, MhaOptions,
    MultiHeadAttention, Result, Tensor,
};

/// Largest size or count a request may give (what u32 index math can address).
const MAX_COUNT: f64 = u32::MAX as f64;

/// An output as JavaScript gets it: f32 values, or f16 bit patterns for f16 inputs.
pub struct Output {
    pub out: Data,
    pub out_shape: Vec<usize>,
    /// f32 attention weights, when asked for.
    pub weights: Option<(Vec<f32>, Vec<usize>)>,
}

/// `attention({q, k, v, shape: [B, Hq, Hkv, Lq, Lk, D, Dv], causal, keyLengths, mask,
/// maskShape, scale, kernel, tiling, returnWeights, averageWeights})` on BHSD data.
pub async fn attention(ctx: &Context, request: Request) -> Result<Output> {
    let [b, hq, hkv, lq, lk, d, dv] = request.counts_exact("shape", MAX_COUNT, "[B, Hq, Hkv, Lq, Lk, D, Dv]")?;
    let (q, k, v) = (request.data("q")?, request.data("k")?, request.data("v")?);
    let options = AttentionOptions {
        causal: request.causal()?,
        key_lengths: request.key_lengths()?,
        mask: request.mask()?,
        scale: request.number("scale")?.map(|x| x as f32),
        kernel: request.kernel()?,
        tiling: request.tiling()?,
        need_weights: request.flag("returnWeights")? || request.flag("averageWeights")?,
        average_weights: request.flag("averageWeights")?,
        ..Default::default()
    };
    let qt = upload(ctx, "q", [b, hq, lq, d], q).await?;
    let kt = upload(ctx, "k", [b, hkv, lk, d], k).await?;
    let vt = upload(ctx, "v", [b, hkv, lk, dv], v).await?;
    // The output comes back in the attention's own submission.
    let (result, values) = sdpa_read_async(ctx, &qt, &kt, &vt, &options).await?;
    let out = match result.out.dtype() {
        DType::F32 => Data::F32(values),
        // Exact: the values were f16 on the GPU.
        DType::F16 => Data::F16(values.iter().map(|&x| f16::from_f32(x).to_bits()).collect()),
    };
    let weights = match &result.weights {
        Some(w) => Some((w.to_f32_vec_async(ctx).await?, w.shape().to_vec())),
        None => None,
    };
    Ok(Output {
        out,
        out_shape: vec![b, hq, lq, dv],
        weights,
    })
}

/// Uploads one input; f32 and f16 inputs may not be mixed (the first decides).
async fn upload(ctx: &Context, name: &str, shape: [usize; 4], data: Data) -> Result<Tensor> {
    check_len(name, shape, data.len())?;
    match data {
        Data::F32(values) => Tensor::from_f32_async(ctx, shape, Layout::Bhsd, &values).await,
        Data::F16(bits) => {
            let values: Vec<f16> = bits.into_iter().map(f16::from_bits).collect();
            Tensor::from_f16_async(ctx, shape, Layout::Bhsd, &values).await
        }
    }
}

/// Refuses `len` values for `shape`, naming the request field.
fn check_len(name: &str, shape: [usize; 4], len: usize) -> Result<()> {
    let expected = shape.iter().try_fold(1usize, |n, &x| n.checked_mul(x));
    if expected == Some(len) {
        return Ok(());
    }
    Err(Error::invalid(
        name,
        format!(
            "holds {len} values; shape {shape:?} needs {}",
            expected.map_or("more than can be addressed".into(), |n| n.to_string())
        ),
    ))
}

/// `mha({safetensors, numHeads, numKvHeads, prefix, postNorm, normEps, query, key,
/// value, shape: [B, Lq, Lk], causal, keyLengths, mask, maskShape, tokens, padId,
/// dtype, returnWeights: "averaged" | "per-head"})`: one multi-head attention layer.
/// The sequences are batch-first `Float32Array`s; `key`/`value` only for
/// cross-attention; `tokens` (`[B, Lk]` ids) masks the keys equal to `padId`.
pub async fn mha(ctx: &Context, request: Request) -> Result<Output> {
    let bytes = request.bytes("safetensors")?;
    let heads = request
        .whole("numHeads", 1)?
        .ok_or_else(|| Error::invalid("numHeads", "is missing"))?;
    let kv_heads = request.whole("numKvHeads", 1)?;
    let prefix = request.string("prefix")?.unwrap_or_default();
    let mut loaded = load_safetensors(&bytes, heads, kv_heads, &prefix)?;
    if request.flag("postNorm")? {
        let eps = request.number("normEps")?.unwrap_or(1e-5) as f32;
        loaded.config.post_norm = Some(PostNorm { eps });
    }
    let config = loaded.config;
    let dtype = match request.string("dtype")?.as_deref() {
        None | Some("f32") => DType::F32,
        Some("f16") => DType::F16,
        Some(other) => return Err(Error::invalid("dtype", format!("must be f32 or f16; got \"{other}\""))),
    };
    let layer = MultiHeadAttention::new(ctx, config.clone(), &loaded.weights, dtype)?;
    let [batch, len_q, len_k] = request.counts_exact("shape", MAX_COUNT, "[B, Lq, Lk]")?;
    // Batch-first sequences `[B, 1, len, width]`, converted to the layer's dtype.
    let upload_sequence = |name: &'static str, data: Vec<f32>, len: usize, width: usize| async move {
        let shape = [batch, 1, len, width];
        check_len(name, shape, data.len())?;
        Tensor::from_f32_as_async(ctx, shape, Layout::Bhsd, dtype, &data).await
    };
    let query = request
        .f32s("query")?
        .ok_or_else(|| Error::invalid("query", "is missing"))?;
    let query = upload_sequence("query", query, len_q, config.embed_dim).await?;
    let cross = match (request.f32s("key")?, request.f32s("value")?) {
        (Some(key), Some(value)) => Some((
            upload_sequence("key", key, len_k, config.kdim).await?,
            upload_sequence("value", value, len_k, config.vdim).await?,
        )),
        (None, None) if len_k == len_q => None,
        (None, None) => {
            return Err(Error::invalid(
                "shape",
                "self-attention (no key and value given) needs Lk equal to Lq",
            ))
        }
        _ => return Err(Error::invalid("key", "key and value come together")),
    };
    let inputs = match &cross {
        Some((key, value)) => Inputs::Cross {
            query: &query,
            key,
            value,
        },
        None => Inputs::SelfAttention(&query),
    };
    let mut attention = AttentionOptions {
        causal: request.causal()?,
        key_lengths: request.key_lengths()?,
        mask: request.mask()?,
        kernel: request.kernel()?,
        ..Default::default()
    };
    if let Some(tokens) = request.counts("tokens", MAX_COUNT)? {
        if attention.mask.is_some() {
            return Err(Error::invalid("tokens", "give either tokens or a mask, not both"));
        }
        if tokens.len() != batch * len_k {
            return Err(Error::invalid(
                "tokens",
                format!("must hold B·Lk = {} ids; got {}", batch * len_k, tokens.len()),
            ));
        }
        let pad = request
            .number("padId")?
            .filter(|p| p.fract() == 0.0)
            .ok_or_else(|| Error::invalid("padId", "a whole number is needed with tokens"))?;
        let tokens: Vec<i64> = tokens.into_iter().map(|t| t as i64).collect();
        attention.mask = Some(key_mask_from_tokens(&tokens, batch, pad as i64)?);
    }
    let weights = match request.string("returnWeights")?.as_deref() {
        None => HeadWeights::None,
        Some("averaged") => HeadWeights::Averaged,
        Some("per-head") => HeadWeights::PerHead,
        Some(other) => {
            return Err(Error::invalid(
                "returnWeights",
                format!("must be \"averaged\", \"per-head\" or absent; got \"{other}\""),
            ))
        }
    };
    let result = layer
        .forward_async(ctx, inputs, &MhaOptions { attention, weights })
        .await?;
    let out = Data::F32(result.out.to_f32_vec_async(ctx).await?);
    let weights = match &result.weights {
        Some(w) => Some((w.to_f32_vec_async(ctx).await?, w.shape().to_vec())),
        None => None,
    };
    Ok(Output {
        out,
        out_shape: vec![batch, len_q, config.embed_dim],
        weights,
    })
}
