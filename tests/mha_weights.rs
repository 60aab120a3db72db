//! Loading multi-head attention weights from `.safetensors`: PyTorch names (packed and
//! separate projections), Hugging Face names (GQA, prefix, biases, norm), and errors that
//! name the tensor with the shape found and the shape expected. No GPU needed.

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use wgpu_attention::check::Rng;
use wgpu_attention::mha::{load_safetensors, WeightNaming};
use wgpu_attention::{Error, MhaConfig, MhaWeights};

/// A safetensors file of f32 tensors.
fn file(tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| bytemuck::cast_slice(v).to_vec())
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            (
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), b).expect("view"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialize")
}

fn random(rng: &mut Rng, shape: &[usize]) -> Vec<f32> {
    rng.vec(shape.iter().product(), -1.0, 1.0)
}

fn entry(name: &str, shape: &[usize], values: Vec<f32>) -> (String, Vec<usize>, Vec<f32>) {
    (name.to_string(), shape.to_vec(), values)
}

/// PyTorch `nn.MultiheadAttention(16, 4)` state-dict names, with a prefix.
fn pytorch_packed(prefix: &str, rng: &mut Rng) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    vec![
        entry(&format!("{prefix}in_proj_weight"), &[48, 16], random(rng, &[48, 16])),
        entry(&format!("{prefix}in_proj_bias"), &[48], random(rng, &[48])),
        entry(&format!("{prefix}out_proj.weight"), &[16, 16], random(rng, &[16, 16])),
        entry(&format!("{prefix}out_proj.bias"), &[16], random(rng, &[16])),
    ]
}

#[test]
fn pytorch_packed_names_split_into_q_k_v() {
    let tensors = pytorch_packed("layer.0.", &mut Rng::new(1));
    let loaded = load_safetensors(&file(&tensors), 4, None, "layer.0.").expect("loads");
    assert_eq!(loaded.naming, WeightNaming::PyTorchPacked);
    assert_eq!(loaded.config, MhaConfig::new(16, 4));
    let (w, b) = (&tensors[0].2, &tensors[1].2);
    let w_ = &loaded.weights;
    assert_eq!(w_.q.weight, w[..256]);
    assert_eq!(w_.k.weight, w[256..512]);
    assert_eq!(w_.v.weight, w[512..]);
    assert_eq!(w_.k.bias.as_deref(), Some(&b[16..32]));
    assert_eq!(w_.o.weight, tensors[2].2);
    assert_eq!(w_.o.bias.as_deref(), Some(&tensors[3].2[..]));
    assert!(w_.norm.is_none());
}

#[test]
fn pytorch_separate_names_give_kdim_and_vdim() {
    let mut rng = Rng::new(2);
    let tensors = vec![
        entry("q_proj_weight", &[16, 16], random(&mut rng, &[16, 16])),
        entry("k_proj_weight", &[16, 12], random(&mut rng, &[16, 12])),
        entry("v_proj_weight", &[16, 8], random(&mut rng, &[16, 8])),
        entry("out_proj.weight", &[16, 16], random(&mut rng, &[16, 16])),
    ];
    let loaded = load_safetensors(&file(&tensors), 2, None, "").expect("loads");
    assert_eq!(loaded.naming, WeightNaming::PyTorchSeparate);
    assert_eq!((loaded.config.kdim, loaded.config.vdim), (12, 8));
    assert!(!loaded.config.bias);
    assert_eq!(loaded.weights.v.weight, tensors[2].2);
}

#[test]
fn hugging_face_names_infer_kv_heads_and_read_norm() {
    let mut rng = Rng::new(3);
    let p = "model.layers.3.";
    let mut tensors = vec![
        entry(&format!("{p}q_proj.weight"), &[32, 32], random(&mut rng, &[32, 32])),
        entry(&format!("{p}q_proj.bias"), &[32], random(&mut rng, &[32])),
        entry(&format!("{p}k_proj.weight"), &[16, 32], random(&mut rng, &[16, 32])),
        entry(&format!("{p}v_proj.weight"), &[16, 32], random(&mut rng, &[16, 32])),
        entry(&format!("{p}o_proj.weight"), &[32, 32], random(&mut rng, &[32, 32])),
    ];
    tensors.push(entry(&format!("{p}norm.weight"), &[32], random(&mut rng, &[32])));
    tensors.push(entry(&format!("{p}norm.bias"), &[32], random(&mut rng, &[32])));
    let loaded = load_safetensors(&file(&tensors), 8, None, p).expect("loads");
    assert_eq!(loaded.naming, WeightNaming::HuggingFace);
    assert_eq!(loaded.config.num_kv_heads, 4, "16 kv rows / head dim 4");
    assert!(loaded.config.bias, "q_proj.bias is present");
    assert!(loaded.weights.k.bias.is_none());
    let norm = loaded.weights.norm.as_ref().expect("norm");
    assert_eq!(norm.bias, tensors[6].2);
    // The loaded weights drive a config with a post-norm.
    let config = MhaConfig {
        post_norm: Some(Default::default()),
        ..loaded.config.clone()
    };
    loaded.weights.check(&config).expect("post-norm weights fit");
    // An explicit kv head count that disagrees with the file is an error naming k_proj.
    let err = load_safetensors(&file(&tensors), 8, Some(2), p).expect_err("2 kv heads do not fit 16 rows");
    let text = err.to_string();
    assert!(
        text.contains("k_proj.weight") && text.contains("[8, 32]") && text.contains("[16, 32]"),
        "{text}"
    );
}

