//! The multi-head attention layer against PyTorch: weights, inputs and outputs exported
//! from `nn.MultiheadAttention` (and a grouped-query layer built on
//! `F.scaled_dot_product_attention`) by `tests/fixtures/torch_mha/make_fixture.py`.
//! Verifies the naming schemes, the mask conventions and the math against the real
//! thing. PyTorch computed in f32; a float64 recomputation agrees with it to 2e-6.

use crate::common;

use common::torch_fixture as fixture;
use wgpu_attention::check::ErrorStats;
use wgpu_attention::key_mask_from_tokens;
use wgpu_attention::mha::reference::multi_head_attention;
use wgpu_attention::mha::{load_safetensors, LoadedMha, PostNorm};
use wgpu_attention::{
    AttentionOptions, CausalAlignment, DType, HeadWeights, Inputs, Mask, MhaOptions, MultiHeadAttention, Tensor,
};

/// GPU (f32) vs PyTorch (f32): both within ~1e-5 of the exact result at these sizes
/// (E <= 32, values O(1)); the f64 reference must match PyTorch to 1e-5 as well.
const TOLERANCE: f64 = 2e-5;

fn npy<T: npyz::Deserialize>(name: &str) -> (Vec<T>, Vec<usize>) {
    let bytes = std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let file = npyz::NpyFile::new(&bytes[..]).expect("npy header");
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    (file.into_vec().expect("npy data"), shape)
}

fn load(name: &str, heads: usize, prefix: &str) -> LoadedMha {
    let bytes = std::fs::read(fixture(name)).expect("weights file");
    load_safetensors(&bytes, heads, None, prefix).expect("loads")
}

struct Expected<'a> {
    out: &'a str,
    weights: &'a str,
}

fn compare(what: &str, got: &[f32], want: &[f32]) {
    let want64: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
    assert_eq!(got.len(), want.len(), "{what}: length");
    let stats = ErrorStats::of(got, &want64);
    assert!(
        stats.max_abs <= TOLERANCE && stats.non_finite == 0,
        "{what}: max abs err vs PyTorch {:.3e} at {} (tolerance {TOLERANCE:.0e})",
        stats.max_abs,
        stats.argmax
    );
}

/// Runs the layer on the GPU and the f64 reference, and compares both with PyTorch.
fn check(loaded: &LoadedMha, inputs: [&str; 3], options: MhaOptions, expected: Expected) {
    let Some(ctx) = common::ctx() else { return };
    let (query, q_shape) = npy::<f32>(inputs[0]);
    let (key, k_shape) = npy::<f32>(inputs[1]);
    let (value, v_shape) = npy::<f32>(inputs[2]);
    let c = &loaded.config;
    let layer = MultiHeadAttention::new(ctx, c.clone(), &loaded.weights, DType::F32).expect("layer");
    let seq = |data: &[f32], s: &[usize]| Tensor::sequence(ctx, [s[0], s[1], s[2]], DType::F32, data).expect("upload");
    let (q_t, k_t, v_t) = (seq(&query, &q_shape), seq(&key, &k_shape), seq(&value, &v_shape));
    let gpu_inputs = if inputs[0] == inputs[1] && inputs[1] == inputs[2] {
        Inputs::SelfAttention(&q_t)
    } else {
        Inputs::Cross {
            query: &q_t,
            key: &k_t,
            value: &v_t,
        }
    };
    let result = layer.forward(ctx, gpu_inputs, &options).expect("forward");
    let (want_out, _) = npy::<f32>(expected.out);
    compare(
        &format!("{} GPU output", expected.out),
        &result.out.to_f32_vec(ctx).expect("readback"),
        &want_out,
    );
    let (want_w, _) = npy::<f32>(expected.weights);
    let weights = result.weights.expect("weights asked for");
    compare(
        &format!("{} GPU weights", expected.weights),
        &weights.to_f32_vec(ctx).expect("readback"),
        &want_w,
    );

    let sizes = [q_shape[0], q_shape[1], k_shape[1]];
    let reference =
        multi_head_attention(c, &loaded.weights, [&query, &key, &value], sizes, &options.attention).expect("reference");
    let as_f32: Vec<f32> = reference.out.iter().map(|&x| x as f32).collect();
    compare(&format!("{} f64 reference", expected.out), &as_f32, &want_out);
}

#[test]
fn self_attention_with_a_pad_mask_from_tokens() {
    let loaded = load("self.safetensors", 4, "");
    let (tokens, shape) = npy::<i64>("self_tokens.npy");
    let mask = key_mask_from_tokens(&tokens, shape[0], 0).expect("mask");
    for (weights, file) in [
        (HeadWeights::Averaged, "self_weights.npy"),
        (HeadWeights::PerHead, "self_weights_per_head.npy"),
    ] {
        let options = MhaOptions {
            attention: AttentionOptions {
                mask: Some(mask.clone()),
                ..Default::default()
            },
            weights,
        };
        let q = "self_query.npy";
        check(
            &loaded,
            [q, q, q],
            options,
            Expected {
                out: "self_out.npy",
                weights: file,
            },
        );
    }
}

#[test]
fn cross_attention_with_separate_projection_weights_and_a_bool_mask() {
    let loaded = load("cross.safetensors", 2, "");
    assert_eq!((loaded.config.kdim, loaded.config.vdim), (12, 8));
    let (allow, shape) = npy::<bool>("cross_mask.npy");
    let mask = Mask::boolean(&[1, 1, shape[0], shape[1]], allow).expect("mask");
    let options = MhaOptions {
        attention: AttentionOptions {
            mask: Some(mask),
            ..Default::default()
        },
        weights: HeadWeights::Averaged,
    };
    check(
        &loaded,
        ["cross_query.npy", "cross_key.npy", "cross_value.npy"],
        options,
        Expected {
            out: "cross_out.npy",
            weights: "cross_weights.npy",
        },
    );
}

#[test]
fn causal_post_norm_layer_with_hugging_face_names_and_a_prefix() {
    let mut loaded = load("postnorm.safetensors", 3, "encoder.layers.0.");
    assert!(loaded.weights.norm.is_some());
    loaded.config.post_norm = Some(PostNorm { eps: 1e-5 });
    let options = MhaOptions {
        attention: AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        },
        weights: HeadWeights::PerHead,
    };
    let q = "postnorm_query.npy";
    check(
        &loaded,
        [q, q, q],
        options,
        Expected {
            out: "postnorm_out.npy",
            weights: "postnorm_weights_per_head.npy",
        },
    );
}

#[test]
fn grouped_query_attention_with_key_lengths() {
    let loaded = load("gqa.safetensors", 4, "");
    assert_eq!(loaded.config.num_kv_heads, 2);
    let (lengths, _) = npy::<i64>("gqa_key_lengths.npy");
    let options = MhaOptions {
        attention: AttentionOptions {
            key_lengths: Some(lengths.iter().map(|&l| l as u32).collect()),
            ..Default::default()
        },
        weights: HeadWeights::PerHead,
    };
    let q = "gqa_query.npy";
    check(
        &loaded,
        [q, q, q],
        options,
        Expected {
            out: "gqa_out.npy",
            weights: "gqa_weights_per_head.npy",
        },
    );
}
