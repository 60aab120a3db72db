//! The tensor-core kernels' logic on an adapter without tensor cores: `flash_coop.wgsl`
//! and `matmul_coop.wgsl` with their cooperative-matrix operations emulated in plain
//! WGSL (`kernels::coop_emulation`), against the f64 reference with the f16 rule. This
//! checks staging, padding, masking, the online softmax with its deferred rescale, GQA,
//! layouts and the GEMM epilogue; the tensor cores themselves only a GPU run checks.
//! Shapes stay small: the emulation is slow and its loops count against llvmpipe's cap.

use crate::common;
use common::paged::{PagedInputs, D};
use wgpu_attention::check::{random_additive_mask, random_bool_mask, run_backward_case, run_case, CheckCase, Rng};
use wgpu_attention::kernels::matmul::{encode_linear, Linear, LinearTiling};
use wgpu_attention::{
    backward_tiling, sdpa, sdpa_backward, AttentionOptions, AttentionShape, BackwardTiling, CausalAlignment, Context,
    DType, FusedTiling, KernelChoice, Layout, Precision, Tensor, Window,
};

/// A context that emulates cooperative matrices (`common::emulating_ctx`: skips where
/// the adapter cannot, except on lavapipe through Vulkan under
/// `WGPU_ATTENTION_REQUIRE_ADAPTER=1`, where it fails).
fn emulating() -> Option<Context> {
    common::emulating_ctx()
}

fn coop_case(shape: AttentionShape, options: AttentionOptions, dtype: DType, seed: u64) -> CheckCase {
    CheckCase {
        shape,
        options: AttentionOptions {
            kernel: KernelChoice::Fused,
            tiling: FusedTiling::Coop,
            precision: Precision::Medium,
            ..options
        },
        dtype,
        layout: Layout::Bhsd,
        seed,
        range: 1.0,
    }
}

fn assert_passes(ctx: &Context, case: &CheckCase) {
    let outcome = run_case(ctx, case).unwrap_or_else(|e| panic!("seed {}: {e}\n{case:?}", case.seed));
    assert_eq!(outcome.kernel, "fused/coop", "seed {}", case.seed);
    assert!(
        outcome.passed,
        "seed {} {:?} {:?} {:?}: {}",
        case.seed,
        case.shape,
        case.dtype,
        case.options.causal,
        outcome.summary()
    );
}

#[test]
fn fused_coop_matches_the_reference_across_shapes_masks_and_dtypes() {
    let Some(ctx) = emulating() else { return };
    let mut rng = Rng::new(71);
    let shapes = [
        // Head dims below, at and past one 16-wide chunk; Dv != D; GQA; Lq, Lk not
        // multiples of 16 or of the tile; one query row; one key.
        AttentionShape::new(1, 2, 2, 19, 45, 16, 16),
        AttentionShape::new(2, 4, 2, 37, 29, 24, 40),
        AttentionShape::new(1, 2, 1, 1, 64, 64, 64),
        AttentionShape::new(1, 1, 1, 70, 1, 8, 8),
        AttentionShape::new(1, 2, 2, 33, 130, 80, 36),
    ];
    let mut seed = 100;
    for shape in shapes {
        for dtype in [DType::F16, DType::F32] {
            for variant in 0..4 {
                seed += 1;
                let [b, hq, lq, lk] = [shape.batch, shape.heads_q, shape.len_q, shape.len_k];
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
                        need_weights: true,
                        ..Default::default()
                    },
                    _ => AttentionOptions {
                        mask: Some(random_additive_mask(&mut rng, [1, hq, 1, lk])),
                        output_layout: Some(Layout::Bshd),
                        ..Default::default()
                    },
                };
                let mut case = coop_case(shape, options, dtype, seed);
                if variant == 3 {
                    case.layout = Layout::Bshd;
                }
                assert_passes(&ctx, &case);
            }
        }
    }
}

#[test]
fn fused_coop_reads_paged_keys_as_the_gathered_ones_bit_for_bit() {
    // Pages of 5 rows: the 64-key staging tiles straddle pages (tests/paged_kv.rs runs
    // the other paths).
    let Some(ctx) = emulating() else { return };
    let mut rng = Rng::new(77);
    let (batch, heads_q, lq) = (3, 4, 21);
    let paged = PagedInputs::new(&ctx, DType::F16, &mut rng, (batch, 17, 60));
    let q: Vec<f32> = rng.vec(batch * heads_q * lq * D, -1.0, 1.0);
    let q = Tensor::from_f32_as(&ctx, [batch, heads_q, lq, D], Layout::Bhsd, DType::F16, &q).expect("upload");
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        key_lengths: Some(vec![85, 40, 3]),
        align_to_key_lengths: true,
        need_lse: true,
        ..coop_case(
            AttentionShape::new(1, 1, 1, 1, 1, 1, 1),
            Default::default(),
            DType::F16,
            77,
        )
        .options
    };
    paged.assert_same(&ctx, &q, &options, "seed 77 fused/coop (emulated)");
}

