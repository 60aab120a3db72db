//! The CPU reference on hand-computed cases, and the token-id helpers. No GPU needed.

use wgpu_attention::reference::attention;
use wgpu_attention::{
    key_lengths_from_tokens, key_mask_from_tokens, AttentionOptions, AttentionShape, CausalAlignment, Mask,
};

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-12 * want.abs().max(1.0)
}

/// Seed 001's worked example, computed correctly: softmax([1/sqrt 2, 0]) is
/// [sigmoid(1/sqrt 2), 1 - sigmoid(1/sqrt 2)] = [0.6698, 0.3302], not [1, 0].
#[test]
fn seed_001_two_by_two_example() {
    let q = [1.0, 0.0, 0.0, 1.0];
    let v = [23.1f32, 24.3, 22.8, 23.5];
    let s = AttentionShape::new(1, 1, 1, 2, 2, 2, 2);
    let r = attention(&q, &q, &v, &s, &AttentionOptions::default()).expect("valid problem");
    // The scale is an f32 (as on the GPU), so the expectation uses the same rounded value.
    let scale = f64::from(1.0 / 2f32.sqrt());
    let w = 1.0 / (1.0 + (-scale).exp());
    assert!((w - 0.669_761).abs() < 1e-6);
    let want_weights = [w, 1.0 - w, 1.0 - w, w];
    for (g, e) in r.weights.iter().zip(want_weights) {
        assert!(close(*g, e), "weights {:?} vs {want_weights:?}", r.weights);
    }
    let v64: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    let want_out = [
        w * v64[0] + (1.0 - w) * v64[2],
        w * v64[1] + (1.0 - w) * v64[3],
        (1.0 - w) * v64[0] + w * v64[2],
        (1.0 - w) * v64[1] + w * v64[3],
    ];
    for (g, e) in r.out.iter().zip(want_out) {
        assert!(close(*g, e), "out {:?} vs {want_out:?}", r.out);
    }
    // The seed's claimed output equals V itself; the correct one does not.
    assert!((r.out[0] - 23.1).abs() > 0.05);
    // lse = log(e^{1/sqrt 2} + e^0)
    assert!(close(r.lse[0], (scale.exp() + 1.0).ln()));
}

#[test]
fn causal_three_by_three_top_left() {
    // Q = K = 0 row-wise scores are all equal, so visible keys share weight equally.
    let q = [0.5f32; 3 * 2];
    let v = [1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0];
    let s = AttentionShape::new(1, 1, 1, 3, 3, 2, 2);
    let options = AttentionOptions {
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    let r = attention(&q, &q, &v, &s, &options).expect("valid problem");
    let third = 1.0 / 3.0;
    let want_w = [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, third, third, third];
    for (g, e) in r.weights.iter().zip(want_w) {
        assert!(close(*g, e), "weights {:?}", r.weights);
    }
    let want_out = [1.0, 10.0, 1.5, 15.0, 2.0, 20.0];
    for (g, e) in r.out.iter().zip(want_out) {
        assert!((g - e).abs() < 1e-12, "out {:?}", r.out);
    }
}

#[test]
fn bottom_right_alignment_and_fully_masked_rows() {
    // Lq = 3 > Lk = 2, bottom-right: query i sees j <= i - 1, so query 0 sees nothing.
    let q = [0.1f32, 0.2, 0.3];
    let k = [0.4f32, 0.5];
    let v = [7.0f32, 9.0];
    let s = AttentionShape::new(1, 1, 1, 3, 2, 1, 1);
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    let r = attention(&q, &k, &v, &s, &options).expect("valid problem");
    assert_eq!(r.out[0], 0.0, "fully masked row gives zeros");
    assert_eq!(&r.weights[0..2], &[0.0, 0.0]);
    assert_eq!(r.lse[0], f64::NEG_INFINITY);
    assert!(
        close(r.weights[2], 1.0) && r.weights[3] == 0.0,
        "query 1 sees key 0 only"
    );
    assert!(close(r.out[1], 7.0));
    assert!((r.weights[4] + r.weights[5] - 1.0).abs() < 1e-12 && r.weights[5] > 0.0);
}

#[test]
fn masks_compose_and_additive_bias_is_added() {
    let q = [1.0f32, 1.0];
    let k = [1.0f32, 1.0, 1.0];
    let v = [1.0f32, 2.0, 3.0];
    let s = AttentionShape::new(1, 1, 1, 2, 3, 1, 1);
    let mask = Mask::additive(&[3], vec![0.0, 2f32.ln(), f32::NEG_INFINITY]).expect("valid mask");
    let options = AttentionOptions {
        scale: Some(1.0),
        mask: Some(mask),
        key_lengths: Some(vec![3]),
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    let r = attention(&q, &k, &v, &s, &options).expect("valid problem");
    // Row 0: causal leaves key 0 only. Row 1: keys 0 and 1 with weights 1:2 (bias ln 2,
    // rounded to f32 as the mask stores it).
    let two = f64::from(2f32.ln()).exp();
    assert!(close(r.weights[0], 1.0));
    let (w0, w1) = (1.0 / (1.0 + two), two / (1.0 + two));
    assert!(close(r.weights[3], w0) && close(r.weights[4], w1) && r.weights[5] == 0.0);
    assert!(close(r.out[1], w0 + 2.0 * w1));
}

#[test]
fn gqa_query_heads_share_kv_heads_in_groups() {
    // 4 query heads, 2 kv heads: heads 0,1 use kv 0 and heads 2,3 use kv 1.
    let q = [1.0f32; 4];
    let k = [1.0f32; 2];
    let v = [5.0f32, -5.0];
    let s = AttentionShape::new(1, 4, 2, 1, 1, 1, 1);
    let r = attention(&q, &k, &v, &s, &AttentionOptions::default()).expect("valid problem");
    assert_eq!(r.out, vec![5.0, 5.0, -5.0, -5.0]);
}

#[test]
fn token_helpers_follow_seed_003() {
    let tokens = [5, 2, 1, 0, 0, 1, 3, 1, 4, 0];
    assert_eq!(
        key_lengths_from_tokens(&tokens, 2, 0).expect("trailing padding"),
        vec![3, 4]
    );
    let mask = key_mask_from_tokens(&tokens, 2, 0).expect("valid tokens");
    assert_eq!(mask.shape(), [2, 1, 1, 5]);
    assert_eq!(mask.bias_at(0, 0, 0, 2), Some(0.0));
    assert_eq!(mask.bias_at(0, 0, 4, 3), None);
    assert_eq!(mask.bias_at(1, 3, 0, 3), Some(0.0));
    assert_eq!(mask.bias_at(1, 3, 0, 4), None);
    let interior = [5, 0, 1];
    let err = key_lengths_from_tokens(&interior, 1, 0).expect_err("interior padding is not a length");
    assert!(err.to_string().contains("key mask"), "{err}");
    assert!(
        key_lengths_from_tokens(&tokens, 3, 0).is_err(),
        "10 tokens do not split into 3 rows"
    );
}
