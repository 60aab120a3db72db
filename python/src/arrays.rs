//! NumPy arrays in and out (docs/design.md, "Python").
//!
//! In: a float32 or float16 array of shape `(..., L, E)` (PyTorch's order, `layout =
//! "bhsd"`: the last three axes are heads, sequence, features, and every axis before
//! the heads is folded into the batch) or `(..., L, H, E)` (`layout = "bshd"`,
//! flash-attn's). Its memory is uploaded as it is where it is C-contiguous in that
//! order, or in the other one (a `(N, L, H, E)` projection viewed as `(N, H, L, E)`
//! with `.transpose(1, 2)` is read as BSHD, no copy on the host); anything else is
//! copied to C order first. Sizes are checked against the device before any copy, so
//! a huge broadcast view is refused rather than materialised.
//!
//! Out: the library's host vectors become the arrays' own buffers (no copy), shaped
//! in the caller's axis order; an output whose memory is in the other order is
//! returned as a transposed view of it.

use crate::value_error;
use half::f16;
use numpy::{
    Element, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use wgpu_attention::{Context, DType, Layout, Tensor};

/// The scores' shape in the caller's terms, which a mask broadcasts to: batch axes,
/// heads (none for a 2-D query), query rows (then keys).
pub(crate) struct Scores {
    pub batch_axes: Vec<usize>,
    pub heads: Option<usize>,
    pub len_q: usize,
}

/// Element data of an input, C-contiguous in its memory order.
pub(crate) enum Host<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F16(PyReadonlyArrayDyn<'py, f16>),
}

/// One array argument, read and ready to upload.
pub(crate) struct Input<'py> {
    /// The argument's name, for messages.
    pub name: &'static str,
    /// The array's shape as given, in the caller's axis order.
    pub shape: Vec<usize>,
    /// `[B, H, S, D]` (B: every axis before the heads, multiplied).
    pub logical: [usize; 4],
    /// The order of the data uploaded.
    pub memory: Layout,
    pub dtype: DType,
    pub data: Host<'py>,
}

/// The other layout: the order of an array's memory when its last three axes are
/// stored with the first two swapped.
pub(crate) fn swapped(layout: Layout) -> Layout {
    match layout {
        Layout::Bhsd => Layout::Bshd,
        Layout::Bshd => Layout::Bhsd,
    }
}

/// The NumPy dtype name of a library dtype.
pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
    }
}

/// The dtype of an array this package reads as q, k, v and their kin, or why not.
pub(crate) fn dtype_of(name: &str, array: &Bound<'_, PyUntypedArray>) -> PyResult<DType> {
    let py = array.py();
    let dtype = array.dtype();
    if dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        Ok(DType::F32)
    } else if dtype.is_equiv_to(&numpy::dtype::<f16>(py)) {
        Ok(DType::F16)
    } else {
        Err(PyValueError::new_err(format!(
            "invalid {name}: dtype {} is not supported; use float32 or float16 (e.g. {name}.astype(numpy.float32))",
            dtype.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into())
        )))
    }
}

/// `obj` as a NumPy array, or a `TypeError` naming the argument.
pub(crate) fn as_array<'py>(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().cloned().map_err(|_| {
        let kind = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into());
        PyTypeError::new_err(format!(
            "{name} must be a numpy.ndarray (float32 or float16); got {kind} \
             (wgpu_attention.torch takes torch tensors)"
        ))
    })
}

/// The element count of `shape` times `item` bytes, if it fits in a u64.
fn byte_count(shape: &[usize], item: usize) -> Option<u64> {
    shape.iter().try_fold(item as u64, |n, &d| n.checked_mul(d as u64))
}

