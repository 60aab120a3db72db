//! `scaled_dot_product_attention` and `sdpa_backward`.

use crate::arrays::{check_lse, dtype_name, f32_array, output, read_input_or_empty, Input, Values};
use crate::context::{resolve, PyContext};
use crate::options::{parse_layout, Raw};
use crate::{value_error, OrPy};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_attention::{
    sdpa_backward as library_backward, sdpa_read, AttentionOptions, AttentionShape, Context, Error, Layout, Tensor,
};

/// q, k and v read and checked against each other, and the call's options.
pub(crate) struct Prepared<'py> {
    pub q: Input<'py>,
    pub k: Input<'py>,
    pub v: Input<'py>,
    pub options: AttentionOptions,
}

/// Reads q, k, v as PyTorch's SDPA takes them and checks what PyTorch checks before
/// the library checks the rest: one dtype, the same batch axes, and as many key/value
/// heads as query heads unless `enable_gqa`. Empty batch, head and sequence axes are
/// read (see [`Prepared::is_empty`]).
pub(crate) fn prepare<'py>(
    ctx: &Context,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    raw: &Raw<'py>,
    enable_gqa: bool,
    axes: Layout,
) -> PyResult<Prepared<'py>> {
    let q = read_input_or_empty(ctx, "query", query, axes)?;
    let k = read_input_or_empty(ctx, "key", key, axes)?;
    let v = read_input_or_empty(ctx, "value", value, axes)?;
    for other in [&k, &v] {
        if other.dtype != q.dtype {
            return Err(value_error(
                other.name,
                format!(
                    "dtype {} differs from the query's {}; q, k and v take one dtype",
                    dtype_name(other.dtype),
                    dtype_name(q.dtype)
                ),
            ));
        }
        if other.shape.len() != q.shape.len() || other.batch_axes() != q.batch_axes() {
            return Err(value_error(
                other.name,
                format!(
                    "shape {:?} does not match the query's {:?} in its batch axes (all but the last three; \
                     no broadcasting)",
                    other.shape, q.shape
                ),
            ));
        }
    }
    let (heads_q, heads_kv) = (q.logical[1], k.logical[1]);
    if heads_q != heads_kv && !enable_gqa {
        return Err(value_error(
            "key",
            format!(
                "{heads_kv} heads against the query's {heads_q}; grouped-query attention needs enable_gqa=True \
                 (as in PyTorch)"
            ),
        ));
    }
    let options = raw.to_options(ctx, &q.scores(), k.logical[2])?;
    let p = Prepared { q, k, v, options };
    if p.is_empty() {
        p.check_empty()?;
    }
    Ok(p)
}

impl Prepared<'_> {
    /// Whether the call has nothing to compute on the device: an empty batch, head or
    /// query axis (an empty result), or no keys (every row fully masked: zeros, an lse
    /// of -inf). PyTorch returns those results rather than refusing the call; so do we,
    /// without uploading anything.
    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty() || self.k.is_empty() || self.v.is_empty()
    }

    /// The library's checks that do not need the empty axes (it refuses every empty
    /// axis): q, k and v agree, head dims in range, query heads a multiple of key/value
    /// heads, one key length per batch element and none past the keys.
    fn check_empty(&self) -> PyResult<()> {
        let (q, k, v) = (self.q.logical, self.k.logical, self.v.logical);
        if let Err(e @ Error::Shape { .. }) = AttentionShape::from_qkv(q, k, v) {
            return Err(crate::to_py(e));
        }
        let (heads_q, heads_kv) = match (q[1], k[1]) {
            (0, 0) => (1, 1),
            (0, h) => (h, h),
            (h, kv) => (h, kv.max(1)),
        };
        let one = |n: usize| n.max(1);
        AttentionShape::new(one(q[0]), heads_q, heads_kv, one(q[2]), one(k[2]), q[3], v[3])
            .validate()
            .py_err()?;
        if let Some(lens) = &self.options.key_lengths {
            if lens.len() != q[0] {
                return Err(value_error(
                    "key_lengths",
                    format!("{} entries; expected one per batch element ({})", lens.len(), q[0]),
                ));
            }
            if let Some(&len) = lens.iter().find(|&&l| l as usize > k[2]) {
                return Err(value_error(
                    "key_lengths",
                    format!("entry {len} is larger than the key length {}", k[2]),
                ));
            }
        }
        Ok(())
    }
}

/// An array of `shape` (the caller's order) filled with `value`, in `dtype`.
fn filled<'py>(
    py: Python<'py>,
    dtype: wgpu_attention::DType,
    shape: &[usize],
    value: f32,
) -> PyResult<Bound<'py, PyAny>> {
    let values = vec![value; shape.iter().product()];
    output(py, Values::of(dtype, values), shape, Layout::Bhsd, Layout::Bhsd)
}

