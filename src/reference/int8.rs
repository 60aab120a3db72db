//! The int8 KV quantization of docs/design.md ("int8 KV cache") on host data, in the
//! f32 arithmetic the append kernel uses (`kv_quantize` in `shaders/kv_append.wgsl`):
//! per row of `dim` elements, scale = max|x| / 127 and code = round(x / max|x| · 127),
//! ties to even, clamped to ±127; a row whose largest magnitude is below f32's smallest
//! normal is all zeros with scale 0; a row holding any NaN or infinity is all zeros with
//! a NaN scale, so it reads back as NaN, never as a finite number that was not there.
//! GPUs divide to within 2.5 ULP, so a code may differ from this one by 1 where
//! x / max|x| · 127 lies within rounding of a half.

/// Codes and scales of `values`, rows of `dim` elements in order.
pub fn quantize_rows(values: &[f32], dim: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / dim.max(1));
    for row in values.chunks(dim.max(1)) {
        let top = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let finite = row.iter().all(|x| x.is_finite());
        let live = top >= f32::MIN_POSITIVE && finite;
        scales.push(match (finite, live) {
            (false, _) => f32::NAN,
            (true, true) => top / 127.0,
            (true, false) => 0.0,
        });
        codes.extend(row.iter().map(|&x| {
            if live {
                (x / top * 127.0).round_ties_even().clamp(-127.0, 127.0) as i8
            } else {
                0
            }
        }));
    }
    (codes, scales)
}

/// The values `codes` stand for: each code times its row's scale (rows of `dim`).
pub fn dequantize_rows(codes: &[i8], scales: &[f32], dim: usize) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(e, &c)| f32::from(c) * scales[e / dim.max(1)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_half_a_step_and_zero_rows_stay_zero() {
        let values = [0.5, -1.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 1.5, -0.012, 2.9];
        let (codes, scales) = quantize_rows(&values, 4);
        assert_eq!(scales[1], 0.0);
        assert_eq!(&codes[4..8], &[0; 4]);
        assert_eq!(codes[1], -127);
        assert_eq!(codes[8], 127);
        let back = dequantize_rows(&codes, &scales, 4);
        for (e, (x, y)) in values.iter().zip(&back).enumerate() {
            assert!((x - y).abs() <= scales[e / 4] / 2.0 * 1.0001, "{e}: {x} -> {y}");
        }
    }

    #[test]
    fn rows_holding_nan_or_infinity_read_back_as_nan() {
        let values = [
            1.0,
            f32::NAN,
            2.0,
            -3.0,
            f32::INFINITY,
            0.5,
            0.0,
            0.0,
            1.0,
            2.0,
            f32::NEG_INFINITY,
            4.0,
        ];
        let (codes, scales) = quantize_rows(&values, 4);
        assert!(scales.iter().all(|s| s.is_nan()), "{scales:?}");
        assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
        assert!(dequantize_rows(&codes, &scales, 4).iter().all(|x| x.is_nan()));
    }
}