#[test]
fn fused_coop_defers_the_rescale_correctly_at_large_logits() {
    // Scores of magnitude ~20 to 60: row maxima climb by more than TAU = 8 from tile to
    // tile, so the output tiles go through the rescale; key length 0 leaves rows unseen.
    let Some(ctx) = emulating() else { return };
    let options = AttentionOptions {
        key_lengths: Some(vec![0, 61]),
        ..Default::default()
    };
    for (dtype, seed) in [(DType::F16, 301), (DType::F32, 302)] {
        let mut case = coop_case(
            AttentionShape::new(2, 2, 2, 21, 61, 32, 32),
            options.clone(),
            dtype,
            seed,
        );
        case.range = 8.0;
        assert_passes(&ctx, &case);
    }
}

#[test]
fn f32_inputs_take_tensor_cores_only_below_the_highest_precision() {
    let Some(ctx) = emulating() else { return };
    let at = |precision| {
        ctx.fused_config_for(FusedTiling::Auto, DType::F32, precision)
            .map(|c| c.name())
    };
    // A CPU adapter picks its own tilings when asked for none; tensor cores are never
    // picked for it, but can be asked for.
    assert_ne!(at(Precision::Medium).ok(), Some("coop"));
    assert!(ctx
        .fused_config_for(FusedTiling::Coop, DType::F32, Precision::Highest)
        .is_err());
    assert!(ctx
        .fused_config_for(FusedTiling::Coop, DType::F32, Precision::Medium)
        .is_ok());
    assert!(ctx
        .fused_config_for(FusedTiling::Coop, DType::F16, Precision::Highest)
        .is_ok());
    assert_eq!(
        ctx.linear_tiling_for(DType::F16, Precision::Highest),
        LinearTiling::Coop
    );
    assert_ne!(
        ctx.linear_tiling_for(DType::F32, Precision::Highest),
        LinearTiling::Coop
    );
}

/// One coop GEMM case: Y = X · Wᵀ (+ bias) split into `widths`, X with row stride
/// `x_stride`, W and bias from row `w_row0` on.
struct GemmCase {
    m: usize,
    k: usize,
    x_stride: usize,
    widths: &'static [usize],
    w_row0: usize,
    bias: bool,
}

fn assert_coop_gemm(ctx: &Context, case: &GemmCase, dtype: DType, seed: u64) {
    let GemmCase {
        m,
        k,
        x_stride,
        widths,
        w_row0,
        bias,
    } = *case;
    let n: usize = widths.iter().sum();
    let rows = w_row0 + n;
    let mut rng = Rng::new(seed);
    let x: Vec<f32> = rng.vec((m - 1) * x_stride + k, -1.0, 1.0);
    let w: Vec<f32> = rng.vec(rows * k, -1.0, 1.0);
    let b: Vec<f32> = rng.vec(rows, -1.0, 1.0);
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect() };
    let (x16, w16, b_used) = (
        round(&x),
        round(&w),
        if dtype == DType::F16 { round(&b) } else { b.clone() },
    );
    let upload = |v: &[f32]| Tensor::sequence(ctx, [1, 1, v.len()], dtype, v).expect("upload");
    let (xt, wt, bt) = (upload(&x), upload(&w), upload(&b));
    let outs: Vec<Tensor> = widths
        .iter()
        .map(|&wd| Tensor::empty(ctx, [1, 1, m, wd], Layout::Bhsd, dtype).expect("output"))
        .collect();
    let outputs: Vec<(&wgpu_attention::wgpu::Buffer, usize)> =
        outs.iter().zip(widths).map(|(t, &wd)| (t.buffer(), wd)).collect();
    let linear = Linear {
        x: xt.buffer(),
        x_stride,
        w: wt.buffer(),
        w_packed: None,
        bias: bias.then(|| bt.buffer()),
        w_row0,
        outputs: &outputs,
        m,
        k,
    };
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    encode_linear(ctx, ctx.policy(), &mut encoder, dtype, LinearTiling::Coop, &linear).expect("records");
    ctx.queue().submit([encoder.finish()]);
    let mut col0 = 0;
    for (t, &wd) in outs.iter().zip(widths) {
        let got = t.to_f32_vec(ctx).expect("readback");
        for r in 0..m {
            for c in 0..wd {
                let j = w_row0 + col0 + c;
                // The products see f16 operands (exact in f32); the f32 sum of k terms
                // and the bias is off by at most (k + 1)·ε·Σ|terms|; f16 storage rounds
                // the result once more.
                let terms: Vec<f64> = (0..k)
                    .map(|t| f64::from(x16[r * x_stride + t]) * f64::from(w16[j * k + t]))
                    .collect();
                let bias_term = if bias { f64::from(b_used[j]) } else { 0.0 };
                let want = terms.iter().sum::<f64>() + bias_term;
                let magnitude = terms.iter().map(|t| t.abs()).sum::<f64>() + bias_term.abs();
                let stored_rounding = if dtype == DType::F16 {
                    want.abs() * 2f64.powi(-11)
                } else {
                    0.0
                };
                let bound = (k + 1) as f64 * f64::from(f32::EPSILON) * magnitude + stored_rounding;
                let err = (f64::from(got[r * wd + c]) - want).abs();
                assert!(
                    err <= bound,
                    "seed {seed} {dtype:?} m={m} k={k} stride={x_stride} widths={widths:?} w_row0={w_row0} \
                     ({r}, {}): got {} want {want} (bound {bound})",
                    col0 + c,
                    got[r * wd + c]
                );
            }
        }
        col0 += wd;
    }
}

