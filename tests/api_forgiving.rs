//! The API forgives the obvious, or says what to do instead (issue 37).

use crate::common;

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

/// A function a user writes: `std::fs::read(..)?` and the crate's calls in one
/// `wgpu_attention::Result`.
fn load_weights(path: &std::path::Path) -> wgpu_attention::Result<usize> {
    let bytes = std::fs::read(path)?;
    Ok(bytes.len())
}

#[test]
fn io_errors_convert_into_the_crates_error() {
    let missing = std::env::temp_dir().join(format!("wgpu-attention-missing-{}", std::process::id()));
    let err = load_weights(&missing).expect_err("no such file");
    assert!(matches!(err, wgpu_attention::Error::Io(_)), "{err:?}");
    assert!(err.to_string().starts_with("I/O error:"), "{err}");
}

#[test]
fn f32_rows_for_an_f16_cache_are_refused_with_the_way_to_convert_them() {
    use wgpu_attention::{KvCache, KvCacheConfig, Layout};
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "SHADER_F16", true);
        return;
    }
    let config = KvCacheConfig {
        batch: 1,
        heads_kv: 2,
        capacity: 8,
        head_dim: 4,
        head_dim_v: 4,
        layout: Layout::Bhsd,
        dtype: DType::F16,
    };
    let mut cache = KvCache::new(ctx, config).expect("cache");
    let mut rng = Rng::new(6);
    let rows = rng.vec(16, -1.0, 1.0);
    let k32 = Tensor::from_f32(ctx, [1, 2, 2, 4], Layout::Bhsd, &rows).expect("k");
    let err = cache.append(ctx, &k32, &k32).expect_err("f32 rows");
    assert!(err.to_string().contains("Tensor::from_f32_as"), "{err}");
    // Done as it says, the rows go in.
    let k16 = Tensor::from_f32_as(ctx, [1, 2, 2, 4], Layout::Bhsd, DType::F16, &rows).expect("k as f16");
    cache.append(ctx, &k16, &k16).expect("f16 rows");
    assert_eq!(cache.lengths(), &[2]);
}
