//! Readback reuses its staging buffers (issue 17 §5): repeated reads of one size create
//! one mappable buffer, not one per read, and every read still returns its own data.

mod common;

use wgpu_attention::check::Rng;
use wgpu_attention::{Layout, Tensor};

#[test]
fn repeated_reads_reuse_one_staging_buffer_and_return_fresh_data() {
    let Some(ctx) = common::ctx() else { return };
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
