//! The error contract of the `encode_*` functions (issue 17 §1.7): everything they can
//! check is checked before recording; a GPU error in the recorded work reaches the
//! caller as `Error::Gpu` from `Context::submit`, or, when the caller submitted outside
//! any error scope, from the next call; never a panic or a silent invalid command
//! buffer. Tensors of another context are refused up front (wgpu did not catch it).

use crate::common;
use wgpu_attention::{encode_sdpa, sdpa, AttentionOptions, Context, Error, Layout, Tensor};

fn up(ctx: &Context, shape: [usize; 4]) -> Tensor {
    Tensor::from_f32(ctx, shape, Layout::Bhsd, &vec![0.5; shape.iter().product()]).expect("upload")
}

fn assert_still_works(ctx: &Context) {
    let (q, k, v) = (up(ctx, [1, 2, 3, 8]), up(ctx, [1, 2, 5, 8]), up(ctx, [1, 2, 5, 8]));
    let out = sdpa(ctx, &q, &k, &v, &AttentionOptions::default()).expect("a valid call");
    assert!(out.out.to_f32_vec(ctx).expect("read back").iter().all(|&x| x == 0.5));
}

#[test]
fn tensors_of_another_context_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let other = Context::new().expect("a second context");
    let q = up(&other, [1, 2, 3, 8]);
    let (k, v) = (up(ctx, [1, 2, 5, 8]), up(ctx, [1, 2, 5, 8]));
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let err = encode_sdpa(ctx, &mut encoder, &q, &k, &v, &AttentionOptions::default()).expect_err("q is foreign");
    assert!(matches!(&err, Error::Invalid { what, .. } if what == "q"), "{err}");
    assert!(
        matches!(q.to_f32_vec(ctx), Err(Error::Invalid { .. })),
        "readback through the wrong context"
    );
    assert_still_works(ctx);
}

#[test]
fn an_error_in_recorded_work_reaches_the_caller() {
    let Some(ctx) = common::ctx() else { return };
    for scoped in [true, false] {
        let (q, k, v) = (up(ctx, [1, 2, 3, 8]), up(ctx, [1, 2, 5, 8]), up(ctx, [1, 2, 5, 8]));
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        encode_sdpa(ctx, &mut encoder, &q, &k, &v, &AttentionOptions::default()).expect("recorded");
        // The caller destroys an input before submitting: the recorded work is invalid.
        k.buffer().destroy();
        if scoped {
            let err = ctx.submit(encoder).expect_err("k was destroyed");
            assert!(matches!(err, Error::Gpu { .. }), "{err}");
        } else {
            ctx.queue().submit([encoder.finish()]);
            let err = sdpa(ctx, &q, &v, &v, &AttentionOptions::default()).expect_err("the escaped error");
            assert!(
                matches!(&err, Error::Gpu { during, .. } if during.contains("outside an error scope")),
                "{err}"
            );
        }
        assert_still_works(ctx);
    }
}
