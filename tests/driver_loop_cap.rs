//! The loop cap, observed rather than assumed. A context on a CPU adapter probes how many
//! loop iterations one invocation may run (`kernels::loop_probe`); the kernels' loop
//! budgets follow `Context::loop_cap`. This test runs the probe's loop at several lengths
//! and checks that the count stops exactly at the context's cap (or never, without one),
//! and pins what was measured per driver: Mesa 22's llvmpipe stops at 65535, Mesa 25's
//! does not stop. A Mesa release that moves the cap fails here first.

mod common;
use wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP;
use wgpu_attention::kernels::loop_probe::{trips, PROBE_TRIPS};

#[test]
fn loops_stop_exactly_at_the_contexts_loop_cap() {
    let Some(ctx) = common::ctx() else { return };
    let info = ctx.adapter_info();
    let driver = format!("{} / {} / {}", info.name, info.driver, info.driver_info);
    let cap = ctx.loop_cap();
    eprintln!("{driver}: loop cap {cap:?}");
    let cap32 = LLVMPIPE_LOOP_CAP as u32;
    for n in [1000, cap32, cap32 + 1, 3 * cap32, PROBE_TRIPS] {
        let ran = trips(ctx.device(), ctx.queue(), n).expect("the probe runs");
        let expected = cap.map_or(n, |c| n.min(c as u32));
        assert_eq!(
            ran, expected,
            "{driver}: a loop of {n} trips ran {ran} (loop cap {cap:?})"
        );
    }
    if info.driver_info.contains("Mesa 22.") && info.name.contains("llvmpipe") {
        assert_eq!(cap, Some(LLVMPIPE_LOOP_CAP), "{driver}");
    }
    if info.driver_info.contains("Mesa 25.") {
        assert_eq!(cap, None, "{driver}: measured without a cap on Mesa 25.0.7");
    }
}

#[test]
fn a_forced_cap_only_ever_lowers_the_drivers() {
    let Some(shared) = common::ctx() else { return };
    let mut ctx = wgpu_attention::Context::new().expect("a second context");
    assert_eq!(ctx.loop_cap(), shared.loop_cap(), "the probe gives the same cap twice");
    ctx.limit_loop_iterations(u64::MAX);
    assert_eq!(ctx.loop_cap(), Some(shared.loop_cap().unwrap_or(u64::MAX)));
    ctx.limit_loop_iterations(1000);
    assert_eq!(ctx.loop_cap(), Some(1000));
    ctx.limit_loop_iterations(5000);
    assert_eq!(ctx.loop_cap(), Some(1000), "raised a forced cap");
}
