//! The API forgives the obvious, or says what to do instead (issue 37).

mod common;

use wgpu_attention::check::Rng;
use wgpu_attention::{
    AttentionOptions, DType, HeadWeights, Inputs, MhaConfig, MhaOptions, MhaWeights, MultiHeadAttention, Tensor,
};

#[test]
fn a_layer_asked_for_weights_through_its_attention_options_says_where_to_ask() {
    let Some(ctx) = common::ctx() else { return };
    let config = MhaConfig::new(16, 2);
    let weights = MhaWeights::xavier_uniform(&config, 3).expect("weights");
    let layer = MultiHeadAttention::new(ctx, config, &weights, DType::F32).expect("layer");
    let mut rng = Rng::new(4);
    let x = Tensor::sequence(ctx, [1, 3, 16], DType::F32, &rng.vec(48, -1.0, 1.0)).expect("x");
    for attention in [
        AttentionOptions {
            need_weights: true,
            ..Default::default()
        },
        AttentionOptions {
            need_lse: true,
            ..Default::default()
        },
    ] {
        let options = MhaOptions {
            attention,
            weights: HeadWeights::None,
        };
        let err = layer
            .forward(ctx, Inputs::SelfAttention(&x), &options)
            .expect_err("refused");
        assert!(err.to_string().contains("MhaOptions::weights"), "{err}");
    }
    let options = MhaOptions {
        weights: HeadWeights::PerHead,
        ..Default::default()
    };
    let out = layer
        .forward(ctx, Inputs::SelfAttention(&x), &options)
        .expect("forward");
    assert_eq!(out.weights.expect("weights").shape(), [1, 2, 3, 3]);
}
