//! Rotary embeddings (issue 41 item 4a): the kernel against the f64 rotation and
//! against the Hugging Face formula (`rotate_half` with cos and sin computed in f32, as
//! transformers' LLaMA does), both pairings, rotary dim below the head dim, positions
//! that differ per batch element, both layouts, f16, bad inputs refused.

use crate::common;

use half::f16;
use wgpu_attention::check::Rng;
use wgpu_attention::{apply_rotary, relayout, DType, Error, Layout, Rotary, RotaryStyle, Tensor};

/// Positions `start_b + s` with a different start per batch element.
fn positions(rng: &mut Rng, batch: usize, len: usize, most: usize) -> Vec<u32> {
    (0..batch)
        .flat_map(|_| {
            let start = rng.below(most);
            (0..len).map(move |s| (start + s) as u32)
        })
        .collect()
}

/// Hugging Face's LLaMA rotation of one row (NeoX pairing) in f32:
/// `inv_freq = 1 / theta^(2i/dim)`, `freqs = (position / scaling) · inv_freq`,
/// `x · cos + rotate_half(x) · sin`.
fn hugging_face_row(x: &[f32], position: u32, r: &Rotary) -> Vec<f32> {
    let half = r.dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / (r.theta as f32).powf((2 * i) as f32 / r.dim as f32))
        .collect();
    let t = position as f32 / r.scaling as f32;
    let mut out = x.to_vec();
    for d in 0..r.dim {
        let f = t * inv_freq[d % half];
        let rotated_half = if d < half { -x[d + half] } else { x[d - half] };
        out[d] = x[d] * f.cos() + rotated_half * f.sin();
    }
    out
}

#[test]
fn rotations_match_the_f64_rotation_and_hugging_faces_formula() {
    let Some(ctx) = common::ctx() else { return };
    let mut seed = 4140;
    for (shape, dim, style, layout, scaling) in [
        ([2, 3, 17, 64], 64, RotaryStyle::NeoX, Layout::Bhsd, 1.0),
        ([3, 2, 9, 40], 24, RotaryStyle::NeoX, Layout::Bshd, 4.0),
        ([1, 4, 33, 32], 32, RotaryStyle::GptJ, Layout::Bhsd, 1.0),
        ([2, 1, 5, 10], 6, RotaryStyle::GptJ, Layout::Bshd, 2.0),
    ] {
        seed += 1;
        let mut rng = Rng::new(seed);
        let [b, h, s, d] = shape;
        let x = rng.vec(b * h * s * d, -1.0, 1.0);
        let pos = positions(&mut rng, b, s, 5000);
        let rotary = Rotary {
            theta: 10000.0,
            dim,
            style,
            scaling,
        };
        let xt = Tensor::from_f32(ctx, shape, layout, &relayout(&x, shape, Layout::Bhsd, layout)).expect("upload");
        let yt = apply_rotary(ctx, &xt, &pos, &rotary).expect("rotary");
        assert_eq!((yt.shape(), yt.layout(), yt.dtype()), (shape, layout, DType::F32));
        let y = relayout(&yt.to_f32_vec(ctx).expect("read"), shape, layout, Layout::Bhsd);
        let eps = f64::from(f32::EPSILON);
        // cos and sin rounded to f32, two products and a sum: under 4 epsilons of the
        // pair's magnitude (at most 2).
        let bound = 8.0 * eps;
        // HF's angle is t · inv_freq in f32: off by about 3 epsilons of the angle, which
        // moves the result by that times the pair's magnitude.
        let max_angle = f64::from(*pos.iter().max().expect("positions")) / scaling;
        let hf_bound = bound + 2.0 * 4.0 * eps * max_angle;
        for (row, chunk) in x.chunks(d).enumerate() {
            let (bi, si) = (row / (h * s), row % s);
            let position = pos[bi * s + si];
            let want = rotary.rotate_row(chunk, position);
            let got = &y[row * d..(row + 1) * d];
            for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= bound,
                    "seed {seed} {style:?} row {row} element {e}: {g} vs {w}"
                );
            }
            if style == RotaryStyle::NeoX {
                let hf = hugging_face_row(chunk, position, &rotary);
                for (e, (g, w)) in got.iter().zip(&hf).enumerate() {
                    assert!(
                        f64::from((g - w).abs()) <= hf_bound,
                        "seed {seed} row {row} element {e}: {g} vs Hugging Face's {w}"
                    );
                }
            }
            // Elements past the rotary dim pass unchanged.
            assert_eq!(&got[dim..], &chunk[dim..], "seed {seed} row {row}");
        }
    }
}

