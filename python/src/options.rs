//! The keyword arguments every attention call takes, as the library's
//! `AttentionOptions`.

use crate::arrays::{as_array, Scores};
use crate::value_error;
use numpy::{PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use wgpu_attention::{AttentionOptions, CausalAlignment, Context, KernelChoice, Layout, Mask, Precision, Window};

/// Largest query length + key length + |position_offset|: the library's
/// `problem::MAX_POSITIONS` (not exported), positions being i32 in the kernels.
const MAX_POSITIONS: usize = 1 << 30;

/// The options of one call as Python gave them.
pub(crate) struct Raw<'py> {
    pub attn_mask: Option<Bound<'py, PyAny>>,
    pub dropout_p: f64,
    pub is_causal: bool,
    pub scale: Option<f64>,
    pub causal_alignment: String,
    pub key_lengths: Option<Bound<'py, PyAny>>,
    pub window: Option<Bound<'py, PyAny>>,
    pub alibi_slopes: Option<Bound<'py, PyAny>>,
    pub softcap: Option<f64>,
    pub need_weights: bool,
    pub return_lse: bool,
    pub kernel: String,
    pub precision: String,
    /// Queries' aligned position `i + offset` (`AttentionOptions::position_offset`).
    pub position_offset: Option<i64>,
}

/// `"bhsd"` or `"bshd"`.
pub(crate) fn parse_layout(text: &str) -> PyResult<Layout> {
    match text.trim().to_lowercase().as_str() {
        "bhsd" => Ok(Layout::Bhsd),
        "bshd" => Ok(Layout::Bshd),
        _ => Err(value_error(
            "layout",
            format!("'{text}' is not \"bhsd\" ((..., H, L, E), PyTorch's) or \"bshd\" ((..., L, H, E), flash-attn's)"),
        )),
    }
}

fn parse_kernel(text: &str) -> PyResult<KernelChoice> {
    match text.trim().to_lowercase().as_str() {
        "auto" => Ok(KernelChoice::Auto),
        "fused" => Ok(KernelChoice::Fused),
        "materialized" => Ok(KernelChoice::Materialized),
        "decode" => Ok(KernelChoice::Decode),
        _ => Err(value_error(
            "kernel",
            format!("'{text}' is not one of auto, fused, materialized, decode"),
        )),
    }
}

fn parse_alignment(text: &str) -> PyResult<CausalAlignment> {
    match text.trim().to_lowercase().replace('-', "_").as_str() {
        "top_left" => Ok(CausalAlignment::TopLeft),
        "bottom_right" => Ok(CausalAlignment::BottomRight),
        _ => Err(value_error(
            "causal_alignment",
            format!("'{text}' is not \"top_left\" (PyTorch's is_causal) or \"bottom_right\" (flash-attn's)"),
        )),
    }
}

/// A Python int as a size, or a `ValueError` naming `what`.
fn whole(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    obj.extract::<i64>()
        .map_err(|_| value_error(what, format!("{} is not an integer", repr(obj))))
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// A sequence (list, tuple, 1-D array) as a vector, each element read by `item`.
fn sequence<T>(
    what: &str,
    obj: &Bound<'_, PyAny>,
    mut item: impl FnMut(&Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(value_error(what, "must be a sequence of numbers, not a string"));
    }
    let iter = obj
        .try_iter()
        .map_err(|_| value_error(what, format!("{} is not a sequence", repr(obj))))?;
    iter.map(|x| x.and_then(|x| item(&x))).collect()
}

impl Raw<'_> {
    /// The library's options for query `q` against `len_k` keys.
    pub(crate) fn to_options(&self, ctx: &Context, q: &Scores, len_k: usize) -> PyResult<AttentionOptions> {
        if self.dropout_p != 0.0 {
            return Err(value_error(
                "dropout_p",
                format!(
                    "{} is not supported: wgpu-attention has no dropout (pass 0.0)",
                    self.dropout_p
                ),
            ));
        }
        let scale = match self.scale {
            None => None,
            Some(s) if s.is_finite() && (s as f32).is_finite() => Some(s as f32),
            Some(s) => return Err(value_error("scale", format!("{s} is not a finite float32"))),
        };
        let softcap = match self.softcap {
            None => None,
            Some(c) if c.is_finite() && c > 0.0 && (c as f32).is_finite() => Some(c as f32),
            Some(c) => return Err(value_error("softcap", format!("{c} is not a finite number above 0"))),
        };
        let causal = if self.is_causal {
            Some(parse_alignment(&self.causal_alignment)?)
        } else {
            // Checked all the same, so a typo is never silently ignored.
            parse_alignment(&self.causal_alignment)?;
            None
        };
        let key_lengths = match &self.key_lengths {
            None => None,
            Some(obj) => Some(sequence("key_lengths", obj, |x| {
                let n = whole("key_lengths", x)?;
                u32::try_from(n)
                    .map_err(|_| value_error("key_lengths", format!("entry {n} is not a length from 0 to {len_k}")))
            })?),
        };
        let window = match &self.window {
            None => None,
            Some(obj) => Some(window(obj)?),
        };
        let alibi_slopes = match &self.alibi_slopes {
            None => None,
            Some(obj) => Some(sequence("alibi_slopes", obj, |x| {
                x.extract::<f64>()
                    .map(|v| v as f32)
                    .map_err(|_| value_error("alibi_slopes", format!("{} is not a number", repr(x))))
            })?),
        };
        if let Some(offset) = self.position_offset {
            // The library refuses this too, but reports |offset| capped at 2^30 + 1 in
            // its sum; this reports the value given.
            let reach = q.len_q as u128 + len_k as u128 + u128::from(offset.unsigned_abs());
            if reach > MAX_POSITIONS as u128 {
                return Err(value_error(
                    "position_offset",
                    format!(
                        "{offset} is too far: query length {} + key length {len_k} + |position_offset| = {reach}, \
                         at most {MAX_POSITIONS} (the kernels measure positions in 32 bits)",
                        q.len_q
                    ),
                ));
            }
        }
        let precision = Precision::parse("precision", &self.precision).map_err(crate::to_py)?;
        let mask = match &self.attn_mask {
            None => None,
            Some(obj) => Some(mask(obj, ctx, q, len_k)?),
        };
        Ok(AttentionOptions {
            scale,
            causal,
            key_lengths,
            mask,
            window,
            alibi_slopes,
            softcap,
            kernel: parse_kernel(&self.kernel)?,
            precision,
            need_weights: self.need_weights,
            need_lse: self.return_lse,
            position_offset: self.position_offset,
            ..Default::default()
        })
    }
}

