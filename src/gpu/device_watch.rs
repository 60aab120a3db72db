//! The loss of a device, seen by every context on it, and GPU errors that escaped every
//! error scope, kept for the thread that raised them (docs/design.md, principle 1).

use super::Gpu;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// A hook run once when a device is lost: wgpu's reason and message.
type LostHook = Box<dyn FnOnce(wgpu::DeviceLostReason, &str) + Send>;

/// At most this many threads' escaped errors are kept ([`DeviceWatch::escaped`]): a
/// thread that never calls again must not make the list grow without bound.
const KEPT_ESCAPED: usize = 16;

/// What every [`crate::Context`] on one device shares. wgpu keeps one device-lost callback per
/// device, so the first context made on a device installs one that notifies this watch,
/// and every later one on the same device ([`crate::Context::from_wgpu`] on a device a context
/// already uses) finds the watch in a process-wide registry rather than replacing the
/// callback, which would leave the earlier contexts blind to the loss.
#[derive(Default)]
pub(super) struct DeviceWatch {
    pub(super) lost: AtomicBool,
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
    pub(super) fn take_escaped(&self) -> Option<String> {
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
    pub(super) fn for_device(device: &wgpu::Device, fresh: bool) -> Arc<DeviceWatch> {
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

impl Gpu {
    /// Installs the device's uncaptured-error handler (for a device this crate made).
    /// Every operation runs inside error scopes; an error that escapes them (work the
    /// caller recorded with an `encode_*` function and submitted outside a scope) is
    /// kept for the `Result` of the next call on the thread that raised it, rather than
    /// aborting the process as wgpu's default handler does. The handler holds the watch
    /// weakly (the device owns the handler).
    pub(crate) fn keep_uncaptured_errors(&self) {
        let watch = Arc::downgrade(&self.watch);
        self.device().on_uncaptured_error(Arc::new(move |e| {
            eprintln!("wgpu-attention: uncaptured wgpu error: {e}");
            if let Some(watch) = watch.upgrade() {
                watch.keep_escaped(e.to_string());
            }
        }));
    }

    /// Runs `hook` once when this context's device is lost, with wgpu's reason and
    /// message, on the thread that polls the device then (or at once, here, if it was
    /// lost already). Every context on one device shares its hooks, and each runs once
    /// however many contexts there are: the way for a caller that owns the device to
    /// keep a handler of its own after [`crate::Context::from_wgpu`] replaced its callback.
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

    /// Whether the device has been lost (after which every call fails, saying so). Every
    /// context on the device sees it (wgpu reports a loss when the device is polled).
    pub fn is_lost(&self) -> bool {
        self.watch.lost.load(Ordering::SeqCst)
    }
}