/// Refuses an array larger than the device's largest buffer, before anything is
/// copied (a broadcast view of 2^40 elements costs nothing until it is).
pub(crate) fn check_size(ctx: &Context, name: &str, shape: &[usize], item: usize) -> PyResult<()> {
    let max = ctx.capabilities().max_buffer;
    match byte_count(shape, item) {
        Some(bytes) if bytes <= max => Ok(()),
        bytes => Err(PyValueError::new_err(format!(
            "{name} of shape {shape:?} needs {} bytes but the device limit max_buffer_size is {max} bytes",
            bytes.map_or("more than 2^64".to_string(), |b| b.to_string())
        ))),
    }
}

/// Reads `obj` as an attention input whose last axes are in `axes`' order (`Bhsd`:
/// `(..., H, L, E)`, at least 2 axes; `Bshd`: `(..., L, H, E)`, at least 3). Every
/// axis must be at least 1.
pub(crate) fn read_input<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    axes: Layout,
) -> PyResult<Input<'py>> {
    read(ctx, name, obj, axes, false)
}

/// [`read_input`] that also takes empty batch, head and sequence axes (not an empty
/// feature axis), as PyTorch's SDPA does: the caller returns an empty result for
/// those ([`Input::is_empty`]) and never uploads them.
pub(crate) fn read_input_or_empty<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    axes: Layout,
) -> PyResult<Input<'py>> {
    read(ctx, name, obj, axes, true)
}

fn read<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    axes: Layout,
    empty_ok: bool,
) -> PyResult<Input<'py>> {
    let array = as_array(name, obj)?;
    let dtype = dtype_of(name, &array)?;
    let shape = array.shape().to_vec();
    let n = shape.len();
    let least = match axes {
        Layout::Bhsd => 2,
        Layout::Bshd => 3,
    };
    if n < least {
        let order = match axes {
            Layout::Bhsd => "(..., L, E)",
            Layout::Bshd => "(..., L, H, E) (layout=\"bshd\")",
        };
        return Err(value_error(
            name,
            format!("shape {shape:?} has {n} axes; expected {order}, at least {least} axes"),
        ));
    }
    if shape[n - 1] == 0 || (!empty_ok && shape.contains(&0)) {
        let which = if empty_ok { "feature axis (E)" } else { "axis" };
        return Err(value_error(
            name,
            format!("shape {shape:?} has an empty {which}; every {which} must be at least 1"),
        ));
    }
    check_size(ctx, name, &shape, dtype.size())?;
    let batch: usize = shape[..n.saturating_sub(3)].iter().product();
    let (heads, seq) = match (axes, n) {
        (Layout::Bhsd, 2) => (1, shape[0]),
        (Layout::Bhsd, _) => (shape[n - 3], shape[n - 2]),
        (Layout::Bshd, _) => (shape[n - 2], shape[n - 3]),
    };
    let logical = [batch, heads, seq, shape[n - 1]];
    // The memory order: C order as given, else C order with the sequence and head axes
    // swapped (a transposed projection), else a C-order copy.
    let (contiguous, memory) = if array.is_c_contiguous() && array.is_aligned() {
        (array.clone().into_any(), axes)
    } else {
        let swapped_view = if n >= 3 {
            Some(
                array
                    .call_method1("swapaxes", (-3, -2))?
                    .cast_into::<PyUntypedArray>()?,
            )
        } else {
            None
        };
        match swapped_view {
            Some(view) if view.is_c_contiguous() && view.is_aligned() => (view.into_any(), swapped(axes)),
            _ => (array.call_method1("copy", ("C",))?, axes),
        }
    };
    let data = match dtype {
        DType::F32 => Host::F32(readonly::<f32>(name, contiguous)?),
        DType::F16 => Host::F16(readonly::<f16>(name, contiguous)?),
    };
    Ok(Input {
        name,
        shape,
        logical,
        memory,
        dtype,
        data,
    })
}

fn readonly<'py, T: Element>(name: &str, array: Bound<'py, PyAny>) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let array = array.cast_into::<PyArrayDyn<T>>()?;
    array
        .try_readonly()
        .map_err(|e| value_error(name, format!("cannot be read: {e}")))
}

