//! `MultiHeadAttention`: PyTorch's `nn.MultiheadAttention` (batch-first, plus GQA and
//! a post-norm) with its weights on the device, forward and backward.

use crate::arrays::Scores;
use crate::arrays::{
    as_array, check_f16_fits, check_f16_range, check_size, dtype_name, f32_array, output, parse_dtype, read_input,
    Input, Values,
};
use crate::context::{resolve, PyContext};
use crate::options::Raw;
use crate::{value_error, OrPy};
use half::f16;
use numpy::{PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use safetensors::tensor::{Dtype, TensorView};
use std::sync::Arc;
use wgpu_attention::mha::PostNorm;
use wgpu_attention::{
    load_safetensors, AttentionOptions, Context, DType, HeadWeights, Inputs, Layout, MhaConfig, MhaOptions, MhaWeights,
    MultiHeadAttention, Tensor,
};

/// A dict of arrays (a `state_dict`, tensors converted with `.numpy()`, or anything
/// `numpy.asarray` takes) as the bytes of a `.safetensors` file, so the library's one
/// loader reads it with every naming and check it has.
fn safetensors_bytes(dict: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let py = dict.py();
    let np = py.import("numpy")?;
    let items = dict.call_method0("items")?;
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for item in items.try_iter()? {
        let (name, value): (String, Bound<'_, PyAny>) = item?
            .extract()
            .map_err(|_| value_error("weights", "keys must be strings (tensor names)"))?;
        let array = np.call_method1("ascontiguousarray", (value,)).map_err(|e| {
            value_error(
                "weights",
                format!("'{name}' is not an array NumPy can read ({e}); use tensor.numpy()"),
            )
        })?;
        let untyped = as_array(&name, &array)?;
        let shape = untyped.shape().to_vec();
        let kind = untyped.dtype();
        let (dtype, bytes) = if kind.is_equiv_to(&numpy::dtype::<f32>(py)) {
            let a = array.cast_into::<PyArrayDyn<f32>>()?.to_vec()?;
            (Dtype::F32, a.iter().flat_map(|x| x.to_le_bytes()).collect())
        } else if kind.is_equiv_to(&numpy::dtype::<f16>(py)) {
            let a = array.cast_into::<PyArrayDyn<f16>>()?.to_vec()?;
            (Dtype::F16, a.iter().flat_map(|x| x.to_le_bytes()).collect())
        } else if kind.is_equiv_to(&numpy::dtype::<f64>(py)) {
            let a = array.cast_into::<PyArrayDyn<f64>>()?.to_vec()?;
            (Dtype::F64, a.iter().flat_map(|x| x.to_le_bytes()).collect())
        } else {
            return Err(value_error(
                "weights",
                format!(
                    "'{name}' has dtype {}; float32, float16 or float64 arrays are read",
                    kind.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into())
                ),
            ));
        };
        owned.push((name, dtype, shape, bytes));
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
                .map_err(|e| value_error("weights", format!("'{name}': {e}")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    safetensors::tensor::serialize(views, None).map_err(|e| value_error("weights", e))
}

/// A multi-head attention layer (``nn.MultiheadAttention`` with ``batch_first=True``,
/// plus grouped-query heads and an optional post-norm ``LayerNorm(attention + query)``)
/// whose weights live on the device.
///
/// ``MultiHeadAttention(weights, num_heads, num_kv_heads=None, *, prefix="",
/// post_norm=None, norm_eps=1e-5, dtype="float32", context=None)``: ``weights`` is a
/// ``.safetensors`` path or a dict of arrays, e.g. a layer's ``state_dict()`` with each
/// tensor's ``.numpy()``, in PyTorch's names (``in_proj_weight``, or
/// ``q_proj_weight``/..., and ``out_proj.*``) or Hugging Face's (``q_proj.weight``/...,
/// ``o_proj.*``), after ``prefix``, or under ``prefix + "self_attn."``. A file that also
/// holds the layer's norm (``norm.*``, ``norm1.*``) needs ``post_norm=True`` (apply
/// it, as ``nn.TransformerEncoderLayer`` does) or ``False`` (leave it out).
///
/// ``forward`` and ``backward`` take batch-first sequences ``(N, L, E)`` (or ``(L, E)``),
/// float32 or float16 (converted to the layer's dtype; with ``dtype="float16"`` inputs and
/// weights beyond float16's range, ``|x| > 65504``, are refused with ``ValueError``).
#[pyclass(name = "MultiHeadAttention", module = "wgpu_attention")]
pub struct PyMultiHeadAttention {
    ctx: Arc<Context>,
    layer: MultiHeadAttention,
    config: MhaConfig,
    dtype: DType,
}

/// One batch-first sequence argument, uploaded as `[B, 1, L, width]`.
struct Sequence<'py> {
    input: Input<'py>,
    /// Whether it came without a batch axis `(L, E)`.
    unbatched: bool,
}

fn sequence<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    width: usize,
    dtype: DType,
) -> PyResult<Sequence<'py>> {
    let array = as_array(name, obj)?;
    crate::arrays::dtype_of(name, &array)?;
    let shape = array.shape().to_vec();
    let (batch, len) = match shape[..] {
        [len, w] if w == width => (1, len),
        [batch, len, w] if w == width => (batch, len),
        _ => {
            return Err(value_error(
                name,
                format!("shape {shape:?} is not (N, L, {width}) or (L, {width}) (batch first)"),
            ))
        }
    };
    check_size(ctx, name, &shape, dtype.size())?;
    check_f16_fits(name, &array, dtype, "the layer's")?;
    // C order as [B, 1, L, width] (a view where the array is C-ordered already).
    let np = obj.py().import("numpy")?;
    let contiguous = np
        .call_method1("ascontiguousarray", (array, dtype_name(dtype)))?
        .call_method1("reshape", ((batch, 1, len, width),))?;
    let input = read_input(ctx, name, &contiguous, Layout::Bhsd)?;
    Ok(Sequence {
        input,
        unbatched: shape.len() == 2,
    })
}

/// The query as read, the key and value tensors of a cross-attention call, the query
/// tensor and the attention options.
type Prepared<'py> = (Sequence<'py>, Option<(Tensor, Tensor)>, Tensor, AttentionOptions);

