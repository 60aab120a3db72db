//! The multi-head layer's backward pass on the GPU against the f64 reference
//! (`mha::reference::multi_head_attention_backward`): self- and cross-attention, packed
//! and separate projections, GQA, masks, biases or none, post-norm, f32 and f16, splits
//! under a loop cap, bitwise repeatability; and the strided GEMM it runs on.
//!
//! Tolerance (docs/design.md, "Backward"): every gradient element within `REL` times
//! its magnitude, the sum of the absolute values of its terms through the whole chain
//! (the reference computes it), for f32. For f16, each gradient's largest error within
//! twice that of a plain f16 implementation (every stored intermediate rounded to f16)
//! plus the f32 bound, the forward's rule.

use crate::common;

use half::f16;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, Rng};
use wgpu_attention::kernels::gemm::{encode_gemm, Gemm, Operand};
use wgpu_attention::mha::reference::{
    f16_stored_backward, multi_head_attention_backward, MhaBackwardReference, MhaReferenceGradients,
};
use wgpu_attention::mha::{MhaGradients, PostNorm};
use wgpu_attention::{
    AttentionOptions, CausalAlignment, Context, DType, Error, HeadWeights, Inputs, Layout, MhaConfig, MhaOptions,
    MhaWeights, MultiHeadAttention, Rotary, RotaryStyle, Tensor,
};

/// f32: a sum of a few stages' relative rounding errors (docs/design.md, "Backward").
const REL: f64 = 1e-5;

/// Where keys and values come from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    SelfAttention,
    /// One tensor passed as key and value (its projections packed).
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
    attention: AttentionOptions,
    seed: u64,
}

/// Xavier weights with random (not zero) biases and LayerNorm parameters, so a dropped
/// term cannot go unnoticed.
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

/// Every gradient under one name, as `(name, values)`, the input's summed for
/// self-attention.
fn named(g: &MhaReferenceGradients, self_attention: bool) -> Vec<(String, Vec<f64>)> {
    let mut all = vec![(
        "d_query".to_string(),
        if self_attention {
            g.d_self_input().expect("self-attention")
        } else {
            g.d_query.clone()
        },
    )];
    if !self_attention {
        all.push(("d_key".into(), g.d_key.clone()));
        all.push(("d_value".into(), g.d_value.clone()));
    }
    for (name, p) in [("q", &g.q), ("k", &g.k), ("v", &g.v), ("o", &g.o)] {
        all.push((format!("{name}.weight"), p.weight.clone()));
        if let Some(b) = &p.bias {
            all.push((format!("{name}.bias"), b.clone()));
        }
    }
    if let Some(n) = &g.norm {
        all.push(("norm.weight".into(), n.weight.clone()));
        all.push(("norm.bias".into(), n.bias.clone()));
    }
    all
}

/// The GPU's gradients read back in the order of [`named`].
fn read_back(ctx: &Context, g: &MhaGradients) -> Vec<(String, Vec<f32>)> {
    let read = |t: &Tensor| {
        assert_eq!(t.dtype(), DType::F32, "gradients are f32");
        t.to_f32_vec(ctx).expect("readback")
    };
    let mut all = vec![("d_query".to_string(), read(&g.d_query))];
    if let (Some(k), Some(v)) = (&g.d_key, &g.d_value) {
        all.push(("d_key".into(), read(k)));
        all.push(("d_value".into(), read(v)));
    }
    for (name, p) in [("q", &g.q), ("k", &g.k), ("v", &g.v), ("o", &g.o)] {
        all.push((format!("{name}.weight"), read(&p.weight)));
        if let Some(b) = &p.bias {
            all.push((format!("{name}.bias"), read(b)));
        }
    }
    if let Some(n) = &g.norm {
        all.push(("norm.weight".into(), read(&n.weight)));
        all.push(("norm.bias".into(), read(&n.bias)));
    }
    all
}

/// The case's inputs and output gradient, drawn from its seed in `dtype`.
struct Drawn {
    query: Vec<f32>,
    key: Vec<f32>,
    value: Vec<f32>,
    d_out: Vec<f32>,
}