#[test]
fn xavier_weights_survive_a_round_trip_through_hugging_face_names() {
    let config = MhaConfig {
        num_kv_heads: 2,
        ..MhaConfig::new(24, 6)
    };
    let w = MhaWeights::xavier_uniform(&config, 9).expect("init");
    let bound = (6.0f32 / 48.0).sqrt();
    assert!(w.q.weight.iter().all(|x| x.abs() <= bound) && w.q.weight.iter().any(|&x| x != 0.0));
    let mut tensors = Vec::new();
    for (name, p) in [("q_proj", &w.q), ("k_proj", &w.k), ("v_proj", &w.v), ("o_proj", &w.o)] {
        tensors.push(entry(
            &format!("{name}.weight"),
            &[p.out_features, p.in_features],
            p.weight.clone(),
        ));
        if let Some(b) = &p.bias {
            tensors.push(entry(&format!("{name}.bias"), &[b.len()], b.clone()));
        }
    }
    let loaded = load_safetensors(&file(&tensors), 6, Some(2), "").expect("loads");
    assert_eq!(loaded.config, config);
    assert_eq!(loaded.weights, w);
}

fn expect_error(bytes: &[u8], heads: usize, kv: Option<usize>, prefix: &str, needles: &[&str]) {
    match load_safetensors(bytes, heads, kv, prefix) {
        Err(e) => {
            let text = e.to_string();
            for needle in needles {
                assert!(text.contains(needle), "error should mention '{needle}': {text}");
            }
        }
        Ok(_) => panic!("expected an error mentioning {needles:?}"),
    }
}

#[test]
fn missing_and_misshaped_tensors_are_named() {
    let mut rng = Rng::new(4);
    let good = pytorch_packed("", &mut rng);
    // Missing output projection.
    let missing: Vec<_> = good.iter().filter(|t| t.0 != "out_proj.weight").cloned().collect();
    expect_error(
        &file(&missing),
        4,
        None,
        "",
        &["out_proj.weight", "missing", "[16, 16]"],
    );
    // Misshaped bias.
    let mut bad_bias = good.clone();
    bad_bias[1] = entry("in_proj_bias", &[47], random(&mut rng, &[47]));
    expect_error(&file(&bad_bias), 4, None, "", &["in_proj_bias", "[48]", "[47]"]);
    // Packed weight that is not [3E, E].
    let mut bad_packed = good.clone();
    bad_packed[0] = entry("in_proj_weight", &[40, 16], random(&mut rng, &[40, 16]));
    expect_error(
        &file(&bad_packed),
        4,
        None,
        "",
        &["in_proj_weight", "[48, 16]", "[40, 16]"],
    );
    // Wrong prefix: says what it looked for and what the file has.
    expect_error(
        &file(&good),
        4,
        None,
        "encoder.",
        &["encoder.in_proj_weight", "in_proj_bias"],
    );
    // Heads that do not divide the width.
    expect_error(&file(&good), 5, None, "", &["embed_dim 16", "num_heads 5"]);
    // PyTorch naming has no GQA.
    expect_error(&file(&good), 4, Some(2), "", &["num_kv_heads"]);
    // Half a norm.
    let mut half_norm = good.clone();
    half_norm.push(entry("norm.weight", &[16], random(&mut rng, &[16])));
    expect_error(&file(&half_norm), 4, None, "", &["norm.bias", "missing"]);
    // Not a safetensors file at all.
    expect_error(b"not a safetensors file", 4, None, "", &["weights file"]);
}

#[test]
fn zero_sized_weights_and_head_counts_are_errors_not_panics() {
    // Issue 17 §1.1: a [0, 0] in_proj_weight divided by the embed dim before any check.
    for name in ["in_proj_weight", "q_proj_weight", "q_proj.weight"] {
        let zero = file(&[entry(name, &[0, 0], vec![])]);
        expect_error(&zero, 4, None, "", &[name, "zero-sized", "[0, 0]"]);
    }
    let zero_rows = file(&[entry("q_proj.weight", &[0, 16], vec![])]);
    expect_error(&zero_rows, 4, None, "", &["q_proj.weight", "[0, 16]"]);
    let mut rng = Rng::new(5);
    let good = pytorch_packed("", &mut rng);
    expect_error(&file(&good), 0, None, "", &["head counts"]);
    expect_error(&file(&good), 4, Some(0), "", &["head counts"]);
}

