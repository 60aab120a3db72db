//! The device layer (docs/design.md, "Host side"): the adapter and device, the queue,
//! what the adapter can do ([`Capabilities`]), error scopes, submission and readback,
//! buffers, and the pipeline cache. It knows nothing of attention: the kernels build
//! on it, and [`crate::Context`] (a [`Gpu`] and the [`crate::Policy`] its kernels are
//! picked under) is what callers hold. Every `&Context` is a `&Gpu` where a function
//! asks for one.
//!
//! Rooms: `adapter` (choosing one), `capabilities` (what it can do), `device_watch`
//! (device loss and escaped errors), `submit` (error scopes, submission, readback),
//! `resources` (buffers, textures, pipelines), `runtime_checks` (what wgpu compiles
//! into each shader), `dtype` (the element types) and `text` (a shader's text, static or
//! generated, as the pipeline cache keys it).

mod adapter;
mod capabilities;
mod device_watch;
mod dtype;
mod resources;
pub mod runtime_checks;
mod submit;
mod text;

#[cfg(test)]
pub use adapter::mesa_version;
#[cfg(not(target_arch = "wasm32"))]
pub use adapter::{enumerate_adapters, quiet_headless_vulkan};
pub use adapter::{enumerate_adapters_async, is_cpu_adapter, AdapterSelector};
pub(crate) use adapter::{env_path, env_value};
pub(crate) use adapter::{new_instance, no_adapter, numbered_names};
pub(crate) use capabilities::experimental_features;
pub use capabilities::{Capabilities, CoopConfig, MAX_INDEXED_BINDING};
pub use dtype::DType;
pub(crate) use resources::{CompiledPipeline, PipelineKey};
pub use runtime_checks::{RuntimeChecks, RUNTIME_CHECKS_VAR};
pub use text::Text;

use crate::error::{Error, Result};
use crate::staging::StagingPool;
use device_watch::DeviceWatch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Adapter, device, queue, capabilities and compiled pipelines: a context's device
/// layer, reached through [`crate::Context`] (which dereferences to it).
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    caps: Capabilities,
    pipelines: Mutex<HashMap<PipelineKey, CompiledPipeline>>,
    /// Readback buffers for reuse.
    staging: StagingPool,
    allocated: AtomicU64,
    /// What every context on this device shares: whether the device was lost (after
    /// which every call fails with an error that says so, where wgpu itself would
    /// panic on some, e.g. mapping a new buffer), the hooks to run then, and GPU errors
    /// that escaped every error scope, kept for the next call to return.
    watch: Arc<DeviceWatch>,
    /// Unique per context in this process (tensors remember the one that made them).
    id: u64,
    /// wgpu's runtime checks the kernels are compiled with.
    checks: RuntimeChecks,
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("caps", &self.caps)
            .field("checks", &self.checks)
            .finish()
    }
}

impl Gpu {
    /// The device layer of a context on `device`; `fresh` for a device this crate has
    /// just made (no other context can share it, so none is looked for). The loop cap
    /// is the context's to probe (`crate::kernels::loop_probe`).
    pub(crate) fn new(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue, fresh: bool) -> Self {
        let watch = DeviceWatch::for_device(&device, fresh);
        let caps = Capabilities::detect(&device, &info);
        Gpu {
            device,
            queue,
            info,
            caps,
            pipelines: Mutex::new(HashMap::new()),
            staging: StagingPool::default(),
            allocated: AtomicU64::new(0),
            watch,
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            checks: RuntimeChecks::WGPU_DEFAULT,
        }
    }

    /// Picks the kernel variants a GPU-class adapter gets (`shared`'s D ≤ 64 class) on a
    /// CPU adapter too: for tests, which run them on lavapipe.
    #[doc(hidden)]
    pub fn use_gpu_variants(&mut self) {
        self.caps.cpu = false;
    }

    /// Picks kernels as on an adapter without subgroups (WebGPU without the `subgroups`
    /// feature, GL): with [`Gpu::use_gpu_variants`], a GPU's variants that sum a
    /// row's lanes through workgroup memory. For tests, which run them on lavapipe.
    #[doc(hidden)]
    pub fn use_no_subgroups(&mut self) {
        self.caps.subgroups = None;
    }

    /// Compiles kernels from now on with these of wgpu's runtime checks (what
    /// `WGPU_ATTENTION_RUNTIME_CHECKS` does for contexts made by [`crate::Context::new`]):
    /// `WGPU_DEFAULT` keeps wgpu's loop counter and bounds checks; dropping them is safe
    /// for this crate's own kernels (every loop is bounded by its problem's shape, every
    /// index checked by the host's guards: docs/design.md, "Runtime checks") and is for
    /// timing them side by side on a GPU, where the counters cost instructions.
    pub fn use_runtime_checks(&mut self, checks: RuntimeChecks) {
        self.checks = checks;
    }