#[test]
fn coop_gemm_matches_a_reference_with_bias_and_split() {
    let Some(ctx) = emulating() else { return };
    // Blocks are 64 x 64 under the emulation (`matmul::coop_tiles`; 128 x 128 on tensor
    // cores, the same code with more tiles per subgroup), slabs 32 deep; operands are
    // staged in 16-byte words (8 f16 or 4 f32) where K and X's row stride are multiples
    // of a word, else element by element. Each workgroup-slab takes llvmpipe seconds
    // emulated: shapes stay small.
    let cases = [
        // m, k, n not multiples of the block or the slab; K not a multiple of a word:
        // element staging throughout; three outputs, bias.
        (
            GemmCase {
                m: 70,
                k: 45,
                x_stride: 45,
                widths: &[20, 30, 9],
                w_row0: 0,
                bias: true,
            },
            &[DType::F16][..],
        ),
        // Words: block (0, 0) is interior for its first slab (no checks) and an edge in
        // K for the second; the others are edges in M, N or both. A split at a column
        // inside a 16 x 16 tile; W and bias from row 3.
        (
            GemmCase {
                m: 80,
                k: 40,
                x_stride: 40,
                widths: &[37, 40],
                w_row0: 3,
                bias: true,
            },
            &[DType::F16, DType::F32][..],
        ),
        // One whole interior block, K a multiple of the slab, X's rows padded (stride
        // a multiple of a word); no bias, one output.
        (
            GemmCase {
                m: 64,
                k: 64,
                x_stride: 72,
                widths: &[64],
                w_row0: 0,
                bias: false,
            },
            &[DType::F16, DType::F32][..],
        ),
        // K a whole number of f32 words but X's stride not: element staging in f32.
        (
            GemmCase {
                m: 33,
                k: 36,
                x_stride: 37,
                widths: &[17],
                w_row0: 1,
                bias: true,
            },
            &[DType::F32][..],
        ),
    ];
    let mut seed = 81;
    for (case, dtypes) in &cases {
        for &dtype in *dtypes {
            seed += 1;
            assert_coop_gemm(&ctx, case, dtype, seed);
        }
    }
}