fn draw(case: &Case, dtype: DType) -> Drawn {
    let c = &case.config;
    let mut rng = Rng::new(case.seed);
    let mut vec = |n: usize| round_to(dtype, &rng.vec(n, -1.0, 1.0));
    let query = vec(case.batch * case.len_q * c.embed_dim);
    let (key, value) = match case.source {
        Source::SelfAttention => (query.clone(), query.clone()),
        Source::SharedKeyValue => {
            let kv = vec(case.batch * case.len_k * c.kdim);
            (kv.clone(), kv)
        }
        Source::Separate => (
            vec(case.batch * case.len_k * c.kdim),
            vec(case.batch * case.len_k * c.vdim),
        ),
    };
    let d_out = vec(case.batch * case.len_q * c.embed_dim);
    Drawn {
        query,
        key,
        value,
        d_out,
    }
}

/// Runs the layer's backward on the GPU and reads every gradient back.
fn gpu_gradients(ctx: &Context, case: &Case, dtype: DType, data: &Drawn) -> Vec<(String, Vec<f32>)> {
    let c = &case.config;
    let weights = random_weights(c, case.seed);
    let layer = MultiHeadAttention::new(ctx, c.clone(), &weights, dtype).expect("layer");
    let seq = |len: usize, width: usize, values: &[f32]| {
        Tensor::sequence(ctx, [case.batch, len, width], dtype, values).expect("upload")
    };
    let q_t = seq(case.len_q, c.embed_dim, &data.query);
    let k_t = seq(case.len_k, c.kdim, &data.key);
    let v_t = seq(case.len_k, c.vdim, &data.value);
    let d_out = seq(case.len_q, c.embed_dim, &data.d_out);
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
    let options = MhaOptions {
        attention: case.attention.clone(),
        weights: HeadWeights::None,
    };
    let grads = layer.backward(ctx, inputs, &d_out, &options).expect("backward");
    read_back(ctx, &grads)
}

/// The reference gradients (and a plain f16 layer's) for the case's data.
fn reference(case: &Case, dtype: DType, data: &Drawn, f16_stored: bool) -> MhaBackwardReference {
    let held = rounded_weights(&random_weights(&case.config, case.seed), dtype);
    let run = if f16_stored {
        f16_stored_backward
    } else {
        multi_head_attention_backward
    };
    run(
        &case.config,
        &held,
        [&data.query, &data.key, &data.value],
        [case.batch, case.len_q, case.len_k],
        &case.attention,
        &data.d_out,
    )
    .expect("reference")
}

/// Largest error relative to the magnitude, over one gradient (where the magnitude is
/// 0 the gradient's terms are all 0, and so must the result be).
fn worst_ratio(got: &[f32], want: &[f64], magnitude: &[f64]) -> (f64, usize) {
    let mut worst = (0.0f64, 0);
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(magnitude).enumerate() {
        if worst.0.is_nan() {
            break;
        }
        let err = (f64::from(g) - w).abs();
        // NaN (a NaN result) ranks above everything.
        let ratio = if err == 0.0 { 0.0 } else { err / m };
        if ratio.is_nan() || ratio > worst.0 {
            worst = (ratio, i);
        }
    }
    worst
}

fn max_abs_error(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, |m, e| if e.is_nan() || m.is_nan() { f64::NAN } else { m.max(e) })
}

