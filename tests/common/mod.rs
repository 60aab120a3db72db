//! Shared by the GPU test binaries: one context per binary (pipelines compile once),
//! and the skip-or-fail rule for machines without an adapter.
#![allow(dead_code)]

pub mod cli;
pub mod paged;

use std::path::PathBuf;
use std::sync::OnceLock;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::kernels::flash::FUSED_TILINGS;
use wgpu_attention::{Context, DType, FusedTiling, KernelChoice};

/// The shared context, or `None` (with a visible message) when no adapter exists and
/// `WGPU_ATTENTION_REQUIRE_ADAPTER` is not `1`.
pub fn ctx() -> Option<&'static Context> {
    static CTX: OnceLock<Option<Context>> = OnceLock::new();
    CTX.get_or_init(|| match Context::new() {
        Ok(ctx) => {
            eprintln!(
                "GPU tests on: {} ({:?})",
                ctx.adapter_info().name,
                ctx.adapter_info().backend
            );
            Some(ctx)
        }
        Err(e) => {
            if std::env::var("WGPU_ATTENTION_REQUIRE_ADAPTER").as_deref() == Ok("1") {
                panic!("WGPU_ATTENTION_REQUIRE_ADAPTER=1 but no adapter: {e}");
            }
            eprintln!("SKIPPING GPU tests: no adapter ({e})");
            None
        }
    })
    .as_ref()
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
    if wgpu_attention::kernels::decode::DecodeDesign::for_context(ctx, FusedTiling::Subgroup).is_ok() {
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
