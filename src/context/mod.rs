//! The GPU context: adapter, device, queue, detected capabilities and the pipeline cache.
//!
//! Rooms: `adapter` (choosing one), `capabilities` (what it can do), `policy` (what
//! the user, the environment or a tuning table chose), `device_watch`
//! (device loss and escaped errors), `submit` (error scopes, submission, readback) and
//! `resources` (buffers, textures, pipelines); this file makes contexts.

mod adapter;
mod capabilities;
mod device_watch;
mod policy;
mod resources;
mod submit;

#[cfg(test)]
pub use adapter::mesa_version;
#[cfg(not(target_arch = "wasm32"))]
pub use adapter::{enumerate_adapters, quiet_headless_vulkan};
pub use adapter::{enumerate_adapters_async, is_cpu_adapter, AdapterSelector};
pub use capabilities::{Capabilities, CoopConfig, MAX_INDEXED_BINDING};
pub(crate) use policy::{env_path, env_value};
pub use policy::{Policy, COOP_BACKWARD_VAR, COOP_GEMM_VAR, KEY_SPLITS_VAR, MAX_KEY_SPLITS, SUBGROUPS_VAR};
pub(crate) use resources::{CompiledPipeline, PipelineKey};

use crate::error::{Error, Result};
use crate::options::FusedTiling;
use crate::staging::StagingPool;
use adapter::{new_instance, no_adapter};
use capabilities::experimental_features;
use device_watch::DeviceWatch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Adapter, device, queue, capabilities and compiled pipelines.
pub struct Context {
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
    /// Pins, tuning and runtime checks: what was chosen, beside what the adapter can do.
    policy: Policy,
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("caps", &self.caps)
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
    /// cores are used only after [`Context::use_cooperative_matrix_properties`], and only
    /// if the device has `EXPERIMENTAL_COOPERATIVE_MATRIX`. The device's uncaptured-error
    /// handler stays the caller's: errors in work the caller submits outside an error
    /// scope go there, not to this context's next call (as they do for contexts this
    /// crate makes).
    ///
    /// **This installs a device-lost callback** (`Device::set_device_lost_callback`),
    /// unless a context already uses this device (then they share it). wgpu keeps one
    /// callback per device and offers no way to read it back, so one the caller set
    /// before is replaced. To keep a handler of your own:
    /// - register it with [`Context::on_device_lost`]: every context on the device runs
    ///   it once, when the device is lost (at once if it already was);
    /// - or, if you set a callback of your own after making the context, call
    ///   [`Context::device_lost_callback`]'s function from it; otherwise no context on
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
                        return Err(no_adapter(&selector, &adapter::numbered_names(&listed, backends)));
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
        // Every operation runs inside error scopes. An error that escapes them (work the
        // caller recorded with an `encode_*` function and submitted outside a scope)
        // is kept for the `Result` of the next call on the thread that raised it, rather
        // than aborting the process as wgpu's default handler does. The handler holds
        // the watch weakly (the device owns the handler).
        let watch = Arc::downgrade(&ctx.watch);
        device.on_uncaptured_error(Arc::new(move |e| {
            eprintln!("wgpu-attention: uncaptured wgpu error: {e}");
            if let Some(watch) = watch.upgrade() {
                watch.keep_escaped(e.to_string());
            }
        }));
        ctx.use_cooperative_matrix_properties(&adapter.cooperative_matrix_properties());
        ctx.policy = policy;
        Ok(ctx)
    }

    /// Pins the tensor-core variant per head-dim class (one per class; the smallest
    /// class that holds a problem's head dims is used), as a tuning table does for the
    /// adapter it names (`crate::tune`): for contexts made with [`Context::from_wgpu`],
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

    /// Picks the kernel variants a GPU-class adapter gets (`shared`'s D ≤ 64 class) on a
    /// CPU adapter too: for tests, which run them on lavapipe.
    #[doc(hidden)]
    pub fn use_gpu_variants(&mut self) {
        self.caps.cpu = false;
    }

    /// Picks kernels as on an adapter without subgroups (WebGPU without the `subgroups`
    /// feature, GL): with [`Context::use_gpu_variants`], a GPU's variants that sum a
    /// row's lanes through workgroup memory. For tests, which run them on lavapipe.
    #[doc(hidden)]
    pub fn use_no_subgroups(&mut self) {
        self.caps.subgroups = None;
    }

    /// Compiles kernels from now on with these of wgpu's runtime checks (what
    /// `WGPU_ATTENTION_RUNTIME_CHECKS` does for contexts made by [`Context::new`]):
    /// `WGPU_DEFAULT` keeps wgpu's loop counter and bounds checks; dropping them is safe
    /// for this crate's own kernels (every loop is bounded by its problem's shape, every
    /// index checked by the host's guards: docs/design.md, "Runtime checks") and is for
    /// timing them side by side on a GPU, where the counters cost instructions.
    pub fn use_runtime_checks(&mut self, checks: crate::kernels::runtime_checks::RuntimeChecks) {
        self.policy.runtime_checks = checks;
    }

    /// The runtime checks kernels are compiled with ([`Context::use_runtime_checks`]).
    pub fn runtime_checks(&self) -> crate::kernels::runtime_checks::RuntimeChecks {
        self.policy.runtime_checks
    }

    /// Sets the dX scratch budget of the texel backward (CPU adapters; docs/design.md,
    /// "Backward") to `bytes`: smaller bands of pairs and query rows, more of them (never
    /// below [`crate::backward::MIN_BAND_ROWS`] rows). For tests of the banding; the
    /// default is [`crate::backward::SCRATCH_BYTES`].
    #[doc(hidden)]
    pub fn limit_backward_scratch(&mut self, bytes: u64) {
        self.policy.backward_scratch_bytes = bytes;
    }

    pub(crate) fn backward_scratch_bytes(&self) -> u64 {
        self.policy.backward_scratch_bytes
    }

    /// Records the cooperative-matrix configurations of the adapter this context's
    /// device came from (`adapter.cooperative_matrix_properties()`), for a context made
    /// by [`Context::from_wgpu`]; ignored unless the device has
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

    /// [`Context::from_wgpu`], awaited (a CPU adapter's context runs the loop probe,
    /// [`Context::loop_cap`], which reads a result back).
    pub async fn from_wgpu_async(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        Self::from_device_async(info, device, queue, false).await
    }

    /// [`Context::from_wgpu_async`]; `fresh` for a device this crate has just made
    /// (no other context can share it, so none is looked for).
    async fn from_device_async(info: wgpu::AdapterInfo, device: wgpu::Device, queue: wgpu::Queue, fresh: bool) -> Self {
        let watch = DeviceWatch::for_device(&device, fresh);
        let mut caps = Capabilities::detect(&device, &info);
        // (A lost device runs nothing: every call on the context will say so.)
        if is_cpu_adapter(&info) && !watch.lost.load(Ordering::SeqCst) {
            caps.loop_cap = crate::kernels::loop_probe::probe_async(&device, &queue).await;
        }
        Context {
            device,
            queue,
            info,
            caps,
            pipelines: Mutex::new(HashMap::new()),
            staging: StagingPool::default(),
            allocated: AtomicU64::new(0),
            watch,
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            policy: Policy::deferred(),
        }
    }

    /// The tiling `WGPU_ATTENTION_TILING` named when this context was made (`Auto` when unset),
    /// or the error it gave.
    pub fn env_tiling(&self) -> Result<FusedTiling> {
        self.policy.tiling()
    }

    /// The split-K decode design pinned for this context (`None`: the adapter's own
    /// pick), or the error `WGPU_ATTENTION_DECODE` gave.
    pub(crate) fn decode_design(&self) -> Result<Option<crate::kernels::decode::DecodeDesign>> {
        self.policy.decode_design()
    }

    /// Pins the split-K decode design (what `WGPU_ATTENTION_DECODE` does for contexts
    /// made by [`Context::new`]): for tests and for timing the designs side by side.
    #[doc(hidden)]
    pub fn use_decode_design(&mut self, design: Option<crate::kernels::decode::DecodeDesign>) {
        self.policy.decode_design = Ok(design);
    }

    /// This context's identity within the process.
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

    /// What was chosen for this context beside what the adapter can do: pins, key
    /// splits, the tuned tensor-core variants, runtime checks ([`Policy`]).
    pub fn policy(&self) -> &Policy {
        &self.policy
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
            Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
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
