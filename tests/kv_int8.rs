//! int8 KV caches (issue 54): the append kernel quantizes as the reference does; the
//! attention over a cache agrees with f64 attention over the values its codes stand
//! for, on the path that reads codes in the kernel (split-K decode's lanes design) and
//! on the paths that dequantize first; and the error against the unquantized values
//! stays within what quantization can cause.

mod common;
use wgpu_attention::check::{ErrorStats, Rng, Tolerance};
use wgpu_attention::reference::{attention, int8};
use wgpu_attention::{
    reads_codes, relayout, AttentionOptions, AttentionShape, CausalAlignment, DType, Error, KvCacheConfig, Layout,
    QuantizedKv, QuantizedKvCache, Tensor,
};

fn rounded(dtype: DType, x: Vec<f32>) -> Vec<f32> {
    match dtype {
        DType::F32 => x,
        DType::F16 => x.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
    }
}

/// Whether the reference's `x / top * 127` lies within rounding of a half, where a
/// GPU's division may round the other way.
fn near_a_tie(x: f32, top: f32) -> bool {
    let t = f64::from(x) / f64::from(top) * 127.0;
    ((t - t.trunc()).abs() - 0.5).abs() < 1e-4
}

#[test]
fn appends_quantize_as_the_reference_does_in_either_layout_and_dtype() {
    let Some(ctx) = common::ctx() else { return };
    let (b, h, s, d, dv) = (2, 2, 37, 16, 32);
    for (n, (layout, dtype)) in [
        (Layout::Bhsd, DType::F32),
        (Layout::Bshd, DType::F16),
        (Layout::Bhsd, DType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        if dtype == DType::F16 && !ctx.capabilities().f16 {
            common::skip_lacking(ctx, "SHADER_F16", true);
            continue;
        }
        let seed = 5400 + n as u64;
        let mut rng = Rng::new(seed);
        let mut draw = |dim: usize| {
            let mut x = rng.vec(b * h * s * dim, -3.0, 3.0);
            // A zero row, a row of subnormals and a row of one large value.
            x[..dim].fill(0.0);
            x[dim..2 * dim].fill(1e-39);
            x[2 * dim..3 * dim].fill(0.0);
            x[2 * dim + 1] = -250.0;
            rounded(dtype, x)
        };
        let (k, v) = (draw(d), draw(dv));
        let upload = |x: &[f32], dim| {
            let shape = [b, h, s, dim];
            Tensor::from_f32_as(ctx, shape, layout, dtype, &relayout(x, shape, Layout::Bhsd, layout)).expect("upload")
        };
        let kv = QuantizedKv::quantize(ctx, &upload(&k, d), &upload(&v, dv)).expect("quantize");
        let got = kv.read(ctx).expect("read codes");
        let (dk, dvv) = kv.dequantize(ctx).expect("dequantize");
        for (what, x, dim, codes, scales, values) in [
            ("K", &k, d, &got.k_codes, &got.k_scales, dk),
            ("V", &v, dv, &got.v_codes, &got.v_scales, dvv),
        ] {
            let memory = relayout(x, [b, h, s, dim], Layout::Bhsd, layout);
            let (want_codes, want_scales) = int8::quantize_rows(&memory, dim);
            for (r, (g, w)) in scales.iter().zip(&want_scales).enumerate() {
                assert!(
                    (g - w).abs() <= 4.0 * f32::EPSILON * w.abs(),
                    "seed {seed} {what} {layout:?} {dtype:?} row {r}: scale {g} against {w}"
                );
            }
            for (e, (&g, &w)) in codes.iter().zip(&want_codes).enumerate() {
                let top = want_scales[e / dim] * 127.0;
                let ok = g == w || ((i16::from(g) - i16::from(w)).abs() == 1 && near_a_tie(memory[e], top));
                assert!(
                    ok,
                    "seed {seed} {what} {layout:?} {dtype:?} element {e}: code {g} against {w}"
                );
            }
            // The dequantized tensor is code times scale, rounded to the dtype.
            let want = rounded(dtype, int8::dequantize_rows(codes, scales, dim));
            let values = values.to_f32_vec(ctx).expect("read values");
            assert_eq!(
                values, want,
                "seed {seed} {what} {layout:?} {dtype:?}: dequantized values"
            );
        }
        // Rows 0 and 1 of BHSD memory: the zero row and the subnormal one.
        if layout == Layout::Bhsd {
            assert!(
                got.k_scales[0] == 0.0 && got.k_codes[..d].iter().all(|&c| c == 0),
                "zero row"
            );
            assert!(got.k_scales[1] == 0.0, "a row of subnormals quantizes to zeros");
        }
    }
}

/// Attention over an int8 cache after ragged appends, per batch element against f64
/// attention over the values its codes stand for (read back), and against the
/// unquantized rows within the bound quantization allows.
#[test]
fn cache_attention_matches_the_dequantized_values_on_every_path() {
    let Some(ctx) = common::ctx() else { return };
    let (b, hkv, hq, d, dv, cap) = (2, 2, 4, 32, 16, 1100);
    for (n, (dtype, lq, options)) in [
        (DType::F32, 1, AttentionOptions::default()),
        (
            DType::F16,
            2,
            AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                ..Default::default()
            },
        ),
        // More query rows than decode takes, and weights: the dequantized paths.
        (
            DType::F32,
            20,
            AttentionOptions {
                causal: Some(CausalAlignment::BottomRight),
                ..Default::default()
            },
        ),
        (
            DType::F32,
            1,
            AttentionOptions {
                need_weights: true,
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        if dtype == DType::F16 && !ctx.capabilities().f16 {
            common::skip_lacking(ctx, "SHADER_F16", true);
            continue;
        }
        let seed = 5410 + n as u64;
        let mut rng = Rng::new(seed);
        let config = KvCacheConfig {
            batch: b,
            heads_kv: hkv,
            capacity: cap,
            head_dim: d,
            head_dim_v: dv,
            layout: Layout::Bshd,
            dtype,
        };
        let mut cache = QuantizedKvCache::new(ctx, config).expect("cache");
        // Host rows, BHSD per batch element: what each element holds, unquantized.
        let mut held_k = vec![vec![Vec::new(); hkv]; b];
        let mut held_v = vec![vec![Vec::new(); hkv]; b];
        for (rows, counts) in [(1030usize, [1030u32, 700]), (40, [20, 40])] {
            let k = rounded(dtype, rng.vec(b * hkv * rows * d, -1.0, 1.0));
            let v = rounded(dtype, rng.vec(b * hkv * rows * dv, -1.0, 1.0));
            let up =
                |x: &[f32], dim| Tensor::from_f32_as(ctx, [b, hkv, rows, dim], Layout::Bhsd, dtype, x).expect("upload");
            cache
                .append_rows(ctx, &up(&k, d), &up(&v, dv), &counts)
                .expect("append");
            for bi in 0..b {
                for h in 0..hkv {
                    let c = counts[bi] as usize;
                    held_k[bi][h].extend_from_slice(&k[(bi * hkv + h) * rows * d..][..c * d]);
                    held_v[bi][h].extend_from_slice(&v[(bi * hkv + h) * rows * dv..][..c * dv]);
                }
            }
        }
        assert_eq!(cache.lengths(), &[1050, 740]);
        let q = rounded(dtype, rng.vec(b * hq * lq * d, -1.0, 1.0));
        let q_tensor = Tensor::from_f32_as(ctx, [b, hq, lq, d], Layout::Bhsd, dtype, &q).expect("upload q");
        let shape = AttentionShape::new(b, hq, hkv, lq, cap, d, dv);
        let in_kernel = reads_codes(ctx, dtype, &shape, &options).expect("route");
        if lq == 1 && !options.need_weights && common::is_vulkan_lavapipe(ctx) {
            assert!(
                in_kernel,
                "lavapipe's fixed 8-lane subgroups run the lanes design on int8 codes"
            );
        }
        let out = cache.attend(ctx, &q_tensor, &options).expect("attend");
        let got = out.out.to_f32_vec(ctx).expect("read out");
        // The codes, as the reference sees them: BSHD capacity rows, read back.
        let codes = cache.quantized().read(ctx).expect("read codes");
        let values = |codes: &[i8], scales: &[f32], dim| {
            let all = int8::dequantize_rows(codes, scales, dim);
            relayout(&all, [b, hkv, cap, dim], Layout::Bshd, Layout::Bhsd)
        };
        let k_values = values(&codes.k_codes, &codes.k_scales, d);
        let v_values = values(&codes.v_codes, &codes.v_scales, dv);
        for bi in 0..b {
            let len = cache.lengths()[bi] as usize;
            let take = |all: &[f32], dim| -> Vec<f32> {
                (0..hkv)
                    .flat_map(|h| all[(bi * hkv + h) * cap * dim..][..len * dim].to_vec())
                    .collect()
            };
            let element = AttentionShape::new(1, hq, hkv, lq, len, d, dv);
            let q_b = &q[bi * hq * lq * d..][..hq * lq * d];
            let want =
                attention(q_b, &take(&k_values, d), &take(&v_values, dv), &element, &options).expect("reference");
            // f16 outputs round once more: half an f16 step of the largest value.
            let rounding = if dtype == DType::F16 {
                want.max_abs_value * 2f64.powi(-11)
            } else {
                0.0
            };
            let bound = Tolerance::F32.bound(&element, &want, 0.0) + rounding;
            let got_b = &got[bi * hq * lq * dv..][..hq * lq * dv];
            let stats = ErrorStats::of(got_b, &want.out);
            assert!(
                stats.passes(bound),
                "seed {seed} {dtype:?} Lq {lq} codes in kernel {in_kernel} element {bi}: {stats:?} (bound {bound:e})"
            );
            // Against the rows as appended: a key's score moves by at most
            // δ = scale · Σ|q| · (its K scale / 2), which moves each weight by a factor
            // within e^(±2δ); each value moves by at most its V scale / 2.
            let unquantized =
                attention(q_b, &held_k[bi].concat(), &held_v[bi].concat(), &element, &options).expect("reference");
            let q_sum = q_b
                .chunks(d)
                .map(|row| row.iter().map(|x| f64::from(x.abs())).sum::<f64>())
                .fold(0.0, f64::max);
            let top_scale = |scales: &[f32]| scales.iter().fold(0.0f64, |m, &s| m.max(f64::from(s)));
            let delta = element.scale(&options) as f64 * q_sum * top_scale(&codes.k_scales) / 2.0;
            let quantized_bound =
                ((2.0 * delta).exp() - 1.0) * unquantized.max_abs_value + top_scale(&codes.v_scales) / 2.0;
            let stats = ErrorStats::of(got_b, &unquantized.out);
            println!(
                "seed {seed} {dtype:?} Lq {lq} element {bi}: against unquantized {stats:?} (bound {quantized_bound:e})"
            );
            assert!(
                stats.passes(quantized_bound + bound),
                "seed {seed} element {bi}: {stats:?} against unquantized (bound {quantized_bound:e})"
            );
        }
    }
}

#[test]
fn bad_int8_caches_and_appends_are_refused_and_change_nothing() {
    let Some(ctx) = common::ctx() else { return };
    let config = KvCacheConfig {
        batch: 1,
        heads_kv: 1,
        capacity: 4,
        head_dim: 8,
        head_dim_v: 8,
        layout: Layout::Bhsd,
        dtype: DType::F32,
    };
    let odd = KvCacheConfig { head_dim: 6, ..config };
    assert!(
        matches!(QuantizedKvCache::new(ctx, odd), Err(Error::Unsupported { .. })),
        "head dim 6"
    );
    let mut cache = QuantizedKvCache::new(ctx, config).expect("cache");
    let rows = |n| Tensor::from_f32(ctx, [1, 1, n, 8], Layout::Bhsd, &vec![0.25; n * 8]).expect("upload");
    cache.append(ctx, &rows(3), &rows(3)).expect("append");
    let err = cache.append(ctx, &rows(2), &rows(2)).expect_err("past the capacity");
    assert!(matches!(err, Error::CapacityExceeded { .. }), "{err}");
    assert!(err.to_string().contains("does not grow"), "{err}");
    assert_eq!(cache.lengths(), &[3]);
    let q16 = Tensor::from_f32(ctx, [1, 1, 1, 16], Layout::Bhsd, &[0.5; 16]).expect("upload");
    assert!(
        cache.attend(ctx, &q16, &AttentionOptions::default()).is_err(),
        "head dim 16 against 8"
    );
    if let Some(other) = common::own_ctx() {
        let q = Tensor::from_f32(&other, [1, 1, 1, 8], Layout::Bhsd, &[0.5; 8]).expect("upload");
        let err = cache
            .attend(ctx, &q, &AttentionOptions::default())
            .expect_err("another context");
        assert!(err.to_string().contains("another Context"), "{err}");
    }
}
