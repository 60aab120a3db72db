//! One `Context` serves many threads at once (issue 13; `Send + Sync` is asserted at
//! compile time in lib.rs): attention calls made concurrently from 8 threads each match the reference. A lost
//! device makes every later call fail with an error that says so, never a panic.

use crate::common;
use wgpu_attention::check::CheckCase;
use wgpu_attention::{sdpa, AttentionOptions, AttentionShape, CausalAlignment, DType, Layout, Tensor};

#[test]
fn eight_threads_share_one_context() {
    let Some(ctx) = common::ctx() else { return };
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            scope.spawn(move || {
                // Different shapes and masks per thread, so pipelines are compiled while
                // other threads dispatch.
                let shape = AttentionShape::new(
                    1 + (t % 2) as usize,
                    2,
                    1 + (t % 2) as usize,
                    9 + t as usize,
                    13 + 2 * t as usize,
                    8 + 4 * (t % 3) as usize,
                    8,
                );
                let case = CheckCase {
                    shape,
                    options: AttentionOptions {
                        causal: (t % 3 == 0).then_some(CausalAlignment::BottomRight),
                        need_weights: t % 4 == 1,
                        ..Default::default()
                    },
                    dtype: DType::F32,
                    layout: if t % 2 == 0 { Layout::Bhsd } else { Layout::Bshd },
                    seed: 900 + t,
                    range: 1.0,
                };
                for _ in 0..3 {
                    common::assert_case(ctx, &case);
                }
            });
        }
    });
}

#[test]
fn a_destroyed_device_makes_later_calls_fail_cleanly() {
    // Its own context: the shared one must stay usable for the other tests.
    let Some(ctx) = common::own_ctx() else { return };
    let data = wgpu_attention::check::Rng::new(31).vec(32, -1.0, 1.0);
    let q = Tensor::from_f32_as(&ctx, [1, 1, 4, 8], Layout::Bhsd, DType::F32, &data).expect("upload");
    assert!(!ctx.is_lost());
    ctx.device().destroy();
    let attention = sdpa(&ctx, &q, &q, &q, &AttentionOptions::default());
    let err = attention.expect_err("attention on a destroyed device");
    assert!(err.to_string().contains("device was lost"), "{err}");
    assert!(ctx.is_lost());
    let upload = Tensor::from_f32_as(&ctx, [1, 1, 4, 8], Layout::Bhsd, DType::F32, &data);
    assert!(upload.is_err(), "an upload to a destroyed device succeeded");
    assert!(
        q.to_f32_vec(&ctx).is_err(),
        "a readback from a destroyed device succeeded"
    );
}