#[test]
fn integer_tensors_are_refused_with_their_dtype() {
    let mut rng = Rng::new(5);
    let mut tensors = pytorch_packed("", &mut rng);
    tensors.truncate(3); // no out_proj.bias: it comes back as an int tensor below
    let mut bytes_f32: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), bytemuck::cast_slice(v).to_vec()))
        .collect();
    bytes_f32.push(("out_proj.bias".into(), vec![16], vec![0u8; 64]));
    let views: Vec<(String, TensorView)> = bytes_f32
        .iter()
        .map(|(n, s, b)| {
            let dtype = if n == "out_proj.bias" { Dtype::I32 } else { Dtype::F32 };
            (n.clone(), TensorView::new(dtype, s.clone(), b).expect("view"))
        })
        .collect();
    let bytes = safetensors::serialize(views, None).expect("serialize");
    expect_error(&bytes, 4, None, "", &["out_proj.bias", "I32"]);
}

#[test]
fn errors_are_the_crate_error_type() {
    assert!(matches!(load_safetensors(b"", 1, None, ""), Err(Error::Invalid { .. })));
}

/// A whole `nn.TransformerEncoderLayer` state dict as PyTorch names it: the attention
/// under `self_attn.`, its norm `norm1`, and the feed-forward and second norm (which
/// the loader leaves alone).
fn transformer_encoder_layer(prefix: &str, rng: &mut Rng) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut tensors = pytorch_packed(&format!("{prefix}self_attn."), rng);
    for (name, shape) in [
        ("norm1.weight", vec![16]),
        ("norm1.bias", vec![16]),
        ("linear1.weight", vec![32, 16]),
        ("linear1.bias", vec![32]),
        ("linear2.weight", vec![16, 32]),
        ("linear2.bias", vec![16]),
        ("norm2.weight", vec![16]),
        ("norm2.bias", vec![16]),
    ] {
        tensors.push(entry(&format!("{prefix}{name}"), &shape, random(rng, &shape)));
    }
    tensors
}

#[test]
fn a_transformer_encoder_layers_state_dict_loads_as_pytorch_saves_it() {
    let seed = 44;
    let mut rng = Rng::new(seed);
    let tensors = transformer_encoder_layer("encoder.layers.0.", &mut rng);
    let loaded = load_safetensors(&file(&tensors), 4, None, "encoder.layers.0.").expect("loads");
    assert_eq!(loaded.naming, WeightNaming::PyTorchPacked);
    assert_eq!(loaded.norm_tensor.as_deref(), Some("encoder.layers.0.norm1.weight"));
    let find = |name: &str| &tensors.iter().find(|t| t.0 == name).expect(name).2;
    let norm = loaded.weights.norm.as_ref().expect("norm1 read");
    assert_eq!(&norm.weight, find("encoder.layers.0.norm1.weight"), "seed {seed}");
    assert_eq!(&norm.bias, find("encoder.layers.0.norm1.bias"), "seed {seed}");
    // The projections are those the attention module alone gives.
    let alone: Vec<_> = tensors
        .iter()
        .filter(|t| t.0.contains("self_attn."))
        .map(|(n, s, v)| (n.replace("encoder.layers.0.self_attn.", ""), s.clone(), v.clone()))
        .collect();
    let plain = load_safetensors(&file(&alone), 4, None, "").expect("loads");
    assert_eq!(plain.weights.q, loaded.weights.q);
    assert_eq!(plain.weights.o, loaded.weights.o);
    assert_eq!(plain.norm_tensor, None);

    // A Hugging Face decoder layer: attention under `self_attn.`, and a
    // `post_attention_layernorm` that is the MLP's pre-norm (bias-less RMSNorm in Llama),
    // not a post-norm of attention: it loads without one.
    let mut hf: Vec<_> = alone
        .iter()
        .map(|(n, s, v)| (format!("layers.3.self_attn.{n}"), s.clone(), v.clone()))
        .collect();
    hf.push(entry(
        "layers.3.post_attention_layernorm.weight",
        &[16],
        random(&mut rng, &[16]),
    ));
    let loaded = load_safetensors(&file(&hf), 4, None, "layers.3.").expect("loads");
    assert_eq!(loaded.norm_tensor, None);
    assert!(loaded.weights.norm.is_none());
    assert_eq!(loaded.weights.q, plain.weights.q);
    // A norm1 weight without its bias is named, not half-read.
    let mut half = transformer_encoder_layer("l.", &mut rng);
    half.retain(|t| t.0 != "l.norm1.bias");
    expect_error(&file(&half), 4, None, "l.", &["norm1.bias"]);
}
