//! Checking a GPU path against the CPU reference: seeded random problems, named
//! tolerances and error reports. Used by the test suite and by `wgpu-attention check`.

use crate::attention::{resolve_kernel, sdpa_async};
use crate::context::Context;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::options::{AttentionOptions, CausalAlignment, FusedTiling, KernelChoice, Mask, Precision, Window};
use crate::problem::AttentionShape;
use crate::reference::{self, ReferenceOutput};
use crate::tensor::{relayout, DType, Layout, Tensor};
use half::f16;

pub use crate::reference::rng::Rng;

/// How close a GPU result must be to the f64 reference (docs/design.md, "Precision").
///
/// Every bound starts from δ ([`score_error`]), what rounding can move one f32 score:
/// it scales with the magnitude of the products that make the score, so the bounds
/// hold at any logit scale, not only for inputs of magnitude ~1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// f32 storage and arithmetic: output error at most
    /// `max|v| · (2δ + 2ε(2 + log2 Lk)) + ε`. Score errors move each weight by at most
    /// `2δ · w(1 − w)` (to first order), so the weights' total change is below 2δ; the
    /// second term is the rounding of exp, the row sum and the weighted sum of values.
    F32,
    /// f16 storage, or f32 inputs multiplied in f16 (Precision::Medium; scores and
    /// softmax in f32 either way): output error at most twice that of a naive f16
    /// implementation (inputs, scores, probabilities and output rounded to f16) plus
    /// `1e-5` (the flash-attn rule), plus the f32 bound, since the f32 arithmetic can
    /// be off by that much where the naive one happens to be exact (one-hot rows at
    /// large logits). Weights and log-sum-exp are computed in f32 and meet the f32
    /// bounds.
    F16,
}

/// δ = `2ε · (1 + A) · (1 + log2 D)`: a bound on the rounding error of one score
/// computed in f32, with A the largest `scale · Σ_t |q_t k_t| + |bias|` of the problem
/// ([`reference::ReferenceOutput::max_abs_product`]) and D terms summed (the log is a
/// typical, not a worst-case, growth of a sum's rounding error).
pub fn score_error(s: &AttentionShape, max_abs_product: f64) -> f64 {
    2.0 * f64::from(f32::EPSILON) * (1.0 + max_abs_product) * (1.0 + (s.head_dim.max(1) as f64).log2())
}

/// `2ε(2 + log2 Lk)`: the relative rounding of exp, a row sum over Lk keys and a division.
pub(crate) fn sum_error(s: &AttentionShape) -> f64 {
    2.0 * f64::from(f32::EPSILON) * (2.0 + (s.len_k.max(1) as f64).log2())
}

/// Error statistics of one comparison.
#[derive(Clone, Debug, Default)]
pub struct ErrorStats {
    pub max_abs: f64,
    pub argmax: usize,
    pub mean_abs: f64,
    /// Non-finite values where the reference is finite (or the other way round), or
    /// another non-finite value than the reference's (NaN for an infinity, -inf for
    /// +inf); NaN where the reference has NaN is a match.
    pub non_finite: usize,
    /// Elements the result lacks, or has beyond the reference: a truncated or oversized
    /// result fails whatever its values.
    pub missing: usize,
    /// Elements whose error exceeds their own bound (see [`ErrorStats::within`]).
    pub over_bound: usize,
}

impl ErrorStats {
    pub fn of(got: &[f32], want: &[f64]) -> Self {
        Self::within(got, want, |_| f64::INFINITY)
    }

    /// Like [`ErrorStats::of`], also counting the elements whose error exceeds
    /// `bound(want)`: for bounds that depend on the exact value.
    pub fn within(got: &[f32], want: &[f64], bound: impl Fn(f64) -> f64) -> Self {
        let mut s = ErrorStats {
            missing: got.len().abs_diff(want.len()),
            ..Default::default()
        };
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let g = f64::from(g);
            // Non-finite values must match exactly: NaN where the reference has NaN, the
            // same infinity where it has one.
            let same_non_finite = g == w || (g.is_nan() && w.is_nan());
            if g.is_finite() != w.is_finite() || (!w.is_finite() && !same_non_finite) {
                s.non_finite += 1;
                continue;
            }
            let e = if w.is_finite() { (g - w).abs() } else { 0.0 };
            s.mean_abs += e;
            if e > s.max_abs {
                s.max_abs = e;
                s.argmax = i;
            }
            if e > bound(w) {
                s.over_bound += 1;
            }
        }
        s.mean_abs /= got.len().max(1) as f64;
        s
    }

    /// No bad values, none missing, none past its own bound, and all within `bound`.
    pub fn passes(&self, bound: f64) -> bool {
        self.max_abs <= bound && self.non_finite == 0 && self.missing == 0 && self.over_bound == 0
    }
}

