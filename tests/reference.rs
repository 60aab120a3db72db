//! The CPU reference on hand-computed cases, and the token-id helpers. No GPU needed.

use wgpu_attention::reference::attention;
use wgpu_attention::{
    key_lengths_from_tokens, key_mask_from_tokens, AttentionOptions, AttentionShape, CausalAlignment, Mask, Window,
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

/// Equal scores (q = k constant) so each row's visible keys share its weight equally:
/// the weights show exactly which keys a window lets through.
fn uniform_weights(len_q: usize, len_k: usize, options: &AttentionOptions) -> Vec<f64> {
    let q = vec![0.5f32; len_q];
    let k = vec![0.5f32; len_k];
    let v: Vec<f32> = (0..len_k).map(|j| j as f32).collect();
    let s = AttentionShape::new(1, 1, 1, len_q, len_k, 1, 1);
    attention(&q, &k, &v, &s, options).expect("valid problem").weights
}

fn assert_rows(weights: &[f64], visible: &[&[usize]], len_k: usize) {
    for (i, keys) in visible.iter().enumerate() {
        let want: Vec<f64> = (0..len_k)
            .map(|j| {
                if keys.contains(&j) {
                    1.0 / keys.len() as f64
                } else {
                    0.0
                }
            })
            .collect();
        let got = &weights[i * len_k..][..len_k];
        assert!(
            got.iter().zip(&want).all(|(g, w)| close(*g, *w)),
            "row {i}: {got:?}, want {want:?}"
        );
    }
}

#[test]
fn sliding_window_with_and_without_causal() {
    // Lq = 2, Lk = 5, no causal: p(i) = i + 3 (bottom-right), so window (1, 1) shows row
    // 0 (p = 3) keys 2..=4 and row 1 (p = 4) keys 3..=4 (5 does not exist).
    let window = Some(Window {
        left: Some(1),
        right: Some(1),
    });
    let options = AttentionOptions {
        window,
        ..Default::default()
    };
    assert_rows(&uniform_weights(2, 5, &options), &[&[2, 3, 4], &[3, 4]], 5);
    // Top-left causal moves p(i) to i and cuts the right side at p(i): row 0 sees key
    // 0 only, row 1 keys 0..=1.
    let options = AttentionOptions {
        window,
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    assert_rows(&uniform_weights(2, 5, &options), &[&[0], &[0, 1]], 5);
    // Left edge only (Mistral's window of 2 keys back, with causal bottom-right).
    let options = AttentionOptions {
        window: Some(Window {
            left: Some(2),
            right: None,
        }),
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    assert_rows(
        &uniform_weights(3, 6, &options),
        &[&[1, 2, 3], &[2, 3, 4], &[3, 4, 5]],
        6,
    );
}

#[test]
fn alibi_adds_minus_slope_times_distance() {
    // One query (p(0) = Lk - 1 = 2) against three keys with equal raw scores; slope ln 2
    // gives biases -2 ln 2, -ln 2, 0: weights proportional to 1/4, 1/2, 1.
    let slope = std::f32::consts::LN_2;
    let options = AttentionOptions {
        alibi_slopes: Some(vec![slope]),
        ..Default::default()
    };
    let w = uniform_weights(1, 3, &options);
    // The slope is an f32, as on the GPU.
    let e = |d: f64| (-f64::from(slope) * d).exp();
    let total = e(2.0) + e(1.0) + e(0.0);
    let want = [e(2.0) / total, e(1.0) / total, e(0.0) / total];
    assert!((want[0] - 1.0 / 7.0).abs() < 1e-6);
    for (g, x) in w.iter().zip(want) {
        assert!(close(*g, x), "{w:?} vs {want:?}");
    }
    // A wrong slope count is refused.
    let options = AttentionOptions {
        alibi_slopes: Some(vec![slope, slope]),
        ..Default::default()
    };
    let s = AttentionShape::new(1, 1, 1, 1, 3, 1, 1);
    assert!(attention(&[1.0f32], &[1.0f32; 3], &[1.0f32; 3], &s, &options).is_err());
}

#[test]
fn softcap_comes_before_the_additive_mask() {
    // Raw scores 3 and 0 (scale 1); cap 1 squashes 3 to tanh(3); the additive 2 on key 1
    // is added after the cap (capping it too would give tanh(2)).
    let s = AttentionShape::new(1, 1, 1, 1, 2, 1, 1);
    let options = AttentionOptions {
        scale: Some(1.0),
        softcap: Some(1.0),
        mask: Some(Mask::additive(&[2], vec![0.0, 2.0]).expect("mask")),
        ..Default::default()
    };
    let r = attention(&[3.0f32], &[1.0f32, 0.0], &[1.0f32, 0.0], &s, &options).expect("valid problem");
    let (s0, s1) = (3f64.tanh(), 2.0);
    let w0 = 1.0 / (1.0 + (s1 - s0).exp());
    assert!(close(r.weights[0], w0), "{:?} vs {w0}", r.weights);
    assert!(close(r.lse[0], (s0.exp() + s1.exp()).ln()));
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let options = AttentionOptions {
            softcap: Some(bad),
            ..Default::default()
        };
        assert!(
            attention(&[3.0f32], &[1.0f32, 0.0], &[1.0f32, 0.0], &s, &options).is_err(),
            "cap {bad}"
        );
    }
}

#[test]
fn window_parses_as_flash_attn_spells_it() {
    assert_eq!(
        Window::parse("--window", "1024,0").expect("valid"),
        Window {
            left: Some(1024),
            right: Some(0)
        }
    );
    assert_eq!(
        Window::parse("--window", "-1, 3").expect("valid"),
        Window {
            left: None,
            right: Some(3)
        }
    );
    for bad in ["", "5", "1,2,3", "a,1", "1.5,2"] {
        assert!(Window::parse("--window", bad).is_err(), "{bad:?}");
    }
}

#[test]
fn windows_and_alibi_refuse_positions_past_i32() {
    let s = AttentionShape::new(1, 1, 1, 1 << 29, (1 << 29) + 1, 1, 1);
    let window = AttentionOptions {
        window: Some(Window {
            left: Some(4),
            right: None,
        }),
        ..Default::default()
    };
    let err = s.check_options(&window).expect_err("Lq + Lk > 2^30");
    assert!(err.to_string().contains("window or ALiBi"), "{err}");
    let alibi = AttentionOptions {
        alibi_slopes: Some(vec![0.5]),
        ..Default::default()
    };
    assert!(s.check_options(&alibi).is_err());
    assert!(s.check_options(&AttentionOptions::default()).is_ok());
}

#[test]
fn positions_aligned_to_each_key_length() {
    // Two batch elements holding 3 and 5 keys of Lk = 5; Lq = 2, causal bottom-right
    // measured from each length: element 0's rows sit at 1 and 2, element 1's at 3, 4.
    let s = AttentionShape::new(2, 1, 1, 2, 5, 1, 1);
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        key_lengths: Some(vec![3, 5]),
        align_to_key_lengths: true,
        ..Default::default()
    };
    let r = attention(&[0.5f32; 4], &[0.5f32; 10], &[1.0f32; 10], &s, &options).expect("valid problem");
    assert_rows(&r.weights[..10], &[&[0, 1], &[0, 1, 2]], 5);
    assert_rows(&r.weights[10..], &[&[0, 1, 2, 3], &[0, 1, 2, 3, 4]], 5);
    // Without key lengths there is nothing to align to.
    let options = AttentionOptions {
        align_to_key_lengths: true,
        ..Default::default()
    };
    assert!(attention(&[0.5f32; 4], &[0.5f32; 10], &[1.0f32; 10], &s, &options).is_err());
}
