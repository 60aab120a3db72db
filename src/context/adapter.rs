//! Choosing an adapter: the selector (names, backends, the environment), listing
//! adapters, and telling CPU drivers apart.

use crate::error::{Error, Result};

/// How to pick an adapter. Empty fields fall back to the environment
/// (`WGPU_ADAPTER_NAME`, `WGPU_BACKEND`, `WGPU_POWER_PREF`), then to wgpu's default.
#[derive(Clone, Debug, Default)]
pub struct AdapterSelector {
    /// Case-insensitive substring of the adapter name.
    pub name: Option<String>,
    /// Comma-separated backend list as wgpu spells it: `vulkan`, `gl`, `metal`, `dx12`.
    pub backend: Option<String>,
}

impl AdapterSelector {
    /// Fills empty fields from `WGPU_ADAPTER_NAME` and `WGPU_BACKEND`.
    pub fn with_env(mut self) -> Self {
        let non_empty = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if self.name.is_none() {
            self.name = non_empty("WGPU_ADAPTER_NAME");
        }
        if self.backend.is_none() {
            self.backend = non_empty("WGPU_BACKEND");
        }
        self
    }

    pub(super) fn backends(&self) -> Result<wgpu::Backends> {
        match &self.backend {
            None => Ok(wgpu::Backends::all()),
            Some(list) => {
                let parsed = wgpu::Backends::from_comma_list(list);
                if parsed.is_empty() {
                    Err(Error::invalid(
                        "backend",
                        format!("'{list}' names no backend (try vulkan, gl, metal, dx12)"),
                    ))
                } else {
                    Ok(parsed)
                }
            }
        }
    }

    fn describe(&self) -> String {
        match (&self.name, &self.backend) {
            (None, None) => "any adapter".into(),
            (Some(n), None) => format!("name containing '{n}'"),
            (None, Some(b)) => format!("backend '{b}'"),
            (Some(n), Some(b)) => format!("name containing '{n}' on backend '{b}'"),
        }
    }

    /// Every adapter this selector's fields admit: on its backends, with its name
    /// (call [`AdapterSelector::with_env`] first to honour the environment as
    /// [`crate::Context::with_selector`] does). Where a name or a backend is given and no
    /// adapter matches, [`Error::NoAdapter`] names the filter and every adapter on any
    /// backend; with neither, the list may be empty.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn adapters(&self) -> Result<Vec<wgpu::Adapter>> {
        pollster::block_on(self.adapters_async())
    }

    /// [`AdapterSelector::adapters`], awaited.
    pub async fn adapters_async(&self) -> Result<Vec<wgpu::Adapter>> {
        let backends = self.backends()?;
        let wanted = self.name.as_ref().map(|n| n.to_lowercase());
        let adapters: Vec<wgpu::Adapter> = new_instance(backends)
            .enumerate_adapters(backends)
            .await
            .into_iter()
            .filter(|a| {
                wanted
                    .as_ref()
                    .is_none_or(|w| a.get_info().name.to_lowercase().contains(w))
            })
            .collect();
        if adapters.is_empty() && (self.name.is_some() || self.backend.is_some()) {
            let every = wgpu::Backends::all();
            let names: Vec<String> = new_instance(every)
                .enumerate_adapters(every)
                .await
                .iter()
                .map(|a| {
                    let info = a.get_info();
                    format!("{} ({:?})", info.name, info.backend)
                })
                .collect();
            return Err(no_adapter(self, &names));
        }
        Ok(adapters)
    }
}

/// Lists every adapter wgpu sees on the selected backends.
#[cfg(not(target_arch = "wasm32"))]
pub fn enumerate_adapters(backend: Option<&str>) -> Result<Vec<wgpu::Adapter>> {
    pollster::block_on(enumerate_adapters_async(backend))
}

/// [`enumerate_adapters`], awaited rather than blocked on (the only form on the web).
pub async fn enumerate_adapters_async(backend: Option<&str>) -> Result<Vec<wgpu::Adapter>> {
    let selector = AdapterSelector {
        name: None,
        backend: backend.map(str::to_owned),
    };
    let backends = selector.backends()?;
    let instance = new_instance(backends);
    Ok(instance.enumerate_adapters(backends).await)
}

pub(super) fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

pub(super) fn no_adapter(selector: &AdapterSelector, names: &[String]) -> Error {
    Error::NoAdapter {
        wanted: selector.describe(),
        available: if names.is_empty() {
            "none (install a GPU driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into()
        } else {
            names.join(", ")
        },
    }
}

/// The (major, minor) release after "Mesa " in a driver-info string, if any.
pub fn mesa_version(driver_info: &str) -> Option<(u32, u32)> {
    let rest = &driver_info[driver_info.find("Mesa ")? + "Mesa ".len()..];
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// True for CPU adapters such as lavapipe and llvmpipe: by device type, or by name for
/// drivers that report another type.
pub fn is_cpu_adapter(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
        || ["llvmpipe", "lavapipe", "swiftshader", "warp"]
            .iter()
            .any(|n| info.name.to_lowercase().contains(n))
}
