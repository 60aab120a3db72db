//! The handle callers hold (docs/design.md, "Host side"): a [`Context`] is the device
//! layer ([`Gpu`]: adapter, device, queue, capabilities, pipeline cache) and the
//! [`Policy`] its kernels are picked under (pins, key splits, the tuning table's
//! variants, read from the environment once, when it is made). It dereferences to its
//! [`Gpu`], so a `&Context` serves wherever a kernel or a tensor asks for the device
//! alone; the operations take the context and hand its policy to the pickers.

#[cfg(not(target_arch = "wasm32"))]
pub use crate::gpu::{enumerate_adapters, quiet_headless_vulkan};
pub use crate::gpu::{enumerate_adapters_async, AdapterSelector, Capabilities, CoopConfig, Gpu};
pub use crate::kernels::policy::{
    Policy, COOP_BACKWARD_VAR, COOP_GEMM_VAR, KEY_SPLITS_VAR, MAX_KEY_SPLITS, SUBGROUPS_VAR,
};

use crate::error::{Error, Result};
use crate::gpu::{experimental_features, new_instance, no_adapter, numbered_names};
use crate::kernels::policy::runtime_checks_from_env;
use crate::options::FusedTiling;

/// A device ([`Gpu`], which it dereferences to) and the choices its kernels are picked
/// under ([`Policy`]).
pub struct Context {
    gpu: Gpu,
    /// Pins and tuning: what was chosen, beside what the adapter can do.
    policy: Policy,
}

impl std::ops::Deref for Context {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.gpu
    }
}

impl std::ops::DerefMut for Context {
    fn deref_mut(&mut self) -> &mut Gpu {
        &mut self.gpu
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("gpu", &self.gpu)
            .field("policy", &self.policy)
            .finish()
    }
}

// Every function that waits on the GPU has an async form, the one implementation; the
// blocking form (native targets only: a browser cannot block) runs it with pollster.
#[cfg(not(target_arch = "wasm32"))]
impl Context {
    /// Builds a context from the environment (`WGPU_ADAPTER_NAME`, `WGPU_BACKEND`,
    /// `WGPU_POWER_PREF`), else wgpu's default adapter. Blocks until the device is ready.
    pub fn new() -> Result<Self> {
        pollster::block_on(Self::new_async())
    }

    /// Builds a context on the adapter the selector (then the environment) names.
    pub fn with_selector(selector: AdapterSelector) -> Result<Self> {
        pollster::block_on(Self::with_selector_async(selector))
    }

    /// Creates a device on `adapter` with the features this crate can use (f16,
    /// subgroups, timestamps, cooperative matrices) and the adapter's own limits.
    pub fn from_adapter(adapter: &wgpu::Adapter) -> Result<Self> {
        pollster::block_on(Self::from_adapter_async(adapter))
    }

    /// Shares a device and queue the caller already owns (e.g. with a renderer). Tensor
    /// cores are used only after [`crate::Gpu::use_cooperative_matrix_properties`], and only
    /// if the device has `EXPERIMENTAL_COOPERATIVE_MATRIX`. The device's uncaptured-error
    /// handler stays the caller's: errors in work the caller submits outside an error
    /// scope go there, not to this context's next call (as they do for contexts this
    /// crate makes).
    ///
    /// **This installs a device-lost callback** (`Device::set_device_lost_callback`),
    /// unless a context already uses this device (then they share it). wgpu keeps one
    /// callback per device and offers no way to read it back, so one the caller set
    /// before is replaced. To keep a handler of your own:
    /// - register it with [`crate::Gpu::on_device_lost`]: every context on the device runs
    ///   it once, when the device is lost (at once if it already was);
    /// - or, if you set a callback of your own after making the context, call
    ///   [`crate::Gpu::device_lost_callback`]'s function from it; otherwise no context on
    ///   the device learns of the loss.
    ///
    /// A device destroyed or lost before this call makes a context that is lost from
    /// the start (natively; on the web only once the browser reports the loss).
    pub fn from_wgpu(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        pollster::block_on(Self::from_wgpu_async(info, device, queue))
    }
}

impl Context {
    /// [`Context::new`], awaited.
    pub async fn new_async() -> Result<Self> {
        Self::with_selector_async(AdapterSelector::default()).await
    }

