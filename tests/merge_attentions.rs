//! `merge_attentions` (issue 41 item 1): attention over random partitions of the keys,
//! merged by log-sum-exp, equals attention over all keys (against the f64 reference,
//! within the forward's bound widened by what the partial lses' errors move the merge
//! weights by), with key lengths and masks cut to each partition and the causal mask,
//! windows and ALiBi measured from each partition's `position_offset`; rows no partition
//! saw; mixed layouts; f16; bad inputs refused.

use crate::common;

use wgpu_attention::check::{Rng, Tolerance};
use wgpu_attention::{
    merge_attentions, sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, Error, Layout, Mask,
    Tensor, Window,
};

/// Keys `0 .. len_k` cut at `parts - 1` random places (empty parts allowed).
fn random_cuts(rng: &mut Rng, len_k: usize, parts: usize) -> Vec<(usize, usize)> {
    let mut cuts: Vec<usize> = (0..parts - 1).map(|_| rng.below(len_k + 1)).collect();
    cuts.push(0);
    cuts.push(len_k);
    cuts.sort_unstable();
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Columns `a .. b` of a `[rows, len_k]` row-major matrix.
fn columns<T: Copy>(values: &[T], len_k: usize, (a, b): (usize, usize)) -> Vec<T> {
    values.chunks(len_k).flat_map(|row| row[a..b].iter().copied()).collect()
}

struct Problem {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Per batch element, or none.
    key_lengths: Option<Vec<u32>>,
    /// `[B, 1, Lq, Lk]` may-attend flags, or none.
    mask: Option<Vec<bool>>,
    /// The rules measured from positions: each partition takes its key offset.
    positions: AttentionOptions,
}

impl Problem {
    fn options(&self) -> AttentionOptions {
        let s = self.shape;
        AttentionOptions {
            causal: self.positions.causal,
            window: self.positions.window,
            alibi_slopes: self.positions.alibi_slopes.clone(),
            key_lengths: self.key_lengths.clone(),
            mask: self
                .mask
                .as_ref()
                .map(|m| Mask::boolean(&[s.batch, 1, s.len_q, s.len_k], m.clone()).expect("mask")),
            ..Default::default()
        }
    }

    /// The sub-problem over keys `a .. b` (at least one key: the caller skips empty
    /// parts) and its options: key lengths and mask cut to the part.
    fn part(&self, (a, b): (usize, usize)) -> (AttentionShape, Vec<f32>, Vec<f32>, AttentionOptions) {
        let s = self.shape;
        let shape = AttentionShape { len_k: b - a, ..s };
        let rows = |x: &[f32], d: usize| columns(x, s.len_k * d, (a * d, b * d));
        // Queries sit at i + g on the whole key axis: at i + g − a on the part's.
        let global = self.options().query_position_offset(s.len_q, s.len_k);
        let options = AttentionOptions {
            causal: self.positions.causal,
            window: self.positions.window,
            alibi_slopes: self.positions.alibi_slopes.clone(),
            position_offset: Some(global - a as i64),
            key_lengths: self.key_lengths.as_ref().map(|lens| {
                lens.iter()
                    .map(|&l| (l as usize).clamp(a, b) as u32 - a as u32)
                    .collect()
            }),
            mask: self
                .mask
                .as_ref()
                .map(|m| Mask::boolean(&[s.batch, 1, s.len_q, b - a], columns(m, s.len_k, (a, b))).expect("mask")),
            need_lse: true,
            ..Default::default()
        };
        (shape, rows(&self.k, s.head_dim), rows(&self.v, s.head_dim_v), options)
    }
}

fn random_problem(rng: &mut Rng, shape: AttentionShape, key_lengths: bool, mask: bool) -> Problem {
    let s = shape;
    Problem {
        shape,
        q: rng.vec(s.batch * s.heads_q * s.len_q * s.head_dim, -1.0, 1.0),
        k: rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim, -1.0, 1.0),
        v: rng.vec(s.batch * s.heads_kv * s.len_k * s.head_dim_v, -1.0, 1.0),
        key_lengths: key_lengths.then(|| (0..s.batch).map(|_| rng.below(s.len_k + 1) as u32).collect()),
        mask: mask.then(|| (0..s.batch * s.len_q * s.len_k).map(|_| rng.below(10) < 7).collect()),
        positions: AttentionOptions::default(),
    }
}

