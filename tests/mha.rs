//! Multi-head attention on the GPU against the f64 CPU reference of the whole layer:
//! self- and cross-attention, packed and separate projections, GQA, every mask kind,
//! post-norm, averaged and per-head weights, f32 and f16.

use crate::common;

use half::f16;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, ErrorStats, Rng};
use wgpu_attention::mha::reference::{f16_stored, multi_head_attention};
use wgpu_attention::mha::{PostNorm, ProjectionPlan};
use wgpu_attention::{
    AttentionOptions, CausalAlignment, Context, DType, Error, HeadWeights, Inputs, KernelChoice, MhaConfig, MhaOptions,
    MhaWeights, MultiHeadAttention, Precision, Rotary, RotaryStyle, Tensor,
};

/// Where keys and values come from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    SelfAttention,
    /// One key/value tensor (keys and values projected by one GEMM).
    SharedKeyValue,
    Separate,
}

#[derive(Clone, Debug)]
struct Case {
    config: MhaConfig,
    batch: usize,
    len_q: usize,
    len_k: usize,
    source: Source,
    options: MhaOptions,
    seed: u64,
}

/// Xavier weights with random (not zero) biases and LayerNorm parameters, so a
/// dropped bias or norm term cannot go unnoticed.
fn random_weights(config: &MhaConfig, seed: u64) -> MhaWeights {
    let mut w = MhaWeights::xavier_uniform(config, seed).expect("valid config");
    let mut rng = Rng::new(seed ^ 0x5eed);
    for p in [&mut w.q, &mut w.k, &mut w.v, &mut w.o] {
        if let Some(b) = &mut p.bias {
            *b = rng.vec(b.len(), -0.5, 0.5);
        }
    }
    if let Some(n) = &mut w.norm {
        n.weight = rng.vec(n.weight.len(), 0.5, 1.5);
        n.bias = rng.vec(n.bias.len(), -0.5, 0.5);
    }
    w
}

fn round_to(dtype: DType, values: &[f32]) -> Vec<f32> {
    match dtype {
        DType::F32 => values.to_vec(),
        DType::F16 => values.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
    }
}

/// The weights as the GPU holds them in `dtype`.
fn rounded_weights(w: &MhaWeights, dtype: DType) -> MhaWeights {
    let mut r = w.clone();
    for p in [&mut r.q, &mut r.k, &mut r.v, &mut r.o] {
        p.weight = round_to(dtype, &p.weight);
        p.bias = p.bias.as_ref().map(|b| round_to(dtype, b));
    }
    if let Some(n) = &mut r.norm {
        n.weight = round_to(dtype, &n.weight);
        n.bias = round_to(dtype, &n.bias);
    }
    r
}

/// Tolerances. f32: the standard bound for dot products accumulated in f32, linear in
/// the longest accumulation (a GEMM's K, or the key count) and in the size of the values
/// involved (the reference's error scale, which includes the post-norm's gain). f16: the
/// flash-attn rule, twice the error of the same layer with every stored intermediate
/// rounded to f16, plus a small absolute term.
fn bound(case: &Case, dtype: DType, error_scale: f64, f16_error: f64) -> f64 {
    let c = &case.config;
    let longest = c.embed_dim.max(c.kdim).max(c.vdim) + (case.len_k as f64).log2().ceil() as usize;
    match dtype {
        DType::F32 => 4.0 * longest as f64 * f64::from(f32::EPSILON) * error_scale,
        DType::F16 => 2.0 * f16_error + 1e-5 * error_scale,
    }
}

