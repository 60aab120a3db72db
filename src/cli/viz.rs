//! `viz`: attention-weight heatmaps as PNG, from `--q/--k` (computed on the GPU with the
//! masks and options of `run`) or from a weights `.npy`. Writes one image per
//! (batch, head) and one grid of all heads per batch element, all or none.

use super::run::{load_4d, LayoutArg, MaskArgs};
use super::{npy, output};
use super::{AdapterArgs, CliError};
use std::path::{Path, PathBuf};
use wgpu_attention::heatmap::{render_grid, render_panel, Labels, Panel, MAX_GRID_PANELS};
use wgpu_attention::{sdpa, AttentionOptions, DType, Layout};

#[derive(clap::Args)]
pub struct VizArgs {
    /// Attention weights: [Lq, Lk], [B, Lq, Lk] or [B, H, Lq, Lk] float32 (instead of --q/--k).
    #[arg(long, conflicts_with_all = ["q", "k", "v"])]
    weights: Option<PathBuf>,
    /// Queries [B, Hq, Lq, D] (or BSHD with --layout bshd).
    #[arg(long, requires = "k")]
    q: Option<PathBuf>,
    /// Keys [B, Hkv, Lk, D].
    #[arg(long, requires = "q")]
    k: Option<PathBuf>,
    /// Values; the weights do not depend on them, so K stands in when omitted.
    #[arg(long, requires = "q")]
    v: Option<PathBuf>,
    #[command(flatten)]
    masks: MaskArgs,
    /// Memory layout of q, k, v.
    #[arg(long, value_enum, default_value = "bhsd")]
    layout: LayoutArg,
    /// Labels of the query positions, comma-separated (e.g. tokens).
    #[arg(long)]
    query_labels: Option<String>,
    /// Labels of the key positions, comma-separated.
    #[arg(long)]
    key_labels: Option<String>,
    /// Directory for the images (created if missing).
    #[arg(long)]
    out_dir: PathBuf,
    /// File name prefix: <prefix>_b<b>_h<h>.png and <prefix>_b<b>_heads.png.
    #[arg(long, default_value = "attention")]
    prefix: String,
    /// Heads to draw: indices and ranges, e.g. 0,3,8-11 (default: the first 16).
    #[arg(long, value_name = "LIST")]
    heads: Option<String>,
    /// Batch elements to draw: indices and ranges (default: the first 8).
    #[arg(long, value_name = "LIST")]
    batches: Option<String>,
}

/// Heads drawn when `--heads` is not given (more are named on stderr).
const DEFAULT_HEADS: usize = 16;
/// Batch elements drawn when `--batches` is not given.
const DEFAULT_BATCHES: usize = 8;
/// Most images one call writes.
const MAX_IMAGES: usize = 1024;