/// The position rules of case `n`: none, causal either way, a window, ALiBi.
fn positions(rng: &mut Rng, s: &AttentionShape, n: usize) -> AttentionOptions {
    match n % 5 {
        0 => AttentionOptions::default(),
        1 => AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            ..Default::default()
        },
        2 => AttentionOptions {
            causal: Some(CausalAlignment::TopLeft),
            window: Some(Window {
                left: Some(rng.below(s.len_k / 2 + 2)),
                right: None,
            }),
            ..Default::default()
        },
        3 => AttentionOptions {
            window: Some(Window {
                left: Some(rng.below(s.len_k / 2 + 2)),
                right: Some(rng.below(s.len_k / 4 + 2)),
            }),
            ..Default::default()
        },
        _ => AttentionOptions {
            alibi_slopes: Some(wgpu_attention::check::alibi_slopes(s.heads_q)),
            causal: Some(CausalAlignment::BottomRight),
            ..Default::default()
        },
    }
}

/// Attends to each non-empty part of `cuts` on the GPU (part n's output in `layouts[n %
/// 2]`) and merges; returns the merged output (BHSD f32) and lse.
fn merged(ctx: &Context, p: &Problem, cuts: &[(usize, usize)], dtype: DType) -> (Vec<f32>, Vec<f32>) {
    let s = p.shape;
    let upload = |data: &[f32], shape: [usize; 4], layout| {
        Tensor::from_f32_as(
            ctx,
            shape,
            layout,
            dtype,
            &wgpu_attention::relayout(data, shape, Layout::Bhsd, layout),
        )
        .expect("upload")
    };
    let q = upload(&p.q, [s.batch, s.heads_q, s.len_q, s.head_dim], Layout::Bhsd);
    let mut partials = Vec::new();
    for (n, &(a, b)) in cuts.iter().enumerate().filter(|(_, (a, b))| b > a) {
        let (shape, k, v, options) = p.part((a, b));
        let layout = [Layout::Bhsd, Layout::Bshd][n % 2];
        let k = upload(&k, [s.batch, s.heads_kv, shape.len_k, s.head_dim], layout);
        let v = upload(&v, [s.batch, s.heads_kv, shape.len_k, s.head_dim_v], layout);
        let options = AttentionOptions {
            output_layout: Some(layout),
            ..options
        };
        let out = sdpa(ctx, &q, &k, &v, &options).expect("partial attention");
        partials.push((out.out, out.lse.expect("lse")));
    }
    let outputs: Vec<&Tensor> = partials.iter().map(|(o, _)| o).collect();
    let lses: Vec<&Tensor> = partials.iter().map(|(_, l)| l).collect();
    let m = merge_attentions(ctx, &outputs, &lses).expect("merge");
    let shape = m.out.shape();
    let out = wgpu_attention::relayout(
        &m.out.to_f32_vec(ctx).expect("read"),
        shape,
        m.out.layout(),
        Layout::Bhsd,
    );
    (out, m.lse.to_f32_vec(ctx).expect("read lse"))
}