/// Checks every gradient of one case on one dtype; returns the largest f32 error
/// relative to its magnitude (for the record).
fn check(ctx: &Context, case: &Case, dtype: DType) -> f64 {
    let data = draw(case, dtype);
    let got = gpu_gradients(ctx, case, dtype, &data);
    let want = reference(case, dtype, &data, false);
    let is_self = case.source == Source::SelfAttention;
    let values = named(&want.gradients, is_self);
    let magnitudes = named(&want.magnitudes, is_self);
    let naive = (dtype == DType::F16).then(|| named(&reference(case, dtype, &data, true).gradients, is_self));
    let names: Vec<&String> = got.iter().map(|(n, _)| n).collect();
    let expected: Vec<&String> = values.iter().map(|(n, _)| n).collect();
    assert_eq!(names, expected, "seed {}: the gradients returned", case.seed);
    let mut worst = 0.0f64;
    for (n, (name, got)) in got.iter().enumerate() {
        let (want, magnitude) = (&values[n].1, &magnitudes[n].1);
        assert_eq!(got.len(), want.len(), "seed {}: {name} length", case.seed);
        assert!(
            got.iter().all(|x| x.is_finite()),
            "seed {}: {name} not finite",
            case.seed
        );
        match &naive {
            None => {
                let (ratio, at) = worst_ratio(got, want, magnitude);
                worst = worst.max(ratio);
                assert!(
                    ratio <= REL,
                    "seed {} {dtype:?}: {name}[{at}] = {} vs {} (magnitude {:.3e}): error {ratio:.3e} of the \
                     magnitude, bound {REL:.0e}\n{case:?}",
                    case.seed,
                    got[at],
                    want[at],
                    magnitude[at]
                );
            }
            Some(naive) => {
                let as_f32: Vec<f32> = naive[n].1.iter().map(|&x| x as f32).collect();
                let largest = magnitude.iter().fold(0.0f64, |m, &x| m.max(x));
                let bound = 2.0 * max_abs_error(&as_f32, want) + REL * largest;
                let err = max_abs_error(got, want);
                assert!(
                    err <= bound,
                    "seed {} f16: {name} max abs error {err:.3e}, bound {bound:.3e} (twice a plain f16 layer's \
                     plus {REL:.0e} of the largest magnitude {largest:.3e})\n{case:?}",
                    case.seed
                );
            }
        }
    }
    worst
}

fn on_both_dtypes(case: Case) {
    let Some(ctx) = common::ctx() else { return };
    let worst = check(ctx, &case, DType::F32);
    eprintln!("seed {}: f32 worst error / magnitude {worst:.2e}", case.seed);
    if ctx.capabilities().f16 {
        check(ctx, &case, DType::F16);
    } else {
        eprintln!("skipping f16: the adapter has no SHADER_F16");
    }
}

#[test]
fn self_attention_with_padding() {
    on_both_dtypes(Case {
        config: MhaConfig::new(32, 4),
        batch: 2,
        len_q: 7,
        len_k: 7,
        source: Source::SelfAttention,
        attention: AttentionOptions {
            key_lengths: Some(vec![7, 4]),
            ..Default::default()
        },
        seed: 71,
    });
}

#[test]
fn grouped_query_self_attention_with_causal_mask_and_post_norm_without_biases() {
    on_both_dtypes(Case {
        config: MhaConfig {
            num_kv_heads: 2,
            bias: false,
            post_norm: Some(PostNorm::default()),
            ..MhaConfig::new(64, 8)
        },
        batch: 2,
        len_q: 13,
        len_k: 13,
        source: Source::SelfAttention,
        attention: AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        },
        seed: 73,
    });
}

#[test]
fn cross_attention_with_other_widths_a_bool_mask_and_post_norm() {
    let mut rng = Rng::new(79);
    on_both_dtypes(Case {
        config: MhaConfig {
            kdim: 12,
            vdim: 20,
            post_norm: Some(PostNorm::default()),
            ..MhaConfig::new(24, 3)
        },
        batch: 2,
        len_q: 5,
        len_k: 9,
        source: Source::Separate,
        attention: AttentionOptions {
            mask: Some(random_bool_mask(&mut rng, [2, 1, 5, 9])),
            ..Default::default()
        },
        seed: 79,
    });
}

#[test]
fn cross_attention_on_one_key_value_tensor_with_gqa_additive_mask_and_causal() {
    let mut rng = Rng::new(83);
    on_both_dtypes(Case {
        config: MhaConfig {
            num_kv_heads: 1,
            ..MhaConfig::new(16, 2)
        },
        batch: 3,
        len_q: 4,
        len_k: 11,
        source: Source::SharedKeyValue,
        attention: AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            mask: Some(random_additive_mask(&mut rng, [1, 2, 4, 11])),
            ..Default::default()
        },
        seed: 83,
    });
}

