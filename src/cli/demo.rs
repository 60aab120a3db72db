//! `demo`: a small attention problem on the chosen adapter, checked against the CPU
//! reference, with timings; then two padded sentences (the seed documents' example,
//! `wgpu_attention::sentence_example`) through a multi-head attention layer with
//! post-norm, showing that padding gets zero weight, and the per-head weights drawn as
//! heatmaps. Its words are the user's (sentences, padding, heads), not the project's.

use super::{viz, AdapterArgs, CliError};
use std::path::{Path, PathBuf};
use std::time::Instant;
use wgpu_attention::check::{run_case, CheckCase};
use wgpu_attention::heatmap::Labels;
use wgpu_attention::sentence_example::{PaddedSentences, OUT_BOUND, PAD, WEIGHTS_BOUND};
use wgpu_attention::{AttentionOptions, AttentionShape, CausalAlignment, Context, DType, KernelChoice, Layout};

/// Runs attention on the adapter and checks it against the CPU; then runs a
/// multi-head attention layer over two padded sentences, shows that no head attends to
/// the padding, and writes each head's attention weights as PNG heatmaps.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The folder the heatmaps go to: per sentence, one image per head and one of all
    /// heads (sentence1_head1.png .. sentence2_heads.png).
    #[arg(long, value_name = "DIR", default_value = "wgpu-attention-demo")]
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
            "  {:<20} max |gpu - cpu| = {:.2e} (bound {:.1e}) {}; first call {:.0?} (compiles), then {:.0?}",
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
    padded_sentences(&ctx, &args.heatmaps)
}

/// Two padded sentences through a multi-head attention layer with post-norm, on the
/// GPU and on the CPU reference; then their per-head weights drawn.
fn padded_sentences(ctx: &Context, heatmaps: &Path) -> Result<(), CliError> {
    let example = PaddedSentences::new()?;
    let (batch, seq, heads) = (example.batch, example.seq, example.heads);
    outln!(
        "\nA multi-head attention layer ({heads} heads of {}, model width {}) over two sentences \
         padded to {seq} tokens; padding is masked:",
        example.config.head_dim(),
        example.d_model
    );
    for b in 0..batch {
        let words = example.words(b);
        let pads = words.iter().filter(|w| *w == PAD).count();
        outln!(
            "  sentence {}: {}  ({} tokens, {pads} padding)",
            b + 1,
            words.join(" "),
            seq - pads
        );
    }
    let result = example.run(ctx)?;
    outln!(
        "  output [{batch}, {seq}, {}]: max |gpu - cpu| = {:.2e}; weights [{batch}, {heads}, {seq}, {seq}]: max |gpu - cpu| = {:.2e}",
        example.d_model, result.out_error, result.weights_error
    );
    outln!(
        "  largest weight on padding, over every head and query: {}",
        result.pad_weight
    );
    let words = example.words(0);
    outln!("  sentence 1, head 1 (rows: queries, columns: keys):");
    outln!(
        "    {:>6} {}",
        "",
        words.iter().map(|w| format!("{w:>6}")).collect::<Vec<_>>().join("")
    );
    let w = &result.weights;
    for (i, word) in words.iter().enumerate() {
        let row: Vec<String> = w[i * seq..(i + 1) * seq].iter().map(|w| format!("{w:>6.3}")).collect();
        outln!("    {word:>6} {}", row.join(""));
    }
    if !result.passed() {
        return Err(CliError::Failed(format!(
            "padded sentences: output error {:.2e} (bound {OUT_BOUND:.0e}), weights error {:.2e} (bound {WEIGHTS_BOUND:.0e}), weight on padding {}",
            result.out_error, result.weights_error, result.pad_weight
        )));
    }
    // Heatmaps per sentence, labelled with its tokens; sentences and heads counted
    // from 1, as the lines above.
    let mut files = Vec::new();
    let plane = heads * seq * seq;
    for b in 0..batch {
        let labels = Labels {
            queries: Some(example.words(b)),
            keys: Some(example.words(b)),
        };
        let data = &w[b * plane..(b + 1) * plane];
        let sentence = b + 1;
        let name = move |_: usize, h: Option<usize>| match h {
            Some(h) => (
                format!("sentence {sentence}, head {}", h + 1),
                format!("sentence{sentence}_head{}", h + 1),
            ),
            None => (format!("sentence {sentence}"), format!("sentence{sentence}_heads")),
        };
        files.extend(viz::render_files(
            [1, heads, seq, seq],
            data,
            &viz::Selection::all(1, heads),
            &labels,
            heatmaps,
            &name,
        )?);
    }
    viz::write_images(heatmaps, &files)
}
