//! The backward pass (issue 39) against the f64 reference gradients: random shapes and
//! every option with a gradient meaning, GQA, both layouts, f32 and f16, long ranges
//! split under a loop cap, and bitwise repeatability.

mod common;

use half::f16;
use wgpu_attention::check::{random_additive_mask, random_bool_mask, Rng};
use wgpu_attention::reference::{attention_backward, ReferenceGradients};
use wgpu_attention::{
    relayout, sdpa, sdpa_backward, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Layout, Tensor,
    Window,
};

/// Inputs drawn from [-1, 1) (rounded to f16 for f16 runs, so the reference sees what
/// the GPU sees), BHSD.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

fn draw(rng: &mut Rng, s: &AttentionShape, dtype: DType) -> Inputs {
    let mut make = |n: usize| {
        let x = rng.vec(n, -1.0, 1.0);
        match dtype {
            DType::F32 => x,
            DType::F16 => x.into_iter().map(|x| f16::from_f32(x).to_f32()).collect(),
        }
    };
    Inputs {
        q: make(s.batch * s.heads_q * s.len_q * s.head_dim),
        k: make(s.batch * s.heads_kv * s.len_k * s.head_dim),
        v: make(s.batch * s.heads_kv * s.len_k * s.head_dim_v),
        d_out: make(s.batch * s.heads_q * s.len_q * s.head_dim_v),
    }
}

/// The GPU gradients (BHSD f32) for inputs in `layout`.
fn gpu_gradients(
    ctx: &Context,
    s: &AttentionShape,
    x: &Inputs,
    options: &AttentionOptions,
    dtype: DType,
    layout: Layout,
) -> [Vec<f32>; 3] {
    let upload = |data: &[f32], shape: [usize; 4]| {
        Tensor::from_f32_as(ctx, shape, layout, dtype, &relayout(data, shape, Layout::Bhsd, layout)).expect("upload")
    };
    let [qs, ks, vs, os] = [
        [s.batch, s.heads_q, s.len_q, s.head_dim],
        [s.batch, s.heads_kv, s.len_k, s.head_dim],
        [s.batch, s.heads_kv, s.len_k, s.head_dim_v],
        s.out_shape(),
    ];
    let (q, k, v, d_out) = (
        upload(&x.q, qs),
        upload(&x.k, ks),
        upload(&x.v, vs),
        upload(&x.d_out, os),
    );
    let forward = sdpa(
        ctx,
        &q,
        &k,
        &v,
        &AttentionOptions {
            need_lse: true,
            ..options.clone()
        },
    )
    .expect("forward");
    let lse = forward.lse.expect("lse");
    let g = sdpa_backward(ctx, &q, &k, &v, &forward.out, &lse, &d_out, options).expect("backward");
    let back = |t: &Tensor, shape: [usize; 4]| relayout(&t.to_f32_vec(ctx).expect("read"), shape, layout, Layout::Bhsd);
    [back(&g.dq, qs), back(&g.dk, ks), back(&g.dv, vs)]
}

/// Largest |x|.
fn max_abs(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())))
}

/// The magnitudes each gradient's rounding errors scale with (docs/design.md,
/// "Backward"): the terms before they cancel. With A = Dv·max|dO|·max|v| (a bound on
/// |dP| and on |D|) and P's column sums c_j = Σ_i P_ij over the query rows and heads
/// that see key j: dQ ~ scale·max|k|·2A, dK ~ scale·max|q|·2A·max c, dV ~ max|dO|·max c.
fn magnitudes(x: &Inputs, s: &AttentionShape, options: &AttentionOptions) -> [f64; 3] {
    let forward = wgpu_attention::reference::attention(&x.q, &x.k, &x.v, s, options).expect("forward");
    let group = s.heads_q / s.heads_kv;
    let mut column = vec![0.0f64; s.batch * s.heads_kv * s.len_k];
    for (at, p) in forward.weights.iter().enumerate() {
        let j = at % s.len_k;
        let h = at / (s.len_q * s.len_k) % s.heads_q;
        let b = at / (s.heads_q * s.len_q * s.len_k);
        column[(b * s.heads_kv + h / group) * s.len_k + j] += p;
    }
    let c = column.iter().fold(0.0f64, |m, &v| m.max(v));
    let a = s.head_dim_v as f64 * max_abs(&x.d_out) * max_abs(&x.v);
    let scale = f64::from(s.scale(options));
    [
        scale * max_abs(&x.k) * 2.0 * a,
        scale * max_abs(&x.q) * 2.0 * a * c,
        max_abs(&x.d_out) * c,
    ]
}

