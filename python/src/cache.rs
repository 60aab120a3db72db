//! KV caches (placeholder while the functions are built).
use pyo3::prelude::*;
#[pyclass(name = "KvCache", module = "wgpu_attention")]
pub struct PyKvCache {}
#[pyclass(name = "PagedKvCache", module = "wgpu_attention")]
pub struct PyPagedKvCache {}
#[pyclass(name = "SequenceId", module = "wgpu_attention", frozen)]
pub struct PySequenceId {}
