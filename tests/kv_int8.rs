//! int8 KV caches (issue 54): the append kernel quantizes as the reference does; the
//! attention over a cache agrees with f64 attention over the values its codes stand
//! for, on the path that reads codes in the kernel (split-K decode's lanes design) and
//! on the paths that dequantize first; and the error against the unquantized values
//! stays within what quantization can cause.

use crate::common;
use wgpu_attention::check::{ErrorStats, Rng, Tolerance};
use wgpu_attention::reference::{attention, int8};
use wgpu_attention::{
    reads_codes, relayout, AttentionOptions, AttentionShape, CausalAlignment, DType, Error, KernelChoice,
    KvCacheConfig, Layout, QuantizedKv, QuantizedKvCache, Tensor,
};

/// Whether the reference's `x / top * 127` lies within rounding of a half, where a
/// GPU's division may round the other way.
fn near_a_tie(x: f32, top: f32) -> bool {
    let t = f64::from(x) / f64::from(top) * 127.0;
    ((t - t.trunc()).abs() - 0.5).abs() < 1e-4
}

/// A BSHD cache of `batch` elements and `heads_kv` heads, room for `capacity` keys.
fn bshd_config(batch: usize, heads_kv: usize, capacity: usize, (d, dv): (usize, usize), dtype: DType) -> KvCacheConfig {
    KvCacheConfig {
        batch,
        heads_kv,
        capacity,
        head_dim: d,
        head_dim_v: dv,
        layout: Layout::Bshd,
        dtype,
    }
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
            common::rounded(dtype, x)
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
            let want = common::rounded(dtype, int8::dequantize_rows(codes, scales, dim));
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
        let config = bshd_config(b, hkv, cap, (d, dv), dtype);
        let mut cache = QuantizedKvCache::new(ctx, config).expect("cache");
        // Host rows, BHSD per batch element: what each element holds, unquantized.
        let mut held_k = vec![vec![Vec::new(); hkv]; b];
        let mut held_v = vec![vec![Vec::new(); hkv]; b];
        for (rows, counts) in [(1030usize, [1030u32, 700]), (40, [20, 40])] {
            let k = common::rounded(dtype, rng.vec(b * hkv * rows * d, -1.0, 1.0));
            let v = common::rounded(dtype, rng.vec(b * hkv * rows * dv, -1.0, 1.0));
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
        let q = common::rounded(dtype, rng.vec(b * hq * lq * d, -1.0, 1.0));
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

/// Issue 64 item 2: an int8 cache never stores a finite number that was not there. A
/// row holding NaN or an infinity is kept with codes 0 and a NaN scale (the tensors are
/// on the device, so an append cannot refuse them without a read back): every element
/// reads back NaN, on the kernel as in `reference::int8`, and attention over the cache
/// is NaN in every row that sees such a key or value, on the path that reads codes and
/// on the one that dequantizes, while rows that see none stay right. The quantizer once
/// dropped NaN from the row maximum and clamped it to -127, and flipped +inf to -inf.
#[test]
fn rows_holding_nan_or_infinity_read_back_as_nan_on_every_path() {
    let Some(ctx) = common::ctx() else { return };
    let (b, hkv, hq, d, dv, cap) = (2, 2, 4, 16, 16, 40);
    for (n, dtype) in common::dtypes(ctx).into_iter().enumerate() {
        let seed = 5460 + n as u64;
        let mut rng = Rng::new(seed);
        let config = bshd_config(b, hkv, cap, (d, dv), dtype);
        let mut cache = QuantizedKvCache::new(ctx, config).expect("cache");
        let rows = 12;
        let mut k = common::rounded(dtype, rng.vec(b * hkv * rows * d, -1.0, 1.0));
        let mut v = common::rounded(dtype, rng.vec(b * hkv * rows * dv, -1.0, 1.0));
        // BHSD rows of the appended tensors: (element, kv head, row).
        let at = |bi: usize, h: usize, s: usize| (bi * hkv + h) * rows + s;
        k[at(0, 0, 3) * d + 2] = f32::NAN;
        k[at(1, 1, 5) * d + 9] = f32::INFINITY;
        v[at(0, 1, 7) * dv] = f32::NEG_INFINITY;
        let poisoned_k = [(0, 0, 3), (1, 1, 5)];
        let poisoned_v = [(0, 1, 7)];
        let up =
            |x: &[f32], dim| Tensor::from_f32_as(ctx, [b, hkv, rows, dim], Layout::Bhsd, dtype, x).expect("upload");
        cache
            .append_rows(ctx, &up(&k, d), &up(&v, dv), &[12, 10])
            .expect("append");
        assert_eq!(cache.lengths(), &[12, 10]);
        // Codes and scales as the reference makes them: the poisoned rows all codes 0
        // with a NaN scale, every other row finite.
        let codes = cache.quantized().read(ctx).expect("read codes");
        for (what, x, dim, got_codes, got_scales, poisoned) in [
            ("K", &k, d, &codes.k_codes, &codes.k_scales, &poisoned_k[..]),
            ("V", &v, dv, &codes.v_codes, &codes.v_scales, &poisoned_v[..]),
        ] {
            let (want_codes, want_scales) = int8::quantize_rows(x, dim);
            for bi in 0..b {
                for h in 0..hkv {
                    for s in 0..cache.lengths()[bi] as usize {
                        let src = at(bi, h, s);
                        let dst = (bi * cap + s) * hkv + h; // BSHD row of the cache
                        let (g, w) = (got_scales[dst], want_scales[src]);
                        let place = format!("seed {seed} {dtype:?} {what} row ({bi}, {h}, {s})");
                        assert_eq!(
                            w.is_nan(),
                            poisoned.contains(&(bi, h, s)),
                            "{place}: reference scale {w}"
                        );
                        assert!(
                            if w.is_nan() {
                                g.is_nan()
                            } else {
                                (g - w).abs() <= 4.0 * f32::EPSILON * w.abs()
                            },
                            "{place}: scale {g} against {w}"
                        );
                        if w.is_nan() {
                            let row_codes = &got_codes[dst * dim..][..dim];
                            assert!(row_codes.iter().all(|&c| c == 0), "{place}: codes {row_codes:?}");
                            assert_eq!(&want_codes[src * dim..][..dim], row_codes, "{place}");
                        }
                    }
                }
            }
        }
        let values = |codes: &[i8], scales: &[f32], dim| {
            let all = int8::dequantize_rows(codes, scales, dim);
            relayout(&all, [b, hkv, cap, dim], Layout::Bshd, Layout::Bhsd)
        };
        let k_values = values(&codes.k_codes, &codes.k_scales, d);
        let v_values = values(&codes.v_codes, &codes.v_scales, dv);
        // Every held value is finite except the poisoned rows, which are NaN throughout.
        for (what, all, dim, poisoned) in [
            ("K", &k_values, d, &poisoned_k[..]),
            ("V", &v_values, dv, &poisoned_v[..]),
        ] {
            for bi in 0..b {
                for h in 0..hkv {
                    for s in 0..cache.lengths()[bi] as usize {
                        let row = &all[((bi * hkv + h) * cap + s) * dim..][..dim];
                        let nan = poisoned.contains(&(bi, h, s));
                        assert!(
                            row.iter().all(|x| if nan { x.is_nan() } else { x.is_finite() }),
                            "seed {seed} {dtype:?} {what} row ({bi}, {h}, {s}) reads back {row:?}"
                        );
                    }
                }
            }
        }
        // Attention with one query row: split-K decode reading the codes, and the fused
        // kernel over the dequantized values.
        let q = common::rounded(dtype, rng.vec(b * hq * d, -1.0, 1.0));
        let q_tensor = Tensor::from_f32_as(ctx, [b, hq, 1, d], Layout::Bhsd, dtype, &q).expect("upload q");
        let shape = AttentionShape::new(b, hq, hkv, 1, cap, d, dv);
        for kernel in [KernelChoice::Decode, KernelChoice::Fused] {
            let options = AttentionOptions {
                kernel,
                ..Default::default()
            };
            let in_kernel = reads_codes(ctx, dtype, &shape, &options).expect("route");
            if kernel == KernelChoice::Decode && common::is_vulkan_lavapipe(ctx) {
                assert!(in_kernel, "lavapipe runs the lanes design on int8 codes");
            }
            let got = cache.attend(ctx, &q_tensor, &options).expect("attend").out;
            let got = got.to_f32_vec(ctx).expect("read out");
            for bi in 0..b {
                let len = cache.lengths()[bi] as usize;
                let take = |all: &[f32], dim| -> Vec<f32> {
                    (0..hkv)
                        .flat_map(|h| all[(bi * hkv + h) * cap * dim..][..len * dim].to_vec())
                        .collect()
                };
                let element = AttentionShape::new(1, hq, hkv, 1, len, d, dv);
                let q_b = &q[bi * hq * d..][..hq * d];
                let (kb, vb) = (take(&k_values, d), take(&v_values, dv));
                let want = attention(q_b, &kb, &vb, &element, &options).expect("reference");
                let zeroed = |x: Vec<f32>| {
                    x.into_iter()
                        .map(|x| if x.is_nan() { 0.0 } else { x })
                        .collect::<Vec<_>>()
                };
                let clean = attention(q_b, &zeroed(kb), &zeroed(vb), &element, &options).expect("reference");
                let rounding = if dtype == DType::F16 {
                    clean.max_abs_value * 2f64.powi(-11)
                } else {
                    0.0
                };
                let bound = Tolerance::F32.bound(&element, &clean, 0.0) + rounding;
                let got_b = &got[bi * hq * dv..][..hq * dv];
                let place = format!("seed {seed} {dtype:?} {kernel:?} (codes in kernel {in_kernel}) element {bi}");
                // Element 0: kv head 0's key and kv head 1's value: every head NaN;
                // element 1: kv head 1's key, query heads 2 and 3 NaN.
                let nan_heads = if bi == 0 { 0..4 } else { 2..4 };
                for (e, (&g, &w)) in got_b.iter().zip(&want.out).enumerate() {
                    let nan = nan_heads.contains(&(e / dv));
                    assert_eq!(w.is_nan(), nan, "{place}: reference element {e} is {w}");
                    assert_eq!(g.is_nan(), nan, "{place}: element {e} is {g}, the reference {w}");
                    if !nan {
                        let err = (f64::from(g) - clean.out[e]).abs();
                        assert!(
                            err <= bound,
                            "{place}: element {e} {g} against {} (bound {bound:e})",
                            clean.out[e]
                        );
                    }
                }
            }
        }
    }
}