#[test]
fn direct_coop_gemm_matches_a_reference_at_clamped_edges() {
    // The direct design loads every fragment from X's and W's rows; at the edges it
    // clamps a fragment's first row (column) to M - 16 (N - 16) and stores only what
    // the tile owns. M 40 and N 50 clamp both ways inside one 64 x 64 block (2 x 2 tiles
    // a subgroup under the emulation); 16 x 16 is the least it serves; K 40 (not whole
    // fragments) runs the staged kernel.
    use wgpu_attention::kernels::matmul::direct_serves;
    let Some(mut ctx) = emulating() else { return };
    ctx.use_direct_coop_gemm(true);
    let cases = [
        GemmCase {
            m: 40,
            k: 48,
            x_stride: 56,
            widths: &[20, 30],
            w_row0: 3,
            bias: true,
        },
        GemmCase {
            m: 16,
            k: 32,
            x_stride: 32,
            widths: &[16],
            w_row0: 0,
            bias: false,
        },
        GemmCase {
            m: 70,
            k: 40,
            x_stride: 40,
            widths: &[37],
            w_row0: 0,
            bias: true,
        },
    ];
    // direct_serves reads the shapes only.
    let placeholder = ctx.device().create_buffer(&wgpu_attention::wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu_attention::wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for (i, case) in cases.iter().enumerate() {
        let outputs: Vec<_> = case.widths.iter().map(|&w| (&placeholder, w)).collect();
        let linear = Linear {
            x: &placeholder,
            x_stride: case.x_stride,
            w: &placeholder,
            w_packed: None,
            bias: None,
            w_row0: case.w_row0,
            outputs: &outputs,
            m: case.m,
            k: case.k,
        };
        assert_eq!(direct_serves(DType::F16, &linear), i < 2, "case {i}");
        assert_coop_gemm(&ctx, case, DType::F16, 91 + i as u64);
    }
}

#[test]
fn the_emulated_kernel_splits_long_key_ranges_under_a_loop_cap() {
    // The D = 80 case above walks its 130 keys in two dispatches, the second resuming
    // from the first's output rows and log-sum-exps (the `key_begin > 0` path).
    use wgpu_attention::kernels::flash::FlashConfig;
    use wgpu_attention::kernels::loop_budget::{keys_per_dispatch, LLVMPIPE_LOOP_CAP};
    let Some(ctx) = emulating() else { return };
    let config = FlashConfig {
        tiling: FusedTiling::Coop,
    };
    let keys = keys_per_dispatch(
        &config,
        &AttentionShape::new(1, 2, 2, 33, 130, 80, 36),
        LLVMPIPE_LOOP_CAP,
        ctx.capabilities(),
        ctx.policy(),
    );
    assert!(keys.is_some_and(|k| k < 130 && k % 4 == 0), "{keys:?}");
}

#[test]
fn every_variant_the_picker_can_choose_runs_at_constants_lavapipe_allows() {
    // The 48 KiB variants an NVIDIA GPU gets cannot compile on lavapipe's 32 KiB; the
    // same code at a smaller head-dim class (and, where needed, fewer rows) keeps their
    // key tile, bands and loop shape. Each is pinned as a tuning table would pin it.
    use wgpu_attention::kernels::flash::{coop_variant_for, COOP_VARIANTS};
    let Some(mut ctx) = emulating() else { return };
    let bytes = ctx.capabilities().max_workgroup_storage;
    let mut rng = Rng::new(91);
    let mut seed = 900;
    // Each distinct emulatable form once (two picker variants may shrink to the same).
    let mut forms: Vec<_> = COOP_VARIANTS
        .iter()
        .map(|v| v.shrunk_to(bytes).expect("an emulatable form"))
        .collect();
    forms.sort();
    forms.dedup();
    for (n, small) in forms.into_iter().enumerate() {
        ctx.use_coop_variants(vec![small]);
        // One dtype per form, alternating (each emulated compile takes tens of seconds
        // cold; the head dims below are run-time values of the same pipeline).
        let dtype = if n % 2 == 0 { DType::F16 } else { DType::F32 };
        // Head dims in the variant's class (f16 words, and elements at D = dmax - 4),
        // keys over several tiles ending mid-tile, causal and a bool mask.
        for (d, dv) in [(small.dmax, small.dmax), (small.dmax - 4, small.dmax / 2 + 4)] {
            assert_eq!(coop_variant_for(d, dv, ctx.capabilities(), ctx.policy()), small);
            {
                seed += 1;
                let shape = AttentionShape::new(
                    1,
                    2,
                    1,
                    small.br as usize + 3,
                    3 * small.bc as usize + 5,
                    d as usize,
                    dv as usize,
                );
                let options = if seed % 2 == 0 {
                    AttentionOptions {
                        causal: Some(CausalAlignment::BottomRight),
                        ..Default::default()
                    }
                } else {
                    AttentionOptions {
                        mask: Some(random_bool_mask(&mut rng, [1, 2, shape.len_q, shape.len_k])),
                        ..Default::default()
                    }
                };
                assert_passes(&ctx, &coop_case(shape, options, dtype, seed));
            }
        }
    }
}

/// Runs causal (bottom-right) f16 attention with its lse on seeded random inputs of
/// `(B, H, Lq, Lk, D) = (1, 2, lq, lk, d)` once per coop form, each pinned and asserted
/// to be the variant the picker takes, and asserts every form gives the first one's bits
/// (output and lse); then that the result passes the reference.
fn assert_forms_agree_bit_for_bit(
    ctx: &mut Context,
    forms: &[wgpu_attention::kernels::flash::CoopVariant],
    (lq, lk, d): (usize, usize, usize),
    seed: u64,
) {
    let (b, h) = (1, 2);
    let mut rng = Rng::new(seed);
    let q = rng.vec(b * h * lq * d, -1.0, 1.0);
    let k = rng.vec(b * h * lk * d, -1.0, 1.0);
    let v = rng.vec(b * h * lk * d, -1.0, 1.0);
    let upload = |x: &[f32], l: usize| Tensor::from_f32_as(ctx, [b, h, l, d], Layout::Bhsd, DType::F16, x);
    let (q, k, v) = (upload(&q, lq), upload(&k, lk), upload(&v, lk));
    let (q, k, v) = (q.expect("q"), k.expect("k"), v.expect("v"));
    let causal = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    let options = AttentionOptions {
        need_lse: true,
        ..coop_case(
            AttentionShape::new(1, 1, 1, 1, 1, 1, 1),
            causal.clone(),
            DType::F16,
            seed,
        )
        .options
    };
    let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut first = None;
    for &form in forms {
        ctx.use_coop_variants(vec![form]);
        // Pinned, not passed over for the rule (which would compare a kernel with itself).
        let runs =
            wgpu_attention::kernels::flash::coop_variant_for(d as u32, d as u32, ctx.capabilities(), ctx.policy());
        assert_eq!(runs, form);
        let out = sdpa(ctx, &q, &k, &v, &options).expect("runs");
        let lse = out.lse.expect("lse").to_f32_vec(ctx).expect("lse");
        let got = (bits(&out.out.to_f32_vec(ctx).expect("out")), bits(&lse));
        match &first {
            None => first = Some(got),
            Some(first) => assert!(
                *first == got,
                "{} differs from {} at Lk {lk} (seed {seed})",
                form.label(),
                forms[0].label()
            ),
        }
    }
    // And they are right, not only the same.
    let shape = AttentionShape::new(1, 2, 1, lq, lk, d, d);
    assert_passes(ctx, &coop_case(shape, causal, DType::F16, seed));
}

#[test]
fn every_fragment_form_computes_what_the_arrayed_kernel_computes_bit_for_bit() {
    // The generator's forms of one source (kernels::unroll): named fragments, and two
    // bands per subgroup, do the same products in the same order for every row, so they
    // give the same bits. 32x32x48 has 2 output tiles in a group of 3 (a short group).
    // One small variant: each emulated compile takes about a minute cold on Mesa 25.
    // (Two bands of named fragments are retired: CoopVariant::valid_for.)
    use wgpu_attention::kernels::flash::CoopVariant;
    let Some(mut ctx) = emulating() else { return };
    let variant = CoopVariant::new(32, 32, 48);
    let forms: Vec<CoopVariant> = [(1, false), (1, true), (2, false)]
        .into_iter()
        .map(|(bands, named)| variant.with_bands(bands).with_named(named))
        .collect();
    let (lq, lk) = (variant.br as usize + 3, 2 * variant.bc as usize + 7);
    assert_forms_agree_bit_for_bit(&mut ctx, &forms, (lq, lk, 28), 5202);
}

#[test]
fn direct_fragments_compute_what_staged_ones_compute_bit_for_bit() {
    // The `direct` axis loads each K and V fragment from its storage buffer instead of
    // the staged tile: the same f16 values into the same products in the same order, so
    // the same bits, named (one band) or in two bands (arrayed). D = DMAX and Lk a
    // multiple of BC, as kernels::flash::direct_serves wants; a key count it cannot
    // serve runs the staged twin. Then key splits (whose second range starts at key
    // 64, a multiple of BC), top-left causal so that the first block sees no key of
    // that range (its key loop never runs: the last P·V is skipped). Three pipelines in
    // all, 16-key tiles: a direct form's emulated compile is the slowest there is
    // (minutes cold on Mesa 25 at 32-key tiles).
    use wgpu_attention::kernels::flash::CoopVariant;
    let Some(mut ctx) = emulating() else { return };
    let variant = CoopVariant::new(32, 32, 16);
    let forms = [
        variant,
        variant.with_direct(true).with_named(true),
        variant.with_direct(true).with_bands(2),
    ];
    let (lq, d, seed) = (variant.br as usize + 3, 32, 5301);
    for lk in [3 * variant.bc as usize, 3 * variant.bc as usize + 5] {
        assert_forms_agree_bit_for_bit(&mut ctx, &forms, (lq, lk, d), seed);
    }
    ctx.use_coop_variants(vec![forms[1]]);
    ctx.use_key_splits(2).expect("two splits");
    let top_left = AttentionOptions {
        causal: Some(CausalAlignment::TopLeft),
        ..Default::default()
    };
    let shape = AttentionShape::new(1, 2, 1, 3 * variant.br as usize, 96, d, d);
    assert_eq!(
        wgpu_attention::kernels::flash::coop_variant_for(32, 32, ctx.capabilities(), ctx.policy()),
        forms[1]
    );
    assert_passes(&ctx, &coop_case(shape, top_left, DType::F16, seed + 1));
}

/// A backward case on the tensor-core tiling (the forward's `coop` at precision medium,
/// so f32 inputs take it too), checked against the f64 reference gradients with the
/// bound of docs/design.md ("Backward"); the tiling is asserted, not assumed.
fn assert_backward_passes(ctx: &Context, case: &CheckCase) {
    let tiling = backward_tiling(ctx, case.dtype, &case.options, &case.shape).expect("a tiling");
    assert!(
        matches!(tiling, BackwardTiling::Coop(..)),
        "seed {}: {tiling:?}",
        case.seed
    );
    let outcome = run_backward_case(ctx, case).unwrap_or_else(|e| panic!("seed {}: {e}\n{case:?}", case.seed));
    assert!(
        outcome.passed,
        "seed {} {:?} {:?} {:?} {:?}: {}",
        case.seed,
        case.shape,
        case.dtype,
        case.layout,
        tiling,
        outcome.summary()
    );
}

#[test]
fn coop_backward_matches_the_reference_across_shapes_masks_and_dtypes() {
    let Some(ctx) = emulating() else { return };
    let mut rng = Rng::new(3971);
    // Head dims below, at and past a 16-wide chunk and past the 32 class; Dv != D; GQA;
    // lengths off the 16-row bands and 32-row tiles; one query row; one key; buffers
    // shorter than a 16-byte word (f16 at D 4: a placeholder stands in for the words).
    // Both staging paths run: whole-word rows (D 16, 32 in f16, 24/40 in f32) and not.
    // One dtype per shape (each emulated compile takes tens of seconds cold, and a
    // head-dim class in two dtypes is two compiles per pass), chosen so that both
    // staging paths run in f16 and whole words run in both dtypes.
    let shapes = [
        (AttentionShape::new(1, 1, 1, 3, 1, 4, 4), DType::F16),
        (AttentionShape::new(1, 2, 2, 19, 45, 16, 16), DType::F16),
        (AttentionShape::new(2, 4, 2, 37, 29, 24, 40), DType::F32),
        (AttentionShape::new(1, 2, 1, 1, 40, 32, 32), DType::F16),
        (AttentionShape::new(1, 1, 1, 50, 1, 8, 8), DType::F32),
        (AttentionShape::new(1, 2, 2, 33, 70, 64, 36), DType::F16),
    ];
    let mut seed = 39710;
    for (shape, dtype) in shapes {
        for variant in 0..4 {
            seed += 1;
            let [b, hq, lq, lk] = [shape.batch, shape.heads_q, shape.len_q, shape.len_k];
            let options = match variant {
                0 => AttentionOptions::default(),
                1 => AttentionOptions {
                    causal: Some(if seed % 2 == 0 {
                        CausalAlignment::TopLeft
                    } else {
                        CausalAlignment::BottomRight
                    }),
                    key_lengths: Some((0..b).map(|i| (lk - (3 * i).min(lk - 1)) as u32).collect()),
                    ..Default::default()
                },
                2 => AttentionOptions {
                    mask: Some(random_bool_mask(&mut rng, [b, hq, lq, lk])),
                    softcap: Some(2.0),
                    alibi_slopes: Some((0..hq).map(|h| 0.25 / (h + 1) as f32).collect()),
                    ..Default::default()
                },
                _ => AttentionOptions {
                    window: Some(Window {
                        left: Some(6),
                        right: Some(3),
                    }),
                    mask: Some(random_additive_mask(&mut rng, [1, 1, lq, lk])),
                    ..Default::default()
                },
            };
            let mut case = coop_case(shape, options, dtype, seed);
            if seed % 3 == 0 {
                case.layout = Layout::Bshd;
            }
            assert_backward_passes(&ctx, &case);
        }
    }
}

#[test]
fn coop_backward_splits_long_walks_under_the_loop_cap() {
    // Under the emulation's loop cap a walk of a few tiles outgrows one invocation: both
    // passes split theirs across dispatches that add to the previous ones' sums.
    use wgpu_attention::kernels::{backward_coop, loop_budget::LLVMPIPE_LOOP_CAP};
    let Some(ctx) = emulating() else { return };
    let shape = AttentionShape::new(1, 4, 2, 300, 260, 64, 48);
    for (dtype, causal, seed) in [
        (DType::F16, None, 39731),
        (DType::F32, Some(CausalAlignment::BottomRight), 39732),
    ] {
        let case = coop_case(
            shape,
            AttentionOptions {
                causal,
                ..Default::default()
            },
            dtype,
            seed,
        );
        let Ok(BackwardTiling::Coop(v, sg)) = backward_tiling(&ctx, dtype, &case.options, &shape) else {
            panic!("seed {seed}: not the coop tiling");
        };
        assert!(backward_coop::dq_iterations(&v, sg, shape.len_k) > LLVMPIPE_LOOP_CAP);
        assert!(backward_coop::dkdv_iterations(&v, sg, shape.len_q, 2) > LLVMPIPE_LOOP_CAP);
        assert_backward_passes(&ctx, &case);
    }
}

#[test]
fn coop_backward_repeats_bit_for_bit_and_keeps_nan_past_key_lengths_out() {
    // Keys past a key length hold NaN (a KV buffer's unused rows may hold anything):
    // neither the forward nor the gradients may see it, and three runs agree bit for bit.
    let Some(ctx) = emulating() else { return };
    let s = AttentionShape::new(2, 4, 2, 40, 50, 32, 32);
    let lengths = [50usize, 21];
    let mut rng = Rng::new(3973);
    let q = rng.vec(2 * 4 * 40 * 32, -1.0, 1.0);
    let mut k = rng.vec(2 * 2 * 50 * 32, -1.0, 1.0);
    let mut v = rng.vec(2 * 2 * 50 * 32, -1.0, 1.0);
    let d_out = rng.vec(2 * 4 * 40 * 32, -1.0, 1.0);
    for (at, x) in k.iter_mut().chain(v.iter_mut()).enumerate() {
        let key = at / 32 % 50;
        let batch = at / (2 * 50 * 32) % 2;
        if key >= lengths[batch] {
            *x = f32::NAN;
        }
    }
    let upload =
        |data: &[f32], shape| Tensor::from_f32_as(&ctx, shape, Layout::Bhsd, DType::F16, data).expect("upload");
    let (qt, kt, vt, dt) = (
        upload(&q, [2, 4, 40, 32]),
        upload(&k, [2, 2, 50, 32]),
        upload(&v, [2, 2, 50, 32]),
        upload(&d_out, [2, 4, 40, 32]),
    );
    let options = AttentionOptions {
        key_lengths: Some(lengths.iter().map(|&l| l as u32).collect()),
        causal: Some(CausalAlignment::TopLeft),
        need_lse: true,
        ..coop_case(s, Default::default(), DType::F16, 3973).options
    };
    assert!(matches!(
        backward_tiling(&ctx, DType::F16, &options, &s),
        Ok(BackwardTiling::Coop(..))
    ));
    let forward = sdpa(&ctx, &qt, &kt, &vt, &options).expect("forward");
    let lse = forward.lse.as_ref().expect("lse");
    let run = || {
        let g = sdpa_backward(&ctx, &qt, &kt, &vt, &forward.out, lse, &dt, &options).expect("backward");
        [&g.dq, &g.dk, &g.dv].map(|t| t.to_f32_vec(&ctx).expect("read"))
    };
    let first = run();
    for (name, got) in ["dq", "dk", "dv"].iter().zip(&first) {
        assert!(got.iter().all(|x| x.is_finite()), "{name}: not finite");
        assert!(got.iter().any(|&x| x != 0.0), "{name}: all zero");
    }
    // Keys past a length get exactly zero gradients.
    for (name, got) in [("dk", &first[1]), ("dv", &first[2])] {
        for (at, x) in got.iter().enumerate() {
            let (key, batch) = (at / 32 % 50, at / (2 * 50 * 32));
            assert!(
                key < lengths[batch] || *x == 0.0,
                "{name}[{at}] = {x} past the key length"
            );
        }
    }
    for _ in 0..2 {
        let again = run();
        for (a, b) in first.iter().zip(&again) {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "runs differ");
        }
    }
}