/// One attention problem to check.
#[derive(Clone, Debug)]
pub struct CheckCase {
    pub shape: AttentionShape,
    pub options: AttentionOptions,
    pub dtype: DType,
    pub layout: Layout,
    pub seed: u64,
    /// Inputs are drawn uniformly from `[-range, range)`.
    pub range: f32,
}

/// The outcome of one case.
#[derive(Clone, Debug)]
pub struct CheckOutcome {
    pub kernel: String,
    pub out: ErrorStats,
    pub lse: ErrorStats,
    pub weights: Option<ErrorStats>,
    /// The bound the output error had to meet.
    pub bound: f64,
    pub passed: bool,
}

impl CheckOutcome {
    pub fn summary(&self) -> String {
        format!(
            "{}: max abs err {:.3e} at {} (bound {:.3e}), mean {:.3e}, lse max {:.3e}, weights max {}, non-finite {}, missing {}",
            self.kernel,
            self.out.max_abs,
            self.out.argmax,
            self.bound,
            self.out.mean_abs,
            self.lse.max_abs,
            self.weights
                .as_ref()
                .map_or("-".into(), |w| format!("{:.3e}", w.max_abs)),
            self.out.non_finite + self.lse.non_finite + self.weights.as_ref().map_or(0, |w| w.non_finite),
            self.out.missing + self.lse.missing + self.weights.as_ref().map_or(0, |w| w.missing),
        )
    }
}

/// Random q, k, v for a case, BHSD, as the device will see them (f16-rounded for f16).
pub fn random_qkv(case: &CheckCase) -> [Vec<f32>; 3] {
    let s = &case.shape;
    let mut rng = Rng::new(case.seed);
    let r = case.range;
    let mut draw = |n: usize| {
        let v = rng.vec(n, -r, r);
        match case.dtype {
            DType::F32 => v,
            DType::F16 => v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect(),
        }
    };
    let q = draw(s.batch * s.heads_q * s.len_q * s.head_dim);
    let k = draw(s.batch * s.heads_kv * s.len_k * s.head_dim);
    let v = draw(s.batch * s.heads_kv * s.len_k * s.head_dim_v);
    [q, k, v]
}

// The `check` grid's kernel variants (the CLI's `check` and the web check page).

/// The seed `check` draws its inputs from unless told otherwise (the CLI and the web
/// check page), so a failing case reproduces on either.
pub const DEFAULT_SEED: u64 = 0x5EED_0001;

/// One kernel variant `check` runs.
#[derive(Clone, Debug)]
pub struct Variant {
    pub label: String,
    pub kernel: KernelChoice,
    pub tiling: FusedTiling,
    pub dtype: DType,
    pub precision: Precision,
    /// Where the variant's keys and values come from.
    pub kv: KvSource,
}

/// Where a check case's keys and values come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSource {
    /// Tensors passed to `sdpa`.
    Tensors,
    /// A [`KvCache`] of capacity Lk holding them, each batch element's first key
    /// length rows (all Lk without key lengths), attended with [`KvCache::attend`]:
    /// through its texel mirror where it keeps one (docs/design.md, "KV cache").
    Cache,
}

impl Variant {
    /// Why this adapter cannot run the variant (a fused tiling or decode design whose
    /// needs it does not meet), if it cannot.
    pub fn unmet(&self, ctx: &Context) -> Option<crate::Error> {
        use crate::kernels::decode::DecodeDesign;
        let runs = match self.kernel {
            // `decode/lanes` runs the adapter's own pick, where that is the lanes design
            // (GPUs with a fixed subgroup size); elsewhere it would repeat another row.
            KernelChoice::Decode if self.tiling == FusedTiling::Auto => {
                match DecodeDesign::for_context(ctx, ctx.policy(), self.tiling) {
                    Ok(DecodeDesign::Lanes) => Ok(()),
                    Ok(_) => Err(crate::Error::MissingFeature {
                        adapter: ctx.adapter_info().name.clone(),
                        feature: "a fixed subgroup size on a GPU",
                        needed_for: "the lanes decode design (this adapter decodes with another)".into(),
                    }),
                    Err(e) => Err(e),
                }
            }
            KernelChoice::Decode => DecodeDesign::for_context(ctx, ctx.policy(), self.tiling).map(|_| ()),
            _ => ctx
                .fused_config_for(self.tiling, self.dtype, self.precision)
                .map(|_| ()),
        };
        runs.err()
    }