fn run(ctx: &Context, case: &Case, dtype: DType) {
    let c = &case.config;
    let seed = case.seed;
    let mut rng = Rng::new(seed);
    let query = round_to(dtype, &rng.vec(case.batch * case.len_q * c.embed_dim, -1.0, 1.0));
    let (key, value) = match case.source {
        Source::SelfAttention => (query.clone(), query.clone()),
        Source::SharedKeyValue => {
            let kv = round_to(dtype, &rng.vec(case.batch * case.len_k * c.kdim, -1.0, 1.0));
            (kv.clone(), kv)
        }
        Source::Separate => (
            round_to(dtype, &rng.vec(case.batch * case.len_k * c.kdim, -1.0, 1.0)),
            round_to(dtype, &rng.vec(case.batch * case.len_k * c.vdim, -1.0, 1.0)),
        ),
    };
    let weights = random_weights(c, seed);
    let layer = MultiHeadAttention::new(ctx, c.clone(), &weights, dtype).expect("layer");
    let q_t = Tensor::sequence(ctx, [case.batch, case.len_q, c.embed_dim], dtype, &query).expect("upload");
    let k_t = Tensor::sequence(ctx, [case.batch, case.len_k, c.kdim], dtype, &key).expect("upload");
    let v_t = Tensor::sequence(ctx, [case.batch, case.len_k, c.vdim], dtype, &value).expect("upload");
    let inputs = match case.source {
        Source::SelfAttention => Inputs::SelfAttention(&q_t),
        Source::SharedKeyValue => Inputs::Cross {
            query: &q_t,
            key: &k_t,
            value: &k_t,
        },
        Source::Separate => Inputs::Cross {
            query: &q_t,
            key: &k_t,
            value: &v_t,
        },
    };
    let result = layer.forward(ctx, inputs, &case.options).expect("forward");
    let got = result.out.to_f32_vec(ctx).expect("readback");

    let held = rounded_weights(&weights, dtype);
    let sizes = [case.batch, case.len_q, case.len_k];
    let attention = &case.options.attention;
    let want = multi_head_attention(c, &held, [&query, &key, &value], sizes, attention).expect("reference");
    // Errors of a plain f16 layer (output, weights), the yardstick of the f16 bounds.
    let (f16_error, f16_weights_error) = if dtype == DType::F16 {
        let naive = f16_stored(c, &held, [&query, &key, &value], sizes, attention).expect("reference");
        let error = |got: &[f64], want: &[f64]| {
            let as_f32: Vec<f32> = got.iter().map(|&x| x as f32).collect();
            ErrorStats::of(&as_f32, want).max_abs
        };
        (error(&naive.out, &want.out), error(&naive.weights, &want.weights))
    } else {
        (0.0, 0.0)
    };
    let out = ErrorStats::of(&got, &want.out);
    let limit = bound(case, dtype, want.error_scale, f16_error);
    assert!(
        out.non_finite == 0 && out.max_abs <= limit,
        "seed {seed} {dtype:?}: output max abs err {:.3e} at {} (bound {limit:.3e}, mean {:.3e}, non-finite {})\n{case:?}",
        out.max_abs,
        out.argmax,
        out.mean_abs,
        out.non_finite
    );
    let per_head = want.weights;
    let (h, lq, lk) = (c.num_heads, case.len_q, case.len_k);
    let expected: Option<Vec<f64>> = match case.options.weights {
        HeadWeights::None => None,
        HeadWeights::PerHead => Some(per_head),
        HeadWeights::Averaged => Some(
            (0..case.batch * lq * lk)
                .map(|i| {
                    let (b, rest) = (i / (lq * lk), i % (lq * lk));
                    (0..h).map(|hh| per_head[(b * h + hh) * lq * lk + rest]).sum::<f64>() / h as f64
                })
                .collect(),
        ),
    };
    match (expected, result.weights) {
        (None, None) => {}
        (Some(expected), Some(w)) => {
            let got = w.to_f32_vec(ctx).expect("readback");
            assert_eq!(got.len(), expected.len(), "weights shape {:?}", w.shape());
            let stats = ErrorStats::of(&got, &expected);
            // f32: probabilities from f32 GEMM outputs, well inside 1e-5. f16: Q and K
            // are stored in f16, so the flash-attn rule again: twice a plain f16 layer's
            // weight error (per-head weights; averaging can only shrink it) plus 1e-5.
            let limit = if dtype == DType::F16 {
                2.0 * f16_weights_error + 1e-5
            } else {
                1e-5
            };
            assert!(
                stats.max_abs <= limit && stats.non_finite == 0,
                "seed {seed} {dtype:?}: weights max abs err {:.3e} (bound {limit:.1e})",
                stats.max_abs
            );
        }
        (want, got) => panic!("weights: wanted {:?}, got {:?}", want.is_some(), got.map(|t| t.shape())),
    }
}

