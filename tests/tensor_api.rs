//! Tensors over a caller's own `wgpu::Buffer`, and readback in the tensor's dtype.

use crate::common;

use half::f16;
use wgpu_attention::check::Rng;
use wgpu_attention::wgpu::{self, util::DeviceExt};
use wgpu_attention::{sdpa, sdpa_backward, AttentionOptions, DType, Error, Layout, Tensor};

#[test]
fn a_callers_buffer_is_a_tensor_without_a_copy() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 37;
    let mut rng = Rng::new(seed);
    let shape = [1, 2, 5, 8];
    let [q, k, v] = [(); 3].map(|()| rng.vec(80, -1.0, 1.0));
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let own = |data: &[f32]| {
        ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("caller's buffer"),
            contents: bytemuck::cast_slice(data),
            usage,
        })
    };
    let wrap = |data: &[f32]| Tensor::from_buffer(ctx, own(data), shape, Layout::Bhsd, DType::F32);
    let (qt, kt, vt) = (wrap(&q).expect("q"), wrap(&k).expect("k"), wrap(&v).expect("v"));
    assert_eq!(qt.to_f32_vec(ctx).expect("read"), q, "seed {seed}");
    let options = AttentionOptions::default();
    let from_own = sdpa(ctx, &qt, &kt, &vt, &options)
        .expect("sdpa")
        .out
        .to_f32_vec(ctx)
        .expect("out");
    let upload = |data: &[f32]| Tensor::from_f32(ctx, shape, Layout::Bhsd, data).expect("upload");
    let uploaded = sdpa(ctx, &upload(&q), &upload(&k), &upload(&v), &options)
        .expect("sdpa")
        .out
        .to_f32_vec(ctx)
        .expect("out");
    assert_eq!(from_own, uploaded, "seed {seed}");

    // Too small, or without STORAGE: refused, naming why.
    let small = Tensor::from_buffer(ctx, own(&q[..79]), shape, Layout::Bhsd, DType::F32).expect_err("small");
    assert!(matches!(small, Error::Shape { .. }), "{small}");
    assert!(small.to_string().contains("320 bytes"), "{small}");
    let uniform = ctx.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 320,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    let err = Tensor::from_buffer(ctx, uniform, shape, Layout::Bhsd, DType::F32).expect_err("usage");
    assert!(err.to_string().contains("STORAGE"), "{err}");
}

#[test]
fn buffers_without_copy_src_take_the_buffer_kernels_forward_and_backward() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 41;
    let mut rng = Rng::new(seed);
    // D 64 in whole words: where the forward's texel kernel would read mirrors copied
    // from these buffers, which a STORAGE-only buffer cannot give; the backward reads
    // the same buffers (it has no texel kernels since 2026-12-08).
    let shape = [1, 2, 40, 64];
    let n = 2 * 40 * 64;
    let [q, k, v, d_out] = [(); 4].map(|()| rng.vec(n, -1.0, 1.0));
    let storage_only = |data: &[f32]| {
        let buffer = ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("caller's storage-only buffer"),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE,
        });
        Tensor::from_buffer(ctx, buffer, shape, Layout::Bhsd, DType::F32).expect("wrap")
    };
    let upload = |data: &[f32]| Tensor::from_f32(ctx, shape, Layout::Bhsd, data).expect("upload");
    let options = AttentionOptions {
        causal: Some(wgpu_attention::CausalAlignment::TopLeft),
        need_lse: true,
        ..AttentionOptions::default()
    };
    let run = |t: &dyn Fn(&[f32]) -> Tensor| -> Vec<Vec<f32>> {
        let (qt, kt, vt) = (t(&q), t(&k), t(&v));
        let fwd = sdpa(ctx, &qt, &kt, &vt, &options).expect("sdpa");
        let lse = fwd.lse.as_ref().expect("lse");
        let grads = sdpa_backward(ctx, &qt, &kt, &vt, &fwd.out, lse, &t(&d_out), &options).expect("backward");
        [&fwd.out, &grads.dq, &grads.dk, &grads.dv]
            .map(|x| x.to_f32_vec(ctx).expect("read"))
            .to_vec()
    };
    let (own, uploaded) = (run(&storage_only), run(&upload));
    for (name, (a, b)) in ["out", "dq", "dk", "dv"].iter().zip(own.iter().zip(&uploaded)) {
        let largest = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-5 * largest.max(1.0),
            "seed {seed}: {name} differs by {worst:e}"
        );
    }
}

#[test]
fn f16_tensors_read_back_as_f16() {
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "SHADER_F16", true);
        return;
    }
    let mut rng = Rng::new(38);
    let halves: Vec<f16> = rng.vec(24, -4.0, 4.0).into_iter().map(f16::from_f32).collect();
    let t = Tensor::from_f16(ctx, [1, 2, 3, 4], Layout::Bshd, &halves).expect("upload");
    assert_eq!(t.to_f16_vec(ctx).expect("read"), halves);
    let f32_tensor = Tensor::from_f32(ctx, [1, 1, 1, 4], Layout::Bhsd, &[1.0, 2.0, 3.0, 4.0]).expect("upload");
    let err = f32_tensor.to_f16_vec(ctx).expect_err("an f32 tensor");
    assert!(err.to_string().contains("to_f32_vec"), "{err}");
}
