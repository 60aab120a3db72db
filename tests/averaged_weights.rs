//! Attention weights averaged over heads (`AttentionOptions::average_weights`, PyTorch's
//! `average_attn_weights=True`), summed chunk by chunk: against the reference, and bit
//! for bit (on CPU drivers; within WGSL's division accuracy elsewhere) the head-order
//! mean of the same call's per-head weights, on every kernel path
//! and with chunks that cut a batch element's heads (B 2, Hq 3: chunks of 2 heads).

use crate::common;

use wgpu_attention::check::{CheckCase, Rng};
use wgpu_attention::{sdpa, AttentionOptions, AttentionShape, CausalAlignment, DType, KernelChoice, Layout, Tensor};

#[test]
fn averaged_weights_are_the_head_order_mean_of_the_per_head_weights() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 3301;
    let mut rng = Rng::new(seed);
    for (kernel, s) in [
        (KernelChoice::Fused, AttentionShape::new(2, 3, 1, 17, 29, 16, 16)),
        (KernelChoice::Materialized, AttentionShape::new(2, 3, 3, 9, 40, 8, 12)),
        (KernelChoice::Decode, AttentionShape::new(3, 4, 2, 1, 300, 32, 32)),
    ] {
        let options = AttentionOptions {
            kernel,
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some((0..s.batch).map(|b| (s.len_k - 3 * b) as u32).collect()),
            need_weights: true,
            average_weights: true,
            ..Default::default()
        };
        let what = format!("{kernel:?} {s:?}, seed {seed}");
        let case = CheckCase {
            shape: s,
            options: options.clone(),
            dtype: DType::F32,
            layout: Layout::Bhsd,
            seed: rng.next_u64(),
            range: 1.0,
        };
        common::assert_case(ctx, &case);

        let upload = |h: usize, l: usize, d: usize, rng: &mut Rng| {
            let data = rng.vec(s.batch * h * l * d, -1.0, 1.0);
            Tensor::from_f32(ctx, [s.batch, h, l, d], Layout::Bhsd, &data).expect("upload")
        };
        let q = upload(s.heads_q, s.len_q, s.head_dim, &mut rng);
        let k = upload(s.heads_kv, s.len_k, s.head_dim, &mut rng);
        let v = upload(s.heads_kv, s.len_k, s.head_dim_v, &mut rng);
        let averaged = sdpa(ctx, &q, &k, &v, &options)
            .expect("averaged")
            .weights
            .expect("weights");
        assert_eq!(averaged.shape(), [s.batch, 1, s.len_q, s.len_k], "{what}");
        let per_head_options = AttentionOptions {
            average_weights: false,
            ..options
        };
        let per_head = sdpa(ctx, &q, &k, &v, &per_head_options)
            .expect("per head")
            .weights
            .expect("weights")
            .to_f32_vec(ctx)
            .expect("read");
        let plane = s.len_q * s.len_k;
        let want: Vec<f32> = (0..s.batch * plane)
            .map(|x| {
                let (b, at) = (x / plane, x % plane);
                let mut sum = 0.0f32;
                for h in 0..s.heads_q {
                    sum += per_head[(b * s.heads_q + h) * plane + at];
                }
                sum / s.heads_q as f32
            })
            .collect();
        let got = averaged.to_f32_vec(ctx).expect("read");
        // CPU drivers divide as IEEE does, so the bits match; a GPU's f32 division may
        // be off by up to 2.5 ULP (WGSL's accuracy for `/`).
        let ulps = if ctx.is_cpu_adapter() { 0 } else { 3 };
        let close = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs() <= ulps;
        assert!(
            got.len() == want.len() && got.iter().zip(&want).all(|(&a, &b)| close(a, b)),
            "{what}: not the head-order mean"
        );
    }
}

#[test]
fn averaged_weights_never_hold_the_per_head_weights() {
    if common::ctx().is_none() {
        return;
    }
    // A context of its own, so that its allocation count is this call's alone.
    let ctx = wgpu_attention::Context::new().expect("a context");
    // Planes of 16 MiB: one head per score chunk (the chunk budget is B heads or 16 MiB).
    let s = AttentionShape::new(1, 8, 8, 2048, 2048, 8, 8);
    let mut rng = Rng::new(3302);
    let upload = |h: usize, l: usize, d: usize, rng: &mut Rng| {
        let data = rng.vec(s.batch * h * l * d, -1.0, 1.0);
        Tensor::from_f32(&ctx, [s.batch, h, l, d], Layout::Bhsd, &data).expect("upload")
    };
    let q = upload(s.heads_q, s.len_q, s.head_dim, &mut rng);
    let k = upload(s.heads_kv, s.len_k, s.head_dim, &mut rng);
    let v = upload(s.heads_kv, s.len_k, s.head_dim_v, &mut rng);
    let per_head_bytes = (4 * s.batch * s.heads_q * s.len_q * s.len_k) as u64;
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        let options = AttentionOptions {
            kernel,
            need_weights: true,
            average_weights: true,
            ..Default::default()
        };
        let before = ctx.allocated_bytes();
        let result = sdpa(&ctx, &q, &k, &v, &options).expect("averaged");
        let allocated = ctx.allocated_bytes() - before;
        // The averaged weights and one score chunk, a quarter of the per-head weights
        // here, plus the output and small buffers.
        assert!(
            allocated < per_head_bytes / 2,
            "{kernel:?}: {allocated} bytes allocated, per-head weights are {per_head_bytes}"
        );
        drop(result);
    }
}