    /// The case run by this variant.
    pub fn apply(&self, case: &CheckCase) -> CheckCase {
        let mut case = case.clone();
        case.options.kernel = self.kernel;
        case.options.tiling = self.tiling;
        case.options.precision = self.precision;
        case.dtype = self.dtype;
        case
    }

    /// Runs `case` (made by [`Variant::apply`]) and compares it with the reference.
    pub async fn run_async(&self, ctx: &Context, case: &CheckCase) -> Result<CheckOutcome> {
        let [q, k, v] = random_qkv(case);
        run_from_async(ctx, case, self.kv, &q, &k, &v).await
    }

    /// [`Variant::run`] on given BHSD inputs (as the device will see them: f16-rounded
    /// for f16), e.g. holding NaN or infinities.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_with(&self, ctx: &Context, case: &CheckCase, q: &[f32], k: &[f32], v: &[f32]) -> Result<CheckOutcome> {
        pollster::block_on(run_from_async(ctx, case, self.kv, q, k, v))
    }

    /// [`Variant::run_async`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(&self, ctx: &Context, case: &CheckCase) -> Result<CheckOutcome> {
        pollster::block_on(self.run_async(ctx, case))
    }
}

/// Every kernel variant: the materialized path, split-K decode (each design) and each registered fused tiling, in f32
/// and (where the adapter has it) f16. Tilings that multiply in f16 (tensor cores) run
/// their f32 variant at precision medium.
pub fn variants(f16: bool) -> Vec<Variant> {
    let dtypes: &[DType] = if f16 { &[DType::F32, DType::F16] } else { &[DType::F32] };
    let mut v = Vec::new();
    for &dtype in dtypes {
        // Split-K decode in each design (kernels::decode::DecodeDesign): a tiling asked
        // for picks one, `subgroup` the subgroup design, any other (here `registers`,
        // which every adapter meets) the tiled one; none (`decode/lanes`) the adapter's
        // own, run only where that is the lanes design.
        // `decode/kv-cache` is the subgroup design reading a KvCache, which keeps a
        // texel mirror of K and V for that design and decode reads it instead.
        for (name, kernel, tiling, kv) in [
            (
                "materialized",
                KernelChoice::Materialized,
                FusedTiling::Auto,
                KvSource::Tensors,
            ),
            (
                "decode/tiles",
                KernelChoice::Decode,
                FusedTiling::Registers,
                KvSource::Tensors,
            ),
            (
                "decode/subgroup",
                KernelChoice::Decode,
                FusedTiling::Subgroup,
                KvSource::Tensors,
            ),
            (
                "decode/lanes",
                KernelChoice::Decode,
                FusedTiling::Auto,
                KvSource::Tensors,
            ),
            (
                "decode/kv-cache",
                KernelChoice::Decode,
                FusedTiling::Subgroup,
                KvSource::Cache,
            ),
        ] {
            v.push(Variant {
                label: format!("{name} {}", dtype.name()),
                kernel,
                tiling,
                dtype,
                precision: Precision::Highest,
                kv,
            });
        }
        for spec in &crate::kernels::flash::FUSED_TILINGS {
            let medium = spec.f16_products && dtype == DType::F32;
            v.push(Variant {
                label: format!(
                    "fused/{} {}{}",
                    spec.name,
                    dtype.name(),
                    if medium { " medium" } else { "" }
                ),
                kernel: KernelChoice::Fused,
                tiling: spec.tiling,
                dtype,
                precision: if medium { Precision::Medium } else { Precision::Highest },
                kv: KvSource::Tensors,
            });
        }
    }
    v
}