#[test]
fn f16_rotations_round_once() {
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "f16", false);
        return;
    }
    let mut rng = Rng::new(4149);
    let shape = [2, 2, 11, 16];
    let x: Vec<f16> = rng
        .vec(2 * 2 * 11 * 16, -1.0, 1.0)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let pos = positions(&mut rng, 2, 11, 300);
    let rotary = Rotary::new(16);
    let xt = Tensor::from_f16(ctx, shape, Layout::Bhsd, &x).expect("upload");
    let y = apply_rotary(ctx, &xt, &pos, &rotary)
        .expect("rotary")
        .to_f32_vec(ctx)
        .expect("read");
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    for (row, chunk) in xf.chunks(16).enumerate() {
        let want = rotary.rotate_row(chunk, pos[(row / (2 * 11)) * 11 + row % 11]);
        for (g, w) in y[row * 16..(row + 1) * 16].iter().zip(&want) {
            // One f16 rounding of a value below 2 in magnitude, plus the f32 arithmetic.
            assert!(
                (f64::from(*g) - w).abs() <= 2f64.powi(-10) + 1e-6,
                "row {row}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn embeddings_that_do_not_fit_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let x = Tensor::from_f32(ctx, [1, 1, 3, 8], Layout::Bhsd, &[0.5; 24]).expect("upload");
    let cases = [
        (Rotary::new(7), vec![0, 1, 2]),
        (Rotary::new(10), vec![0, 1, 2]),
        (Rotary::new(0), vec![0, 1, 2]),
        (
            Rotary {
                theta: 0.0,
                ..Rotary::new(8)
            },
            vec![0, 1, 2],
        ),
        (
            Rotary {
                scaling: f64::NAN,
                ..Rotary::new(8)
            },
            vec![0, 1, 2],
        ),
        (Rotary::new(8), vec![0, 1]),
    ];
    for (n, (rotary, pos)) in cases.iter().enumerate() {
        match apply_rotary(ctx, &x, pos, rotary) {
            Err(Error::Invalid { .. } | Error::Shape { .. }) => {}
            other => panic!("case {n}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn kv_caches_rotate_keys_as_they_append_and_queries_as_they_attend() {
    use wgpu_attention::{
        AttentionOptions, AttentionShape, CausalAlignment, KvCache, KvCacheConfig, PagedKvCache, PagedKvConfig,
        QuantizedKvCache,
    };
    let Some(ctx) = common::ctx() else { return };
    let (b, hkv, hq, d, cap) = (2, 2, 4, 16, 24);
    for (seed, style) in [(4150, RotaryStyle::NeoX), (4151, RotaryStyle::GptJ)] {
        let mut rng = Rng::new(seed);
        let rotary = Rotary {
            theta: 500.0,
            dim: 12,
            style,
            scaling: 1.0,
        };
        let config = KvCacheConfig {
            batch: b,
            heads_kv: hkv,
            capacity: cap,
            head_dim: d,
            head_dim_v: d,
            layout: Layout::Bshd,
            dtype: DType::F32,
        };
        let mut cache = KvCache::new(ctx, config).expect("cache");
        cache.set_rotary(Some(rotary)).expect("rotary");
        // The same rows through an int8 cache, which rotates keys before it quantizes.
        let mut int8 = QuantizedKvCache::new(ctx, config).expect("int8 cache");
        int8.set_rotary(Some(rotary)).expect("int8 rotary");
        // The same rows through a paged cache (pages of 4 rows), which must attend alike.
        let mut paged = PagedKvCache::new(
            ctx,
            PagedKvConfig {
                pages: 16,
                page_size: 4,
                heads_kv: hkv,
                head_dim: d,
                head_dim_v: d,
                layout: Layout::Bhsd,
                dtype: DType::F32,
            },
        )
        .expect("paged cache");
        paged.set_rotary(Some(rotary)).expect("paged rotary");
        let ids = [paged.add_sequence(), paged.add_sequence()];
        // The cache's contents as the host expects them: rotated keys, plain values.
        let mut k_host = vec![0.0f32; b * hkv * cap * d];
        let mut v_host = vec![0.0f32; b * hkv * cap * d];
        for (n, counts) in [(5, [5u32, 3]), (2, [2, 2])] {
            let k = rng.vec(b * hkv * n * d, -1.0, 1.0);
            let v = rng.vec(b * hkv * n * d, -1.0, 1.0);
            let starts = cache.lengths().to_vec();
            let shape = [b, hkv, n, d];
            let (kt, vt) = (
                Tensor::from_f32(ctx, shape, Layout::Bhsd, &k).expect("k"),
                Tensor::from_f32(ctx, shape, Layout::Bhsd, &v).expect("v"),
            );
            cache.append_rows(ctx, &kt, &vt, &counts).expect("append");
            int8.append_rows(ctx, &kt, &vt, &counts).expect("int8 append");
            paged.append_rows(ctx, &ids, &kt, &vt, &counts).expect("paged append");
            for bi in 0..b {
                for h in 0..hkv {
                    for s in 0..counts[bi] as usize {
                        let src = ((bi * hkv + h) * n + s) * d;
                        let dst = ((bi * hkv + h) * cap + starts[bi] as usize + s) * d;
                        let row = rotary.rotate_row(&k[src..src + d], starts[bi] + s as u32);
                        for e in 0..d {
                            k_host[dst + e] = row[e] as f32;
                        }
                        v_host[dst..dst + d].copy_from_slice(&v[src..src + d]);
                    }
                }
            }
        }
        assert_eq!(cache.lengths(), &[7, 5]);
        let held = relayout(
            &cache.keys().to_f32_vec(ctx).expect("keys"),
            [b, hkv, cap, d],
            Layout::Bshd,
            Layout::Bhsd,
        );
        let worst = held
            .iter()
            .zip(&k_host)
            .map(|(a, w)| (a - w).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 4.0 * f32::EPSILON * 2.0,
            "seed {seed} {style:?}: stored keys off by {worst}"
        );
        // Two query rows per sequence, rotated at len − 2 and len − 1.
        let lq = 2;
        let q = rng.vec(b * hq * lq * d, -1.0, 1.0);
        let options = AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            ..Default::default()
        };
        let qt = Tensor::from_f32(ctx, [b, hq, lq, d], Layout::Bhsd, &q).expect("q");
        let read = |out: Tensor| {
            relayout(
                &out.to_f32_vec(ctx).expect("read"),
                out.shape(),
                out.layout(),
                Layout::Bhsd,
            )
        };
        let got = read(cache.attend(ctx, &qt, &options).expect("attend").out);
        let got_paged = read(paged.attend(ctx, &ids, &qt, &options).expect("paged attend").out);
        let mut q_rot = q.clone();
        for (row, chunk) in q.chunks(d).enumerate() {
            let (bi, i) = (row / (hq * lq), row % lq);
            let position = cache.lengths()[bi] - lq as u32 + i as u32;
            for (e, x) in rotary.rotate_row(chunk, position).into_iter().enumerate() {
                q_rot[row * d + e] = x as f32;
            }
        }
        let shape = AttentionShape::new(b, hq, hkv, lq, cap, d, d);
        let want = wgpu_attention::reference::attention(
            &q_rot,
            &k_host,
            &v_host,
            &shape,
            &AttentionOptions {
                key_lengths: Some(cache.lengths().to_vec()),
                align_to_key_lengths: true,
                ..options.clone()
            },
        )
        .expect("reference");
        let bound = wgpu_attention::check::Tolerance::F32.bound(&shape, &want, 0.0) + 1e-6;
        for (name, values) in [("cache", &got), ("paged cache", &got_paged)] {
            let err = values
                .iter()
                .zip(&want.out)
                .map(|(a, w)| (f64::from(*a) - w).abs())
                .fold(0.0f64, f64::max);
            assert!(
                err <= bound,
                "seed {seed} {style:?}: {name} attention off by {err:.3e} (bound {bound:.3e})"
            );
        }

        // The int8 cache: its keys are the rotated rows within half a quantization step
        // (a key quantized unrotated, or rotated at another position, is far off), and
        // its attention is the reference's over the values its codes stand for.
        assert_eq!(int8.lengths(), cache.lengths());
        let codes = int8.quantized().read(ctx).expect("read codes");
        let values = |codes: &[i8], scales: &[f32]| {
            let all = wgpu_attention::reference::int8::dequantize_rows(codes, scales, d);
            relayout(&all, [b, hkv, cap, d], Layout::Bshd, Layout::Bhsd)
        };
        let (k8, v8) = (
            values(&codes.k_codes, &codes.k_scales),
            values(&codes.v_codes, &codes.v_scales),
        );
        for bi in 0..b {
            for h in 0..hkv {
                for s in 0..cache.lengths()[bi] as usize {
                    let row = ((bi * hkv + h) * cap + s) * d;
                    let step = codes.k_scales[(bi * cap + s) * hkv + h]; // BSHD rows
                    let worst = (0..d)
                        .map(|e| (k8[row + e] - k_host[row + e]).abs())
                        .fold(0.0f32, f32::max);
                    assert!(
                        worst <= step / 2.0 * (1.0 + 1e-5) + 1e-7,
                        "seed {seed} {style:?}: int8 key ({bi}, {h}, {s}) off the rotated row by {worst} (step {step})"
                    );
                }
            }
        }
        let got8 = read(int8.attend(ctx, &qt, &options).expect("int8 attend").out);
        let want8 = wgpu_attention::reference::attention(
            &q_rot,
            &k8,
            &v8,
            &shape,
            &AttentionOptions {
                key_lengths: Some(cache.lengths().to_vec()),
                align_to_key_lengths: true,
                ..options.clone()
            },
        )
        .expect("int8 reference");
        let stats = wgpu_attention::check::ErrorStats::of(&got8, &want8.out);
        let bound8 = wgpu_attention::check::Tolerance::F32.bound(&shape, &want8, 0.0) + 1e-6;
        assert!(
            stats.passes(bound8),
            "seed {seed} {style:?}: int8 cache attention {stats:?} (bound {bound8:.3e})"
        );
    }
}