/// Every gradient within `rel` times its magnitude.
fn assert_close(got: &[Vec<f32>; 3], want: &ReferenceGradients, magnitude: [f64; 3], dtype: DType, what: &str) {
    let rel = match dtype {
        DType::F32 => 1e-6,
        DType::F16 => 2e-3,
    };
    for (n, (name, g, w)) in [
        ("dq", &got[0], &want.dq),
        ("dk", &got[1], &want.dk),
        ("dv", &got[2], &want.dv),
    ]
    .into_iter()
    .enumerate()
    {
        let (mut worst, mut at) = (0.0f64, 0);
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(a.is_finite(), "{what} {name}[{i}] = {a}");
            let e = (f64::from(*a) - b).abs();
            if e > worst {
                (worst, at) = (e, i);
            }
        }
        let bound = rel * magnitude[n].max(1e-30);
        eprintln!("{name}: error / magnitude {:.3e}", worst / magnitude[n].max(1e-30));
        assert!(
            worst <= bound,
            "{what} {name}: max abs error {worst:.3e} at {at} (got {}, want {}), bound {bound:.3e}",
            g[at],
            w[at],
        );
    }
}

fn run_case(ctx: &Context, s: AttentionShape, options: AttentionOptions, dtype: DType, layout: Layout, seed: u64) {
    let mut rng = Rng::new(seed);
    let x = draw(&mut rng, &s, dtype);
    let want = attention_backward(&x.q, &x.k, &x.v, &x.d_out, &s, &options).expect("reference");
    let got = gpu_gradients(ctx, &s, &x, &options, dtype, layout);
    let magnitude = magnitudes(&x, &s, &options);
    assert_close(
        &got,
        &want,
        magnitude,
        dtype,
        &format!("seed {seed} {s:?} {dtype:?} {layout:?} {options:?}"),
    );
}

#[test]
fn gradients_match_the_reference_across_shapes_options_and_dtypes() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(390);
    let shapes = [
        AttentionShape::new(1, 2, 2, 9, 13, 8, 8),
        AttentionShape::new(2, 4, 2, 17, 6, 12, 20),
        AttentionShape::new(1, 3, 1, 1, 33, 64, 32),
        AttentionShape::new(1, 1, 1, 40, 1, 5, 3),
    ];
    let mut seed = 3900;
    for s in shapes {
        for variant in 0..6 {
            seed += 1;
            let [b, hq, lq, lk] = [s.batch, s.heads_q, s.len_q, s.len_k];
            let options = match variant {
                0 => AttentionOptions::default(),
                1 => AttentionOptions {
                    causal: Some(if seed % 2 == 0 {
                        CausalAlignment::TopLeft
                    } else {
                        CausalAlignment::BottomRight
                    }),
                    key_lengths: Some((0..b).map(|i| (lk - i.min(lk - 1)) as u32).collect()),
                    ..Default::default()
                },
                2 => AttentionOptions {
                    mask: Some(random_bool_mask(&mut rng, [b, 1, lq, lk])),
                    scale: Some(0.3),
                    ..Default::default()
                },
                3 => AttentionOptions {
                    mask: Some(random_additive_mask(&mut rng, [1, hq, 1, lk])),
                    softcap: Some(1.5),
                    ..Default::default()
                },
                4 => AttentionOptions {
                    window: Some(Window {
                        left: Some(3),
                        right: Some(1),
                    }),
                    alibi_slopes: Some((0..hq).map(|h| 0.5 / (h + 1) as f32).collect()),
                    ..Default::default()
                },
                _ => AttentionOptions {
                    // Key length 0 for the first batch element: rows with no visible
                    // key get zero gradients.
                    key_lengths: Some((0..b).map(|i| if i == 0 { 0 } else { lk as u32 }).collect()),
                    ..Default::default()
                },
            };
            let dtype = if seed % 3 == 0 { DType::F16 } else { DType::F32 };
            let layout = if seed % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            run_case(ctx, s, options, dtype, layout, seed);
        }
    }
}

#[test]
fn long_ranges_split_under_a_loop_cap_give_the_same_gradients() {
    // Both walks split into several dispatches that add to the previous sums.
    let Some(ctx) = common::capped_ctx() else { return };
    let s = AttentionShape::new(1, 4, 2, 300, 280, 64, 64);
    run_case(
        ctx,
        s,
        AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            ..Default::default()
        },
        DType::F32,
        Layout::Bhsd,
        3990,
    );
}

#[test]
fn gradients_repeat_bit_for_bit() {
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 4, 2, 50, 70, 32, 32);
    let x = draw(&mut Rng::new(3991), &s, DType::F32);
    let options = AttentionOptions {
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    let first = gpu_gradients(ctx, &s, &x, &options, DType::F32, Layout::Bhsd);
    for _ in 0..3 {
        let again = gpu_gradients(ctx, &s, &x, &options, DType::F32, Layout::Bhsd);
        for (a, b) in first.iter().zip(&again) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}