/// A gradient read back: its name, values and tensor shape.
type NamedValues = (&'static str, (Vec<f32>, [usize; 4]));

impl PyMultiHeadAttention {
    /// The uploaded inputs and the options of a forward or backward call.
    #[allow(clippy::too_many_arguments)]
    fn prepare<'py>(
        &self,
        query: &Bound<'py, PyAny>,
        key: Option<Bound<'py, PyAny>>,
        value: Option<Bound<'py, PyAny>>,
        attn_mask: Option<Bound<'py, PyAny>>,
        is_causal: bool,
        key_lengths: Option<Bound<'py, PyAny>>,
        scale: Option<f64>,
        kernel: &str,
    ) -> PyResult<Prepared<'py>> {
        let c = &self.config;
        let q = sequence(&self.ctx, "query", query, c.embed_dim, self.dtype)?;
        let cross = match (key, value) {
            (None, None) => None,
            (Some(k), Some(v)) => {
                let k = sequence(&self.ctx, "key", &k, c.kdim, self.dtype)?;
                let v = sequence(&self.ctx, "value", &v, c.vdim, self.dtype)?;
                if k.unbatched != q.unbatched || k.input.logical[0] != q.input.logical[0] {
                    return Err(value_error("key", "batch differs from the query's"));
                }
                Some((k, v))
            }
            _ => {
                return Err(value_error(
                    "key",
                    "key and value come together (or neither: self-attention)",
                ))
            }
        };
        let len_k = cross.as_ref().map_or(q.input.logical[2], |(k, _)| k.input.logical[2]);
        let scores = Scores {
            batch_axes: if q.unbatched { vec![] } else { vec![q.input.logical[0]] },
            heads: Some(c.num_heads),
            len_q: q.input.logical[2],
        };
        let options = Raw {
            attn_mask,
            dropout_p: 0.0,
            is_causal,
            scale,
            causal_alignment: "top_left".into(),
            key_lengths,
            window: None,
            alibi_slopes: None,
            softcap: None,
            need_weights: false,
            return_lse: false,
            kernel: kernel.to_string(),
            precision: "highest".into(),
            position_offset: None,
        }
        .to_options(&self.ctx, &scores, len_k)?;
        let qt = q.input.upload(&self.ctx)?;
        let kv = cross
            .map(|(k, v)| Ok::<_, PyErr>((k.input.upload(&self.ctx)?, v.input.upload(&self.ctx)?)))
            .transpose()?;
        Ok((q, kv, qt, options))
    }
}

