//! Readback (issue 17 §5): repeated reads of one size create one mappable buffer, not
//! one per read, and every read still returns its own data; `sdpa_read` (attention and
//! its readback in one submission) gives exactly what `sdpa` then a read give.

use crate::common;

use wgpu_attention::check::Rng;
use wgpu_attention::{
    sdpa, sdpa_read, AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice, Layout, Tensor,
};

#[test]
fn repeated_reads_reuse_one_staging_buffer_and_return_fresh_data() {
    if common::ctx().is_none() {
        return;
    }
    // A context of its own: the other test allocates on the shared one meanwhile.
    let own = Context::new().expect("a context");
    let ctx = &own;
    let seed = 1723;
    let mut rng = Rng::new(seed);
    let shapes = [[1, 2, 3, 5], [1, 2, 3, 6], [2, 1, 1, 7]]; // 30, 36 and 14 floats: one class
    let tensors: Vec<(Tensor, Vec<f32>)> = shapes
        .iter()
        .map(|&shape| {
            let data = rng.vec(shape.iter().product(), -1.0, 1.0);
            (Tensor::from_f32(ctx, shape, Layout::Bhsd, &data).expect("upload"), data)
        })
        .collect();
    // The first read may create the class's buffer; none after it may.
    assert_eq!(tensors[0].0.to_f32_vec(ctx).expect("read"), tensors[0].1, "seed {seed}");
    let before = ctx.allocated_bytes();
    for round in 0..3 {
        for (tensor, data) in &tensors {
            assert_eq!(
                &tensor.to_f32_vec(ctx).expect("read"),
                data,
                "round {round}, seed {seed}"
            );
        }
    }
    assert_eq!(ctx.allocated_bytes(), before, "reads created buffers");
    assert!(ctx.kept_staging_buffers() >= 1);
}

#[test]
fn sdpa_read_gives_the_bits_of_sdpa_then_a_read() {
    let Some(ctx) = common::ctx() else { return };
    let seed = 2207;
    let mut rng = Rng::new(seed);
    let mut dtypes = vec![DType::F32];
    if ctx.capabilities().f16 {
        dtypes.push(DType::F16);
    }
    for dtype in dtypes {
        for (kernel, s) in [
            (KernelChoice::Fused, AttentionShape::new(2, 4, 2, 37, 53, 32, 24)),
            (KernelChoice::Decode, AttentionShape::new(1, 8, 2, 1, 1500, 64, 64)),
            (KernelChoice::Materialized, AttentionShape::new(1, 2, 2, 9, 17, 16, 16)),
        ] {
            let upload = |h: usize, l: usize, d: usize, rng: &mut Rng| {
                let data = rng.vec(s.batch * h * l * d, -1.0, 1.0);
                Tensor::from_f32_as(ctx, [s.batch, h, l, d], Layout::Bhsd, dtype, &data).expect("upload")
            };
            let q = upload(s.heads_q, s.len_q, s.head_dim, &mut rng);
            let k = upload(s.heads_kv, s.len_k, s.head_dim, &mut rng);
            let v = upload(s.heads_kv, s.len_k, s.head_dim_v, &mut rng);
            let options = AttentionOptions {
                kernel,
                causal: Some(CausalAlignment::BottomRight),
                output_layout: Some(Layout::Bshd),
                ..Default::default()
            };
            // sdpa_read first: its staging buffer then holds an earlier read's data (a
            // read that staged nothing new would give that).
            let (out, got) = sdpa_read(ctx, &q, &k, &v, &options).expect("sdpa_read");
            let want = sdpa(ctx, &q, &k, &v, &options)
                .expect("sdpa")
                .out
                .to_f32_vec(ctx)
                .expect("read");
            let what = format!("{kernel:?} {dtype:?} {s:?}, seed {seed}");
            assert_eq!(got.len(), want.len(), "{what}");
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
            assert_eq!(
                out.out.to_f32_vec(ctx).expect("read"),
                got,
                "{what}: the returned tensor"
            );
        }
    }
    // A tensor of another context is refused, and this one still works.
    let other = Context::new().expect("a second context");
    let foreign = Tensor::from_f32(&other, [1, 1, 2, 4], Layout::Bhsd, &[0.5; 8]).expect("upload");
    let mine = Tensor::from_f32(ctx, [1, 1, 2, 4], Layout::Bhsd, &[0.5; 8]).expect("upload");
    let refused = sdpa_read(ctx, &foreign, &mine, &mine, &AttentionOptions::default());
    assert!(
        matches!(refused, Err(wgpu_attention::Error::Invalid { .. })),
        "{refused:?}"
    );
    let (_, ok) = sdpa_read(ctx, &mine, &mine, &mine, &AttentionOptions::default()).expect("still works");
    assert_eq!(ok, vec![0.5; 8]);
}