#[test]
fn merged_partitions_equal_attention_over_all_keys() {
    let Some(ctx) = common::ctx() else { return };
    let mut rng = Rng::new(4101);
    let shapes = [
        AttentionShape::new(1, 2, 2, 5, 40, 16, 16),
        AttentionShape::new(2, 4, 2, 17, 65, 24, 40),
        AttentionShape::new(1, 1, 1, 1, 300, 64, 64),
    ];
    let mut seed = 41010;
    for s in shapes {
        for (key_lengths, mask) in [(false, false), (true, false), (false, true), (true, true)] {
            for parts in [1, 2, 3, 5] {
                seed += 1;
                let mut rng_case = Rng::new(seed);
                let mut p = random_problem(&mut rng_case, s, key_lengths, mask);
                p.positions = positions(&mut rng_case, &s, seed as usize);
                let cuts = random_cuts(&mut rng, s.len_k, parts);
                let (got, got_lse) = merged(ctx, &p, &cuts, DType::F32);
                let want = wgpu_attention::reference::attention(&p.q, &p.k, &p.v, &s, &p.options()).expect("reference");
                // Each partial is within the forward's bound of its exact value, and the
                // lses' errors move each merge weight by at most twice the lse bound.
                let max_v = p.v.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
                let lse_bound = Tolerance::lse_bound(&s, &want);
                let bound = Tolerance::F32.bound(&s, &want, 0.0) + 4.0 * lse_bound * max_v;
                let err = got
                    .iter()
                    .zip(&want.out)
                    .map(|(a, b)| (f64::from(*a) - b).abs())
                    .fold(0.0f64, f64::max);
                assert!(
                    err <= bound,
                    "seed {seed} {s:?} cuts {cuts:?} lengths {key_lengths} mask {mask} {:?}: error {err:.3e} > {bound:.3e}",
                    p.positions
                );
                for (n, (a, b)) in got_lse.iter().zip(&want.lse).enumerate() {
                    if b.is_finite() {
                        assert!(
                            (f64::from(*a) - b).abs() <= 2.0 * lse_bound,
                            "seed {seed} cuts {cuts:?}: lse {n}: {a} vs {b}"
                        );
                    } else {
                        assert_eq!(
                            *a,
                            f32::NEG_INFINITY,
                            "seed {seed} cuts {cuts:?}: lse {n} of a row with no key"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn rows_no_partition_saw_get_zeros_and_minus_infinity() {
    // Key length 0 for the first batch element: every partial of its rows is -inf.
    let Some(ctx) = common::ctx() else { return };
    let s = AttentionShape::new(2, 2, 1, 4, 30, 8, 8);
    let mut rng = Rng::new(4102);
    let mut p = random_problem(&mut rng, s, false, false);
    p.key_lengths = Some(vec![0, 30]);
    let (out, lse) = merged(ctx, &p, &[(0, 10), (10, 30)], DType::F32);
    let rows_of_first = s.heads_q * s.len_q;
    assert!(out[..rows_of_first * s.head_dim_v].iter().all(|&x| x == 0.0));
    assert!(lse[..rows_of_first].iter().all(|&x| x == f32::NEG_INFINITY));
    assert!(out[rows_of_first * s.head_dim_v..]
        .iter()
        .all(|x| x.is_finite() && *x != 0.0));
}

#[test]
fn f16_partials_merge_within_the_f16_rule() {
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "f16", false);
        return;
    }
    let s = AttentionShape::new(1, 2, 2, 9, 50, 32, 32);
    let mut rng = Rng::new(4103);
    let p = random_problem(&mut rng, s, true, false);
    let (got, _) = merged(ctx, &p, &[(0, 20), (20, 50)], DType::F16);
    let (full, _) = merged(ctx, &p, &[(0, 50)], DType::F16);
    // Two f16 roundings of the partials against one of the full output: within a few
    // f16 epsilons of the values' scale.
    let err = got.iter().zip(&full).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err <= 4.0 * 2f32.powi(-11), "error {err}");
}

#[test]
fn bad_partials_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let t = |shape: [usize; 4], dtype: DType| Tensor::empty(ctx, shape, Layout::Bhsd, dtype).expect("tensor");
    let (o1, o2) = (t([1, 2, 3, 4], DType::F32), t([1, 2, 3, 5], DType::F32));
    let (l1, l_bad) = (t([1, 2, 3, 1], DType::F32), t([1, 2, 4, 1], DType::F32));
    let cases: [(&[&Tensor], &[&Tensor]); 4] = [
        (&[], &[]),
        (&[&o1, &o1], &[&l1]),
        (&[&o1, &o2], &[&l1, &l1]),
        (&[&o1], &[&l_bad]),
    ];
    for (n, (outs, lses)) in cases.iter().enumerate() {
        match merge_attentions(ctx, outs, lses) {
            Err(Error::Invalid { .. } | Error::Shape { .. }) => {}
            other => panic!("case {n}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn position_offsets_that_cannot_be_honoured_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    let t = |shape: [usize; 4]| {
        Tensor::from_f32(ctx, shape, Layout::Bhsd, &vec![0.5; shape.iter().product()]).expect("tensor")
    };
    let (q, k, v) = (t([1, 1, 2, 4]), t([1, 1, 3, 4]), t([1, 1, 3, 4]));
    let refused = [
        AttentionOptions {
            position_offset: Some(1),
            key_lengths: Some(vec![3]),
            align_to_key_lengths: true,
            ..Default::default()
        },
        AttentionOptions {
            position_offset: Some(1 << 31),
            ..Default::default()
        },
        AttentionOptions {
            position_offset: Some(i64::MIN),
            causal: Some(CausalAlignment::TopLeft),
            ..Default::default()
        },
    ];
    for (n, options) in refused.iter().enumerate() {
        match sdpa(ctx, &q, &k, &v, options) {
            Err(Error::Invalid { .. } | Error::Unsupported { .. }) => {}
            other => panic!("case {n}: expected a refusal, got {other:?}"),
        }
    }
}