#[test]
fn rotary_layers_carry_gradients_back_through_the_rotation() {
    // LLaMA-style: NeoX pairs over part of each head, GQA, causal; then GPT-J pairs in
    // cross-attention with more keys than queries (key positions run past the queries').
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
        attention: AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        },
        seed: 87,
    });
    on_both_dtypes(Case {
        config: MhaConfig {
            rotary: Some(Rotary {
                style: RotaryStyle::GptJ,
                theta: 500.0,
                ..Rotary::new(8)
            }),
            ..MhaConfig::new(16, 2)
        },
        batch: 2,
        len_q: 4,
        len_k: 11,
        source: Source::SharedKeyValue,
        attention: AttentionOptions::default(),
        seed: 88,
    });
}

#[test]
fn long_contractions_split_under_a_loop_cap() {
    // A cap of 500 iterations: the weight GEMMs take 320 rows per dispatch and the norm's
    // column pass 499, so 600 rows split into several accumulating dispatches each.
    let Some(mut ctx) = common::own_ctx() else { return };
    ctx.limit_loop_iterations(500);
    let case = Case {
        config: MhaConfig {
            post_norm: Some(PostNorm::default()),
            ..MhaConfig::new(16, 2)
        },
        batch: 2,
        len_q: 300,
        len_k: 300,
        source: Source::SelfAttention,
        attention: AttentionOptions::default(),
        seed: 89,
    };
    let worst = check(&ctx, &case, DType::F32);
    eprintln!("seed {}: f32 worst error / magnitude {worst:.2e}", case.seed);
}

#[test]
fn gradients_repeat_bit_for_bit() {
    let Some(ctx) = common::ctx() else { return };
    let case = Case {
        config: MhaConfig {
            post_norm: Some(PostNorm::default()),
            ..MhaConfig::new(24, 3)
        },
        batch: 2,
        len_q: 6,
        len_k: 6,
        source: Source::SelfAttention,
        attention: AttentionOptions::default(),
        seed: 97,
    };
    let data = draw(&case, DType::F32);
    let first = gpu_gradients(ctx, &case, DType::F32, &data);
    let second = gpu_gradients(ctx, &case, DType::F32, &data);
    for ((name, a), (_, b)) in first.iter().zip(&second) {
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "seed {}: {name} differs between calls", case.seed);
    }
}

#[test]
fn unsupported_options_and_bad_gradients_are_errors() {
    let Some(ctx) = common::ctx() else { return };
    let config = MhaConfig::new(8, 2);
    let layer =
        MultiHeadAttention::new(ctx, config, &random_weights(&MhaConfig::new(8, 2), 101), DType::F32).expect("layer");
    let x = Tensor::sequence(ctx, [1, 3, 8], DType::F32, &Rng::new(101).vec(24, -1.0, 1.0)).expect("upload");
    let d_out = Tensor::sequence(ctx, [1, 3, 8], DType::F32, &Rng::new(102).vec(24, -1.0, 1.0)).expect("upload");
    let run = |d_out: &Tensor, options: &MhaOptions| layer.backward(ctx, Inputs::SelfAttention(&x), d_out, options);
    for options in [
        MhaOptions {
            weights: HeadWeights::PerHead,
            ..Default::default()
        },
        MhaOptions {
            attention: AttentionOptions {
                need_lse: true,
                ..Default::default()
            },
            ..Default::default()
        },
    ] {
        let err = run(&d_out, &options).expect_err("weights have no gradient here");
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    }
    let short = Tensor::sequence(ctx, [1, 2, 8], DType::F32, &Rng::new(103).vec(16, -1.0, 1.0)).expect("upload");
    let err = run(&short, &MhaOptions::default()).expect_err("d_out of the wrong shape");
    assert!(err.to_string().contains("d_out"), "{err}");
    if ctx.capabilities().f16 {
        let half = Tensor::sequence(ctx, [1, 3, 8], DType::F16, &Rng::new(104).vec(24, -1.0, 1.0)).expect("upload");
        let err = run(&half, &MhaOptions::default()).expect_err("d_out of the wrong dtype");
        assert!(err.to_string().contains("d_out"), "{err}");
    }
    // A bad input is the forward's error, before anything is recorded.
    let wide = Tensor::sequence(ctx, [1, 3, 4], DType::F32, &Rng::new(105).vec(12, -1.0, 1.0)).expect("upload");
    assert!(layer
        .backward(ctx, Inputs::SelfAttention(&wide), &d_out, &MhaOptions::default())
        .is_err());
}

