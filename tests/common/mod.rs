//! Shared by the GPU test binaries: one context per binary (pipelines compile once),
//! and the skip-or-fail rule for machines without an adapter.
#![allow(dead_code)]

pub mod cli;
pub mod paged;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{Context, DType, FusedTiling, KernelChoice};

/// Whether `WGPU_ATTENTION_REQUIRE_ADAPTER=1` (CI): a GPU test that cannot run must
/// fail, never pass by skipping.
pub fn adapter_required() -> bool {
    std::env::var("WGPU_ATTENTION_REQUIRE_ADAPTER").as_deref() == Ok("1")
}

/// The one place that decides whether a test that cannot run skips or fails: it prints
/// a visible `SKIPPING <test>: <reason>` line, or, under
/// `WGPU_ATTENTION_REQUIRE_ADAPTER=1`, panics with the reason. The caller returns
/// right after (it only returns here when skipping).
#[track_caller]
pub fn skip_or_fail(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    if adapter_required() {
        panic!("WGPU_ATTENTION_REQUIRE_ADAPTER=1, so {test} fails instead of skipping: {reason}");
    }
    eprintln!("SKIPPING {test}: {reason}");
}

/// A skip for something this adapter lacks that other adapters have (f16 and subgroups
/// on llvmpipe GL, a loop cap on Mesa 25, ...): a legitimate skip even under
/// `WGPU_ATTENTION_REQUIRE_ADAPTER=1`, except where the adapter is lavapipe through
/// Vulkan (CI's) and `lavapipe_has_it`: CI's lavapipe (Mesa 22.3 and 25) has f16 and
/// subgroups of a fixed size, so there a skip would only hide a detection bug, and it
/// fails (through [`skip_or_fail`]).
#[track_caller]
pub fn skip_lacking(ctx: &Context, lacking: &str, lavapipe_has_it: bool) {
    let info = ctx.adapter_info();
    let reason = format!("{} ({:?}) lacks {lacking}", info.name, info.backend);
    if lavapipe_has_it && is_vulkan_lavapipe(ctx) {
        skip_or_fail(&format!("{reason}, which lavapipe through Vulkan has"));
    } else {
        let thread = std::thread::current();
        eprintln!("SKIPPING {}: {reason}", thread.name().unwrap_or("a test"));
    }
}

/// Whether the context runs on lavapipe (Mesa's llvmpipe through Vulkan), CI's adapter.
pub fn is_vulkan_lavapipe(ctx: &Context) -> bool {
    let info = ctx.adapter_info();
    info.backend == wgpu_attention::wgpu::Backend::Vulkan && info.name.contains("llvmpipe")
}

/// A shared context, or `None` (after [`skip_or_fail`], which panics under
/// `WGPU_ATTENTION_REQUIRE_ADAPTER=1`) when no adapter exists: every test that gets
/// `None` prints its own `SKIPPING` line.
///
/// The tests share one context per core (up to [`MAX_SHARED`]), each test thread the
/// least used one for its life (libtest runs each test on a thread of its own): lavapipe
/// compiles a device's pipelines one at a time, on its queue's thread, so with one
/// shared device a cold suite compiled on one core whatever the test threads (docs/ci.md).
pub fn ctx() -> Option<&'static Context> {
    static SHARED: [OnceLock<Result<Context, String>>; MAX_SHARED] = [const { OnceLock::new() }; MAX_SHARED];
    let slot = CLAIM.with(|claim| claim.0);
    let shared = SHARED[slot].get_or_init(|| match Context::new() {
        Ok(ctx) => {
            eprintln!(
                "GPU tests on: {} ({:?}), shared context {slot}",
                ctx.adapter_info().name,
                ctx.adapter_info().backend
            );
            Ok(ctx)
        }
        Err(e) => Err(e.to_string()),
    });
    match shared {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            skip_or_fail(&format!("no adapter ({e})"));
            None
        }
    }
}