    /// [`Context::with_selector`], awaited.
    pub async fn with_selector_async(selector: AdapterSelector) -> Result<Self> {
        let selector = selector.with_env()?;
        let adapter = match &selector.name {
            // Numbered as `info` numbers them: every adapter on the listed backends.
            Some(_) => selector
                .numbered_adapters_async()
                .await?
                .into_iter()
                .map(|(_, a)| a)
                .next()
                .ok_or_else(|| no_adapter(&selector, &[]))?,
            None => {
                let backends = selector.backends()?;
                let instance = new_instance(backends);
                let options = wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::from_env().unwrap_or_default(),
                    ..Default::default()
                };
                match instance.request_adapter(&options).await {
                    Ok(adapter) => adapter,
                    Err(_) => {
                        let listed = instance.enumerate_adapters(backends).await;
                        return Err(no_adapter(&selector, &numbered_names(&listed, backends)));
                    }
                }
            }
        };
        Self::from_adapter_async(&adapter).await
    }

    /// [`Context::from_adapter`], awaited.
    pub async fn from_adapter_async(adapter: &wgpu::Adapter) -> Result<Self> {
        let info = adapter.get_info();
        // The environment, read before the device is made: it may keep subgroups off.
        let policy = Policy::from_env(&info)?;
        let checks = runtime_checks_from_env()?;
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        if !policy.subgroups {
            wanted.remove(wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER);
        }
        let features = adapter.features() & wanted;
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgpu-attention"),
            required_features: features,
            required_limits: adapter.limits(),
            experimental_features: experimental_features(features),
            ..Default::default()
        };
        let (device, queue) = adapter.request_device(&desc).await.map_err(|e| Error::RequestDevice {
            adapter: info.name.clone(),
            reason: e.to_string(),
        })?;
        let mut ctx = Self::from_device_async(info, device.clone(), queue, true).await;
        ctx.gpu.use_runtime_checks(checks);
        ctx.gpu.keep_uncaptured_errors();
        ctx.use_cooperative_matrix_properties(&adapter.cooperative_matrix_properties());
        ctx.policy = policy;
        Ok(ctx)
    }

    /// Pins the tensor-core variant per head-dim class (one per class; the smallest
    /// class that holds a problem's head dims is used), as a tuning table does for the
    /// adapter it names (`crate::kernels::tune`): for contexts made with [`Context::from_wgpu`],
    /// which read no table, and for `wgpu-attention tune`. A variant that does not fit
    /// the adapter is passed over for the picker's rule.
    pub fn use_coop_variants(&mut self, variants: Vec<crate::kernels::flash::CoopVariant>) {
        self.policy.coop_tuned = variants;
    }

    /// Pins the lanes over which the micro-tile tiling reduces a row with subgroup
    /// shuffles (1, 8 or 16; more than the adapter's subgroups hold falls back to the
    /// most they do); `None` restores the default, the most they hold. For `tune`,
    /// which times each. Any other count is refused: the kernel has no variant for it.
    pub fn use_micro_lanes(&mut self, lanes: Option<u32>) -> Result<()> {
        if let Some(l) = lanes.filter(|l| !matches!(l, 1 | 8 | 16)) {
            return Err(Error::invalid("micro lanes", format!("{l} is not 1, 8 or 16")));
        }
        self.policy.micro_lanes = lanes;
        Ok(())
    }

    /// Pins the number of disjoint key ranges a fused attention is split into (1 to
    /// [`MAX_KEY_SPLITS`]; what `WGPU_ATTENTION_KEY_SPLITS` does for contexts made by
    /// [`Context::new`]). Each range runs in dispatches of its own, into outputs of its
    /// own, and the ranges are merged by log-sum-exp: more workgroups for problems whose
    /// B·H·(Lq/rows) leaves a GPU idle. Attention with weights is never split. For
    /// `tune` and benchmarks, which time it (docs/design.md, "Key splits").
    pub fn use_key_splits(&mut self, splits: u32) -> Result<()> {
        if !(1..=MAX_KEY_SPLITS).contains(&splits) {
            return Err(Error::invalid(
                "key splits",
                format!("{splits} is not a count of 1 to {MAX_KEY_SPLITS}"),
            ));
        }
        self.policy.key_splits = splits;
        Ok(())
    }

    /// Runs the tensor-core backward with its fragments and gradient tiles as named
    /// values, every loop over them unrolled (`true`), or as arrays indexed by loop
    /// counters (`false`, the default): the forward's `named` axis, which the GPU must
    /// time (what `WGPU_ATTENTION_COOP_BACKWARD=named` does for contexts made by
    /// [`Context::new`]; docs/design.md, "Tensor cores").
    pub fn use_named_coop_backward(&mut self, named: bool) {
        self.policy.coop_backward_named = named;
    }

    /// Pins the tensor-core backward's variant (its own form, arrayed or named) for every
    /// problem it fits; `None` restores the picker's. For `tune --backward`, which times
    /// each.
    pub fn use_coop_backward_variant(&mut self, variant: Option<crate::kernels::backward_coop::CoopBackwardVariant>) {
        self.policy.coop_backward_pinned = variant;
    }

    /// Runs the tensor-core GEMM (the linear layers and the benchmark's probe) in its
    /// `direct` design, every fragment loaded straight from X's and W's rows, wherever
    /// it serves a layer (`true`; f16, `kernels::matmul::direct_serves`), or staged
    /// through workgroup memory (`false`, the default), which the GPU must time side by
    /// side (what `WGPU_ATTENTION_COOP_GEMM=direct` does for contexts made by
    /// [`Context::new`]; docs/design.md, "Tensor cores").
    pub fn use_direct_coop_gemm(&mut self, direct: bool) {
        self.policy.coop_gemm_direct = direct;
    }

    /// [`Context::from_wgpu`], awaited (a CPU adapter's context runs the loop probe,
    /// [`crate::Gpu::loop_cap`], which reads a result back).
    pub async fn from_wgpu_async(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::from_device_async(info, device, queue, false).await
    }

    /// [`Context::from_wgpu_async`]; `fresh` for a device this crate has just made
    /// (no other context can share it, so none is looked for). A CPU adapter's
    /// context probes the driver's loop cap ([`Gpu::loop_cap`]).
    async fn from_device_async(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue, fresh: bool) -> Self {
        let mut gpu = Gpu::new(info, device, queue, fresh);
        // (A lost device runs nothing: every call on the context will say so.)
        if gpu.is_cpu_adapter() && !gpu.is_lost() {
            if let Some(cap) = crate::kernels::loop_probe::probe_async(gpu.device(), gpu.queue()).await {
                gpu.limit_loop_iterations(cap);
            }
        }
        Context {
            gpu,
            policy: Policy::deferred(),
        }
    }

    /// The tiling `WGPU_ATTENTION_TILING` named when this context was made (`Auto` when unset),
    /// or the error it gave.
    pub fn env_tiling(&self) -> Result<FusedTiling> {
        self.policy.tiling()
    }

    /// Pins the split-K decode design (what `WGPU_ATTENTION_DECODE` does for contexts
    /// made by [`Context::new`]): for tests and for timing the designs side by side.
    #[doc(hidden)]
    pub fn use_decode_design(&mut self, design: Option<crate::kernels::decode::DecodeDesign>) {
        self.policy.decode_design = Ok(design);
    }

    /// What was chosen for this context beside what the adapter can do: pins, key
    /// splits, the tuned tensor-core variants ([`Policy`]).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn awaited_scopes_catch_what_bare_steps_raise() {
        // On the web, steps inside an async entry point run without scopes of their own
        // (`Context::scoped` on wasm32); the entry point's awaited scopes must catch
        // what they raise, and leave nothing behind for the next call.
        let ctx = match Context::new() {
            Ok(ctx) => ctx,
            Err(e) => {
                assert!(
                    std::env::var("WGPU_ATTENTION_REQUIRE_ADAPTER").as_deref() != Ok("1"),
                    "WGPU_ATTENTION_REQUIRE_ADAPTER=1 but no adapter: {e}"
                );
                eprintln!("SKIPPING: no adapter ({e})");
                return;
            }
        };
        let result = pollster::block_on(ctx.scoped_async("a buffer both mappable and storage", || {
            Ok(ctx.device().create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            }))
        }));
        assert!(
            matches!(&result, Err(Error::Gpu { during, .. }) if during.contains("mappable")),
            "{result:?}"
        );
        assert!(ctx.check_usable("the next call").is_ok());
    }
}