impl Input<'_> {
    /// Whether the array has no elements (an empty batch, head or sequence axis).
    pub(crate) fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Uploads the data as a tensor of its logical shape and memory order.
    pub(crate) fn upload(&self, ctx: &Context) -> PyResult<Tensor> {
        let result = match &self.data {
            Host::F32(a) => Tensor::from_f32(ctx, self.logical, self.memory, slice(self.name, a)?),
            Host::F16(a) => {
                if !ctx.capabilities().f16 {
                    return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                        "adapter '{}' has no f16 storage (SHADER_F16), needed for float16 {}; use float32",
                        ctx.adapter_info().name,
                        self.name
                    )));
                }
                Tensor::from_f16(ctx, self.logical, self.memory, slice(self.name, a)?)
            }
        };
        result.map_err(crate::to_py)
    }

    /// Whether row `row` holds a NaN, the rows numbered as a log-sum-exp's flat index
    /// (`[B, H, S]` in C order, whichever the memory order).
    pub(crate) fn row_has_nan(&self, row: usize) -> PyResult<bool> {
        let [_, heads, len, dim] = self.logical;
        let start = match self.memory {
            Layout::Bhsd => row * dim,
            Layout::Bshd => {
                let (b, head, i) = (row / (heads * len), row / len % heads, row % len);
                ((b * len + i) * heads + head) * dim
            }
        };
        Ok(match &self.data {
            Host::F32(a) => slice(self.name, a)?[start..start + dim].iter().any(|x| x.is_nan()),
            Host::F16(a) => slice(self.name, a)?[start..start + dim].iter().any(|x| x.is_nan()),
        })
    }

    /// The shape of this query's scores (for masks).
    pub(crate) fn scores(&self) -> Scores {
        Scores {
            batch_axes: self.batch_axes().to_vec(),
            heads: (self.shape.len() >= 3).then_some(self.logical[1]),
            len_q: self.logical[2],
        }
    }

    /// The batch axes: every axis before the heads (`(..., H, L, E)` or `(..., L, H, E)`).
    pub(crate) fn batch_axes(&self) -> &[usize] {
        &self.shape[..self.shape.len().saturating_sub(3)]
    }
}

fn slice<'a, T: Element>(name: &str, array: &'a PyReadonlyArrayDyn<'_, T>) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|e| value_error(name, format!("is not contiguous after copying: {e}")))
}

/// Values read back from the device, in a tensor's memory order.
pub(crate) enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Values {
    /// `values` (as the library reads any tensor back: f32) in `dtype`; exact for f16
    /// tensors, whose values were f16 on the device.
    pub(crate) fn of(dtype: DType, values: Vec<f32>) -> Self {
        match dtype {
            DType::F32 => Values::F32(values),
            DType::F16 => Values::F16(values.into_iter().map(f16::from_f32).collect()),
        }
    }
}

/// An array of `shape` (the caller's axis order, `axes`) over `values` in `memory`
/// order: the values themselves reshaped where the orders agree, else a view with
/// the sequence and head axes swapped back.
pub(crate) fn output<'py>(
    py: Python<'py>,
    values: Values,
    shape: &[usize],
    axes: Layout,
    memory: Layout,
) -> PyResult<Bound<'py, PyAny>> {
    let mut stored = shape.to_vec();
    let n = stored.len();
    let swap = memory != axes && n >= 3;
    if swap {
        stored.swap(n - 3, n - 2);
    }
    let array = match values {
        Values::F32(v) => PyArray1::from_vec(py, v).reshape(stored)?.into_any(),
        Values::F16(v) => PyArray1::from_vec(py, v).reshape(stored)?.into_any(),
    };
    if swap {
        array.call_method1("swapaxes", (-3, -2))
    } else {
        Ok(array)
    }
}

/// An f32 array of `shape` over `values` in C order.
pub(crate) fn f32_array<'py>(py: Python<'py>, values: Vec<f32>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, values).reshape(shape.to_vec())?.into_any())
}

