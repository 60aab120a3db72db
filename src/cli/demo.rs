//! `demo`: a small attention problem on the chosen adapter, checked against the CPU
//! reference, with timings; then seed 003's padded sentences, showing that pad keys
//! get zero weight.

use super::{AdapterArgs, CliError};
use std::time::Instant;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::{
    key_lengths_from_tokens, reference, sdpa, AttentionOptions, AttentionShape, CausalAlignment, Context, DType,
    KernelChoice, Layout, Tensor,
};

pub fn run(adapter: &AdapterArgs) -> Result<(), CliError> {
    let start = Instant::now();
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    println!(
        "adapter: {} ({:?}, {:?}), context in {:.0?}",
        info.name,
        info.backend,
        info.device_type,
        start.elapsed()
    );

    let shape = AttentionShape {
        batch: 2,
        heads_q: 4,
        heads_kv: 2,
        len_q: 128,
        len_k: 128,
        head_dim: 64,
        head_dim_v: 64,
    };
    println!(
        "problem: q [{}, {}, {}, {}], k/v [{}, {}, {}, {}] (GQA), causal top-left, f32",
        shape.batch,
        shape.heads_q,
        shape.len_q,
        shape.head_dim,
        shape.batch,
        shape.heads_kv,
        shape.len_k,
        shape.head_dim
    );
    for kernel in [KernelChoice::Fused, KernelChoice::Materialized] {
        let case = CheckCase {
            shape,
            options: AttentionOptions {
                causal: Some(CausalAlignment::TopLeft),
                kernel,
                ..Default::default()
            },
            dtype: DType::F32,
            layout: Layout::Bhsd,
            seed: 2026,
            range: 1.0,
        };
        let first = Instant::now();
        let outcome = run_case(&ctx, &case)?;
        let first = first.elapsed();
        let warm = Instant::now();
        run_case(&ctx, &case)?;
        let warm = warm.elapsed();
        println!(
            "  {:<20} max |gpu - cpu| = {:.2e} (bound {:.1e}) {}   first call {:.0?} (compiles pipelines), warm call {:.0?} (incl. upload, readback, CPU reference)",
            outcome.kernel,
            outcome.out.max_abs,
            outcome.bound,
            if outcome.passed { "ok" } else { "MISMATCH" },
            first,
            warm
        );
        if !outcome.passed {
            return Err(CliError::Failed(outcome.summary()));
        }
    }
    padded_sentences(&ctx)
}

/// Seed 003's example: token ids with pad id 0; keys at pad positions must get weight 0.
fn padded_sentences(ctx: &Context) -> Result<(), CliError> {
    let tokens: [i64; 10] = [5, 2, 1, 0, 0, 1, 3, 1, 4, 0];
    let (batch, seq, heads, dim) = (2, 5, 2, 8);
    let lengths = key_lengths_from_tokens(&tokens, batch, 0)?;
    println!("tokens [[5,2,1,0,0],[1,3,1,4,0]], pad id 0 -> key lengths {lengths:?}");
    let mut rng = wgpu_attention::check::Rng::new(3);
    let x = rng.vec(batch * heads * seq * dim, -1.0, 1.0);
    let shape4 = [batch, heads, seq, dim];
    let t = Tensor::from_f32(ctx, shape4, Layout::Bhsd, &x)?;
    let options = AttentionOptions {
        key_lengths: Some(lengths),
        need_weights: true,
        ..Default::default()
    };
    let result = sdpa(ctx, &t, &t, &t, &options)?;
    let weights = result
        .weights
        .as_ref()
        .map(|w| w.to_f32_vec(ctx))
        .transpose()?
        .unwrap_or_default();
    let shape = AttentionShape::from_qkv(shape4, shape4, shape4)?;
    let want = reference::attention(&x, &x, &x, &shape, &options)?;
    let max_err = weights
        .iter()
        .zip(&want.weights)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max);
    println!("weights [{batch}, {heads}, {seq}, {seq}], max |gpu - cpu| = {max_err:.2e}; batch 0, head 0:");
    for i in 0..seq {
        let row: Vec<String> = weights[i * seq..(i + 1) * seq]
            .iter()
            .map(|w| format!("{w:.3}"))
            .collect();
        println!("  query {i}: [{}]", row.join(", "));
    }
    println!("pad keys 3 and 4 of sentence 0 get weight 0 in every row.");
    Ok(())
}
