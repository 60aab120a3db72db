//! Choosing an adapter: the selector (names, backends, the environment), listing
//! adapters, and telling CPU drivers apart.

use crate::error::{Error, Result};

/// How to pick an adapter. Empty fields fall back to the environment
/// (`WGPU_ADAPTER_NAME`, `WGPU_BACKEND`, `WGPU_POWER_PREF`), then to wgpu's default.
#[derive(Clone, Debug, Default)]
pub struct AdapterSelector {
    /// Case-insensitive substring of the adapter name; or an index into the adapters
    /// listed on the selected backends, in `wgpu-attention info`'s order: `#1`, or `1`
    /// where no adapter's name contains "1" (so `4090` still finds an RTX 4090).
    /// Either may follow a backend and a colon (`vulkan:llvmpipe`, `gl:0`): two
    /// drivers can share a name on different backends.
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
        let listed = match &self.backend {
            None => wgpu::Backends::all(),
            Some(list) => {
                let parsed = wgpu::Backends::from_comma_list(list);
                if parsed.is_empty() {
                    return Err(Error::invalid(
                        "backend",
                        format!("'{list}' names no backend (try vulkan, gl, metal, dx12)"),
                    ));
                }
                parsed
            }
        };
        match self.name_parts().0 {
            Some(prefix) if (listed & prefix).is_empty() => Err(Error::invalid(
                "adapter",
                format!(
                    "'{}' asks for a backend outside the backends chosen ({})",
                    self.name.as_deref().unwrap_or(""),
                    self.backend.as_deref().unwrap_or("all")
                ),
            )),
            Some(prefix) => Ok(listed & prefix),
            None => Ok(listed),
        }
    }

    /// The name's backend prefix, if it has one that names a backend, and the rest.
    fn name_parts(&self) -> (Option<wgpu::Backends>, Option<&str>) {
        let Some(name) = self.name.as_deref() else {
            return (None, None);
        };
        if let Some((prefix, rest)) = name.split_once(':') {
            let backend = wgpu::Backends::from_comma_list(prefix.trim());
            if !prefix.contains(',') && !backend.is_empty() {
                return (Some(backend), Some(rest.trim()).filter(|r| !r.is_empty()));
            }
        }
        (None, Some(name))
    }

    /// Whether the name (past any backend prefix) asks for nothing, an index (`#2`),
    /// a substring or a number that is either (`2`: a substring first).
    fn wanted(&self) -> Wanted {
        match self.name_parts().1 {
            None => Wanted::Any,
            Some(rest) => match (rest.strip_prefix('#').map(str::parse::<usize>), rest.parse::<usize>()) {
                (Some(Ok(index)), _) => Wanted::Index(index),
                (_, Ok(index)) => Wanted::NameOrIndex(rest.to_lowercase(), index),
                _ => Wanted::Containing(rest.to_lowercase()),
            },
        }
    }

    /// The adapters of `listed` (every adapter on this selector's backends, in listing
    /// order) that the name admits.
    pub(super) fn pick(&self, listed: Vec<wgpu::Adapter>) -> Vec<wgpu::Adapter> {
        let containing = |listed: Vec<wgpu::Adapter>, w: &str| -> Vec<wgpu::Adapter> {
            listed
                .into_iter()
                .filter(|a| a.get_info().name.to_lowercase().contains(w))
                .collect()
        };
        match self.wanted() {
            Wanted::Any => listed,
            Wanted::Index(i) => listed.into_iter().nth(i).into_iter().collect(),
            Wanted::Containing(w) => containing(listed, &w),
            Wanted::NameOrIndex(w, i) => {
                if listed.iter().any(|a| a.get_info().name.to_lowercase().contains(&w)) {
                    containing(listed, &w)
                } else {
                    listed.into_iter().nth(i).into_iter().collect()
                }
            }
        }
    }

    /// Whether anything narrows the choice beyond wgpu's default.
    pub(super) fn filters(&self) -> bool {
        self.name.is_some() || self.backend.is_some()
    }

    fn describe(&self) -> String {
        let name = match (self.name_parts(), self.wanted()) {
            (_, Wanted::Any) => None,
            (_, Wanted::Index(i)) => Some(format!("adapter #{i}")),
            ((_, Some(n)), Wanted::NameOrIndex(..)) => Some(format!("name containing '{n}' (or adapter #{n})")),
            ((_, Some(n)), Wanted::Containing(_)) => Some(format!("name containing '{n}'")),
            _ => None,
        };
        let backend = match (self.name_parts().0, &self.backend) {
            (Some(_), _) => self
                .name
                .as_deref()
                .and_then(|n| n.split_once(':'))
                .map(|(b, _)| b.to_string()),
            (None, b) => b.clone(),
        };
        match (name, backend) {
            (None, None) => "any adapter".into(),
            (Some(n), None) => n,
            (None, Some(b)) => format!("backend '{b}'"),
            (Some(n), Some(b)) => format!("{n} on backend '{b}'"),
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
        let adapters = self.pick(new_instance(backends).enumerate_adapters(backends).await);
        if adapters.is_empty() && self.filters() {
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

/// Turns off Mesa's Vulkan device-select layer (`NODEVICE_SELECT=1`) on a headless
/// machine (no `XDG_RUNTIME_DIR`), unless the variable is set already: the layer
/// connects to a Wayland display while devices are listed, and libwayland then prints
/// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." although nothing
/// failed. Call it first in `main`, before any thread exists (it sets an environment
/// variable); the CLI, the examples and the Python package do.
#[cfg(not(target_arch = "wasm32"))]
pub fn quiet_headless_vulkan() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() && std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

/// What an [`AdapterSelector`]'s name asks for, past any backend prefix.
enum Wanted {
    Any,
    Index(usize),
    Containing(String),
    /// Digits: a name containing them where one does, else that index.
    NameOrIndex(String, usize),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str, backend: Option<&str>) -> AdapterSelector {
        AdapterSelector {
            name: Some(name.into()),
            backend: backend.map(Into::into),
        }
    }

    #[test]
    fn names_take_a_backend_prefix_and_an_index() {
        // Two Mesa drivers share the name "llvmpipe (LLVM 15.0.6, 256 bits)".
        let vk = named("vulkan:llvmpipe", None);
        assert_eq!(vk.backends().expect("backend"), wgpu::Backends::VULKAN);
        assert!(matches!(vk.wanted(), Wanted::Containing(ref w) if w == "llvmpipe"));
        assert!(matches!(named("gl:#1", None).wanted(), Wanted::Index(1)));
        assert!(matches!(named("gl:1", None).wanted(), Wanted::NameOrIndex(ref w, 1) if w == "1"));
        // Digits that a name holds stay a name: an RTX 4090 is no adapter #4090.
        assert!(matches!(named("4090", None).wanted(), Wanted::NameOrIndex(ref w, 4090) if w == "4090"));
        assert_eq!(named("gl:1", None).backends().expect("backend"), wgpu::Backends::GL);
        assert!(matches!(named("#2", None).wanted(), Wanted::Index(2)));
        assert!(matches!(named("vulkan:", None).wanted(), Wanted::Any));
        // A colon that does not follow a backend is part of the name.
        let colon = named("Radeon: Pro", None);
        assert_eq!(colon.backends().expect("all"), wgpu::Backends::all());
        assert!(matches!(colon.wanted(), Wanted::Containing(ref w) if w == "radeon: pro"));
        // A prefix outside --backend is refused, saying so.
        let e = named("gl:0", Some("vulkan"))
            .backends()
            .expect_err("outside")
            .to_string();
        assert!(e.contains("gl:0") && e.contains("vulkan"), "{e}");
        assert_eq!(named("gl:#0", None).describe(), "adapter #0 on backend 'gl'");
    }
}