/// A case in one line: shape, layout and masks.
pub fn describe(case: &CheckCase) -> String {
    let s = &case.shape;
    let mut masks = Vec::new();
    if let Some(c) = case.options.causal {
        masks.push(format!("causal {c:?}"));
    }
    if case.options.key_lengths.is_some() {
        masks.push("key-lengths".into());
    }
    if let Some(m) = &case.options.mask {
        masks.push(match m.values() {
            crate::options::MaskValues::Bool(_) => "bool-mask".into(),
            crate::options::MaskValues::Additive(_) => "additive-mask".into(),
        });
    }
    if let Some(w) = case.options.window {
        masks.push(format!("window {w}"));
    }
    if case.options.alibi_slopes.is_some() {
        masks.push("alibi".into());
    }
    if let Some(cap) = case.options.softcap {
        masks.push(format!("softcap {cap:.2}"));
    }
    let weights = match (case.options.need_weights, case.options.average_weights) {
        (false, _) => "",
        (true, false) => ", weights",
        (true, true) => ", averaged weights",
    };
    format!(
        "B{} Hq{} Hkv{} Lq{} Lk{} D{} Dv{} {:?} {}{weights}",
        s.batch,
        s.heads_q,
        s.heads_kv,
        s.len_q,
        s.len_k,
        s.head_dim,
        s.head_dim_v,
        case.layout,
        if masks.is_empty() {
            "no mask".into()
        } else {
            masks.join("+")
        }
    )
}

/// Runs a case on the GPU and compares out, lse and (if asked) weights with the reference.
#[cfg(not(target_arch = "wasm32"))]
pub fn run_case(ctx: &Context, case: &CheckCase) -> Result<CheckOutcome> {
    pollster::block_on(run_case_async(ctx, case))
}

/// Like [`run_case`] with given BHSD inputs (e.g. with NaN planted at masked keys).
#[cfg(not(target_arch = "wasm32"))]
pub fn run_case_with(ctx: &Context, case: &CheckCase, q: &[f32], k: &[f32], v: &[f32]) -> Result<CheckOutcome> {
    pollster::block_on(run_case_with_async(ctx, case, q, k, v))
}

/// [`run_case`], awaited (the only form on the web).
pub async fn run_case_async(ctx: &Context, case: &CheckCase) -> Result<CheckOutcome> {
    let [q, k, v] = random_qkv(case);
    run_case_with_async(ctx, case, &q, &k, &v).await
}