fn on_both_dtypes(case: Case) {
    let Some(ctx) = common::ctx() else { return };
    for dtype in [DType::F32, DType::F16] {
        if dtype == DType::F16 && !ctx.capabilities().f16 {
            eprintln!("skipping f16: the adapter has no SHADER_F16");
            continue;
        }
        run(ctx, &case, dtype);
    }
}

#[test]
fn self_attention_with_padding_and_averaged_weights() {
    let config = MhaConfig::new(32, 4);
    on_both_dtypes(Case {
        config,
        batch: 2,
        len_q: 7,
        len_k: 7,
        source: Source::SelfAttention,
        options: MhaOptions {
            attention: AttentionOptions {
                key_lengths: Some(vec![7, 4]),
                ..Default::default()
            },
            weights: HeadWeights::Averaged,
        },
        seed: 41,
    });
}

#[test]
fn cross_attention_with_other_key_and_value_widths_and_a_bool_mask() {
    let config = MhaConfig {
        kdim: 12,
        vdim: 20,
        ..MhaConfig::new(24, 3)
    };
    let mut rng = Rng::new(43);
    on_both_dtypes(Case {
        config,
        batch: 2,
        len_q: 5,
        len_k: 9,
        source: Source::Separate,
        options: MhaOptions {
            attention: AttentionOptions {
                mask: Some(random_bool_mask(&mut rng, [2, 1, 5, 9])),
                ..Default::default()
            },
            weights: HeadWeights::PerHead,
        },
        seed: 43,
    });
}

#[test]
fn cross_attention_on_one_key_value_tensor_with_additive_mask_and_causal() {
    let mut rng = Rng::new(47);
    on_both_dtypes(Case {
        config: MhaConfig::new(16, 2),
        batch: 3,
        len_q: 4,
        len_k: 11,
        source: Source::SharedKeyValue,
        options: MhaOptions {
            attention: AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                mask: Some(random_additive_mask(&mut rng, [1, 2, 4, 11])),
                kernel: KernelChoice::Materialized,
                ..Default::default()
            },
            weights: HeadWeights::Averaged,
        },
        seed: 47,
    });
}

#[test]
fn grouped_query_attention_with_causal_mask_and_post_norm() {
    let config = MhaConfig {
        num_kv_heads: 2,
        bias: false,
        post_norm: Some(PostNorm::default()),
        ..MhaConfig::new(64, 8)
    };
    on_both_dtypes(Case {
        config,
        batch: 2,
        len_q: 13,
        len_k: 13,
        source: Source::SelfAttention,
        options: MhaOptions {
            attention: AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                ..Default::default()
            },
            weights: HeadWeights::PerHead,
        },
        seed: 53,
    });
}

#[test]
fn rotary_embeddings_rotate_queries_and_keys_at_their_positions() {
    // LLaMA-style self-attention (NeoX pairs over part of each head, GQA, causal), then
    // GPT-J pairs with position interpolation in cross-attention, keys outnumbering
    // queries.
    on_both_dtypes(Case {
        config: MhaConfig {
            num_kv_heads: 2,
            bias: false,
            rotary: Some(Rotary::new(6)),
            ..MhaConfig::new(32, 4)
        },
        batch: 2,
        len_q: 9,
        len_k: 9,
        source: Source::SelfAttention,
        options: MhaOptions {
            attention: AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                ..Default::default()
            },
            weights: HeadWeights::PerHead,
        },
        seed: 59,
    });
    on_both_dtypes(Case {
        config: MhaConfig {
            rotary: Some(Rotary {
                style: RotaryStyle::GptJ,
                scaling: 2.5,
                ..Rotary::new(8)
            }),
            ..MhaConfig::new(16, 2)
        },
        batch: 2,
        len_q: 4,
        len_k: 11,
        source: Source::Separate,
        options: MhaOptions::default(),
        seed: 61,
    });
}

