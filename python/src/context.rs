//! `Context`: an adapter, its device and the library's pipeline cache; and the default
//! context every call without `context=` shares, made on first use.

use crate::OrPy;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use wgpu_attention::{AdapterSelector, Capabilities, Context};

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

/// `wgpu-attention info --json`'s entry for this context's adapter, built as
/// `src/cli/info.rs` (`adapter_json`) builds it, from the device's features and limits
/// (the context asked for the adapter's own limits and every feature the library uses,
/// so those the JSON reports are the adapter's). The tests compare it with the CLI's.
fn adapter_json(ctx: &Context) -> serde_json::Value {
    let info = ctx.adapter_info();
    let features = ctx.device().features();
    let limits = ctx.device().limits();
    let coop = &ctx.capabilities().cooperative_matrix;
    let subgroups = features
        .contains(wgpu_attention::wgpu::Features::SUBGROUP)
        .then(|| serde_json::json!([info.subgroup_min_size, info.subgroup_max_size]));
    use wgpu_attention::wgpu::Features;
    serde_json::json!({
        "name": info.name,
        "backend": format!("{:?}", info.backend),
        "device_type": format!("{:?}", info.device_type),
        "vendor": format!("0x{:04x}", info.vendor),
        "device": format!("0x{:04x}", info.device),
        "driver": info.driver,
        "driver_info": info.driver_info,
        "f16": features.contains(Features::SHADER_F16),
        "subgroup_sizes": subgroups,
        "timestamp_query": features.contains(Features::TIMESTAMP_QUERY),
        "timestamp_query_inside_encoders": features.contains(Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
        "cooperative_matrix": coop.iter().map(|c| c.label()).collect::<Vec<_>>(),
        "fused_tilings": tilings_json(info, features, &limits, coop),
        "limits": {
            "max_compute_workgroup_storage_size": limits.max_compute_workgroup_storage_size,
            "max_compute_invocations_per_workgroup": limits.max_compute_invocations_per_workgroup,
            "max_compute_workgroups_per_dimension": limits.max_compute_workgroups_per_dimension,
            "max_storage_buffer_binding_size": limits.max_storage_buffer_binding_size,
            "max_storage_buffers_per_shader_stage": limits.max_storage_buffers_per_shader_stage,
            "max_buffer_size": limits.max_buffer_size,
        },
    })
}

/// Every registered fused tiling: available or why not, and for which inputs the
/// picker takes it (as `src/cli/info.rs`'s `tilings_json`).
fn tilings_json(
    info: &wgpu_attention::wgpu::AdapterInfo,
    features: wgpu_attention::wgpu::Features,
    limits: &wgpu_attention::wgpu::Limits,
    coop: &[wgpu_attention::CoopConfig],
) -> serde_json::Value {
    use wgpu_attention::kernels::flash::{default_tiling, AdapterClass, FUSED_TILINGS};
    let mut caps = Capabilities::of(info, features, limits);
    caps.cooperative_matrix = coop.to_vec();
    let class = AdapterClass::of(info);
    let picked = [
        ("f32", default_tiling(class, &caps, false)),
        ("f16", default_tiling(class, &caps, true)),
    ];
    FUSED_TILINGS
        .iter()
        .map(|spec| {
            let default_for: Vec<&str> = picked
                .iter()
                .filter(|&&(_, tiling)| tiling == spec.tiling)
                .map(|&(inputs, _)| inputs)
                .collect();
            serde_json::json!({
                "name": spec.name,
                "about": spec.about,
                "default_for": default_for,
                "unavailable": spec.unmet(&info.name, &caps).map(|e| e.to_string()),
            })
        })
        .collect()
}