/// `[B, 1, L, W]` values as `(B, L, W)`, or `(L, W)` for an unbatched call.
fn sequence_out<'py>(
    py: Python<'py>,
    values: Values,
    [b, _, l, w]: [usize; 4],
    unbatched: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<usize> = if unbatched { vec![l, w] } else { vec![b, l, w] };
    output(py, values, &shape, Layout::Bhsd, Layout::Bhsd)
}

#[pymethods]
impl PyMultiHeadAttention {
    #[new]
    #[pyo3(signature = (weights, num_heads, num_kv_heads=None, *, prefix="", post_norm=None, norm_eps=1e-5,
        dtype="float32", context=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        weights: &Bound<'_, PyAny>,
        num_heads: usize,
        num_kv_heads: Option<usize>,
        prefix: &str,
        post_norm: Option<bool>,
        norm_eps: f64,
        dtype: &str,
        context: Option<Bound<'_, PyContext>>,
    ) -> PyResult<Self> {
        let ctx = resolve(py, context.as_ref())?;
        let dtype = parse_dtype(dtype)?;
        let bytes = if weights.hasattr("items")? {
            safetensors_bytes(weights)?
        } else {
            let path: std::path::PathBuf = weights
                .extract()
                .map_err(|_| value_error("weights", "must be a .safetensors path or a dict of arrays"))?;
            std::fs::read(&path).map_err(|e| {
                crate::to_py(wgpu_attention::Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                )))
            })?
        };
        let mut loaded = load_safetensors(&bytes, num_heads, num_kv_heads, prefix).py_err()?;
        match (&loaded.norm_tensor, post_norm) {
            (Some(name), None) => {
                return Err(value_error(
                    "post_norm",
                    format!(
                        "the weights hold a post-attention LayerNorm ({name}): pass post_norm=True to apply it \
                         (as the layer it came from does) or post_norm=False to run without"
                    ),
                ))
            }
            (None, Some(true)) => {
                return Err(value_error(
                    "post_norm",
                    format!("True, but the weights hold no norm (norm.weight or norm1.weight after prefix '{prefix}')"),
                ))
            }
            _ => {}
        }
        if post_norm == Some(true) {
            if !(norm_eps.is_finite() && norm_eps > 0.0) {
                return Err(value_error(
                    "norm_eps",
                    format!("{norm_eps} is not a finite number above 0"),
                ));
            }
            loaded.config.post_norm = Some(PostNorm { eps: norm_eps as f32 });
        }
        if dtype == DType::F16 {
            check_f16_weights(&loaded.weights, loaded.config.post_norm.is_some())?;
        }
        let config = loaded.config.clone();
        let layer = py
            .detach(|| MultiHeadAttention::new(&ctx, config.clone(), &loaded.weights, dtype))
            .py_err()?;
        Ok(PyMultiHeadAttention {
            ctx,
            layer,
            config,
            dtype,
        })
    }

    /// Runs the layer. ``query`` ``(N, Lq, E)``; ``key`` ``(N, Lk, kdim)`` and ``value``
    /// ``(N, Lk, vdim)`` for cross-attention, else self-attention. ``attn_mask``
    /// (broadcastable to ``(N, H, Lq, Lk)``) takes SDPA's convention: bool ``True`` =
    /// may attend (``nn.MultiheadAttention``'s bool mask means the opposite), float =
    /// added. ``key_lengths`` masks padding at the end of each key sequence.
    ///
    /// Returns the output ``(N, Lq, E)`` in the layer's dtype; with ``need_weights`` a
    /// tuple ``(out, weights)``, the weights float32 ``(N, Lq, Lk)`` averaged over
    /// heads (``average_attn_weights=True``) or ``(N, H, Lq, Lk)``.
    #[pyo3(signature = (query, key=None, value=None, attn_mask=None, is_causal=false, *, key_lengths=None,
        need_weights=false, average_attn_weights=true, scale=None, kernel="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        key: Option<Bound<'py, PyAny>>,
        value: Option<Bound<'py, PyAny>>,
        attn_mask: Option<Bound<'py, PyAny>>,
        is_causal: bool,
        key_lengths: Option<Bound<'py, PyAny>>,
        need_weights: bool,
        average_attn_weights: bool,
        scale: Option<f64>,
        kernel: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (q, kv, qt, attention) =
            self.prepare(query, key, value, attn_mask, is_causal, key_lengths, scale, kernel)?;
        let weights = match (need_weights, average_attn_weights) {
            (false, _) => HeadWeights::None,
            (true, true) => HeadWeights::Averaged,
            (true, false) => HeadWeights::PerHead,
        };
        let options = MhaOptions { attention, weights };
        let inputs = match &kv {
            Some((key, value)) => Inputs::Cross { query: &qt, key, value },
            None => Inputs::SelfAttention(&qt),
        };
        let (ctx, layer) = (&*self.ctx, &self.layer);
        let (out_shape, out, weights) = py
            .detach(|| -> wgpu_attention::Result<_> {
                let result = layer.forward(ctx, inputs, &options)?;
                let out = result.out.to_f32_vec(ctx)?;
                let weights = result
                    .weights
                    .as_ref()
                    .map(|w| w.to_f32_vec(ctx).map(|v| (v, w.shape())))
                    .transpose()?;
                Ok((result.out.shape(), out, weights))
            })
            .py_err()?;
        let out = sequence_out(py, Values::of(self.dtype, out), out_shape, q.unbatched)?;
        let Some((w, [b, h, lq, lk])) = weights else {
            return Ok(out);
        };
        let mut shape = if q.unbatched { vec![] } else { vec![b] };
        if h != 1 || !average_attn_weights {
            shape.push(h);
        }
        shape.extend([lq, lk]);
        Ok(PyTuple::new(py, [out, f32_array(py, w, &shape)?])?.into_any())
    }

    /// The gradients of ``forward(query, key, value, ...)`` given the output's gradient
    /// ``d_out`` (the output's shape), with the forward's options. Returns a dict of
    /// float32 arrays: ``"query"`` (for self-attention the input's whole gradient),
    /// ``"key"`` and ``"value"`` (cross-attention), and ``"q_proj.weight"``,
    /// ``"q_proj.bias"``, ``"k_proj.*"``, ``"v_proj.*"``, ``"out_proj.*"`` (weights
    /// ``(out_features, in_features)`` as ``nn.Linear``; biases where the layer has
    /// them) and ``"norm.weight"``, ``"norm.bias"`` with a post-norm.
    #[pyo3(signature = (d_out, query, key=None, value=None, attn_mask=None, is_causal=false, *, key_lengths=None,
        scale=None, kernel="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        d_out: &Bound<'py, PyAny>,
        query: &Bound<'py, PyAny>,
        key: Option<Bound<'py, PyAny>>,
        value: Option<Bound<'py, PyAny>>,
        attn_mask: Option<Bound<'py, PyAny>>,
        is_causal: bool,
        key_lengths: Option<Bound<'py, PyAny>>,
        scale: Option<f64>,
        kernel: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (q, kv, qt, attention) =
            self.prepare(query, key, value, attn_mask, is_causal, key_lengths, scale, kernel)?;
        let d = sequence(&self.ctx, "d_out", d_out, self.config.embed_dim, self.dtype)?;
        if d.input.logical != [q.input.logical[0], 1, q.input.logical[2], self.config.embed_dim] {
            return Err(value_error(
                "d_out",
                format!(
                    "shape {:?} differs from the output's (the query's with E = {})",
                    d.input.shape, self.config.embed_dim
                ),
            ));
        }
        let dt = d.input.upload(&self.ctx)?;
        let options = MhaOptions {
            attention,
            weights: HeadWeights::None,
        };
        let inputs = match &kv {
            Some((key, value)) => Inputs::Cross { query: &qt, key, value },
            None => Inputs::SelfAttention(&qt),
        };
        let (ctx, layer) = (&*self.ctx, &self.layer);
        let read = |t: &Tensor| t.to_f32_vec(ctx).map(|v| (v, t.shape()));
        let grads = py
            .detach(|| -> wgpu_attention::Result<Vec<NamedValues>> {
                let g = layer.backward(ctx, inputs, &dt, &options)?;
                let mut all = vec![("query", read(&g.d_query)?)];
                if let Some(t) = &g.d_key {
                    all.push(("key", read(t)?));
                }
                if let Some(t) = &g.d_value {
                    all.push(("value", read(t)?));
                }
                for (name, w) in [("q_proj", &g.q), ("k_proj", &g.k), ("v_proj", &g.v), ("out_proj", &g.o)] {
                    all.push((weight_name(name), read(&w.weight)?));
                    if let Some(b) = &w.bias {
                        all.push((bias_name(name), read(b)?));
                    }
                }
                if let Some(n) = &g.norm {
                    all.push(("norm.weight", read(&n.weight)?));
                    all.push(("norm.bias", read(&n.bias)?));
                }
                Ok(all)
            })
            .py_err()?;
        let dict = PyDict::new(py);
        for (name, (values, shape)) in grads {
            let array = match name {
                "query" | "key" | "value" => sequence_out(py, Values::F32(values), shape, q.unbatched)?,
                _ if name.ends_with(".weight") && !name.starts_with("norm") => {
                    f32_array(py, values, &[shape[2], shape[3]])?
                }
                _ => f32_array(py, values, &[shape[3]])?,
            };
            dict.set_item(name, array)?;
        }
        Ok(dict)
    }

    /// Model width ``E``.
    #[getter]
    fn embed_dim(&self) -> usize {
        self.config.embed_dim
    }

    /// Query heads.
    #[getter]
    fn num_heads(&self) -> usize {
        self.config.num_heads
    }

    /// Key/value heads (fewer than ``num_heads`` for grouped-query attention).
    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.config.num_kv_heads
    }

    /// ``"float32"`` or ``"float16"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.dtype)
    }

    fn __repr__(&self) -> String {
        let c = &self.config;
        format!(
            "MultiHeadAttention(embed_dim={}, num_heads={}, num_kv_heads={}, kdim={}, vdim={}, bias={}, post_norm={}, dtype={:?})",
            c.embed_dim,
            c.num_heads,
            c.num_kv_heads,
            c.kdim,
            c.vdim,
            c.bias,
            c.post_norm.is_some(),
            dtype_name(self.dtype)
        )
    }
}