#[test]
fn a_rotary_embedding_that_does_not_fit_the_heads_is_an_error() {
    let Some(ctx) = common::ctx() else { return };
    for dim in [0, 3, 10] {
        let config = MhaConfig {
            rotary: Some(Rotary::new(dim)),
            ..MhaConfig::new(16, 2)
        };
        let weights = random_weights(&MhaConfig::new(16, 2), 7);
        let err = MultiHeadAttention::new(ctx, config, &weights, DType::F32).expect_err("head dim is 8");
        assert!(err.to_string().contains("rotary dim"), "{err}");
    }
}

#[test]
fn packed_and_separate_projection_plans_agree_exactly() {
    // One GEMM writing Q, K and V through the split epilogue must give the same bits
    // as three GEMMs over row ranges of the packed weight.
    let Some(ctx) = common::ctx() else { return };
    let config = MhaConfig {
        num_kv_heads: 3,
        ..MhaConfig::new(48, 6)
    };
    let weights = random_weights(&config, 59);
    let layer = MultiHeadAttention::new(ctx, config, &weights, DType::F32).expect("layer");
    let x = Rng::new(59).vec(2 * 9 * 48, -1.0, 1.0);
    let x = Tensor::sequence(ctx, [2, 9, 48], DType::F32, &x).expect("upload");
    let mut outputs = Vec::new();
    for plan in [ProjectionPlan::Fused, ProjectionPlan::Separate] {
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        let qkv = layer
            .encode_projections(ctx, &mut encoder, Inputs::SelfAttention(&x), plan, Precision::Highest)
            .expect("projections");
        ctx.queue().submit([encoder.finish()]);
        let values: Vec<Vec<f32>> = qkv.iter().map(|t| t.to_f32_vec(ctx).expect("readback")).collect();
        outputs.push(values);
    }
    assert_eq!(outputs[0], outputs[1], "fused vs separate Q/K/V projections");
}

#[test]
fn bad_layers_and_inputs_are_errors() {
    let Some(ctx) = common::ctx() else { return };
    let config = MhaConfig::new(16, 4);
    let weights = random_weights(&config, 61);
    // Config and weights that do not fit together.
    let bad_heads = MhaConfig::new(16, 3);
    assert!(matches!(bad_heads.validate(), Err(Error::Invalid { .. })));
    let post_norm_without_weights = MhaConfig {
        post_norm: Some(PostNorm::default()),
        ..config.clone()
    };
    assert!(MultiHeadAttention::new(ctx, post_norm_without_weights, &weights, DType::F32).is_err());
    let mut short = weights.clone();
    short.k.weight.pop();
    let err = MultiHeadAttention::new(ctx, config.clone(), &short, DType::F32).expect_err("short weight");
    assert!(err.to_string().contains("key projection weight"), "{err}");

    let layer = MultiHeadAttention::new(ctx, config, &weights, DType::F32).expect("layer");
    let x = Tensor::sequence(ctx, [2, 3, 16], DType::F32, &Rng::new(1).vec(96, -1.0, 1.0)).expect("upload");
    let narrow = Tensor::sequence(ctx, [2, 3, 8], DType::F32, &Rng::new(2).vec(48, -1.0, 1.0)).expect("upload");
    let other_batch = Tensor::sequence(ctx, [1, 3, 16], DType::F32, &Rng::new(3).vec(48, -1.0, 1.0)).expect("upload");
    let options = MhaOptions::default();
    for (what, inputs) in [
        ("narrow query", Inputs::SelfAttention(&narrow)),
        (
            "key of another batch size",
            Inputs::Cross {
                query: &x,
                key: &other_batch,
                value: &other_batch,
            },
        ),
        (
            "narrow value",
            Inputs::Cross {
                query: &x,
                key: &x,
                value: &narrow,
            },
        ),
    ] {
        match layer.forward(ctx, inputs, &options) {
            Err(Error::Shape { .. }) => {}
            other => panic!("{what}: expected a shape error, got {other:?}"),
        }
    }
}