/// [`run_case_with`], awaited.
pub async fn run_case_with_async(
    ctx: &Context,
    case: &CheckCase,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Result<CheckOutcome> {
    run_from_async(ctx, case, KvSource::Tensors, q, k, v).await
}

/// Runs a case with its keys and values from `kv` and compares it with the reference.
async fn run_from_async(
    ctx: &Context,
    case: &CheckCase,
    kv: KvSource,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Result<CheckOutcome> {
    let s = &case.shape;
    let upload = |data: &[f32], shape: [usize; 4]| {
        let laid = relayout(data, shape, Layout::Bhsd, case.layout);
        Tensor::from_f32_as(ctx, shape, case.layout, case.dtype, &laid)
    };
    // In one awaited scope, which on the web is what catches the uploads' errors.
    let (qt, kt, vt) = ctx
        .scoped_async("uploading the inputs", || {
            Ok((
                upload(q, [s.batch, s.heads_q, s.len_q, s.head_dim])?,
                upload(k, [s.batch, s.heads_kv, s.len_k, s.head_dim])?,
                upload(v, [s.batch, s.heads_kv, s.len_k, s.head_dim_v])?,
            ))
        })
        .await?;
    let options = AttentionOptions {
        need_lse: true,
        ..case.options.clone()
    };
    // `options` become what the reference computes: for a cache, the options it
    // attends with (its lengths as key lengths, positions aligned to them).
    let (result, options, source) = match kv {
        KvSource::Tensors => (sdpa_async(ctx, &qt, &kt, &vt, &options).await?, options, ""),
        KvSource::Cache => {
            let (cache, options) = cache_holding(ctx, case, &kt, &vt, options)?;
            let source = if cache.has_texel_mirror() {
                ", from a KV cache's texel mirror"
            } else {
                ", from a KV cache"
            };
            (
                cache.attend(ctx, &qt, &options)?,
                cache.attend_options(&options)?,
                source,
            )
        }
    };
    let resolved = resolve_kernel(ctx, case.dtype, &options, s)?;
    let kernel = format!("{}{source}", resolved.name());
    // f32 inputs on a path that multiplies in f16 (Precision::Medium) are rounded to f16.
    let rounds_inputs = case.dtype == DType::F32 && resolved.f16_products();
    let out_layout = result.out.layout();
    let out = relayout(
        &result.out.to_f32_vec_async(ctx).await?,
        s.out_shape(),
        out_layout,
        Layout::Bhsd,
    );
    // Asked for above; a path that returned none fails as `missing`.
    let lse = match &result.lse {
        Some(t) => t.to_f32_vec_async(ctx).await?,
        None => Vec::new(),
    };
    let weights = match &result.weights {
        Some(t) => Some(t.to_f32_vec_async(ctx).await?),
        None => None,
    };

    let want = reference::attention(q, k, v, s, &options)?;
    let out_stats = ErrorStats::of(&out, &want.out);
    let lse_stats = ErrorStats::of(&lse, &want.lse);
    let weights_bound = Tolerance::weights_bound(s, &want);
    let weight_stats = match (&weights, options.need_weights) {
        (Some(w), _) => Some(ErrorStats::within(w, &want.weights, weights_bound)),
        // Asked for and not returned: every element missing.
        (None, true) => Some(ErrorStats::within(&[], &want.weights, weights_bound)),
        (None, false) => None,
    };
    let bound = if case.dtype == DType::F16 || rounds_inputs {
        let naive = naive_f16_error(q, k, v, s, &options, &want.out, rounds_inputs)?;
        Tolerance::F16.bound(s, &want, naive)
    } else {
        Tolerance::F32.bound(s, &want, 0.0)
    };
    let lse_bound = Tolerance::lse_bound(s, &want)
        + if rounds_inputs {
            f16_input_score_error(want.max_abs_product)
        } else {
            0.0
        };
    let passed = out_stats.passes(bound)
        && lse_stats.passes(lse_bound)
        && weight_stats.as_ref().is_none_or(|w| w.passes(f64::INFINITY));
    Ok(CheckOutcome {
        kernel,
        out: out_stats,
        lse: lse_stats,
        weights: weight_stats,
        bound,
        passed,
    })
}

/// A cache of capacity Lk (the case's layout and dtype) holding the first key-length
/// rows of `k` and `v` per batch element (all without key lengths), and the options to
/// attend it with: `options` less the key lengths, which the cache supplies.
fn cache_holding(
    ctx: &Context,
    case: &CheckCase,
    k: &Tensor,
    v: &Tensor,
    mut options: AttentionOptions,
) -> Result<(KvCache, AttentionOptions)> {
    let s = &case.shape;
    let lengths = options
        .key_lengths
        .take()
        .unwrap_or_else(|| vec![s.len_k as u32; s.batch]);
    let mut cache = KvCache::for_shape(ctx, s, case.layout, case.dtype)?;
    cache.append_rows(ctx, k, v, &lengths)?;
    Ok((cache, options))
}

impl Tolerance {
    /// The absolute bound on the output error against the reference `want`;
    /// `naive_f16_error` is used by [`Tolerance::F16`] only.
    pub fn bound(self, s: &AttentionShape, want: &ReferenceOutput, naive_f16_error: f64) -> f64 {
        let eps = f64::from(f32::EPSILON);
        let f32_bound = want.max_abs_value * (2.0 * score_error(s, want.max_abs_product) + sum_error(s)) + eps;
        match self {
            Tolerance::F32 => f32_bound,
            Tolerance::F16 => 2.0 * naive_f16_error + 1e-5 + f32_bound,
        }
    }

    /// The bound on a row's log-sum-exp, `m + log(l)`: one score's error δ, the
    /// rounding of the sum, and that of an f32 of magnitude up to the largest |score|.
    pub fn lse_bound(s: &AttentionShape, want: &ReferenceOutput) -> f64 {
        let eps = f64::from(f32::EPSILON);
        score_error(s, want.max_abs_product) + sum_error(s) + 2.0 * eps * (1.0 + want.max_abs_score)
    }

    /// The bound on one attention weight whose exact value is `w`, for every dtype (the
    /// weights are computed in f32 from the stored inputs):
    /// `|ŵ − w| ≤ 4δ · w(1 − w) + 2ε(2 + log2 Lk) · w + ε`.
    ///
    /// Normalising against the maximum of the same rounded scores moves a weight by at
    /// most `2δ · w(1 − w)` to first order (twice that here, for the second-order
    /// terms), so a weight that is (nearly) 1 or 0 is exact at any logit scale; the
    /// other terms are the rounding of exp, the row sum and the division. A path that
    /// normalised with a log-sum-exp from a different computation of the scores misses
    /// this by `w · δ` and fails at logits of 1e3.
    pub fn weights_bound(s: &AttentionShape, want: &ReferenceOutput) -> impl Fn(f64) -> f64 {
        let eps = f64::from(f32::EPSILON);
        let delta = score_error(s, want.max_abs_product);
        let sum_terms = sum_error(s);
        move |w| 4.0 * delta * w * (1.0 - w) + sum_terms * w + eps
    }
}

/// The error one score takes from rounding f32 inputs to f16 (Precision::Medium):
/// each product `q_t k_t` moves by at most `2u + u²` relatively, u = 2^-11, so the
/// score by `(2u + u²) · A` with A as in [`score_error`] (`4.9e-4 · A` in all).
pub fn f16_input_score_error(max_abs_product: f64) -> f64 {
    let u = 2f64.powi(-11);
    (2.0 * u + u * u) * max_abs_product
}

/// Max error of a naive f16 implementation against the f64 reference: scores,
/// probabilities and output rounded to f16 at each step, and with `round_inputs` the
/// inputs too (f32 inputs multiplied in f16).
fn naive_f16_error(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &AttentionShape,
    options: &AttentionOptions,
    want: &[f64],
    round_inputs: bool,
) -> Result<f64> {
    let r16 = |x: f64| f64::from(f16::from_f64(x).to_f32());
    let input = |x: f32| if round_inputs { r16(f64::from(x)) } else { f64::from(x) };
    let scale = f64::from(s.scale(options));
    let mut max_err: f64 = 0.0;
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = s.kv_head(h);
            for i in 0..s.len_q {
                let row = (b * s.heads_q + h) * s.len_q + i;
                let scores: Vec<Option<f64>> = (0..s.len_k)
                    .map(|j| {
                        reference::visible(s, options, b, h, i, j).map(|bias| {
                            let dot: f64 = (0..s.head_dim)
                                .map(|t| {
                                    input(q[row * s.head_dim + t])
                                        * input(k[((b * s.heads_kv + hk) * s.len_k + j) * s.head_dim + t])
                                })
                                .sum();
                            r16(reference::soft_capped(options, r16(dot) * scale) + bias.total())
                        })
                    })
                    .collect();
                let max = reference::row_max(scores.iter().flatten().copied());
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = scores.iter().flatten().map(|x| (x - max).exp()).sum();
                for c in 0..s.head_dim_v {
                    let mut o = 0.0;
                    for (j, sc) in scores.iter().enumerate() {
                        if let Some(x) = sc {
                            let pr = r16((x - max).exp() / sum);
                            o += pr * input(v[((b * s.heads_kv + hk) * s.len_k + j) * s.head_dim_v + c]);
                        }
                    }
                    // Non-finite references are compared exactly, not bounded.
                    let w = want[row * s.head_dim_v + c];
                    if w.is_finite() {
                        max_err = max_err.max((r16(o) - w).abs());
                    }
                }
            }
        }
    }
    Ok(max_err)
}

