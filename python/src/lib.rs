//! The Python module `wgpu_attention._native` (re-exported by the package
//! `wgpu_attention`): PyTorch's `scaled_dot_product_attention` signature on NumPy arrays,
//! its backward pass, the KV caches and the multi-head attention layer, on the
//! library's GPU kernels (docs/design.md, "Python").
//!
//! Rooms: `context` (adapters, the default context, `info`), `arrays` (NumPy arrays in
//! and out), `options` (keyword arguments to `AttentionOptions`), `sdpa` (the two
//! functions), `merge` (`merge_attentions`), `cache` (`KvCache`, `PagedKvCache`) and `layer` (`MultiHeadAttention`).

mod arrays;
mod cache;
mod context;
mod exclusive;
mod layer;
mod merge;
mod options;
mod sdpa;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use wgpu_attention::Error;

/// The library's error as a Python exception, with its one-line message: `ValueError`
/// for what the caller asked (shapes, options, sizes beyond a limit), `RuntimeError` for
/// what the GPU did or lacks, `OSError` for files.
pub(crate) fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Shape { .. }
        | Error::Unsupported { .. }
        | Error::Invalid { .. }
        | Error::LimitExceeded { .. }
        | Error::CapacityExceeded { .. } => PyValueError::new_err(message),
        Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
        Error::Io(_) => PyOSError::new_err(message),
        Error::NoAdapter { .. }
        | Error::RequestDevice { .. }
        | Error::MissingFeature { .. }
        | Error::Gpu { .. }
        | Error::Readback(_) => PyRuntimeError::new_err(message),
    }
}

/// Results of the library as Python results.
pub(crate) trait OrPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> OrPy<T> for wgpu_attention::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A `ValueError` naming the argument.
pub(crate) fn value_error(what: &str, why: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("invalid {what}: {why}"))
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<context::PyContext>()?;
    m.add_function(wrap_pyfunction!(context::default_context, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::scaled_dot_product_attention, m)?)?;
    m.add_function(wrap_pyfunction!(sdpa::sdpa_backward, m)?)?;
    m.add_function(wrap_pyfunction!(merge::merge_attentions, m)?)?;
    m.add_class::<cache::PyKvCache>()?;
    m.add_class::<cache::PyPagedKvCache>()?;
    m.add_class::<cache::PySequenceId>()?;
    m.add_class::<layer::PyMultiHeadAttention>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
