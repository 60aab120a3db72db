//! Every bad input gives its `Error` variant, before anything is dispatched.

use crate::common;
use wgpu_attention::{sdpa, AttentionOptions, Context, DType, Error, KernelChoice, Layout, Mask, Tensor, MAX_HEAD_DIM};

fn tensor(ctx: &Context, shape: [usize; 4]) -> Tensor {
    let n = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.5).collect();
    Tensor::from_f32(ctx, shape, Layout::Bhsd, &data).expect("upload")
}

fn attend(ctx: &Context, q: [usize; 4], k: [usize; 4], v: [usize; 4], options: &AttentionOptions) -> Error {
    sdpa(ctx, &tensor(ctx, q), &tensor(ctx, k), &tensor(ctx, v), options).expect_err("must be rejected")
}

#[test]
fn mismatched_shapes_are_shape_errors() {
    let Some(ctx) = common::ctx() else { return };
    let o = AttentionOptions::default();
    for (q, k, v, needle) in [
        ([1, 2, 4, 8], [2, 2, 4, 8], [2, 2, 4, 8], "batch"),
        ([1, 2, 4, 8], [1, 2, 4, 7], [1, 2, 4, 8], "head dim of k"),
        ([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 5, 8], "sequence length of v"),
        ([1, 3, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], "multiple"),
        ([1, 2, 4, 8], [1, 2, 4, 8], [1, 1, 4, 8], "heads of v"),
    ] {
        let e = attend(ctx, q, k, v, &o);
        assert!(matches!(e, Error::Shape { .. }), "{e:?}");
        assert!(e.to_string().contains(needle), "'{e}' should mention {needle}");
    }
}

#[test]
fn unsupported_sizes_name_the_limit() {
    let Some(ctx) = common::ctx() else { return };
    let o = AttentionOptions::default();
    let big = MAX_HEAD_DIM + 1;
    let e = attend(ctx, [1, 1, 2, big], [1, 1, 2, big], [1, 1, 2, 4], &o);
    assert!(
        matches!(e, Error::Unsupported { .. }) && e.to_string().contains("257"),
        "{e}"
    );
    let e = attend(ctx, [1, 1, 2, 4], [1, 1, 2, 4], [1, 1, 2, big], &o);
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    let e = attend(ctx, [1, 1, 0, 4], [1, 1, 2, 4], [1, 1, 2, 4], &o);
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[test]
fn bad_options_are_rejected() {
    let Some(ctx) = common::ctx() else { return };
    let shapes = ([2, 2, 3, 4], [2, 2, 5, 4], [2, 2, 5, 4]);
    let run = |o: AttentionOptions| attend(ctx, shapes.0, shapes.1, shapes.2, &o);
    let e = run(AttentionOptions {
        key_lengths: Some(vec![1]),
        ..Default::default()
    });
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = run(AttentionOptions {
        key_lengths: Some(vec![1, 6]),
        ..Default::default()
    });
    assert!(matches!(e, Error::Invalid { .. }) && e.to_string().contains('6'), "{e}");
    let e = run(AttentionOptions {
        scale: Some(f32::NAN),
        ..Default::default()
    });
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    let e = run(AttentionOptions {
        mask: Some(Mask::boolean(&[3, 4], vec![true; 12]).expect("valid mask")),
        ..Default::default()
    });
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("axis 3"),
        "{e}"
    );
}

#[test]
fn mask_constructors_check_their_data() {
    assert!(matches!(
        Mask::boolean(&[2, 3], vec![true; 5]),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(Mask::boolean(&[], vec![]), Err(Error::Shape { .. })));
    assert!(matches!(
        Mask::additive(&[2], vec![0.0, f32::NAN]),
        Err(Error::Invalid { .. })
    ));
    assert!(Mask::additive(&[2], vec![0.0, f32::NEG_INFINITY]).is_ok());
}

#[test]
fn mixed_dtypes_and_bad_tensor_data_are_rejected() {
    let Some(ctx) = common::ctx() else { return };
    let e = Tensor::from_f32(ctx, [1, 1, 2, 2], Layout::Bhsd, &[0.5; 3]).expect_err("3 values for 4 elements");
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    if !ctx.capabilities().f16 {
        let e = Tensor::from_f32_as(ctx, [1, 1, 1, 1], Layout::Bhsd, DType::F16, &[0.5]).expect_err("no f16");
        assert!(matches!(e, Error::MissingFeature { .. }), "{e}");
        return;
    }
    let q = Tensor::from_f32_as(ctx, [1, 1, 2, 4], Layout::Bhsd, DType::F16, &[0.25; 8]).expect("upload");
    let k = tensor(ctx, [1, 1, 2, 4]);
    let e = sdpa(ctx, &q, &k, &k, &AttentionOptions::default()).expect_err("mixed dtypes");
    assert!(e.to_string().contains("dtype"), "{e}");
}

#[test]
fn score_matrix_beyond_the_binding_limit_is_refused_not_crashed() {
    let Some(ctx) = common::ctx() else { return };
    // One head of 8192 x 8192 f32 scores is 256 MiB, beyond the 128 MiB default binding.
    let l = 8192;
    let limit = ctx.capabilities().max_storage_binding;
    if (4 * l * l) as u64 <= limit {
        common::skip_lacking(
            ctx,
            &format!("a storage binding limit below 256 MiB (it binds {limit} bytes)"),
            false,
        );
        return;
    }
    let o = AttentionOptions {
        kernel: KernelChoice::Materialized,
        ..Default::default()
    };
    let e = attend(ctx, [1, 1, l, 4], [1, 1, l, 4], [1, 1, l, 4], &o);
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e}");
    assert!(e.to_string().contains("max_storage_buffer_binding_size"), "{e}");
    // The fused path needs no score matrix and runs.
    let fused = AttentionOptions {
        kernel: KernelChoice::Fused,
        ..Default::default()
    };
    let q = tensor(ctx, [1, 1, l, 4]);
    let out = sdpa(ctx, &q, &q, &q, &fused).expect("fused runs");
    let values = out.out.to_f32_vec(ctx).expect("readback");
    assert!(values.iter().all(|x| x.is_finite()));
}

#[test]
fn unknown_adapter_and_backend_are_clear_errors() {
    let e = Context::with_selector(wgpu_attention::AdapterSelector {
        name: Some("no-such-adapter-xyz".into()),
        backend: None,
    })
    .expect_err("no such adapter");
    assert!(
        matches!(e, Error::NoAdapter { .. }) && e.to_string().contains("no-such-adapter-xyz"),
        "{e}"
    );
    let e = Context::with_selector(wgpu_attention::AdapterSelector {
        name: None,
        backend: Some("nonsense".into()),
    })
    .expect_err("no such backend");
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
}

#[test]
fn bindings_are_capped_where_u32_indices_end() {
    // Metal reports maxBufferLength (often above 4 GiB) as its binding limit; the
    // kernels index with u32, so the capabilities cap it (issue 17 §1.3).
    let Some(ctx) = common::ctx() else { return };
    use wgpu_attention::MAX_INDEXED_BINDING;
    for (reported, want) in [(8u64 << 30, MAX_INDEXED_BINDING), (1 << 27, 1 << 27)] {
        let limits = wgpu_attention::wgpu::Limits {
            max_storage_buffer_binding_size: reported,
            ..Default::default()
        };
        let caps = wgpu_attention::Capabilities::of(ctx.adapter_info(), Default::default(), &limits);
        assert_eq!(caps.max_storage_binding, want, "reported {reported}");
    }
}