#[test]
fn the_strided_gemm_reads_operands_transposed_and_broadcast() {
    // C = Aᵀ-as-stored · B, then += 1ᵀ · B, on a context whose loop cap splits the
    // contraction (100 iterations: 48 per dispatch), against a CPU product.
    let Some(mut ctx) = common::own_ctx() else { return };
    ctx.limit_loop_iterations(100);
    let (m, n, depth) = (70, 67, 150);
    let mut rng = Rng::new(107);
    let a_stored = rng.vec(depth * m, -1.0, 1.0); // [depth, m]: A is its transpose
    let b = rng.vec(depth * n, -1.0, 1.0); // [depth, n]
    let upload = |v: &[f32]| Tensor::from_f32(&ctx, [1, 1, 1, v.len()], Layout::Bhsd, v).expect("upload");
    let (a_t, b_t, one) = (upload(&a_stored), upload(&b), upload(&[1.0]));
    let c = Tensor::empty(&ctx, [1, 1, m, n], Layout::Bhsd, DType::F32).expect("c");
    let colsum = Tensor::from_f32(&ctx, [1, 1, 1, n], Layout::Bhsd, &vec![0.5; n]).expect("c");
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let product = Gemm {
        a: Operand::transposed(a_t.buffer(), m),
        b: Operand::rows(b_t.buffer(), 0, n),
        c: c.buffer(),
        m,
        n,
        depth,
        accumulate: false,
        f32_out: true,
    };
    encode_gemm(&ctx, &mut encoder, DType::F32, &product).expect("gemm");
    let sums = Gemm {
        a: Operand::broadcast(one.buffer()),
        c: colsum.buffer(),
        m: 1,
        accumulate: true,
        ..product
    };
    encode_gemm(&ctx, &mut encoder, DType::F32, &sums).expect("column sums");
    ctx.submit(encoder).expect("submit");
    let got = c.to_f32_vec(&ctx).expect("readback");
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..depth)
                .map(|t| f64::from(a_stored[t * m + i]) * f64::from(b[t * n + j]))
                .sum();
            let magnitude: f64 = (0..depth)
                .map(|t| f64::from(a_stored[t * m + i]).abs() * f64::from(b[t * n + j]).abs())
                .sum();
            let err = (f64::from(got[i * n + j]) - want).abs();
            assert!(
                err <= REL * magnitude,
                "seed 107: C[{i}][{j}] {} vs {want}",
                got[i * n + j]
            );
        }
    }
    let got = colsum.to_f32_vec(&ctx).expect("readback");
    for j in 0..n {
        let want: f64 = 0.5 + (0..depth).map(|t| f64::from(b[t * n + j])).sum::<f64>();
        let magnitude: f64 = 0.5 + (0..depth).map(|t| f64::from(b[t * n + j]).abs()).sum::<f64>();
        assert!(
            (f64::from(got[j]) - want).abs() <= REL * magnitude,
            "seed 107: column sum {j}: {} vs {want}",
            got[j]
        );
    }
    // An operand that reads past its buffer is refused before recording.
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let past = Gemm {
        depth: depth + 1,
        ..product
    };
    assert!(matches!(
        encode_gemm(&ctx, &mut encoder, DType::F32, &past),
        Err(Error::Invalid { .. })
    ));
}

