//! The linear-layer GEMM (`shaders/matmul.wgsl`) against an f64 reference: awkward sizes
//! (not multiples of any tile), bias, split outputs, row strides, every tiling the
//! adapter has (tensor cores in f16 where it has them), f32/f16;
//! for the texture tiling also both ways of packing (copy and kernel), pre-packed
//! weights, and matrices taller than one texture layer.

use crate::common;

use wgpu_attention::check::{linear_tilings, run_linear_case, LinearCase as Case};
use wgpu_attention::kernels::matmul::{encode_linear, Linear, LinearTiling};
use wgpu_attention::kernels::pack_rows::{PackedRows, RowSource};
use wgpu_attention::Error;
use wgpu_attention::{Context, DType, Layout, Tensor};

fn matrix(ctx: &Context, dtype: DType, rows: usize, cols: usize, data: &[f32]) -> Tensor {
    Tensor::from_f32_as(ctx, [1, 1, rows, cols], Layout::Bhsd, dtype, data).expect("upload")
}

/// Runs the case (`check::run_linear_case`); an error from `encode_linear` is
/// returned, a wrong value panics.
fn run(ctx: &Context, case: &Case) -> Result<(), Error> {
    let outcome = run_linear_case(ctx, case)?;
    assert!(
        outcome.passed,
        "seed {}: {:?} {:?} m={} k={} widths={:?}: {}",
        case.seed,
        case.tiling,
        case.dtype,
        case.m,
        case.k,
        case.widths,
        outcome.summary()
    );
    Ok(())
}

