//! The async forms (docs/design.md, "The web") are the one implementation of every
//! wait; the blocking forms run them with pollster. Here, natively: the async forms give
//! the blocking forms' bits, build a working context (with the loop probe's readback
//! awaited), report GPU errors, and pass the check grid's cases.

use crate::common;
use pollster::block_on;
use wgpu_attention::check::{run_case_async, CheckCase, Rng};
use wgpu_attention::{
    sdpa, sdpa_async, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Error, Inputs, KernelChoice,
    Layout, MhaConfig, MhaOptions, MhaWeights, MultiHeadAttention, Tensor,
};

fn random(ctx: &Context, rng: &mut Rng, shape: [usize; 4]) -> Tensor {
    let data = rng.vec(shape.iter().product(), -1.0, 1.0);
    Tensor::from_f32(ctx, shape, Layout::Bhsd, &data).expect("upload")
}

#[test]
fn async_forms_give_the_blocking_forms_bits() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 71;
    let mut rng = Rng::new(seed);
    let (q, k, v) = (
        random(ctx, &mut rng, [2, 4, 37, 16]),
        random(ctx, &mut rng, [2, 2, 53, 16]),
        random(ctx, &mut rng, [2, 2, 53, 16]),
    );
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        let options = AttentionOptions {
            kernel,
            causal: Some(CausalAlignment::BottomRight),
            need_lse: true,
            ..Default::default()
        };
        let blocking = sdpa(ctx, &q, &k, &v, &options).expect("sdpa");
        let awaited = block_on(sdpa_async(ctx, &q, &k, &v, &options)).expect("sdpa_async");
        for (a, b) in [
            (&blocking.out, &awaited.out),
            (
                blocking.lse.as_ref().expect("asked for"),
                awaited.lse.as_ref().expect("asked for"),
            ),
        ] {
            let a = a.to_f32_vec(ctx).expect("read back");
            let b = block_on(b.to_f32_vec_async(ctx)).expect("read back, awaited");
            assert_eq!(a.len(), b.len());
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "seed {seed}, {kernel:?}: the async form gave other bits"
            );
        }
    }
}

#[test]
fn an_awaited_context_probes_its_loop_cap_and_runs() {
    let Some(shared) = common::ctx() else { return };
    let ctx = block_on(Context::new_async()).expect("a context, awaited");
    assert_eq!(ctx.adapter_info().name, shared.adapter_info().name);
    assert_eq!(
        ctx.loop_cap(),
        shared.loop_cap(),
        "the awaited probe saw what the blocking one saw"
    );
    let case = CheckCase {
        shape: AttentionShape::new(1, 2, 1, 19, 45, 24, 24),
        options: AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            key_lengths: Some(vec![40]),
            ..Default::default()
        },
        dtype: DType::F32,
        layout: Layout::Bshd,
        seed: 73,
        range: 1.0,
    };
    let outcome = block_on(run_case_async(&ctx, &case)).expect("runs");
    assert!(outcome.passed, "seed 73: {}", outcome.summary());
}

#[test]
fn gpu_errors_reach_the_async_caller() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(79);
    let (q, k, v) = (
        random(ctx, &mut rng, [1, 2, 3, 8]),
        random(ctx, &mut rng, [1, 2, 5, 8]),
        random(ctx, &mut rng, [1, 2, 5, 8]),
    );
    k.buffer().destroy();
    let err = block_on(sdpa_async(ctx, &q, &k, &v, &AttentionOptions::default())).expect_err("k was destroyed");
    assert!(matches!(err, Error::Gpu { .. }), "{err}");
    let err = block_on(k.to_f32_vec_async(ctx)).expect_err("reading a destroyed buffer");
    assert!(matches!(err, Error::Gpu { .. }), "{err}");
    // An awaited upload refuses data of the wrong length; the context goes on working.
    let short = block_on(Tensor::from_f32_async(ctx, [1, 2, 5, 8], Layout::Bhsd, &[0.5; 79]));
    assert!(matches!(short, Err(Error::Shape { .. })), "{short:?}");
    let k_data = rng.vec(80, -1.0, 1.0);
    let k = block_on(Tensor::from_f32_async(ctx, [1, 2, 5, 8], Layout::Bhsd, &k_data)).expect("awaited upload");
    let out = block_on(sdpa_async(ctx, &q, &k, &v, &AttentionOptions::default())).expect("a valid call");
    assert_eq!(block_on(out.out.to_f32_vec_async(ctx)).expect("read back").len(), 48);
}

#[test]
fn forward_async_gives_forwards_bits() {
    let Some(ctx) = common::ctx() else { return };
    let config = MhaConfig::new(32, 4);
    let weights = MhaWeights::xavier_uniform(&config, 83).expect("valid config");
    let layer = MultiHeadAttention::new(ctx, config, &weights, DType::F32).expect("layer");
    let x = Rng::new(83).vec(2 * 7 * 32, -1.0, 1.0);
    let x = Tensor::sequence(ctx, [2, 7, 32], DType::F32, &x).expect("upload");
    let options = MhaOptions::default();
    let blocking = layer
        .forward(ctx, Inputs::SelfAttention(&x), &options)
        .expect("forward");
    let awaited = block_on(layer.forward_async(ctx, Inputs::SelfAttention(&x), &options)).expect("forward_async");
    let a = blocking.out.to_f32_vec(ctx).expect("read back");
    let b = block_on(awaited.out.to_f32_vec_async(ctx)).expect("read back, awaited");
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len(),
        "seed 83: forward_async gave other bits"
    );
}