/// The gradients PyTorch's autograd computed for the fixture layers
/// (`tests/fixtures/torch_mha/make_fixture.py`: `loss = Σ out · dOut`, dOut seeded),
/// against the GPU's and the f64 reference's. PyTorch computed in f32, so it is within
/// `REL` of the magnitude like the GPU: the GPU within twice that of PyTorch, the f64
/// reference within once.
mod torch_fixture {
    use super::*;
    use common::torch_fixture as fixture;
    use wgpu_attention::mha::{load_safetensors, LoadedMha};
    use wgpu_attention::{key_mask_from_tokens, Mask};

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

    /// One fixture case: its layer, inputs (one file for self-attention), options, and
    /// each PyTorch gradient file with the crate's gradients it holds, concatenated
    /// (PyTorch packs the in-projection's weights or biases).
    struct Fixture<'a> {
        case: &'a str,
        loaded: LoadedMha,
        inputs: &'a [&'a str],
        attention: AttentionOptions,
        expected: &'a [(&'a str, &'a [&'a str])],
    }

    fn check(f: Fixture) {
        let Some(ctx) = common::ctx() else { return };
        let c = &f.loaded.config;
        let read = |name: &str| npy::<f32>(&format!("{}_{name}.npy", f.case));
        let ((query, q_shape), (d_out, _)) = (read(f.inputs[0]), read("d_out"));
        let (key, k_shape) = read(f.inputs.get(1).unwrap_or(&f.inputs[0]));
        let (value, v_shape) = read(f.inputs.get(2).unwrap_or(&f.inputs[0]));
        let is_self = f.inputs.len() == 1;

        let layer = MultiHeadAttention::new(ctx, c.clone(), &f.loaded.weights, DType::F32).expect("layer");
        let seq =
            |data: &[f32], s: &[usize]| Tensor::sequence(ctx, [s[0], s[1], s[2]], DType::F32, data).expect("upload");
        let (q_t, k_t, v_t, d_t) = (
            seq(&query, &q_shape),
            seq(&key, &k_shape),
            seq(&value, &v_shape),
            seq(&d_out, &q_shape),
        );
        let inputs = if is_self {
            Inputs::SelfAttention(&q_t)
        } else {
            Inputs::Cross {
                query: &q_t,
                key: &k_t,
                value: &v_t,
            }
        };
        let options = MhaOptions {
            attention: f.attention.clone(),
            weights: HeadWeights::None,
        };
        let gpu = read_back(ctx, &layer.backward(ctx, inputs, &d_t, &options).expect("backward"));
        let want = multi_head_attention_backward(
            c,
            &f.loaded.weights,
            [&query, &key, &value],
            [q_shape[0], q_shape[1], k_shape[1]],
            &f.attention,
            &d_out,
        )
        .expect("reference");
        let values = named(&want.gradients, is_self);
        let magnitudes = named(&want.magnitudes, is_self);
        let joined = |from: &[(String, Vec<f64>)], parts: &[&str]| -> Vec<f64> {
            parts
                .iter()
                .flat_map(|p| {
                    from.iter()
                        .find(|(n, _)| n == p)
                        .unwrap_or_else(|| panic!("{p}"))
                        .1
                        .clone()
                })
                .collect()
        };
        let gpu_joined = |parts: &[&str]| -> Vec<f32> {
            parts
                .iter()
                .flat_map(|p| {
                    gpu.iter()
                        .find(|(n, _)| n == p)
                        .unwrap_or_else(|| panic!("{p}"))
                        .1
                        .clone()
                })
                .collect()
        };
        let mut worst = [0.0f64; 2];
        for &(file, parts) in f.expected {
            let (torch, _) = read(&format!("grad_{file}"));
            let torch64: Vec<f64> = torch.iter().map(|&x| f64::from(x)).collect();
            let magnitude = joined(&magnitudes, parts);
            let reference: Vec<f32> = joined(&values, parts).iter().map(|&x| x as f32).collect();
            let ours = gpu_joined(parts);
            assert_eq!(ours.len(), torch.len(), "{}: grad_{file} length", f.case);
            for (n, (what, got, rel)) in [("GPU", &ours, 2.0 * REL), ("f64 reference", &reference, REL)]
                .into_iter()
                .enumerate()
            {
                let (ratio, at) = worst_ratio(got, &torch64, &magnitude);
                worst[n] = worst[n].max(ratio);
                assert!(
                    ratio <= rel,
                    "{} grad_{file}[{at}]: {what} {} vs PyTorch {} (magnitude {:.3e}): {ratio:.3e} of the \
                     magnitude, bound {rel:.0e}",
                    f.case,
                    got[at],
                    torch[at],
                    magnitude[at]
                );
            }
        }
        eprintln!(
            "{}: worst error / magnitude vs PyTorch: GPU {:.2e}, f64 reference {:.2e}",
            f.case, worst[0], worst[1]
        );
    }

    #[test]
    fn self_attention_gradients_match_pytorch() {
        let (tokens, shape) = npy::<i64>("self_tokens.npy");
        check(Fixture {
            case: "self",
            loaded: load("self.safetensors", 4, ""),
            inputs: &["query"],
            attention: AttentionOptions {
                mask: Some(key_mask_from_tokens(&tokens, shape[0], 0).expect("mask")),
                ..Default::default()
            },
            expected: &[
                ("query", &["d_query"]),
                ("in_proj_weight", &["q.weight", "k.weight", "v.weight"]),
                ("in_proj_bias", &["q.bias", "k.bias", "v.bias"]),
                ("out_proj.weight", &["o.weight"]),
                ("out_proj.bias", &["o.bias"]),
            ],
        });
    }

    #[test]
    fn cross_attention_gradients_match_pytorch() {
        let (allow, shape) = npy::<bool>("cross_mask.npy");
        check(Fixture {
            case: "cross",
            loaded: load("cross.safetensors", 2, ""),
            inputs: &["query", "key", "value"],
            attention: AttentionOptions {
                mask: Some(Mask::boolean(&[1, 1, shape[0], shape[1]], allow).expect("mask")),
                ..Default::default()
            },
            expected: &[
                ("query", &["d_query"]),
                ("key", &["d_key"]),
                ("value", &["d_value"]),
                ("q_proj_weight", &["q.weight"]),
                ("k_proj_weight", &["k.weight"]),
                ("v_proj_weight", &["v.weight"]),
                ("in_proj_bias", &["q.bias", "k.bias", "v.bias"]),
                ("out_proj.weight", &["o.weight"]),
                ("out_proj.bias", &["o.bias"]),
            ],
        });
    }

    #[test]
    fn post_norm_gradients_match_pytorch() {
        let mut loaded = load("postnorm.safetensors", 3, "encoder.layers.0.");
        loaded.config.post_norm = Some(PostNorm { eps: 1e-5 });
        check(Fixture {
            case: "postnorm",
            loaded,
            inputs: &["query"],
            attention: AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                ..Default::default()
            },
            expected: &[
                ("query", &["d_query"]),
                ("q_proj.weight", &["q.weight"]),
                ("q_proj.bias", &["q.bias"]),
                ("k_proj.weight", &["k.weight"]),
                ("k_proj.bias", &["k.bias"]),
                ("v_proj.weight", &["v.weight"]),
                ("v_proj.bias", &["v.bias"]),
                ("o_proj.weight", &["o.weight"]),
                ("o_proj.bias", &["o.bias"]),
                ("norm.weight", &["norm.weight"]),
                ("norm.bias", &["norm.bias"]),
            ],
        });
    }

    #[test]
    fn grouped_query_gradients_match_pytorch() {
        let (lengths, _) = npy::<i64>("gqa_key_lengths.npy");
        check(Fixture {
            case: "gqa",
            loaded: load("gqa.safetensors", 4, ""),
            inputs: &["query"],
            attention: AttentionOptions {
                key_lengths: Some(lengths.iter().map(|&l| l as u32).collect()),
                ..Default::default()
            },
            expected: &[
                ("query", &["d_query"]),
                ("q_proj.weight", &["q.weight"]),
                ("k_proj.weight", &["k.weight"]),
                ("v_proj.weight", &["v.weight"]),
                ("o_proj.weight", &["o.weight"]),
            ],
        });
    }
}