/// (m, k, x_stride, output widths, w_row0, bias)
type Shape = (usize, usize, usize, &'static [usize], usize, bool);

#[test]
fn linear_matches_the_f64_reference_on_awkward_sizes() {
    let Some(ctx) = common::ctx() else { return };
    let shapes: [Shape; 10] = [
        (1, 1, 1, &[1], 0, false),
        (13, 29, 29, &[37], 5, true),
        (70, 100, 131, &[9, 17, 5], 0, true),
        (9, 64, 64, &[64, 16, 16], 0, false),
        (65, 7, 7, &[130], 0, true),
        (3, 300, 300, &[2, 70], 71, false),
        // f32 rows the texture tiling copies straight into its texture (row stride a
        // multiple of 256 bytes, whole texels) with a stride wider than K.
        (5, 128, 192, &[40], 3, true),
        // More than one 128 x 128 block both ways, ragged, K not a multiple of 16.
        (200, 45, 47, &[150, 10], 2, true),
        // The same with K and the row strides multiples of 4 (rows read as 16-byte
        // words by the blocked tiling), K neither a multiple of 8 nor of 16: several
        // slabs, the last partial; then X's stride off the words (W's rows on them).
        (200, 100, 108, &[150, 10], 3, true),
        (131, 68, 69, &[129], 1, false),
    ];
    let mut seed = 100;
    for tiling in linear_tilings(ctx) {
        for dtype in [DType::F32, DType::F16] {
            if (dtype == DType::F16 && !ctx.capabilities().f16) || (dtype == DType::F32 && tiling == LinearTiling::Coop)
            {
                continue;
            }
            for &(m, k, x_stride, widths, w_row0, bias) in &shapes {
                seed += 1;
                let case = Case {
                    m,
                    k,
                    x_stride,
                    widths: widths.to_vec(),
                    w_row0,
                    bias,
                    dtype,
                    tiling,
                    prepacked: false,
                    seed,
                };
                run(ctx, &case).expect("encode");
            }
        }
    }
}

#[test]
fn linear_rejects_bad_requests_with_errors() {
    let Some(ctx) = common::ctx() else { return };
    let small = matrix(ctx, DType::F32, 1, 4, &[1.0, 2.0, 3.0, 4.0]);
    let out = Tensor::empty(ctx, [1, 1, 1, 4], Layout::Bhsd, DType::F32).expect("alloc");
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    let attempt = |encoder: &mut wgpu_attention::wgpu::CommandEncoder, m: usize, k: usize, widths: &[usize]| {
        let outputs: Vec<_> = widths.iter().map(|&wd| (out.buffer(), wd)).collect();
        let linear = Linear {
            x: small.buffer(),
            x_stride: k,
            w: small.buffer(),
            w_packed: None,
            bias: None,
            w_row0: 0,
            outputs: &outputs,
            m,
            k,
        };
        encode_linear(ctx, ctx.policy(), encoder, DType::F32, LinearTiling::Tiled, &linear)
    };
    assert!(attempt(&mut encoder, 0, 4, &[1]).is_err(), "m = 0");
    assert!(attempt(&mut encoder, 1, 4, &[]).is_err(), "no outputs");
    assert!(attempt(&mut encoder, 1, 4, &[1, 1, 1, 1]).is_err(), "four outputs");
    assert!(attempt(&mut encoder, 2, 4, &[1]).is_err(), "X too small for 2 rows");
    assert!(attempt(&mut encoder, 1, 4, &[2]).is_err(), "W too small for 2 columns");
    assert!(attempt(&mut encoder, 1, 4, &[0]).is_err(), "zero-width output");

    // A pre-packed W must be rows 0.. of the very W passed: a packing of other rows, or
    // of another buffer, is refused rather than read.
    let two_rows = matrix(ctx, DType::F32, 2, 4, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let pack = |row0: usize, buffer| {
        let source = RowSource {
            buffer,
            row0,
            rows: 2 - row0,
            cols: 4,
            stride: 4,
        };
        PackedRows::upload(ctx, DType::F32, &source).expect("pack")
    };
    let with_packed = |encoder: &mut wgpu_attention::wgpu::CommandEncoder, packed: &PackedRows| {
        let linear = Linear {
            x: small.buffer(),
            x_stride: 4,
            w: two_rows.buffer(),
            w_packed: Some(packed),
            bias: None,
            w_row0: 0,
            outputs: &[(out.buffer(), 1)],
            m: 1,
            k: 4,
        };
        encode_linear(ctx, ctx.policy(), encoder, DType::F32, LinearTiling::Texture, &linear)
    };
    assert!(
        with_packed(&mut encoder, &pack(0, two_rows.buffer())).is_ok(),
        "rows 0.. of W"
    );
    assert!(
        with_packed(&mut encoder, &pack(1, two_rows.buffer())).is_err(),
        "rows 1.. of W"
    );
    let other = matrix(ctx, DType::F32, 2, 4, &[0.5; 8]);
    assert!(
        with_packed(&mut encoder, &pack(0, other.buffer())).is_err(),
        "another buffer"
    );
}

#[test]
fn texture_gemm_takes_prepacked_weights_and_matrices_taller_than_a_layer() {
    let Some(ctx) = common::ctx() else { return };
    if ctx.linear_tiling() != LinearTiling::Texture {
        common::skip_lacking(ctx, "the texture GEMM (a CPU adapter with 8-lane subgroups)", true);
        return;
    }
    let tall = ctx.capabilities().max_texture_dim as usize + 5;
    let dtypes: &[DType] = if ctx.capabilities().f16 {
        &[DType::F32, DType::F16]
    } else {
        &[DType::F32]
    };
    let mut seed = 300;
    for &dtype in dtypes {
        // (m, k, output widths, w_row0, pre-packed W): X over two layers; W over two
        // layers, pre-packed, its rows picked by w_row0; both with K not a texel multiple.
        let shapes: [(usize, usize, &[usize], usize, bool); 3] = [
            (tall, 6, &[3], 0, false),
            (3, 6, &[1, 9], tall - 4, true),
            (37, 64, &[20, 12, 12], 7, true),
        ];
        for (m, k, widths, w_row0, prepacked) in shapes {
            seed += 1;
            let case = Case {
                m,
                k,
                x_stride: k,
                widths: widths.to_vec(),
                w_row0,
                bias: true,
                dtype,
                tiling: LinearTiling::Texture,
                prepacked,
                seed,
            };
            run(ctx, &case).expect("encode");
        }
    }
}

#[test]
fn linear_layers_wider_than_texture_limits_fall_back_or_are_refused() {
    let Some(ctx) = common::ctx() else { return };
    // K past what a texture row holds: the texture tiling hands over to the tiled
    // kernel, which on llvmpipe needs more loop iterations than the driver runs.
    let k = 4 * ctx.capabilities().max_texture_dim as usize + 1;
    let case = Case {
        m: 2,
        k,
        x_stride: k,
        widths: vec![3],
        w_row0: 0,
        bias: false,
        dtype: DType::F32,
        tiling: LinearTiling::Texture,
        prepacked: false,
        seed: 400,
    };
    match run(ctx, &case) {
        Ok(()) => assert!(
            ctx.loop_cap().is_none(),
            "k = {k} ran past the loop cap {:?}",
            ctx.loop_cap()
        ),
        Err(Error::LimitExceeded { limit, .. }) => {
            assert!(ctx.loop_cap().is_some(), "refused without a loop cap: {limit}");
            assert!(limit.contains("loop iterations"), "{limit}");
        }
        Err(other) => panic!("k = {k}: unexpected error {other}"),
    }

    // More rows than the packing kernel's dispatches of 8 rows per workgroup reach: the
    // tiled kernel (64 rows per workgroup) takes them, correctly.
    let m = 8 * ctx.capabilities().max_workgroups_per_dim as usize + 3;
    let case = Case {
        m,
        k: 5,
        x_stride: 5,
        widths: vec![2],
        w_row0: 0,
        bias: true,
        dtype: DType::F32,
        tiling: LinearTiling::Texture,
        prepacked: false,
        seed: 401,
    };
    run(ctx, &case).expect("m past the texture tiling's dispatch limit runs tiled");
}
