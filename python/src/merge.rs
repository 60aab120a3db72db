//! `merge_attentions`: partial attentions over disjoint blocks of keys merged by their
//! log-sum-exp (docs/design.md, "Merging partial attentions").

use crate::arrays::{as_array, check_lse, dtype_name, f32_array, output, read_input, Input, Values};
use crate::context::{resolve, PyContext};
use crate::options::parse_layout;
use crate::sdpa::score_shape;
use crate::{value_error, OrPy};
use numpy::{PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use wgpu_attention::{merge_attentions as library_merge, Layout, Tensor};

/// Merges partial attentions by their log-sum-exp: ``outputs[n]`` is
/// :func:`scaled_dot_product_attention`'s output for the same queries over the n-th of
/// disjoint blocks of the keys, and ``lses[n]`` its log-sum-exp (``return_lse=True``).
/// Returns attention over all the blocks' keys, as one call over them would give it
/// (xformers' ``merge_attentions``, flash-attn's combine).
///
/// ``lse = log(sum_n exp(lses[n]))`` and ``out = sum_n exp(lses[n] - lse) * outputs[n]``,
/// in f32 on the GPU. A block where a row saw no key (lse ``-inf``) adds nothing,
/// whatever its output row holds; a row no block saw gets zeros and ``-inf``, never
/// NaN. For the causal mask, windows and ALiBi on a block, pass that block's
/// ``position_offset`` to the attention call.
///
/// Args:
///     outputs: one or more arrays of one shape ``(..., Hq, Lq, Ev)`` (``(..., Lq, Hq,
///         Ev)`` with ``layout="bshd"``) and one dtype, float32 or float16; any strides.
///     lses: as many float arrays ``(..., Hq, Lq)``, the outputs' rows (the shape
///         ``return_lse=True`` gives, in either layout); ``+inf`` is refused, and NaN
///         but where the output's row holds NaN too (a forward over NaN inputs gives
///         both; the merged row is then NaN).
///     layout: the outputs' axis order, ``"bhsd"`` or ``"bshd"``.
///     context: the ``Context`` to run on; default ``default_context()``.
///
/// Returns:
///     ``(out, lse)``: out in the outputs' shape and dtype, lse float32 ``(..., Hq, Lq)``.
///
/// Raises:
///     TypeError: an item is not an array. ValueError: no outputs, counts, shapes or
///     dtypes that disagree, or +inf (or NaN beside a row without NaN) in an lse.
#[pyfunction]
#[pyo3(signature = (outputs, lses, *, layout="bhsd", context=None))]
pub fn merge_attentions<'py>(
    py: Python<'py>,
    outputs: Vec<Bound<'py, PyAny>>,
    lses: Vec<Bound<'py, PyAny>>,
    layout: &str,
    context: Option<Bound<'py, PyContext>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let ctx = resolve(py, context.as_ref())?;
    let axes = parse_layout(layout)?;
    if outputs.is_empty() {
        return Err(value_error("outputs", "no partial outputs (give at least one)"));
    }
    if outputs.len() != lses.len() {
        return Err(value_error(
            "lses",
            format!("{} lses for {} outputs (one per output)", lses.len(), outputs.len()),
        ));
    }
    let parts = outputs
        .iter()
        .map(|o| read_input(&ctx, "outputs", o, axes))
        .collect::<PyResult<Vec<Input<'py>>>>()?;
    let first = &parts[0];
    for (n, part) in parts.iter().enumerate().skip(1) {
        if part.shape != first.shape || part.dtype != first.dtype {
            return Err(value_error(
                "outputs",
                format!(
                    "outputs[{n}] is {:?} {} but outputs[0] is {:?} {}; the partials share one shape and dtype",
                    part.shape,
                    dtype_name(part.dtype),
                    first.shape,
                    dtype_name(first.dtype)
                ),
            ));
        }
    }
    let lse_shape = score_shape(first, None);
    let [b, h, lq, _] = first.logical;
    let np = py.import("numpy")?;
    let mut lse_tensors = Vec::with_capacity(lses.len());
    for (n, obj) in lses.iter().enumerate() {
        let array = as_array("lses", obj)?;
        if array.dtype().kind() != b'f' {
            return Err(value_error(
                "lses",
                format!("lses[{n}] is not a floating-point array (return_lse=True gives float32)"),
            ));
        }
        if array.shape() != lse_shape.as_slice() {
            return Err(value_error(
                "lses",
                format!(
                    "lses[{n}] has shape {:?}; the outputs' rows are {lse_shape:?} (as return_lse=True gives them)",
                    array.shape()
                ),
            ));
        }
        let contiguous = np
            .call_method1("ascontiguousarray", (array, "float32"))?
            .cast_into::<PyArrayDyn<f32>>()?;
        let contiguous = contiguous.readonly();
        let values = contiguous.as_slice().map_err(|e| value_error("lses", e))?;
        // NaN where a forward gave it, over NaN inputs: that output row is NaN too,
        // and so is the merged row (as sdpa_backward takes it).
        check_lse(
            "lses",
            &format!("lses[{n}]"),
            values,
            |row| parts[n].row_has_nan(row),
            &format!(", where outputs[{n}]'s row holds no NaN"),
        )?;
        lse_tensors.push(Tensor::from_f32(&ctx, [b, h, lq, 1], Layout::Bhsd, values).py_err()?);
    }
    let out_tensors = parts.iter().map(|p| p.upload(&ctx)).collect::<PyResult<Vec<_>>>()?;
    let merged = py
        .detach(|| -> wgpu_attention::Result<_> {
            let outs: Vec<&Tensor> = out_tensors.iter().collect();
            let ls: Vec<&Tensor> = lse_tensors.iter().collect();
            let m = library_merge(&ctx, &outs, &ls)?;
            Ok((m.out.to_f32_vec(&ctx)?, m.out.layout(), m.lse.to_f32_vec(&ctx)?))
        })
        .py_err()?;
    let (values, memory, lse) = merged;
    let out = output(py, Values::of(first.dtype, values), &first.shape, axes, memory)?;
    let lse = f32_array(py, lse, &lse_shape)?;
    PyTuple::new(py, [out, lse])
}