    /// The runtime checks kernels are compiled with ([`Gpu::use_runtime_checks`]).
    pub fn runtime_checks(&self) -> RuntimeChecks {
        self.checks
    }

    /// Records the cooperative-matrix configurations of the adapter this context's
    /// device came from (`adapter.cooperative_matrix_properties()`), for a context made
    /// by [`crate::Context::from_wgpu`]; ignored unless the device has
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` enabled.
    pub fn use_cooperative_matrix_properties(&mut self, properties: &[wgpu::CooperativeMatrixProperties]) {
        if self
            .device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            self.caps.cooperative_matrix = properties.iter().map(CoopConfig::of).collect();
        }
    }

    /// Lets an adapter without tensor cores run the cooperative-matrix kernels with each
    /// coop operation emulated per subgroup in plain WGSL (`kernels::coop_emulation`):
    /// slow, and a check of the kernels' logic only, for CI on lavapipe. Needs f16 and
    /// `SUBGROUP` with a fixed subgroup size of at most 16 lanes; a device with real
    /// tensor cores keeps them.
    pub fn emulate_cooperative_matrix(&mut self) -> Result<()> {
        if self.caps.coop_subgroup_size().is_some() && !self.caps.coop_emulated {
            return Ok(()); // real tensor cores the kernels can use
        }
        let mut caps = self.caps.clone();
        caps.cooperative_matrix = vec![CoopConfig {
            m: 16,
            n: 16,
            k: 16,
            ab: "f16",
            c: "f32",
        }];
        if caps.coop_subgroup_size().is_none() {
            return Err(Error::MissingFeature {
                adapter: self.info.name.clone(),
                feature: "SHADER_F16, SUBGROUP with a fixed subgroup size and SUBGROUP_BARRIER",
                needed_for: "emulating cooperative matrices".into(),
            });
        }
        // A lane holds 16 / SG elements of a tile row (kernels::coop_emulation).
        if caps.coop_subgroup_size().is_some_and(|sg| 16 % sg != 0) {
            return Err(Error::MissingFeature {
                adapter: self.info.name.clone(),
                feature: "subgroups of at most 16 lanes",
                needed_for: "emulating cooperative matrices".into(),
            });
        }
        // The loop model of the emulated kernels (kernels::loop_budget::coop_iterations)
        // covers subgroups of 8 and 16 lanes; on 4 one tile of the larger variants
        // could pass llvmpipe's cap.
        if self.caps.loop_cap.is_some() && caps.coop_subgroup_size().is_some_and(|sg| sg < 8) {
            return Err(Error::MissingFeature {
                adapter: self.info.name.clone(),
                feature: "subgroups of at least 8 lanes (under this driver's loop cap)",
                needed_for: "emulating cooperative matrices".into(),
            });
        }
        caps.coop_emulated = true;
        self.caps = caps;
        Ok(())
    }

    /// This device layer's identity (its context's) within the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The wgpu device, to make buffers for [`crate::Tensor::from_buffer`] or record
    /// work of your own beside this crate's.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The device's queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// The adapter's name, backend, device type and driver.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// What the device can do, as detected when the context was made.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// True for CPU adapters such as lavapipe and llvmpipe.
    pub fn is_cpu_adapter(&self) -> bool {
        is_cpu_adapter(&self.info)
    }

    /// Loop iterations one invocation may run on this device (Mesa's llvmpipe up to
    /// 22.x ends them after 65535), or `None` if unbounded; see `kernels::loop_budget`.
    pub fn loop_cap(&self) -> Option<u64> {
        self.caps.loop_cap
    }

    /// Makes this context behave as if the driver ended an invocation's loops after
    /// `iterations` (never raising a cap the driver has): the fused kernels then split
    /// long key ranges across dispatches and resume, as on Mesa 22's llvmpipe, and the
    /// paths that cannot split refuse such work. For tests that must run the resume
    /// path on every adapter.
    pub fn limit_loop_iterations(&mut self, iterations: u64) {
        self.caps.loop_cap = Some(self.caps.loop_cap.map_or(iterations, |c| c.min(iterations)));
    }

    pub(crate) fn require_f16(&self, needed_for: &str) -> Result<()> {
        if self.caps.f16 {
            Ok(())
        } else {
            Err(Error::MissingFeature {
                adapter: self.info.name.clone(),
                feature: "SHADER_F16",
                needed_for: needed_for.into(),
            })
        }
    }
}