/// The fixed grid of awkward cases `check` and the tests run: lengths 1, 7, 97, 239
/// (and 1025 where cheap), head dims from docs/design.md, GQA, Lq != Lk both ways, every
/// mask kind and both causal alignments, sliding windows, ALiBi and soft-capping, both
/// layouts.
pub fn standard_grid(seed: u64) -> Vec<CheckCase> {
    let mut rng = Rng::new(seed);
    let mut cases = Vec::new();
    let base = AttentionShape::new;
    let shapes = [
        base(1, 1, 1, 1, 1, 8, 8),
        base(2, 2, 1, 7, 97, 40, 40),
        base(1, 4, 2, 97, 7, 59, 59),
        base(2, 2, 2, 239, 239, 64, 64),
        base(1, 3, 1, 33, 65, 80, 96),
        base(1, 2, 2, 17, 31, 111, 111),
        base(1, 1, 1, 23, 41, 128, 128),
        base(1, 2, 1, 9, 1025, 96, 96),
        base(1, 1, 1, 5, 19, 256, 256),
        base(1, 1, 1, 13, 13, 3, 5),
    ];
    for (n, shape) in shapes.into_iter().enumerate() {
        let causal = match n % 3 {
            0 => None,
            1 => Some(CausalAlignment::TopLeft),
            _ => Some(CausalAlignment::BottomRight),
        };
        let key_lengths = (n % 2 == 1).then(|| (0..shape.batch).map(|_| rng.below(shape.len_k + 1) as u32).collect());
        let mask = match n % 4 {
            1 => Some(random_bool_mask(&mut rng, [shape.batch, 1, shape.len_q, shape.len_k])),
            3 => Some(random_additive_mask(&mut rng, [1, shape.heads_q, 1, shape.len_k])),
            _ => None,
        };
        // Sliding windows on a third of the shapes (one side unbounded in two of
        // them), ALiBi and soft-capping on others, so every kernel meets each mixed
        // with the rest.
        let window = match n % 3 {
            2 => Some(Window {
                left: Some(rng.below(shape.len_k / 2 + 2)),
                right: (n != 2).then(|| rng.below(shape.len_k / 4 + 2)),
            }),
            0 if n > 0 && n % 2 == 1 => Some(Window {
                left: None,
                right: Some(rng.below(3)),
            }),
            _ => None,
        };
        let alibi_slopes = (n % 4 == 2 || n == 9).then(|| alibi_slopes(shape.heads_q));
        let softcap = (n % 3 == 1 || n == 5 || n == 6).then(|| rng.uniform(0.5, 3.0));
        cases.push(CheckCase {
            shape,
            options: AttentionOptions {
                causal,
                key_lengths,
                mask,
                window,
                alibi_slopes,
                softcap,
                need_weights: n % 2 == 0 || n == 3,
                average_weights: n == 3 || n == 4,
                ..Default::default()
            },
            dtype: DType::F32,
            layout: if n % 2 == 0 { Layout::Bhsd } else { Layout::Bshd },
            seed: seed.wrapping_add(n as u64),
            range: 1.0,
        });
    }
    // The commonest calls: causality and padding and no other rule. A kernel may take a
    // fast path where no rule applies to a block, which the mixed cases above never
    // reach (the subgroup tiling skips its masking loop there).
    let plain = [
        (
            base(2, 4, 2, 37, 70, 64, 64),
            CausalAlignment::BottomRight,
            Some(vec![70, 45]),
            Layout::Bshd,
        ),
        (
            base(1, 2, 2, 50, 50, 32, 32),
            CausalAlignment::TopLeft,
            None,
            Layout::Bhsd,
        ),
    ];
    for (shape, causal, key_lengths, layout) in plain {
        let n = cases.len() as u64;
        cases.push(CheckCase {
            shape,
            options: AttentionOptions {
                causal: Some(causal),
                key_lengths,
                ..Default::default()
            },
            dtype: DType::F32,
            layout,
            seed: seed.wrapping_add(n),
            range: 1.0,
        });
    }
    cases
}

