//! `Context`: an adapter, its device and the library's pipeline cache; and the default
//! context every call without `context=` shares, made on first use.

use crate::OrPy;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use wgpu_attention::{AdapterSelector, Context};

/// A GPU context: one adapter, its device and the compiled kernels.
///
/// ``Context(adapter=None, backend=None)`` picks the first adapter whose name contains
/// ``adapter`` (case-insensitive) on ``backend`` (``"vulkan"``, ``"gl"``, ``"metal"``,
/// ``"dx12"``, or a comma-separated list); either left out falls back to the
/// environment (``WGPU_ADAPTER_NAME``, ``WGPU_BACKEND``), then to wgpu's default
/// adapter. Making one takes a while (the device, a driver probe); keep it.
///
/// Every function takes ``context=``; without it they share ``default_context()``,
/// made on first use. Arrays never belong to a context: each call uploads its inputs
/// and returns NumPy arrays. A context is safe to share between threads.
#[pyclass(name = "Context", module = "wgpu_attention", frozen)]
pub struct PyContext {
    pub(crate) ctx: Arc<Context>,
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (adapter=None, backend=None))]
    fn new(py: Python<'_>, adapter: Option<String>, backend: Option<String>) -> PyResult<Self> {
        let selector = AdapterSelector { name: adapter, backend };
        let ctx = py.detach(|| Context::with_selector(selector)).py_err()?;
        Ok(PyContext { ctx: Arc::new(ctx) })
    }

    /// The adapter as ``wgpu-attention info --json`` describes it: name, backend,
    /// device type, driver, features (f16, subgroup sizes, timestamps), cooperative
    /// matrices, every fused tiling (available or why not, and the default for f32 and
    /// f16 inputs) and the limits that matter.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = adapter_json(&self.ctx).to_string();
        py.import("json")?.call_method1("loads", (text,))
    }

    /// The adapter's name, e.g. ``"llvmpipe (LLVM 15.0.6, 256 bits)"``.
    #[getter]
    fn adapter_name(&self) -> String {
        self.ctx.adapter_info().name.clone()
    }

    /// Whether the adapter stores f16 (``float16`` arrays need it).
    #[getter]
    fn supports_f16(&self) -> bool {
        self.ctx.capabilities().f16
    }

    fn __repr__(&self) -> String {
        let info = self.ctx.adapter_info();
        format!(
            "Context(adapter={:?}, backend={:?})",
            info.name,
            format!("{:?}", info.backend).to_lowercase()
        )
    }
}

static DEFAULT: Mutex<Option<Py<PyContext>>> = Mutex::new(None);

/// The context calls without ``context=`` use: made on first use from the environment
/// (``WGPU_ADAPTER_NAME``, ``WGPU_BACKEND``), then kept for the process. If making it
/// fails, the error is raised and the next call tries again.
#[pyfunction]
pub fn default_context(py: Python<'_>) -> PyResult<Py<PyContext>> {
    // Made outside the lock's critical section with the GIL released; two threads that
    // race here each make one and the first stored wins.
    if let Some(ctx) = DEFAULT.lock().ok().and_then(|d| d.as_ref().map(|c| c.clone_ref(py))) {
        return Ok(ctx);
    }
    let made = Py::new(py, PyContext::new(py, None, None)?)?;
    let mut slot = DEFAULT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok(slot.get_or_insert(made).clone_ref(py))
}

/// The context a call runs on: the one given, else the default.
pub(crate) fn resolve(py: Python<'_>, context: Option<&Bound<'_, PyContext>>) -> PyResult<Arc<Context>> {
    match context {
        Some(c) => Ok(c.get().ctx.clone()),
        None => Ok(default_context(py)?.get().ctx.clone()),
    }
}

/// `wgpu-attention info --json`'s entry for this context's adapter, from the library's
/// one builder (`wgpu_attention::report`) and the device's features and limits (the
/// context asked for the adapter's own limits and every feature the library uses, so
/// those the JSON reports are the adapter's). The tests compare it with the CLI's.
fn adapter_json(ctx: &Context) -> serde_json::Value {
    let device = ctx.device();
    wgpu_attention::report::adapter_json(
        ctx.adapter_info(),
        device.features(),
        &device.limits(),
        &ctx.capabilities().cooperative_matrix,
    )
}
