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
    /// Fills empty fields from `WGPU_ADAPTER_NAME` and `WGPU_BACKEND`. A variable set
    /// but empty is refused, naming it (as every variable this crate reads), and so is a
    /// `WGPU_BACKEND` that names anything but backends.
    pub fn with_env(mut self) -> Result<Self> {
        if self.name.is_none() {
            self.name = env_value("WGPU_ADAPTER_NAME")?;
        }
        if self.backend.is_none() {
            if let Some(list) = env_value("WGPU_BACKEND")? {
                Self::parse_backends("WGPU_BACKEND", &list)?;
                self.backend = Some(list);
            }
        }
        Ok(self)
    }

    /// Parses a comma-separated list of backends as wgpu names them (`vulkan` or `vk`,
    /// `gl`, `gles` or `opengl`, `metal` or `mtl`, `dx12` or `d3d12`, `webgpu`; any
    /// case). Every name must be one: an unknown or empty one is refused, `what` (the
    /// flag or variable) named, where wgpu's own parser would skip it.
    pub fn parse_backends(what: &str, list: &str) -> Result<wgpu::Backends> {
        let mut backends = wgpu::Backends::empty();
        for name in list.split(',') {
            backends |= match name.trim().to_lowercase().as_str() {
                "vulkan" | "vk" => wgpu::Backends::VULKAN,
                "gl" | "gles" | "opengl" => wgpu::Backends::GL,
                "metal" | "mtl" => wgpu::Backends::METAL,
                "dx12" | "d3d12" => wgpu::Backends::DX12,
                "webgpu" => wgpu::Backends::BROWSER_WEBGPU,
                _ => {
                    return Err(Error::invalid(
                        what,
                        format!("'{}' is not a backend (vulkan, gl, metal, dx12)", name.trim()),
                    ))
                }
            };
        }
        Ok(backends)
    }

    /// The backends whose adapters are listed and numbered: `backend`, else every one.
    /// A backend prefix on the name narrows the choice, not the numbering, so that
    /// `gl:#1` is the adapter `info` lists as `#1`.
    fn listed_backends(&self) -> Result<wgpu::Backends> {
        match &self.backend {
            None => Ok(wgpu::Backends::all()),
            Some(list) => Self::parse_backends("backend", list),
        }
    }

    /// The backends an adapter may be picked from: the listed ones, narrowed by a
    /// backend prefix on the name (refused where the prefix is outside them).
    pub(crate) fn backends(&self) -> Result<wgpu::Backends> {
        let listed = self.listed_backends()?;
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
            if let Some(backend) = Self::parse_backends("", prefix).ok().filter(|_| !prefix.contains(',')) {
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

    /// The adapters of `listed` (every adapter on the listed backends, in listing
    /// order: [`AdapterSelector::listed_backends`]) that the name admits, each with its
    /// number in that listing (`info`'s, and what `#N` asks for, prefix or not).
    pub(super) fn pick(&self, listed: Vec<wgpu::Adapter>) -> Vec<(usize, wgpu::Adapter)> {
        let prefix = self.name_parts().0;
        let allowed: Vec<(usize, wgpu::Adapter)> = listed
            .into_iter()
            .enumerate()
            .filter(|(_, a)| prefix.is_none_or(|p| p.contains(a.get_info().backend.into())))
            .collect();
        let containing = |allowed: Vec<(usize, wgpu::Adapter)>, w: &str| -> Vec<(usize, wgpu::Adapter)> {
            allowed
                .into_iter()
                .filter(|(_, a)| a.get_info().name.to_lowercase().contains(w))
                .collect()
        };
        let numbered = |allowed: Vec<(usize, wgpu::Adapter)>, i: usize| -> Vec<(usize, wgpu::Adapter)> {
            allowed.into_iter().filter(|&(n, _)| n == i).collect()
        };
        match self.wanted() {
            Wanted::Any => allowed,
            Wanted::Index(i) => numbered(allowed, i),
            Wanted::Containing(w) => containing(allowed, &w),
            Wanted::NameOrIndex(w, i) => {
                if allowed
                    .iter()
                    .any(|(_, a)| a.get_info().name.to_lowercase().contains(&w))
                {
                    containing(allowed, &w)
                } else {
                    numbered(allowed, i)
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
    /// adapter matches, [`Error::NoAdapter`] names the filter and lists, numbered, the
    /// adapters its backends allow; with neither, the list may be empty.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn adapters(&self) -> Result<Vec<wgpu::Adapter>> {
        Ok(self.numbered_adapters()?.into_iter().map(|(_, a)| a).collect())
    }

    /// [`AdapterSelector::adapters`], each with its number: its position among every
    /// adapter on the backends `backend` lists (all where unset), the number
    /// `wgpu-attention info` prints beside it and `#N` picks, with a backend prefix on the
    /// name or without.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn numbered_adapters(&self) -> Result<Vec<(usize, wgpu::Adapter)>> {
        pollster::block_on(self.numbered_adapters_async())
    }

    /// [`AdapterSelector::adapters`], awaited.
    pub async fn adapters_async(&self) -> Result<Vec<wgpu::Adapter>> {
        Ok(self
            .numbered_adapters_async()
            .await?
            .into_iter()
            .map(|(_, a)| a)
            .collect())
    }

    /// [`AdapterSelector::numbered_adapters`], awaited.
    pub async fn numbered_adapters_async(&self) -> Result<Vec<(usize, wgpu::Adapter)>> {
        let allowed = self.backends()?;
        let listed = self.listed_backends()?;
        let every = new_instance(listed).enumerate_adapters(listed).await;
        let available = numbered_names(&every, allowed);
        let adapters = self.pick(every);
        if adapters.is_empty() && self.filters() {
            return Err(no_adapter(self, &available));
        }
        Ok(adapters)
    }
}

/// "#N name (Backend)" for each adapter of `listed` (numbered in listing order) on the
/// `allowed` backends: what an error lists.
pub(crate) fn numbered_names(listed: &[wgpu::Adapter], allowed: wgpu::Backends) -> Vec<String> {
    listed
        .iter()
        .enumerate()
        .map(|(n, a)| (n, a.get_info()))
        .filter(|(_, info)| allowed.contains(info.backend.into()))
        .map(|(n, info)| format!("#{n} {} ({:?})", info.name, info.backend))
        .collect()
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
    let backends = match backend {
        None => wgpu::Backends::all(),
        Some(list) => AdapterSelector::parse_backends("backend", list)?,
    };
    let instance = new_instance(backends);
    Ok(instance.enumerate_adapters(backends).await)
}

pub(crate) fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// The error for a selector that matched nothing; `names` are the adapters its backends
/// allow ([`numbered_names`]).
pub(crate) fn no_adapter(selector: &AdapterSelector, names: &[String]) -> Error {
    let backends = selector.backends().ok().filter(|b| *b != wgpu::Backends::all());
    Error::NoAdapter {
        wanted: selector.describe(),
        available: match (names.is_empty(), backends) {
            (false, _) => names.join(", "),
            (true, Some(_)) => "none on the backends chosen".into(),
            (true, None) => {
                "none (install a GPU driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into()
            }
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

/// The value of the environment variable `var`, the one rule every variable this crate
/// reads follows: `None` where unset; refused where set but empty (or only spaces: an
/// empty value is an accident, e.g. `VAR=$UNSET_SHELL_VARIABLE`, never a choice) or not
/// UTF-8. Each variable's own parser then reads the value.
pub(crate) fn env_value(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid(var, "is not UTF-8")),
        Ok(value) if value.trim().is_empty() => Err(empty_env(var)),
        Ok(value) => Ok(Some(value)),
    }
}

/// [`env_value`] for a variable that names a path: any bytes, but not empty.
pub(crate) fn env_path(var: &str) -> Result<Option<std::path::PathBuf>> {
    match std::env::var_os(var) {
        None => Ok(None),
        Some(value) if value.to_string_lossy().trim().is_empty() => Err(empty_env(var)),
        Some(value) => Ok(Some(value.into())),
    }
}

/// The error for a variable set to nothing.
fn empty_env(var: &str) -> Error {
    Error::invalid(var, "is set but empty (unset it for the default)")
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