/// The indices `spec` names (`0,3,8-11`), each below `count`; all of `0..default` (and a
/// note on stderr if that leaves some out) when there is no spec.
fn select(spec: Option<&str>, flag: &str, what: &str, count: usize, default: usize) -> Result<Vec<usize>, CliError> {
    let Some(spec) = spec else {
        if count > default {
            eprintln!(
                "viz: drawing {what} 0-{} of {count}; choose others with --{flag}",
                default - 1
            );
        }
        return Ok((0..count.min(default)).collect());
    };
    let bad = |why: String| CliError::bad(format!("--{flag} '{spec}': {why}"));
    let index = |t: &str| -> Result<usize, CliError> {
        let i: usize = t.trim().parse().map_err(|e| bad(format!("'{t}': {e}")))?;
        if i >= count {
            return Err(bad(format!("{what} {i} does not exist (there are {count})")));
        }
        Ok(i)
    };
    let mut out = Vec::new();
    for part in spec.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (index(a)?, index(b)?);
                if a > b {
                    return Err(bad(format!("range {a}-{b} runs backwards")));
                }
                if out.len() + (b - a + 1) > MAX_IMAGES {
                    return Err(bad(format!("more than {MAX_IMAGES} {what}")));
                }
                out.extend(a..=b);
            }
            None => out.push(index(part)?),
        }
        if out.len() > MAX_IMAGES {
            return Err(bad(format!("more than {MAX_IMAGES} {what}")));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Weights as [B, H, Lq, Lk] host data.
struct Weights {
    shape: [usize; 4],
    data: Vec<f32>,
}

fn weights_from_file(path: &Path) -> Result<Weights, CliError> {
    let a = npy::read_float(path)?;
    let shape = match a.shape.as_slice() {
        &[lq, lk] => [1, 1, lq, lk],
        &[b, lq, lk] => [b, 1, lq, lk],
        &[b, h, lq, lk] => [b, h, lq, lk],
        other => {
            return Err(CliError::bad(format!(
                "{}: expected [Lq, Lk], [B, Lq, Lk] or [B, H, Lq, Lk], got {other:?}",
                path.display()
            )))
        }
    };
    Ok(Weights { shape, data: a.data })
}

fn weights_from_qk(adapter: &AdapterArgs, args: &VizArgs, q_path: &Path, k_path: &Path) -> Result<Weights, CliError> {
    let ctx = adapter.context()?;
    let layout = match args.layout {
        LayoutArg::Bhsd => Layout::Bhsd,
        LayoutArg::Bshd => Layout::Bshd,
    };
    let q = load_4d(&ctx, q_path, layout, DType::F32)?;
    let k = load_4d(&ctx, k_path, layout, DType::F32)?;
    let v = load_4d(&ctx, args.v.as_deref().unwrap_or(k_path), layout, DType::F32)?;
    let options = AttentionOptions {
        need_weights: true,
        ..args.masks.options(q.shape()[0])?
    };
    let result = sdpa(&ctx, &q, &k, &v, &options)?;
    let weights = result
        .weights
        .ok_or_else(|| CliError::bad("the attention call returned no weights"))?;
    Ok(Weights {
        shape: weights.shape(),
        data: weights.to_f32_vec(&ctx)?,
    })
}

fn split_labels(list: &Option<String>, what: &str, count: usize) -> Result<Option<Vec<String>>, CliError> {
    let Some(list) = list else { return Ok(None) };
    let labels: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    if labels.len() != count {
        return Err(CliError::bad(format!(
            "--{what}-labels has {} labels for {count} positions",
            labels.len()
        )));
    }
    Ok(Some(labels))
}

pub fn run(adapter: &AdapterArgs, args: &VizArgs) -> Result<(), CliError> {
    let weights = match (&args.weights, &args.q, &args.k) {
        (Some(path), _, _) => weights_from_file(path)?,
        (None, Some(q), Some(k)) => weights_from_qk(adapter, args, q, k)?,
        _ => return Err(CliError::bad("give --weights W.npy, or --q Q.npy and --k K.npy")),
    };
    let [batch, heads, len_q, len_k] = weights.shape;
    if batch * heads * len_q * len_k == 0 {
        return Err(CliError::bad(format!(
            "nothing to draw: weights of shape {:?}",
            weights.shape
        )));
    }
    let labels = Labels {
        queries: split_labels(&args.query_labels, "query", len_q)?,
        keys: split_labels(&args.key_labels, "key", len_k)?,
    };
    let heads_drawn = select(args.heads.as_deref(), "heads", "heads", heads, DEFAULT_HEADS)?;
    let batches_drawn = select(
        args.batches.as_deref(),
        "batches",
        "batch elements",
        batch,
        DEFAULT_BATCHES,
    )?;
    if heads_drawn.len() > MAX_GRID_PANELS {
        return Err(CliError::bad(format!(
            "--heads selects {} heads; one grid image holds at most {MAX_GRID_PANELS}",
            heads_drawn.len()
        )));
    }
    let images = batches_drawn.len() * (heads_drawn.len() + 1);
    if images > MAX_IMAGES {
        return Err(CliError::bad(format!(
            "{} batch elements x {} heads make {images} images, more than {MAX_IMAGES}: select fewer with --batches/--heads",
            batches_drawn.len(),
            heads_drawn.len()
        )));
    }
    let selection = Selection {
        batches: batches_drawn,
        heads: heads_drawn,
    };
    let files = render_files(
        weights.shape,
        &weights.data,
        &selection,
        &labels,
        &args.out_dir,
        &index_names(&args.prefix),
    )?;
    write_images(&args.out_dir, &files)?;
    Ok(())
}

/// The batch elements and heads to draw.
pub struct Selection {
    pub batches: Vec<usize>,
    pub heads: Vec<usize>,
}

impl Selection {
    /// Every batch element and head of a `[B, H, ..]` array.
    pub fn all(batch: usize, heads: usize) -> Self {
        Selection {
            batches: (0..batch).collect(),
            heads: (0..heads).collect(),
        }
    }
}

/// PNG heatmaps of weights `[B, H, Lq, Lk]`: one per selected (batch, head) and a grid
/// of the selected heads per batch element. `name(b, Some(h))` gives a panel's title and
/// file stem, `name(b, None)` the grid's (its title unused): `viz` names them by array
/// index (`{prefix}_b{b}_h{h}`), the demo by sentence.
pub fn render_files(
    [_, heads, len_q, len_k]: [usize; 4],
    data: &[f32],
    selection: &Selection,
    labels: &Labels,
    out_dir: &Path,
    name: &dyn Fn(usize, Option<usize>) -> (String, String),
) -> Result<Vec<(PathBuf, Vec<u8>)>, CliError> {
    let panel_len = len_q * len_k;
    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for &b in &selection.batches {
        let panels: Vec<Panel> = selection
            .heads
            .iter()
            .map(|&h| {
                let start = (b * heads + h) * panel_len;
                Panel {
                    title: name(b, Some(h)).0,
                    weights: &data[start..start + panel_len],
                    len_q,
                    len_k,
                }
            })
            .collect();
        for (&h, panel) in selection.heads.iter().zip(&panels) {
            let (canvas, _) = render_panel(panel, labels)?;
            files.push((out_dir.join(format!("{}.png", name(b, Some(h)).1)), canvas.to_png()?));
        }
        let (grid, _) = render_grid(&panels, labels)?;
        files.push((out_dir.join(format!("{}.png", name(b, None).1)), grid.to_png()?));
    }
    Ok(files)
}

/// `viz`'s names: array indices, `{prefix}_b{b}_h{h}.png` and `{prefix}_b{b}_heads.png`.
pub fn index_names(prefix: &str) -> impl Fn(usize, Option<usize>) -> (String, String) + '_ {
    move |b, h| match h {
        Some(h) => (format!("batch {b}, head {h}"), format!("{prefix}_b{b}_h{h}")),
        None => (format!("batch {b}"), format!("{prefix}_b{b}_heads")),
    }
}

/// Creates `out_dir` and writes the images (all or none, as every CLI output).
pub fn write_images(out_dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> Result<(), CliError> {
    std::fs::create_dir_all(out_dir).map_err(|e| CliError::bad(format!("cannot create {}: {e}", out_dir.display())))?;
    output::write_all(files)?;
    outln!("wrote {} images to {}", files.len(), out_dir.display());
    Ok(())
}