/// The shape of the attention weights `(..., Hq, Lq, Lk)`, or without `Lk` of the
/// log-sum-exp, in the caller's terms: q's batch axes, its heads unless it has none
/// (a 2-D query), the rows (and the keys).
pub(crate) fn score_shape(q: &Input<'_>, len_k: Option<usize>) -> Vec<usize> {
    let mut shape = q.batch_axes().to_vec();
    if q.shape.len() >= 3 {
        shape.push(q.logical[1]);
    }
    shape.push(q.logical[2]);
    shape.extend(len_k);
    shape
}

/// The output's shape: q's with the value's head dim last.
pub(crate) fn out_shape(q: &Input<'_>, head_dim_v: usize) -> Vec<usize> {
    let mut shape = q.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last = head_dim_v;
    }
    shape
}

/// Scaled dot-product attention, ``softmax(query @ key.T * scale + mask) @ value``,
/// with PyTorch's signature (``torch.nn.functional.scaled_dot_product_attention``) on
/// NumPy arrays, on the GPU.
///
/// Arrays are float32 or float16 (all three alike) of shape ``(..., L, E)``: ``(L, E)``,
/// ``(H, L, E)``, ``(N, H, L, E)``; further leading axes are batch axes, which q, k and
/// v share (no broadcasting). ``layout="bshd"`` reads ``(..., L, H, E)`` instead
/// (flash-attn's order) and returns the output in it. Any strides are accepted: C
/// order is read in place, as is a ``(N, L, H, E)`` array viewed as ``(N, H, L, E)``
/// (``.transpose(1, 2)``); other arrays are copied to C order first.
///
/// Args:
///     attn_mask: bool (``True`` = may attend) or float (added to the scores; ``-inf``
///         masks), broadcastable to ``(..., Hq, Lq, Lk)``. Composes with every other
///         mask (PyTorch refuses it with ``is_causal``; here they intersect).
///     dropout_p: must be 0.0 (no dropout).
///     is_causal: query i sees keys j <= i (``causal_alignment="top_left"``, PyTorch's)
///         or j <= i + Lk - Lq (``"bottom_right"``, flash-attn's and KV caches').
///     scale: multiplies the scores; default ``1 / sqrt(E)``.
///     enable_gqa: allow Hq a multiple of Hkv (query head h reads kv head
///         ``h // (Hq // Hkv)``), as PyTorch.
///     key_lengths: valid keys per batch element (keys j >= len[b] are masked).
///     window: ``(left, right)`` sliding window around each query's position; -1 or
///         None = unbounded (flash-attn's ``window_size``).
///     alibi_slopes: one slope per query head; ``-slope * |p(i) - j|`` is added.
///     softcap: scores become ``cap * tanh(s / cap)`` (Gemma 2).
///     need_weights: also return the weights ``(..., Hq, Lq, Lk)``, float32.
///     return_lse: also return the log-sum-exp per row ``(..., Hq, Lq)``, float32.
///     kernel: ``"auto"``, ``"fused"``, ``"materialized"`` or ``"decode"``.
///     precision: ``"highest"`` (f32 products) or ``"high"``/``"medium"`` (f32 inputs may
///         be multiplied in f16 on tensor cores), as ``torch.set_float32_matmul_precision``.
///     position_offset: query i sits at position ``i + position_offset`` on this call's
///         keys, for ``is_causal`` (keys past it are masked; ``causal_alignment`` is
///         then unused), ``window`` and ALiBi, in place of the alignment's offset. For
///         attention over a block of keys starting at global key ``o``, with queries at
///         global rows ``r0, r0 + 1, ...``: top-left causal takes ``r0 - o``
///         (bottom-right: ``r0 + Lk_total - Lq_total - o``); then :func:`merge_attentions`
///         combines the blocks. Not past 2^30 in size.
///     context: the ``Context`` to run on; default ``default_context()``.
///
/// Returns:
///     The output ``(..., Hq, Lq, Ev)`` in the inputs' dtype; with ``need_weights`` or
///     ``return_lse`` a tuple ``(out, weights, lse)`` of the ones asked for, in that
///     order. A fully masked row gives zeros, weights of zeros and an lse of -inf.
///     Empty batch, head or sequence axes give what PyTorch gives: empty arrays of
///     the right shapes and dtypes, or with no keys (``Lk = 0``) such fully masked rows;
///     :func:`sdpa_backward` then gives zero gradients.
///
/// Raises:
///     TypeError: an argument is not an array. ValueError: bad shapes, dtypes or
///     options, or sizes beyond the device's limits. RuntimeError: the GPU failed, or
///     the adapter lacks what the call needs (f16).
#[pyfunction]
#[pyo3(signature = (
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=false, scale=None, enable_gqa=false, *,
    causal_alignment="top_left", key_lengths=None, window=None, alibi_slopes=None, softcap=None,
    need_weights=false, return_lse=false, kernel="auto", precision="highest", layout="bhsd", position_offset=None,
    context=None
))]
#[allow(clippy::too_many_arguments)]
pub fn scaled_dot_product_attention<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    attn_mask: Option<Bound<'py, PyAny>>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    causal_alignment: &str,
    key_lengths: Option<Bound<'py, PyAny>>,
    window: Option<Bound<'py, PyAny>>,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    softcap: Option<f64>,
    need_weights: bool,
    return_lse: bool,
    kernel: &str,
    precision: &str,
    layout: &str,
    position_offset: Option<i64>,
    context: Option<Bound<'py, PyContext>>,
) -> PyResult<Bound<'py, PyAny>> {
    let ctx = resolve(py, context.as_ref())?;
    let axes = parse_layout(layout)?;
    let raw = Raw {
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        causal_alignment: causal_alignment.to_string(),
        key_lengths,
        window,
        alibi_slopes,
        softcap,
        need_weights,
        return_lse,
        kernel: kernel.to_string(),
        precision: precision.to_string(),
        position_offset,
    };
    let p = prepare(&ctx, query, key, value, &raw, enable_gqa, axes)?;
    let len_k = p.k.logical[2];
    if p.is_empty() {
        // Nothing to attend: PyTorch's empty result, or zeros where there are no keys.
        let out = filled(py, p.q.dtype, &out_shape(&p.q, p.v.logical[3]), 0.0)?;
        let count = |shape: Vec<usize>| shape.iter().product::<usize>();
        let weights = need_weights.then(|| vec![0.0; count(score_shape(&p.q, Some(len_k)))]);
        let lse = return_lse.then(|| vec![f32::NEG_INFINITY; count(score_shape(&p.q, None))]);
        return attention_result(py, out, weights, lse, &p.q, len_k);
    }
    // Uploading copies the arrays' memory into the device's buffers, with the GIL held
    // (no other thread can change an array meanwhile); the GPU work and its wait run
    // without it.
    let (qt, kt, vt) = (p.q.upload(&ctx)?, p.k.upload(&ctx)?, p.v.upload(&ctx)?);
    let outputs = py
        .detach(|| -> wgpu_attention::Result<_> {
            let (result, values) = sdpa_read(&ctx, &qt, &kt, &vt, &p.options)?;
            let weights = result.weights.as_ref().map(|w| w.to_f32_vec(&ctx)).transpose()?;
            let lse = result.lse.as_ref().map(|l| l.to_f32_vec(&ctx)).transpose()?;
            Ok((result.out.layout(), values, weights, lse))
        })
        .py_err()?;
    let (memory, values, weights, lse) = outputs;
    let out = output(
        py,
        Values::of(p.q.dtype, values),
        &out_shape(&p.q, p.v.logical[3]),
        axes,
        memory,
    )?;
    attention_result(py, out, weights, lse, &p.q, len_k)
}