/// [`read_input`] converting float32 to float16 or back where the array is not
/// `dtype` already (rows appended to a cache of that dtype, its queries); `owner` names
/// whose dtype it is, for messages.
pub(crate) fn read_input_as<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    axes: Layout,
    dtype: DType,
    owner: &str,
) -> PyResult<Input<'py>> {
    let array = as_array(name, obj)?;
    if dtype_of(name, &array)? == dtype {
        return read_input(ctx, name, obj, axes);
    }
    check_size(ctx, name, array.shape(), dtype.size())?;
    check_f16_fits(name, &array, dtype, owner)?;
    let cast = array.call_method1("astype", (dtype_name(dtype),))?;
    read_input(ctx, name, &cast, axes)
}

/// Refuses values float16 cannot hold (|x| > 65504, its largest finite value): the
/// conversion would make them infinities and the results NaN, with no more than a
/// NumPy warning. Names the array, the first such value and `owner`'s dtype, as the
/// CLI's check of f16 inputs does.
pub(crate) fn check_f16_range(name: &str, values: impl IntoIterator<Item = f32>, owner: &str) -> PyResult<()> {
    let max = f32::from(f16::MAX);
    match values
        .into_iter()
        .enumerate()
        .find(|(_, x)| x.is_finite() && x.abs() > max)
    {
        None => Ok(()),
        Some((i, x)) => Err(value_error(
            name,
            format!(
                "value {x} at flat index {i} is beyond float16's range (|x| <= {max}, its largest finite value), \
                 which {owner} dtype float16 needs; scale it down or use float32"
            ),
        )),
    }
}

/// Refuses a log-sum-exp holding +inf, or NaN at a flat index where `nan_from_forward`
/// says no forward gives it (`why_not` says why, in the message), naming `which` and
/// the first such value's index. No
/// forward gives +inf; NaN only where its inputs held NaN (then its output row is NaN
/// too); a row that saw no key has -inf, which passes. On the GPU a NaN lse spreads to
/// every gradient or output it touches and +inf makes them zeros, silently.
/// `merge_attentions` and `sdpa_backward` check here, on the host copy they upload; the
/// library takes the lse as a GPU tensor and leaves it unread.
pub(crate) fn check_lse(
    name: &str,
    which: &str,
    values: &[f32],
    nan_from_forward: impl Fn(usize) -> PyResult<bool>,
    why_not: &str,
) -> PyResult<()> {
    for (i, &x) in values.iter().enumerate() {
        if x == f32::INFINITY || (x.is_nan() && !nan_from_forward(i)?) {
            let why = if x.is_nan() { why_not } else { "" };
            return Err(value_error(
                name,
                format!(
                    "{which} holds NaN or +inf ({x} at flat index {i}, as float32{why}); a log-sum-exp is \
                     finite, or -inf for a row that saw no key"
                ),
            ));
        }
    }
    Ok(())
}

/// [`check_f16_range`] for a float32 array about to become `dtype` float16 (any
/// strides; flat indices in C order); nothing to check for other conversions.
pub(crate) fn check_f16_fits(name: &str, array: &Bound<'_, PyUntypedArray>, dtype: DType, owner: &str) -> PyResult<()> {
    if dtype != DType::F16 || dtype_of(name, array)? != DType::F32 {
        return Ok(());
    }
    let array = array.cast::<PyArrayDyn<f32>>()?;
    let values = array
        .try_readonly()
        .map_err(|e| value_error(name, format!("cannot be read: {e}")))?;
    check_f16_range(name, values.as_array().iter().copied(), owner)
}

/// Parses `"float32"` or `"float16"` (NumPy's names; `"f32"`/`"f16"` too).
pub(crate) fn parse_dtype(text: &str) -> PyResult<DType> {
    match text.trim().to_lowercase().as_str() {
        "float32" | "f32" => Ok(DType::F32),
        "float16" | "f16" | "half" => Ok(DType::F16),
        _ => Err(value_error("dtype", format!("'{text}' is not float32 or float16"))),
    }
}
