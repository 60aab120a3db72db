//! `demo`: a small attention problem on the chosen adapter, checked against the CPU
//! reference, with timings; then seed 003's padded sentences through a multi-head
//! attention layer with post-norm, showing that pad keys get zero weight and drawing
//! the per-head weights.

use super::{viz, AdapterArgs, CliError};
use std::path::{Path, PathBuf};
use std::time::Instant;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::heatmap::Labels;
use wgpu_attention::sentence_example::{PaddedSentences, OUT_BOUND, WEIGHTS_BOUND};
use wgpu_attention::{AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice, Layout};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Where the seed 003 attention heatmaps go.
    #[arg(long, default_value = "wgpu-attention-demo")]
    heatmaps: PathBuf,
}

pub fn run(adapter: &AdapterArgs, args: &DemoArgs) -> Result<(), CliError> {
    let start = Instant::now();
    let ctx = adapter.context()?;
    let info = ctx.adapter_info();
    outln!(
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
    outln!(
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
        outln!(
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
    seed_003(&ctx, &args.heatmaps)
}

/// Seed 003's example (`wgpu_attention::sentence_example`): two padded sentences
/// through a multi-head attention layer with post-norm, on the GPU and on the CPU
/// reference; then their per-head weights drawn.
fn seed_003(ctx: &Context, heatmaps: &Path) -> Result<(), CliError> {
    let example = PaddedSentences::new()?;
    let (batch, seq, heads) = (example.batch, example.seq, example.heads);
    outln!(
        "\nseed 003: tokens [[5,2,1,0,0],[1,3,1,4,0]], pad id 0, vocab {}, d_model {}, {heads} heads of {}",
        example.vocab,
        example.d_model,
        example.config.head_dim()
    );
    let result = example.run(ctx)?;
    outln!(
        "  output [{batch}, {seq}, {}]: max |gpu - cpu| = {:.2e}; weights [{batch}, {heads}, {seq}, {seq}]: max |gpu - cpu| = {:.2e}",
        example.d_model, result.out_error, result.weights_error
    );
    outln!(
        "  largest weight on a pad key, over every head and query: {}",
        result.pad_weight
    );
    outln!("  sentence 0, head 0:");
    let w = &result.weights;
    for i in 0..seq {
        let row: Vec<String> = w[i * seq..(i + 1) * seq].iter().map(|w| format!("{w:.3}")).collect();
        outln!("    query {i}: [{}]", row.join(", "));
    }
    if !result.passed() {
        return Err(CliError::Failed(format!(
            "seed 003 layer: output error {:.2e} (bound {OUT_BOUND:.0e}), weights error {:.2e} (bound {WEIGHTS_BOUND:.0e}), pad weight {}",
            result.out_error, result.weights_error, result.pad_weight
        )));
    }
    // Heatmaps per sentence, labelled with its tokens.
    let mut files = Vec::new();
    let plane = heads * seq * seq;
    for b in 0..batch {
        let labels = Labels {
            queries: Some(example.words(b)),
            keys: Some(example.words(b)),
        };
        let data = &w[b * plane..(b + 1) * plane];
        let prefix = format!("seed003_sentence{b}");
        files.extend(viz::render_files(
            [1, heads, seq, seq],
            data,
            &viz::Selection::all(1, heads),
            &labels,
            heatmaps,
            &prefix,
        )?);
    }
    viz::write_images(heatmaps, &files)
}