/// `out` alone, or `(out, weights?, lse?)` with those asked for.
pub(crate) fn attention_result<'py>(
    py: Python<'py>,
    out: Bound<'py, PyAny>,
    weights: Option<Vec<f32>>,
    lse: Option<Vec<f32>>,
    q: &Input<'_>,
    len_k: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if weights.is_none() && lse.is_none() {
        return Ok(out);
    }
    let mut items = vec![out];
    if let Some(w) = weights {
        items.push(f32_array(py, w, &score_shape(q, Some(len_k)))?);
    }
    if let Some(l) = lse {
        items.push(f32_array(py, l, &score_shape(q, None))?);
    }
    Ok(PyTuple::new(py, items)?.into_any())
}

/// The gradients of :func:`scaled_dot_product_attention` with respect to query, key
/// and value, given its output ``out``, its log-sum-exp ``lse`` (``return_lse=True``)
/// and the output's gradient ``d_out`` (``out``'s shape and dtype).
///
/// Pass the forward's options: every option with a gradient meaning is honoured
/// (scale, causal in both alignments, ``position_offset``, key lengths, masks, window, ALiBi, soft cap,
/// GQA: dk and dv are summed over the query heads sharing a kv head). Masks get no
/// gradient.
///
/// ``lse`` is read as float32 ``(..., Hq, Lq)``. ``+inf`` is refused, and NaN where
/// ``out``'s row holds no NaN (no forward gives either; a forward over NaN inputs gives
/// NaN in both, and NaN gradients then, as PyTorch does). ``-inf`` is a fully masked
/// row's and gives its query zero gradient.
///
/// Returns:
///     ``(dq, dk, dv)``, each the shape and dtype of its input.
///
/// Raises:
///     ValueError: shapes or dtypes that differ from the forward's, or an ``lse``
///     no forward gives (above).
#[pyfunction]
#[pyo3(signature = (
    query, key, value, out, lse, d_out, attn_mask=None, dropout_p=0.0, is_causal=false, scale=None,
    enable_gqa=false, *, causal_alignment="top_left", key_lengths=None, window=None, alibi_slopes=None,
    softcap=None, kernel="auto", precision="highest", layout="bhsd", position_offset=None, context=None
))]
#[allow(clippy::too_many_arguments)]
pub fn sdpa_backward<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    d_out: &Bound<'py, PyAny>,
    attn_mask: Option<Bound<'py, PyAny>>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    causal_alignment: &str,
    key_lengths: Option<Bound<'py, PyAny>>,
    window: Option<Bound<'py, PyAny>>,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    softcap: Option<f64>,
    kernel: &str,
    precision: &str,
    layout: &str,
    position_offset: Option<i64>,
    context: Option<Bound<'py, PyContext>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let ctx = resolve(py, context.as_ref())?;
    let axes = parse_layout(layout)?;
    let raw = Raw {
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        causal_alignment: causal_alignment.to_string(),
        key_lengths,
        window,
        alibi_slopes,
        softcap,
        need_weights: false,
        return_lse: false,
        kernel: kernel.to_string(),
        precision: precision.to_string(),
        position_offset,
    };
    let p = prepare(&ctx, query, key, value, &raw, enable_gqa, axes)?;
    let want = out_shape(&p.q, p.v.logical[3]);
    let read_like_out = |name: &'static str, obj: &Bound<'py, PyAny>| -> PyResult<Input<'py>> {
        let input = read_input_or_empty(&ctx, name, obj, axes)?;
        if input.shape != want || input.dtype != p.q.dtype {
            return Err(value_error(
                name,
                format!(
                    "shape {:?} {} differs from the forward output's {want:?} {}",
                    input.shape,
                    dtype_name(input.dtype),
                    dtype_name(p.q.dtype)
                ),
            ));
        }
        Ok(input)
    };
    let out = read_like_out("out", out)?;
    let d_out = read_like_out("d_out", d_out)?;
    let lse_shape = score_shape(&p.q, None);
    let lse = crate::arrays::as_array("lse", lse)?;
    if lse.shape() != lse_shape.as_slice() {
        return Err(value_error(
            "lse",
            format!(
                "shape {:?} differs from the forward's log-sum-exp {lse_shape:?} (return_lse=True)",
                lse.shape()
            ),
        ));
    }
    let lse = py
        .import("numpy")?
        .call_method1("ascontiguousarray", (lse, "float32"))?
        .cast_into::<PyArrayDyn<f32>>()?;
    let lse = lse.readonly();
    let lse = lse.as_slice().map_err(|e| value_error("lse", e))?;
    // NaN where the forward gave it, over NaN inputs: out's row is NaN too, and the
    // gradients are NaN whatever the lse (as PyTorch's are).
    check_lse(
        "lse",
        "lse",
        lse,
        |row| out.row_has_nan(row),
        ", where out's row holds no NaN",
    )?;
    if p.is_empty() {
        // No pair of a query and a key: every gradient is zero (empty where its input is).
        let items = [&p.q, &p.k, &p.v]
            .into_iter()
            .map(|input| filled(py, input.dtype, &input.shape, 0.0))
            .collect::<PyResult<Vec<_>>>()?;
        return PyTuple::new(py, items);
    }
    let [b, hq, lq, _] = p.q.logical;
    let lse_tensor = Tensor::from_f32(&ctx, [b, hq, lq, 1], Layout::Bhsd, lse).py_err()?;
    let (qt, kt, vt) = (p.q.upload(&ctx)?, p.k.upload(&ctx)?, p.v.upload(&ctx)?);
    let (ot, dot) = (out.upload(&ctx)?, d_out.upload(&ctx)?);
    let grads = py
        .detach(|| -> wgpu_attention::Result<_> {
            let g = library_backward(&ctx, &qt, &kt, &vt, &ot, &lse_tensor, &dot, &p.options)?;
            let read = |t: &Tensor| t.to_f32_vec(&ctx).map(|v| (v, t.layout()));
            Ok([read(&g.dq)?, read(&g.dk)?, read(&g.dv)?])
        })
        .py_err()?;
    let [dq, dk, dv] = grads;
    let items = [(dq, &p.q), (dk, &p.k), (dv, &p.v)]
        .into_iter()
        .map(|((values, memory), input)| output(py, Values::of(input.dtype, values), &input.shape, axes, memory))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, items)
}