/// The ALiBi slopes of the paper for `heads` heads: the geometric sequence
/// `2^(-8/n), 2^(-16/n), ...` with n the next power of two (the interleaving for other
/// head counts does not matter to a test).
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    let n = heads.next_power_of_two() as f32;
    (1..=heads).map(|h| 2f32.powf(-8.0 * h as f32 / n)).collect()
}

/// A boolean mask of the given (broadcastable) shape, about 70% visible.
pub fn random_bool_mask(rng: &mut Rng, shape: [usize; 4]) -> Mask {
    let n = shape.iter().product();
    let values = (0..n).map(|_| rng.uniform(0.0, 1.0) < 0.7).collect();
    Mask::boolean(&shape, values).expect("shape and length agree")
}

/// An additive mask of the given shape: values in [-2, 2), about 20% -inf.
pub fn random_additive_mask(rng: &mut Rng, shape: [usize; 4]) -> Mask {
    let n = shape.iter().product();
    let values = (0..n)
        .map(|_| {
            if rng.uniform(0.0, 1.0) < 0.2 {
                f32::NEG_INFINITY
            } else {
                rng.uniform(-2.0, 2.0)
            }
        })
        .collect();
    Mask::additive(&shape, values).expect("shape and length agree")
}

mod backward;
#[cfg(not(target_arch = "wasm32"))]
mod linear;
#[cfg(not(target_arch = "wasm32"))]
pub use backward::run_backward_case;
pub use backward::{backward_magnitudes, backward_rel_bound, run_backward_case_async, BackwardOutcome};
#[cfg(not(target_arch = "wasm32"))]
pub use linear::{linear_grid, linear_tilings, run_linear_case, LinearCase, LinearOutcome};