#[test]
fn named_coop_backward_computes_what_the_arrayed_one_computes_bit_for_bit() {
    // The backward's named form (kernels::unroll: the owned rows' fragments and the
    // gradient tiles as named values, every loop over them unrolled) does the same
    // products in the same order as the arrayed one: the same bits, and right. D 64 in
    // tiles of 32 (its gradients go out in two groups), Dv 48 (the second group short).
    let Some(mut ctx) = emulating() else { return };
    let seed = 3981;
    let shape = AttentionShape::new(1, 2, 1, 37, 45, 64, 48);
    let mut rng = Rng::new(seed);
    let [lq, lk] = [shape.len_q, shape.len_k];
    let upload = |data: &[f32], s| Tensor::from_f32_as(&ctx, s, Layout::Bhsd, DType::F16, data).expect("upload");
    let q = upload(&rng.vec(2 * lq * 64, -1.0, 1.0), [1, 2, lq, 64]);
    let k = upload(&rng.vec(lk * 64, -1.0, 1.0), [1, 1, lk, 64]);
    let v = upload(&rng.vec(lk * 48, -1.0, 1.0), [1, 1, lk, 48]);
    let d_out = upload(&rng.vec(2 * lq * 48, -1.0, 1.0), [1, 2, lq, 48]);
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        need_lse: true,
        ..coop_case(shape, Default::default(), DType::F16, seed).options
    };
    let forward = sdpa(&ctx, &q, &k, &v, &options).expect("forward");
    let lse = forward.lse.as_ref().expect("lse");
    let mut grads = Vec::new();
    for named in [false, true] {
        ctx.use_named_coop_backward(named);
        let tiling = backward_tiling(&ctx, DType::F16, &options, &shape);
        assert!(
            matches!(tiling, Ok(BackwardTiling::Coop(v, _)) if v.named == named),
            "{tiling:?}"
        );
        let g = sdpa_backward(&ctx, &q, &k, &v, &forward.out, lse, &d_out, &options).expect("backward");
        grads.push([&g.dq, &g.dk, &g.dv].map(|t| t.to_f32_vec(&ctx).expect("read")));
    }
    for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(grads[0].iter().zip(&grads[1])) {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: the named form differs (seed {seed})"
        );
    }
    assert_backward_passes(&ctx, &coop_case(shape, options.clone(), DType::F16, seed));
}