/// Refuses weights float16 cannot hold (the layer converts them on upload), naming the
/// tensor as `backward` names its gradient; the norm's only where it is applied (and
/// so uploaded).
fn check_f16_weights(weights: &MhaWeights, with_norm: bool) -> PyResult<()> {
    for (name, p) in [
        ("q_proj", &weights.q),
        ("k_proj", &weights.k),
        ("v_proj", &weights.v),
        ("out_proj", &weights.o),
    ] {
        check_f16_range(
            &format!("weights '{}'", weight_name(name)),
            p.weight.iter().copied(),
            "the layer's",
        )?;
        if let Some(b) = &p.bias {
            check_f16_range(
                &format!("weights '{}'", bias_name(name)),
                b.iter().copied(),
                "the layer's",
            )?;
        }
    }
    if let (Some(n), true) = (&weights.norm, with_norm) {
        check_f16_range("weights 'norm.weight'", n.weight.iter().copied(), "the layer's")?;
        check_f16_range("weights 'norm.bias'", n.bias.iter().copied(), "the layer's")?;
    }
    Ok(())
}

fn weight_name(projection: &str) -> &'static str {
    match projection {
        "q_proj" => "q_proj.weight",
        "k_proj" => "k_proj.weight",
        "v_proj" => "v_proj.weight",
        _ => "out_proj.weight",
    }
}

fn bias_name(projection: &str) -> &'static str {
    match projection {
        "q_proj" => "q_proj.bias",
        "k_proj" => "k_proj.bias",
        "v_proj" => "v_proj.bias",
        _ => "out_proj.bias",
    }
}