/// Most shared contexts [`ctx`] makes.
pub const MAX_SHARED: usize = 4;

/// Test threads using each shared context now.
static USERS: [AtomicUsize; MAX_SHARED] = [const { AtomicUsize::new(0) }; MAX_SHARED];

thread_local! {
    /// The shared context this thread uses, released when the thread (its test) ends.
    static CLAIM: Claim = Claim::take();
}

/// A test thread's hold on one shared context.
struct Claim(usize);

impl Claim {
    /// The least used of one shared context per core.
    fn take() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let slot = (0..cores.clamp(1, MAX_SHARED))
            .min_by_key(|&i| USERS[i].load(Ordering::Relaxed))
            .unwrap_or(0);
        USERS[slot].fetch_add(1, Ordering::Relaxed);
        Claim(slot)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        USERS[self.0].fetch_sub(1, Ordering::Relaxed);
    }
}

/// A context of its own on the shared context's adapter (a test that changes it:
/// destroys its device, lowers its loop cap), or `None` as [`ctx`] gives it.
pub fn own_ctx() -> Option<Context> {
    ctx()?;
    Some(Context::new().expect("a second context on the shared context's adapter"))
}

/// A context of its own that emulates cooperative matrices
/// ([`Context::emulate_cooperative_matrix`]), its long key ranges split as under Mesa
/// 22's llvmpipe loop cap whatever the driver (so the resume path runs), or `None`
/// where there is no adapter ([`ctx`]) or it cannot emulate them (no f16 or no fixed
/// subgroup size: llvmpipe GL; [`skip_lacking`], which fails on lavapipe through
/// Vulkan, where emulation must work).
pub fn emulating_ctx() -> Option<Context> {
    let mut ctx = own_ctx()?;
    ctx.limit_loop_iterations(wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP);
    match ctx.emulate_cooperative_matrix() {
        Ok(()) => Some(ctx),
        Err(e) => {
            skip_lacking(&ctx, &format!("cooperative-matrix emulation ({e})"), true);
            None
        }
    }
}

/// A context that splits long key ranges as under Mesa 22's llvmpipe loop cap, on
/// every adapter (`Context::limit_loop_iterations`), so the fused kernels' resume path
/// runs everywhere: the shared context where its driver has that cap, else a second one.
pub fn capped_ctx() -> Option<&'static Context> {
    use wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP;
    static CAPPED: OnceLock<Option<Context>> = OnceLock::new();
    let shared = ctx()?;
    if shared.loop_cap() == Some(LLVMPIPE_LOOP_CAP) {
        return Some(shared);
    }
    CAPPED
        .get_or_init(|| {
            let mut capped = Context::new().expect("a second context on the same adapter");
            capped.limit_loop_iterations(LLVMPIPE_LOOP_CAP);
            Some(capped)
        })
        .as_ref()
}

/// A context whose fused kernels walk short key ranges: a forced loop cap of
/// [`SHORT_RANGE_CAP`] (below Mesa 22's, which a forced cap can only lower), so that
/// the split-dispatch tests cut their keys into several ranges for every tiling, on
/// every adapter. Under Mesa 22's own cap the subgroup tiling walks ~43K keys at D 64
/// and ~14K at D 256 in one dispatch, more than those tests hold.
pub fn short_ranges_ctx() -> Option<&'static Context> {
    static SHORT: OnceLock<Option<Context>> = OnceLock::new();
    ctx()?;
    SHORT
        .get_or_init(|| {
            let mut short = Context::new().expect("a second context on the same adapter");
            short.limit_loop_iterations(SHORT_RANGE_CAP);
            Some(short)
        })
        .as_ref()
}

/// The loop cap of [`short_ranges_ctx`]: the subgroup tiling then walks about 2400
/// keys per dispatch at D 256 and 7800 at D 64.
pub const SHORT_RANGE_CAP: u64 = 12_000;