#[test]
fn coop_backward_in_the_128_class_matches_the_reference() {
    // The 128 class (lavapipe's 32 KiB take 128x32x32), each band's two subgroups
    // holding half of its operands and gradients. Emulated, one invocation walks more
    // than Mesa 22's llvmpipe loop cap allows for even 4 keys: it runs where the driver
    // has no cap (Mesa 25 in CI), uncapped.
    let Some(mut ctx) = common::own_ctx() else { return };
    if let Some(cap) = ctx.loop_cap() {
        eprintln!("SKIPPING the 128 class's emulated backward: the driver caps loops at {cap} iterations");
        return;
    }
    if let Err(e) = ctx.emulate_cooperative_matrix() {
        common::skip_lacking(&ctx, &format!("cooperative-matrix emulation ({e})"), true);
        return;
    }
    let shape = AttentionShape::new(1, 2, 1, 21, 35, 100, 72);
    let causal = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        key_lengths: Some(vec![30]),
        ..Default::default()
    };
    for (n, options) in [AttentionOptions::default(), causal].into_iter().enumerate() {
        let case = coop_case(shape, options, DType::F16, 39790 + n as u64);
        assert_backward_passes(&ctx, &case);
    }
}

#[test]
fn head_dim_256_forms_match_the_reference_across_resumes_masks_and_staging() {
    // The D 256 class's two forms as the picker runs them: 256x64x32 splits each band
    // over two subgroups (on lavapipe's 32 KiB, its form at D 128 with the same
    // split), 256x32x16 keeps 8 of Q's 16 chunks in workgroup memory and rotates the
    // output tiles through `ss` (at D 256 itself). Key ranges short enough that every
    // case resumes (key_begin != 0: output columns through ss_col and the rotation),
    // per-batch key lengths, causal and left-window masks, Lq and Lk off the tiles,
    // head dims in whole words or not (WORDS 1 and 0), f32 (precision medium) for one
    // form and f16 for the other, and logits large enough to move row maxima past TAU mid-sequence (the rescale).
    use wgpu_attention::kernels::flash::{coop_variant_for, FlashConfig, COOP_VARIANTS};
    use wgpu_attention::kernels::loop_budget::keys_per_dispatch;
    let Some(probe) = emulating() else { return };
    let bytes = probe.capabilities().max_workgroup_storage;
    let forms: Vec<_> = COOP_VARIANTS
        .iter()
        .filter(|v| v.dmax == 256)
        .map(|v| v.shrunk_to(bytes).expect("an emulatable form"))
        .collect();
    assert!(
        forms.iter().any(|v| v.split == 2) && forms.iter().any(|v| v.qr == 8 && v.dmax == 256),
        "{forms:?}"
    );
    let mut rng = Rng::new(263);
    let mut seed = 2600;
    for form in forms {
        let dmax = form.dmax as usize;
        // (D, Dv, causal, left window, logit range): whole words at dmax and dmax - 64,
        // not at dmax - 2.
        let cases = [
            (dmax, dmax, Some(CausalAlignment::BottomRight), None, 1.0),
            (dmax - 64, dmax, None, Some(form.bc as usize + 3), 1.0),
            (dmax - 2, dmax - 2, Some(CausalAlignment::TopLeft), None, 8.0),
        ];
        let (lq, lk) = (form.br as usize + 5, 4 * form.bc as usize + 7);
        let mut ctx = emulating().expect("emulates");
        ctx.use_coop_variants(vec![form]);
        // A loop cap that cuts every case's keys into at least two ranges (one context
        // per form: each emulated pipeline compiles once, cold, for minutes).
        let config = FlashConfig {
            tiling: FusedTiling::Coop,
        };
        let shape_of = |d: usize, dv: usize| AttentionShape::new(2, 2, 1, lq, lk, d, dv);
        let keys = |cap: u64, d: usize, dv: usize| {
            keys_per_dispatch(&config, &shape_of(d, dv), cap, ctx.capabilities(), ctx.policy())
        };
        let mut cap = wgpu_attention::kernels::loop_budget::LLVMPIPE_LOOP_CAP;
        while cases
            .iter()
            .any(|&(d, dv, ..)| keys(cap, d, dv).is_some_and(|k| k >= lk / 2))
        {
            cap = cap * 7 / 8;
        }
        assert!(
            cases.iter().all(|&(d, dv, ..)| keys(cap, d, dv).is_some()),
            "{}: no cap splits {lk} keys",
            form.label()
        );
        ctx.limit_loop_iterations(cap);
        // One dtype per form (each pipeline compiles cold for minutes in CI): f32 where
        // the split form's class (D 128 here) would stage f16 early (EARLY_FETCH), so
        // both forms run copy_words when staged in words.
        let dtype = if form.split == 2 { DType::F32 } else { DType::F16 };
        for &(d, dv, causal, left, range) in &cases {
            seed += 1;
            assert_eq!(
                coop_variant_for(d as u32, dv as u32, ctx.capabilities(), ctx.policy()),
                form
            );
            let options = AttentionOptions {
                causal,
                window: left.map(|l| Window {
                    left: Some(l),
                    right: None,
                }),
                key_lengths: Some(vec![lk as u32, (lk - 2 * form.bc as usize + 3) as u32]),
                mask: (seed % 3 == 0).then(|| random_bool_mask(&mut rng, [2, 1, lq, lk])),
                ..Default::default()
            };
            let mut case = coop_case(shape_of(d, dv), options, dtype, seed);
            case.range = range;
            assert_passes(&ctx, &case);
        }
    }
}