/// `(left, right)`, either side `None` or negative for unbounded (flash-attn's
/// `window_size=(-1, -1)`).
fn window(obj: &Bound<'_, PyAny>) -> PyResult<Window> {
    let sides = sequence("window", obj, |x| {
        if x.is_none() {
            return Ok(None);
        }
        let n = whole("window", x)?;
        Ok(usize::try_from(n).ok())
    })?;
    match sides[..] {
        [left, right] => Ok(Window { left, right }),
        _ => Err(value_error(
            "window",
            format!("{} is not a pair (left, right); -1 or None = unbounded", repr(obj)),
        )),
    }
}

/// An attention mask broadcastable to the scores `(..., Hq, Lq, Lk)` (q's batch axes,
/// then heads, query rows, keys), as PyTorch's: bool = may attend, float = added to
/// the scores. Folded to the library's rank-4 mask: the batch axes become one where
/// the mask has all of them or none, and are expanded otherwise.
fn mask(obj: &Bound<'_, PyAny>, ctx: &Context, q: &Scores, len_k: usize) -> PyResult<Mask> {
    let py = obj.py();
    let array = as_array("attn_mask", obj)?;
    let dtype = array.dtype();
    let is_bool = dtype.is_equiv_to(&numpy::dtype::<bool>(py));
    if !is_bool && dtype.kind() != b'f' {
        return Err(value_error(
            "attn_mask",
            format!(
                "dtype {} is neither bool (True = may attend) nor floating (added to the scores)",
                dtype.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into())
            ),
        ));
    }
    // The scores' shape in the caller's terms: batch axes, heads (absent for a 2-D
    // query), rows, keys.
    let batch_axes = q.batch_axes.clone();
    let mut target = batch_axes.clone();
    target.extend(q.heads);
    target.extend([q.len_q, len_k]);
    let shape = array.shape().to_vec();
    if shape.is_empty() || shape.len() > target.len() {
        return Err(value_error(
            "attn_mask",
            format!("shape {shape:?} does not broadcast to the scores' shape {target:?}"),
        ));
    }
    let mut padded = vec![1usize; target.len() - shape.len()];
    padded.extend(&shape);
    if let Some(axis) = (0..target.len()).find(|&a| padded[a] != 1 && padded[a] != target[a]) {
        return Err(value_error(
            "attn_mask",
            format!(
                "shape {shape:?} does not broadcast to the scores' shape {target:?} (axis {axis}: {} against {})",
                padded[axis], target[axis]
            ),
        ));
    }
    let nb = batch_axes.len();
    let mask_batch = &padded[..nb];
    let rest = &padded[nb..];
    // Batch axes all 1 or all full fold into one; a mix is expanded to full (the mask's
    // other axes stay as they are, so the copy is no larger than B times them).
    let expand = !(mask_batch.iter().all(|&m| m == 1) || mask_batch == batch_axes.as_slice());
    let mut full_shape = padded.clone();
    if expand {
        full_shape[..nb].copy_from_slice(&batch_axes);
    }
    let mut folded: Vec<usize> = vec![full_shape[..nb].iter().product()];
    if rest.len() == 2 {
        folded.push(1);
    }
    folded.extend(&full_shape[nb..]);
    crate::arrays::check_size(ctx, "attn_mask (broadcast to the batch)", &folded, 4)?;
    let np = py.import("numpy")?;
    let reshaped = np
        .call_method1("broadcast_to", (array.reshape_any(&padded)?, full_shape))?
        .call_method1("reshape", (folded.clone(),))?;
    if is_bool {
        let contiguous = np.call_method1("ascontiguousarray", (reshaped,))?;
        let values = contiguous.cast_into::<PyArrayDyn<bool>>()?.to_vec()?;
        Mask::boolean(&folded, values).map_err(crate::to_py)
    } else {
        let contiguous = np.call_method1("ascontiguousarray", (reshaped, "float32"))?;
        let values = contiguous.cast_into::<PyArrayDyn<f32>>()?.to_vec()?;
        if values.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
            return Err(PyValueError::new_err(
                "invalid attn_mask: contains NaN or +inf; use -inf (or a bool mask) to mask a position",
            ));
        }
        Mask::additive(&folded, values).map_err(crate::to_py)
    }
}

trait ReshapeAny<'py> {
    fn reshape_any(&self, shape: &[usize]) -> PyResult<Bound<'py, PyAny>>;
}

impl<'py> ReshapeAny<'py> for Bound<'py, PyUntypedArray> {
    fn reshape_any(&self, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        self.call_method1("reshape", (shape.to_vec(),))
    }
}