/// Runs a case and panics with the seed and error report if it fails.
pub fn assert_case(ctx: &Context, case: &CheckCase) {
    let outcome =
        run_case(ctx, case).unwrap_or_else(|e| panic!("case failed to run (seed {}): {e}\n{case:?}", case.seed));
    assert!(
        outcome.passed,
        "GPU result differs from the reference (seed {}): {}\ncase: {:?} {:?} {:?} causal={:?} key_lengths={:?} mask={} window={:?} alibi={:?} softcap={:?} weights={}",
        case.seed,
        outcome.summary(),
        case.shape,
        case.dtype,
        case.layout,
        case.options.causal,
        case.options.key_lengths,
        case.options.mask.is_some(),
        case.options.window,
        case.options.alibi_slopes,
        case.options.softcap,
        case.options.need_weights,
    );
}

/// A file of the PyTorch multi-head attention fixture (`tests/fixtures/torch_mha/`).
pub fn torch_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch_mha")
        .join(name)
}

/// The split-K decode designs this adapter runs, each as the tiling that asks for it
/// (`subgroup` for the subgroup design, any other for the tiled one).
pub fn decode_designs(ctx: &Context) -> Vec<FusedTiling> {
    let mut designs = vec![FusedTiling::Registers];
    if wgpu_attention::kernels::decode::DecodeDesign::for_context(ctx, ctx.policy(), FusedTiling::Subgroup).is_ok() {
        designs.push(FusedTiling::Subgroup);
    }
    designs
}

/// Every path this adapter can run: materialized, each fused tiling it meets the needs
/// of, and split-K decode in each design.
pub fn paths(ctx: &Context) -> Vec<(KernelChoice, FusedTiling)> {
    let fused = FUSED_TILINGS
        .iter()
        .filter(|s| ctx.fused_config(s.tiling).is_ok())
        .map(|s| (KernelChoice::Fused, s.tiling));
    [(KernelChoice::Materialized, FusedTiling::Auto)]
        .into_iter()
        .chain(fused)
        .chain(decode_designs(ctx).into_iter().map(|t| (KernelChoice::Decode, t)))
        .collect()
}

/// The input dtypes this adapter can run.
pub fn dtypes(ctx: &Context) -> Vec<DType> {
    if ctx.capabilities().f16 {
        vec![DType::F32, DType::F16]
    } else {
        vec![DType::F32]
    }
}

/// A second context on the shared context's adapter (found again, never skipped: a
/// skip would let a test pass without running), its device made with `limits` applied
/// to the adapter's and those of `features` the adapter has.
pub fn ctx_with_limits(
    features: wgpu_attention::wgpu::Features,
    limits: impl FnOnce(&mut wgpu_attention::wgpu::Limits),
) -> Option<Context> {
    let shared = ctx()?;
    let instance = wgpu_attention::wgpu::Instance::default();
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu_attention::wgpu::Backends::all()));
    let adapter = adapters
        .into_iter()
        .find(|a| {
            a.get_info().name == shared.adapter_info().name && a.get_info().backend == shared.adapter_info().backend
        })
        .expect("the shared context's adapter, enumerated again");
    let mut required_limits = adapter.limits();
    limits(&mut required_limits);
    let desc = wgpu_attention::wgpu::DeviceDescriptor {
        required_features: adapter.features() & features,
        required_limits,
        ..Default::default()
    };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&desc)).expect("a device with the limits asked for");
    Some(Context::from_wgpu(adapter.get_info(), device, queue))
}

/// Values as `dtype` stores them.
pub fn rounded(dtype: DType, x: Vec<f32>) -> Vec<f32> {
    match dtype {
        DType::F32 => x,
        DType::F16 => x.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
    }
}

/// BHSD element index of (batch, head, row, element) in a tensor of `heads` heads,
/// `rows` rows and `dim` elements per row.
pub fn bhsd_index(heads: usize, rows: usize, dim: usize, (b, h, r, t): (usize, usize, usize, usize)) -> usize {
    ((b * heads + h) * rows + r) * dim + t
}
