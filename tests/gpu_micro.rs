//! The micro-tile tiling (`flash_micro.wgsl`) at every lane count the adapter allows
//! (its row reductions through workgroup memory alone, or with subgroup shuffles), every
//! head-dim class, several key tiles with ragged ends, causal in both alignments, GQA
//! and Dv != D, against the CPU reference.

use crate::common;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::kernels::flash::micro_lanes;
use wgpu_attention::{
    AttentionOptions, AttentionShape, CausalAlignment, Context, DType, FusedTiling, KernelChoice, Layout,
};

fn case(shape: AttentionShape, causal: Option<CausalAlignment>, dtype: DType, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options: AttentionOptions {
            kernel: KernelChoice::Fused,
            tiling: FusedTiling::Micro,
            causal,
            ..Default::default()
        },
        dtype,
        layout: Layout::Bhsd,
        seed,
        range: 1.0,
    }
}

#[test]
fn micro_tiles_match_the_reference_at_every_lane_count() {
    let Some(shared) = common::ctx() else { return };
    if let Err(e) = shared.fused_config(FusedTiling::Micro) {
        common::skip_lacking(shared, &format!("the micro tiling ({e})"), true);
        return;
    }
    let most = micro_lanes(shared.capabilities(), shared.policy());
    // Only counts the kernel has a variant for are taken.
    for bad in [0, 2, 4, 32] {
        assert!(
            Context::new().expect("a context").use_micro_lanes(Some(bad)).is_err(),
            "{bad}"
        );
    }
    // A context of its own: the lane count is pinned on it.
    let mut ctx = Context::new().expect("a second context on the test adapter");
    let shapes = [
        // Two blocks of rows, four key tiles, the last ragged.
        AttentionShape::new(1, 2, 2, 67, 197, 64, 64),
        AttentionShape::new(1, 4, 2, 70, 131, 128, 96),
        AttentionShape::new(1, 2, 1, 33, 90, 200, 256),
        AttentionShape::new(2, 2, 2, 5, 70, 20, 36),
    ];
    for lanes in [1, 8, 16].into_iter().filter(|&l| l <= most) {
        ctx.use_micro_lanes(Some(lanes)).expect("a lane count the kernel has");
        for (i, shape) in shapes.iter().enumerate() {
            for causal in [None, Some(CausalAlignment::BottomRight), Some(CausalAlignment::TopLeft)] {
                let dtype = if i == 3 && ctx.capabilities().f16 {
                    DType::F16
                } else {
                    DType::F32
                };
                let c = case(*shape, causal, dtype, 5300 + i as u64);
                let outcome = run_case(&ctx, &c).unwrap_or_else(|e| panic!("{shape:?} lanes {lanes}: {e}"));
                assert!(
                    outcome.passed,
                    "lanes {lanes}, {shape:?}, causal {causal:?}, {} (seed {}): {}",
                    dtype.name(),
                    c.seed,
                    outcome.summary()
                );
            }
        }
    }
}
