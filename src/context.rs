//! The GPU context: adapter, device, queue, detected capabilities and the pipeline cache.

use crate::error::{Error, Result};
use crate::options::FusedTiling;
use crate::staging::{self, StagingPool};
use crate::tensor::DType;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

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

    fn backends(&self) -> Result<wgpu::Backends> {
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
    /// [`Context::with_selector`] does). Where a name or a backend is given and no
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

/// The largest binding the kernels can index: they address elements (2 or 4 bytes)
/// with u32 arithmetic, so a binding under 2^32 bytes keeps every index, and the sum of
/// two, below 2^32. Vulkan and DX12 report at most this; Metal reports its
/// `maxBufferLength`, often more, which would wrap indices silently.
pub const MAX_INDEXED_BINDING: u64 = u32::MAX as u64;

/// What the device can do, detected once when the context is made.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// `SHADER_F16` is enabled: f16 storage and arithmetic in shaders.
    pub f16: bool,
    /// Subgroup operations are enabled; `(min, max)` subgroup size.
    pub subgroups: Option<(u32, u32)>,
    /// Timestamp queries are enabled.
    pub timestamps: bool,
    /// Bytes of workgroup memory one workgroup may use.
    pub max_workgroup_storage: u32,
    /// Largest storage buffer binding in bytes: the device's limit, capped at
    /// [`MAX_INDEXED_BINDING`].
    pub max_storage_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Largest workgroup count along one dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Largest number of invocations in one workgroup.
    pub max_invocations: u32,
    /// Largest width and height of a 2D texture, in texels.
    pub max_texture_dim: u32,
    /// Largest number of layers of a 2D-array texture.
    pub max_texture_layers: u32,
    /// Cooperative-matrix (tensor core) configurations the device may use: empty unless
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` is enabled on it and the adapter listed them.
    pub cooperative_matrix: Vec<CoopConfig>,
    /// The cooperative-matrix kernels run with their coop operations emulated in plain
    /// WGSL ([`Context::emulate_cooperative_matrix`]; CI on adapters without tensor cores).
    pub coop_emulated: bool,
    /// Loop iterations one invocation may run before the driver ends its loops (Mesa's
    /// llvmpipe up to 22.x: 65535), as [`crate::kernels::loop_probe`] observed on a CPU
    /// adapter; `None` where loops run to the end (GPUs, Mesa 25's lavapipe).
    pub loop_cap: Option<u64>,
    /// The Mesa release (major, minor) of a Mesa driver, from the adapter's driver
    /// info (`Mesa 22.3.6 (LLVM 15.0.6)`): some tilings run best differently per release.
    pub mesa_version: Option<(u32, u32)>,
}

#[cfg(test)]
impl Capabilities {
    /// A generous adapter for the tilings' unit tests, with these subgroup sizes,
    /// workgroup memory and Mesa release.
    pub(crate) fn for_tests(
        subgroups: Option<(u32, u32)>,
        max_workgroup_storage: u32,
        mesa_version: Option<(u32, u32)>,
    ) -> Self {
        Capabilities {
            f16: true,
            subgroups,
            timestamps: true,
            max_workgroup_storage,
            max_storage_binding: 1 << 30,
            max_buffer: 1 << 30,
            max_workgroups_per_dim: 65535,
            max_invocations: 256,
            max_texture_dim: 16384,
            max_texture_layers: 2048,
            cooperative_matrix: Vec::new(),
            coop_emulated: false,
            loop_cap: None,
            mesa_version,
        }
    }
}

/// One cooperative-matrix configuration: `M x N x K` tiles with A/B elements of `ab`
/// and accumulator elements of `c` (`"f16"`, `"f32"`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopConfig {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ab: &'static str,
    pub c: &'static str,
}

impl CoopConfig {
    pub fn of(p: &wgpu::CooperativeMatrixProperties) -> Self {
        let name = |t: wgpu::CooperativeScalarType| match t {
            wgpu::CooperativeScalarType::F32 => "f32",
            wgpu::CooperativeScalarType::F16 => "f16",
            wgpu::CooperativeScalarType::I32 => "i32",
            wgpu::CooperativeScalarType::U32 => "u32",
            #[allow(unreachable_patterns)]
            _ => "other",
        };
        CoopConfig {
            m: p.m_size,
            n: p.n_size,
            k: p.k_size,
            ab: name(p.ab_type),
            c: name(p.cr_type),
        }
    }

    /// What `info` and `bench` print: `16x16x16 f16->f32`.
    pub fn label(&self) -> String {
        format!("{}x{}x{} {}->{}", self.m, self.n, self.k, self.ab, self.c)
    }

    /// Labels as one line: comma-separated, or `none`.
    pub fn summary<S: AsRef<str>>(labels: &[S]) -> String {
        if labels.is_empty() {
            return "none".into();
        }
        labels.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

impl Capabilities {
    /// The subgroup size the tensor-core kernels run with (their `SG` override), if the
    /// device can run them: the 16x16x16 f16->f32 cooperative-matrix configuration, f16,
    /// and one fixed subgroup size (the kernels give each subgroup a band of rows by
    /// `subgroup_id`, so the host must know how many invocations make one).
    pub fn coop_subgroup_size(&self) -> Option<u32> {
        let tile = CoopConfig {
            m: 16,
            n: 16,
            k: 16,
            ab: "f16",
            c: "f32",
        };
        match self.subgroups {
            Some((min, max)) if min == max && min > 0 && self.f16 && self.cooperative_matrix.contains(&tile) => {
                Some(min)
            }
            _ => None,
        }
    }

    fn detect(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Self {
        Self::of(info, device.features(), &device.limits())
    }

    /// What a device with these features and limits can do (for an adapter, what a
    /// device made from it with the same features would).
    pub fn of(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        Capabilities {
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_storage_binding: limits.max_storage_buffer_binding_size.min(MAX_INDEXED_BINDING),
            max_buffer: limits.max_buffer_size,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            max_texture_dim: limits.max_texture_dimension_2d,
            max_texture_layers: limits.max_texture_array_layers,
            cooperative_matrix: Vec::new(),
            coop_emulated: false,
            loop_cap: None,
            mesa_version: mesa_version(&info.driver_info),
        }
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

/// The token that lets a device enable `EXPERIMENTAL_COOPERATIVE_MATRIX`, when the
/// adapter offers it; otherwise none is asked for.
#[allow(unsafe_code)]
fn experimental_features(features: wgpu::Features) -> wgpu::ExperimentalFeatures {
    if !features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return wgpu::ExperimentalFeatures::disabled();
    }
    // SAFETY: wgpu asks us to acknowledge that its experimental features may have bugs
    // with undefined behaviour. Enabling the feature changes nothing for shaders that do
    // not `enable wgpu_cooperative_matrix`. The two that do (shaders/matmul_coop.wgsl,
    // shaders/flash_coop.wgsl) keep every cooperative load and store inside workgroup
    // arrays they declare (operands are staged there with bounds checks), and the host
    // dispatches them only where `Capabilities::coop_subgroup_size` found the 16x16x16
    // f16->f32 configuration and a fixed subgroup size to set as `SG`.
    unsafe { wgpu::ExperimentalFeatures::enabled() }
}

/// True for CPU adapters such as lavapipe and llvmpipe: by device type, or by name for
/// drivers that report another type.
pub fn is_cpu_adapter(info: &wgpu::AdapterInfo) -> bool {
    info.device_type == wgpu::DeviceType::Cpu
        || ["llvmpipe", "lavapipe", "swiftshader", "warp"]
            .iter()
            .any(|n| info.name.to_lowercase().contains(n))
}

/// Identifies one compiled pipeline: which shader, which element type, which override
/// constants. Pipelines are compiled once per context (lavapipe compiles through LLVM).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    /// Shader file, entry point and variant.
    pub shader: (&'static str, &'static str, &'static str),
    pub dtype: DType,
    pub constants: Vec<(&'static str, u32)>,
}

/// A compiled pipeline and its (automatic) bind group layout, fetched once: every
/// dispatch makes a bind group against it (issue 17 §5: not one
/// `get_bind_group_layout` per dispatch).
#[derive(Clone, Debug)]
pub(crate) struct CompiledPipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

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
    /// `WGPU_ATTENTION_TILING` as read when the context was made (`Auto` when unset),
    /// or why it could not be parsed.
    env_tiling: std::result::Result<FusedTiling, String>,
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A hook run once when a device is lost: wgpu's reason and message.
type LostHook = Box<dyn FnOnce(wgpu::DeviceLostReason, &str) + Send>;

/// At most this many threads' escaped errors are kept ([`DeviceWatch::escaped`]): a
/// thread that never calls again must not make the list grow without bound.
const KEPT_ESCAPED: usize = 16;

/// What every [`Context`] on one device shares. wgpu keeps one device-lost callback per
/// device, so the first context made on a device installs one that notifies this watch,
/// and every later one on the same device ([`Context::from_wgpu`] on a device a context
/// already uses) finds the watch in a process-wide registry rather than replacing the
/// callback, which would leave the earlier contexts blind to the loss.
#[derive(Default)]
struct DeviceWatch {
    lost: AtomicBool,
    on_lost: Mutex<LostState>,
    /// GPU errors that escaped every error scope (work the caller submitted outside
    /// one), each with the thread wgpu raised it on: natively wgpu raises an error on
    /// the thread of the call that caused it (its error scopes are per thread), so
    /// that thread's next call gets it, and no other thread's. The first per thread.
    escaped: Mutex<Vec<Escaped>>,
}

#[derive(Default)]
struct LostState {
    hooks: Vec<LostHook>,
    /// Set once the device is lost: hooks registered later run at once with it.
    cause: Option<(wgpu::DeviceLostReason, String)>,
}

/// A GPU error that escaped every error scope.
struct Escaped {
    /// The thread wgpu raised it on. On the web every error arrives on the one thread,
    /// after the call that caused it has returned, so none is recorded.
    #[cfg(not(target_arch = "wasm32"))]
    thread: std::thread::ThreadId,
    message: String,
}

/// Locks a mutex whose data stays consistent whatever a panicking holder did (each
/// change is one push, take or assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl DeviceWatch {
    /// Marks the device lost and runs the hooks (outside the lock: a hook may register
    /// another, which then runs at once). Only the first loss counts.
    fn notify(&self, reason: wgpu::DeviceLostReason, message: String) {
        self.lost.store(true, Ordering::SeqCst);
        let hooks = {
            let mut state = lock(&self.on_lost);
            if state.cause.is_some() {
                return;
            }
            state.cause = Some((reason, message.clone()));
            std::mem::take(&mut state.hooks)
        };
        for hook in hooks {
            hook(reason, &message);
        }
    }

    fn add_hook(&self, hook: LostHook) {
        let mut state = lock(&self.on_lost);
        match &state.cause {
            Some((reason, message)) => {
                let (reason, message) = (*reason, message.clone());
                drop(state);
                hook(reason, &message);
            }
            None => state.hooks.push(hook),
        }
    }

    /// Keeps an error that escaped every scope, for the next call of the thread it was
    /// raised on (the first one per thread; at most [`KEPT_ESCAPED`] threads, oldest
    /// dropped).
    fn keep_escaped(&self, message: String) {
        let mut escaped = lock(&self.escaped);
        #[cfg(not(target_arch = "wasm32"))]
        let entry = Escaped {
            thread: std::thread::current().id(),
            message,
        };
        #[cfg(target_arch = "wasm32")]
        let entry = Escaped { message };
        #[cfg(not(target_arch = "wasm32"))]
        if escaped.iter().any(|e| e.thread == entry.thread) {
            return;
        }
        #[cfg(target_arch = "wasm32")]
        if !escaped.is_empty() {
            return;
        }
        if escaped.len() == KEPT_ESCAPED {
            escaped.remove(0);
        }
        escaped.push(entry);
    }

    /// The escaped error that belongs to the calling thread, if any (on the web, the
    /// one kept, whichever call raised it).
    fn take_escaped(&self) -> Option<String> {
        let mut escaped = lock(&self.escaped);
        #[cfg(not(target_arch = "wasm32"))]
        let i = {
            let me = std::thread::current().id();
            escaped.iter().position(|e| e.thread == me)?
        };
        #[cfg(target_arch = "wasm32")]
        let i = (!escaped.is_empty()).then_some(0)?;
        Some(escaped.remove(i).message)
    }

    /// The watch every context on `device` shares: the one registered for it, unless
    /// `fresh` (a device this crate has just made, which none can be), else a new one,
    /// whose device-lost callback this installs.
    fn for_device(device: &wgpu::Device, fresh: bool) -> Arc<DeviceWatch> {
        prune_watches();
        let (watch, created) = with_watches(|watches| {
            if !fresh {
                let found = watches
                    .iter()
                    .filter(|(_, w)| w.strong_count() > 0)
                    .find(|(d, _)| same_device(d, device))
                    .and_then(|(_, w)| w.upgrade());
                if let Some(watch) = found {
                    return (watch, false);
                }
            }
            let watch = Arc::new(DeviceWatch::default());
            watches.push((device.clone(), Arc::downgrade(&watch)));
            (watch, true)
        });
        if created {
            // Installed outside the registry's lock: replacing the caller's callback drops
            // it, and whatever it owned with it.
            device.set_device_lost_callback(lost_callback(&watch));
            #[cfg(not(target_arch = "wasm32"))]
            if !fresh && is_dead(device) {
                watch.notify(
                    wgpu::DeviceLostReason::Unknown,
                    "the device was lost before this context was made".into(),
                );
            }
        }
        watch
    }
}

/// What wgpu's device-lost callback runs: notifies the watch if a context still uses
/// it. It holds the watch weakly: the registry keeps the device, which keeps this.
fn lost_callback(watch: &Arc<DeviceWatch>) -> impl Fn(wgpu::DeviceLostReason, String) + Send + Sync + 'static {
    let watch = Arc::downgrade(watch);
    move |reason, message| {
        if let Some(watch) = watch.upgrade() {
            watch.notify(reason, message);
        }
    }
}

impl Drop for DeviceWatch {
    fn drop(&mut self) {
        // The last context on the device is gone: its registry entry goes, and with it
        // the registry's handle on the device.
        prune_watches();
    }
}

/// Each device a context uses, with its watch (held weakly: the contexts own it).
type Watches = Vec<(wgpu::Device, Weak<DeviceWatch>)>;

/// Runs `f` on the registry of device watches. `f` must not drop a watch or a device:
/// either may end up back here ([`prune_watches`]).
#[cfg(not(target_arch = "wasm32"))]
fn with_watches<R>(f: impl FnOnce(&mut Watches) -> R) -> R {
    static WATCHES: Mutex<Watches> = Mutex::new(Vec::new());
    f(&mut lock(&WATCHES))
}

/// [`with_watches`] on the web, where devices cannot cross threads (nor do they need
/// to: there is one).
#[cfg(target_arch = "wasm32")]
fn with_watches<R>(f: impl FnOnce(&mut Watches) -> R) -> R {
    thread_local! {
        static WATCHES: std::cell::RefCell<Watches> = const { std::cell::RefCell::new(Vec::new()) };
    }
    WATCHES.with(|w| f(&mut w.borrow_mut()))
}

/// Drops the registry's entries of devices no context uses any more (outside the
/// registry, so that nothing a device owns runs with it held).
fn prune_watches() {
    let dead: Watches = with_watches(|watches| {
        let (live, dead) = std::mem::take(watches)
            .into_iter()
            .partition(|(_, w)| w.strong_count() > 0);
        *watches = live;
        dead
    });
    drop(dead);
}

/// Whether `a` and `b` are the same device. On the web, wgpu's device ids are unique
/// in the process.
#[cfg(target_arch = "wasm32")]
fn same_device(a: &wgpu::Device, b: &wgpu::Device) -> bool {
    a == b
}

/// Whether `a` and `b` are the same device. wgpu compares devices by id, and natively
/// the devices of two wgpu instances (each `Context::new` makes one) number their ids
/// alike, so equal ids are confirmed: a validation error raised on `a` reaches the
/// innermost error scope of its own device, which is the one pushed on `b` only if `b`
/// is `a`.
#[cfg(not(target_arch = "wasm32"))]
fn same_device(a: &wgpu::Device, b: &wgpu::Device) -> bool {
    if a != b {
        return false;
    }
    let outer = a.push_error_scope(wgpu::ErrorFilter::Validation);
    let inner = b.push_error_scope(wgpu::ErrorFilter::Validation);
    raise_validation_error(a);
    // Scopes pop in the reverse order of their pushes; natively a popped scope is
    // ready at once.
    let (inner, outer) = (inner.pop(), outer.pop());
    let caught_by_b = pollster::block_on(inner).is_some();
    let _ = pollster::block_on(outer);
    caught_by_b
}

/// Whether `device` was destroyed or lost already: wgpu answers an invalid request on
/// such a device with nothing (it reports only the loss, through the callback, which
/// it may have run before this crate installed its own), a live one with a validation
/// error.
#[cfg(not(target_arch = "wasm32"))]
fn is_dead(device: &wgpu::Device) -> bool {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    raise_validation_error(device);
    pollster::block_on(scope.pop()).is_none()
}

/// Creates a buffer without usages, always invalid, and drops it at once.
#[cfg(not(target_arch = "wasm32"))]
fn raise_validation_error(device: &wgpu::Device) {
    drop(device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("wgpu-attention device probe"),
        size: 16,
        usage: wgpu::BufferUsages::empty(),
        mapped_at_creation: false,
    }));
}

/// The environment variable that names the fused tiling when none is asked for.
pub const TILING_VAR: &str = "WGPU_ATTENTION_TILING";

/// [`TILING_VAR`], parsed: read once per context, so a typo is one clear error when
/// the context is made rather than a surprise at some later call.
fn tiling_from_env() -> std::result::Result<FusedTiling, String> {
    match std::env::var(TILING_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(FusedTiling::Auto),
        Err(e) => Err(e.to_string()),
        Ok(name) => crate::kernels::flash::parse_tiling(TILING_VAR, &name).map_err(|e| match e {
            Error::Invalid { reason, .. } => reason,
            e => e.to_string(),
        }),
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("caps", &self.caps)
            .finish()
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

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
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

/// The error scopes every step runs in.
struct ErrorScopes {
    internal: wgpu::ErrorScopeGuard,
    oom: wgpu::ErrorScopeGuard,
    validation: wgpu::ErrorScopeGuard,
}

impl ErrorScopes {
    /// The first error caught, validation first. All three scopes leave the device's
    /// stack before the first await: on the web another call may run while this one
    /// waits, and a pop that is not of the top scope panics there.
    async fn pop(self) -> Option<wgpu::Error> {
        // Scopes pop in the reverse order of their pushes.
        let (validation, oom, internal) = (self.validation.pop(), self.oom.pop(), self.internal.pop());
        let validation = validation.await;
        let oom = oom.await;
        let internal = internal.await;
        validation.or(oom).or(internal)
    }
}

impl Context {
    /// [`Context::new`], awaited.
    pub async fn new_async() -> Result<Self> {
        Self::with_selector_async(AdapterSelector::default()).await
    }

    /// [`Context::with_selector`], awaited.
    pub async fn with_selector_async(selector: AdapterSelector) -> Result<Self> {
        let selector = selector.with_env();
        let backends = selector.backends()?;
        let instance = new_instance(backends);
        let adapter = match &selector.name {
            Some(name) => {
                let wanted = name.to_lowercase();
                let adapters = instance.enumerate_adapters(backends).await;
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&wanted))
                    .ok_or_else(|| no_adapter(&selector, &names))?
            }
            None => {
                let options = wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::from_env().unwrap_or_default(),
                    ..Default::default()
                };
                match instance.request_adapter(&options).await {
                    Ok(adapter) => adapter,
                    Err(_) => {
                        let names: Vec<String> = instance
                            .enumerate_adapters(backends)
                            .await
                            .iter()
                            .map(|a| a.get_info().name)
                            .collect();
                        return Err(no_adapter(&selector, &names));
                    }
                }
            }
        };
        Self::from_adapter_async(&adapter).await
    }

    /// [`Context::from_adapter`], awaited.
    pub async fn from_adapter_async(adapter: &wgpu::Adapter) -> Result<Self> {
        let info = adapter.get_info();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
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
        ctx.env_tiling()?;
        Ok(ctx)
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
    /// `SUBGROUP` with a fixed subgroup size; a device with real tensor cores keeps them.
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
                feature: "SHADER_F16 and SUBGROUP with a fixed subgroup size",
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
            env_tiling: tiling_from_env(),
        }
    }

    /// Runs `hook` once when this context's device is lost, with wgpu's reason and
    /// message, on the thread that polls the device then (or at once, here, if it was
    /// lost already). Every context on one device shares its hooks, and each runs once
    /// however many contexts there are: the way for a caller that owns the device to
    /// keep a handler of its own after [`Context::from_wgpu`] replaced its callback.
    pub fn on_device_lost(&self, hook: impl FnOnce(wgpu::DeviceLostReason, &str) + Send + 'static) {
        self.watch.add_hook(Box::new(hook));
    }

    /// The function the device-lost callback this crate installed runs: for a caller
    /// that sets a callback of its own on the device after making contexts on it (wgpu
    /// keeps one per device, so that replaces this crate's). Call it from yours, or no
    /// context on the device learns of the loss:
    ///
    /// ```no_run
    /// # let ctx = wgpu_attention::Context::new().unwrap();
    /// let ours = ctx.device_lost_callback();
    /// ctx.device().set_device_lost_callback(move |reason, message| {
    ///     eprintln!("device lost: {message}");
    ///     ours(reason, message);
    /// });
    /// ```
    pub fn device_lost_callback(&self) -> impl Fn(wgpu::DeviceLostReason, String) + Send + Sync + 'static {
        lost_callback(&self.watch)
    }

    /// The tiling [`TILING_VAR`] named when this context was made (`Auto` when unset),
    /// or the error it gave.
    pub fn env_tiling(&self) -> Result<FusedTiling> {
        self.env_tiling
            .clone()
            .map_err(|reason| Error::invalid(TILING_VAR, reason))
    }

    /// This context's identity within the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

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

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns
    /// anything wgpu reports into [`Error::Gpu`].
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn scoped<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        let scopes = self.push_scopes();
        let out = f();
        // Natively a popped scope is ready at once.
        let error = pollster::block_on(scopes.pop());
        self.settle(during, out, error)
    }

    /// On the web an error scope is popped by awaiting it, which a synchronous step
    /// cannot do: `f` runs bare, and the scopes of the async entry point around it
    /// ([`Context::scoped_async`]: `sdpa_async`, `forward_async`, readback) catch what
    /// it raises.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn scoped<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        f()
    }

    /// [`Context::scoped`], with the scopes awaited.
    pub(crate) async fn scoped_async<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        let scopes = self.push_scopes();
        let out = f();
        let error = scopes.pop().await;
        self.settle(during, out, error)
    }

    /// An error from before this call: the device was lost, or an error escaped every
    /// scope (kept by the uncaptured-error handler).
    fn check_usable(&self, during: &str) -> Result<()> {
        if self.is_lost() {
            return Err(Self::lost_error(during));
        }
        if let Some(message) = self.watch.take_escaped() {
            return Err(Error::Gpu {
                during: escaped_during(during),
                message,
            });
        }
        Ok(())
    }

    fn lost_error(during: &str) -> Error {
        Error::Gpu {
            during: during.into(),
            message: "the device was lost (destroyed, reset or removed); make a new Context".into(),
        }
    }

    fn push_scopes(&self) -> ErrorScopes {
        // Internal errors too (a backend failing to translate a shader): one no scope
        // caught would reach the uncaptured handler and be blamed on the next call.
        ErrorScopes {
            internal: self.device.push_error_scope(wgpu::ErrorFilter::Internal),
            oom: self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            validation: self.device.push_error_scope(wgpu::ErrorFilter::Validation),
        }
    }

    /// What a step's result and the error its scopes caught make of the call.
    fn settle<T>(&self, during: &str, out: Result<T>, error: Option<wgpu::Error>) -> Result<T> {
        if error.is_some() || out.is_err() {
            // wgpu reports a loss through a callback it runs when polled: a failure is
            // the moment to ask, so the error names the cause rather than its symptom.
            let _ = self.device.poll(wgpu::PollType::Poll);
            if self.is_lost() {
                return Err(Self::lost_error(during));
            }
        }
        if let Some(e) = error {
            return Err(Error::Gpu {
                during: during.into(),
                message: e.to_string(),
            });
        }
        out
    }

    /// Creates a buffer after checking the device's size limit.
    pub(crate) fn create_buffer(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        let size = self.check_buffer_size(label, bytes)?;
        self.scoped(label, || {
            Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            }))
        })
    }

    /// Creates a buffer holding `contents` after checking the device's size limit.
    /// (Mapped at creation, as wgpu's `create_buffer_init`, but a failed mapping is an
    /// error rather than wgpu's panic.)
    pub(crate) fn create_buffer_init(
        &self,
        label: &str,
        contents: &[u8],
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let size = self.check_buffer_size(label, contents.len() as u64)?;
        self.scoped(label, || {
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: true,
            });
            let mut view = buffer.get_mapped_range_mut(..).map_err(|e| Error::Gpu {
                during: label.into(),
                message: e.to_string(),
            })?;
            // The padding past `contents` stays zero: wgpu zeroes new buffers.
            view.slice(..contents.len()).copy_from_slice(contents);
            drop(view);
            buffer.unmap();
            Ok(buffer)
        })
    }

    /// Whether the device has been lost (see [`Context::scoped`]'s callers). Every
    /// context on the device sees it (wgpu reports a loss when the device is polled).
    pub fn is_lost(&self) -> bool {
        self.watch.lost.load(Ordering::SeqCst)
    }

    /// Creates a texture; its bytes count in [`Context::allocated_bytes`].
    pub(crate) fn create_texture(&self, descriptor: &wgpu::TextureDescriptor, bytes: u64) -> Result<wgpu::Texture> {
        let label = descriptor.label.unwrap_or("texture");
        let texture = self.scoped(label, || Ok(self.device.create_texture(descriptor)))?;
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
        Ok(texture)
    }

    /// The rounded size of a new buffer, counted in [`Context::allocated_bytes`]: whole
    /// 16-byte units, so any buffer can be bound as an array of vec4s that reaches its
    /// last element (the subgroup decode design reads K and V only so).
    fn check_buffer_size(&self, label: &str, bytes: u64) -> Result<u64> {
        // Checked: within 16 bytes of 2^64, rounding up would wrap to a 0-byte buffer.
        let size = bytes.max(16).checked_next_multiple_of(16);
        let Some(size) = size.filter(|&size| size <= self.caps.max_buffer) else {
            return Err(Error::LimitExceeded {
                what: label.into(),
                limit: "max_buffer_size",
                unit: "bytes",
                requested: size.unwrap_or(bytes),
                max: self.caps.max_buffer,
            });
        };
        self.allocated.fetch_add(size, Ordering::Relaxed);
        Ok(size)
    }

    /// Bytes of GPU buffers and textures this context has created so far (cumulative: freed buffers
    /// are not subtracted). The difference around a call is what that call allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Finishes `encoder` and submits it, returning any GPU error in the recorded work
    /// as [`Error::Gpu`]. wgpu validates much of a recording only when it is finished,
    /// so work recorded by the `encode_*` functions should be submitted this way (or
    /// finished and submitted inside the caller's own error scopes).
    pub fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.submit_as("submitting recorded work", encoder)
    }

    /// Records work into a new encoder with `record` and submits it as
    /// [`Context::submit`] does; returns what `record` returned.
    pub(crate) fn record_and_submit<T>(
        &self,
        during: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<T>,
    ) -> Result<T> {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let out = record(&mut encoder)?;
        self.submit_as(during, encoder)?;
        Ok(out)
    }

    /// [`Context::submit`], naming what was recorded in an error.
    fn submit_as(&self, during: &str, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.scoped(during, || {
            self.queue.submit([encoder.finish()]);
            Ok(())
        })
    }

    /// Blocks until all submitted work is done. Native targets only: a browser cannot
    /// block (await a readback instead).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_idle(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::Readback(e.to_string()))
    }

    /// Resolves once the GPU has finished all work submitted so far: what a benchmark
    /// awaits between timed calls (on the web, where [`Context::wait_idle`] cannot block).
    pub async fn finished_async(&self) -> Result<()> {
        let (tx, rx) = crate::wait::oneshot();
        self.queue.on_submitted_work_done(move || tx.send(()));
        // Native devices run callbacks when polled; a browser runs them by itself.
        #[cfg(not(target_arch = "wasm32"))]
        self.wait_idle()?;
        rx.await
            .ok_or_else(|| Error::Readback("the work-done callback was dropped".into()))
    }

    /// Copies the first `bytes` of `buffer` to the host, through a staging buffer from
    /// the pool (returned to it once unmapped); natively waits for exactly the copy's
    /// submission.
    pub(crate) async fn read_buffer_async(&self, buffer: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let ((), data) = self
            .record_and_read_async("readback copy", |_| Ok(()), |()| (buffer.clone(), bytes))
            .await?;
        Ok(data)
    }

    /// Records work with `record`, then a copy of the first bytes of the buffer `read`
    /// names in its result, and submits both as one: one submission and one wait,
    /// where submitting and then reading back take two (issue 17 §5).
    pub(crate) async fn record_and_read_async<T>(
        &self,
        during: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<T>,
        read: impl FnOnce(&T) -> (wgpu::Buffer, u64),
    ) -> Result<(T, Vec<u8>)> {
        let mut staged = None;
        let out = self
            .scoped_async(during, || {
                let mut encoder = self.device.create_command_encoder(&Default::default());
                let out = record(&mut encoder)?;
                let (buffer, bytes) = read(&out);
                // A copy is whole 4-byte words, all inside the buffer.
                let padded = bytes
                    .max(4)
                    .checked_next_multiple_of(4)
                    .filter(|&padded| padded <= buffer.size())
                    .ok_or_else(|| {
                        Error::Readback(format!("{bytes} bytes asked of a buffer of {} bytes", buffer.size()))
                    })?;
                let class = staging::class_of(padded);
                let staging = match self.staging.take(class) {
                    Some(b) => b,
                    None => self.create_buffer(
                        "wgpu-attention readback",
                        class,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    )?,
                };
                encoder.copy_buffer_to_buffer(&buffer, 0, &staging, 0, padded);
                let submitted = self.queue.submit([encoder.finish()]);
                staged = Some((staging, padded, bytes, submitted));
                Ok(out)
            })
            .await?;
        let (staging, padded, bytes, submitted) =
            staged.ok_or_else(|| Error::Readback("nothing was staged for reading".into()))?;
        let (tx, rx) = crate::wait::oneshot();
        staging
            .slice(..padded)
            .map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        // Native devices run callbacks when polled; a browser runs them by itself.
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submitted),
                timeout: None,
            })
            .map_err(|e| Error::Readback(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = submitted;
        rx.await
            .ok_or_else(|| Error::Readback("the mapping callback was dropped".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let data = {
            let view = staging
                .slice(..padded)
                .get_mapped_range()
                .map_err(|e| Error::Readback(e.to_string()))?;
            // `bytes` <= `padded`, the view's length, which fits in memory.
            let len = usize::try_from(bytes).map_err(|e| Error::Readback(e.to_string()))?;
            view[..len].to_vec()
        };
        staging.unmap();
        self.staging.give(staging);
        Ok((out, data))
    }

    /// Readback buffers the pool keeps now (for tests).
    #[doc(hidden)]
    pub fn kept_staging_buffers(&self) -> usize {
        self.staging.len()
    }

    /// Returns the cached pipeline for `key`, compiling it with `build` on first use.
    pub(crate) fn pipeline(
        &self,
        key: PipelineKey,
        build: impl FnOnce(&PipelineKey) -> Result<wgpu::ComputePipeline>,
    ) -> Result<CompiledPipeline> {
        if let Some(p) = self.lock_pipelines().get(&key) {
            return Ok(p.clone());
        }
        // Compile outside the lock: two threads may race to compile the same pipeline,
        // which is wasteful but correct, and nobody waits behind a slow LLVM compile.
        let pipeline = build(&key)?;
        let compiled = CompiledPipeline {
            layout: pipeline.get_bind_group_layout(0),
            pipeline,
        };
        self.lock_pipelines().insert(key, compiled.clone());
        Ok(compiled)
    }

    fn lock_pipelines(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineKey, CompiledPipeline>> {
        // A panic while holding the lock cannot leave the map inconsistent (inserts are
        // atomic), so a poisoned lock is still usable.
        self.pipelines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of pipelines compiled so far (for tests and the bench report).
    pub fn compiled_pipelines(&self) -> usize {
        self.lock_pipelines().len()
    }
}

/// What an escaped error's [`Error::Gpu`] says it happened during: natively the
/// calling thread's own work (wgpu raised it on this thread, in a call made outside
/// every error scope).
#[cfg(not(target_arch = "wasm32"))]
fn escaped_during(during: &str) -> String {
    format!("work submitted on this thread before {during}, outside an error scope (Context::submit scopes it)")
}

/// [`escaped_during`] on the web, where errors arrive after their call has returned,
/// so the one kept may be another call's.
#[cfg(target_arch = "wasm32")]
fn escaped_during(during: &str) -> String {
    format!(
        "work submitted before {during}, outside an error scope (Context::submit scopes it); \
         it may belong to another call than this one"
    )
}

fn no_adapter(selector: &AdapterSelector, names: &[String]) -> Error {
    Error::NoAdapter {
        wanted: selector.describe(),
        available: if names.is_empty() {
            "none (install a GPU driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)".into()
        } else {
            names.join(", ")
        },
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
