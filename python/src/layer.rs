//! The layer (placeholder).
use pyo3::prelude::*;
#[pyclass(name = "MultiHeadAttention", module = "wgpu_attention")]
pub struct PyMultiHeadAttention {}
