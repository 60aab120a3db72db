//! `run`: one attention call on `.npy` inputs, outputs written as float32 `.npy`.

use super::npy::{self, MaskArray};
use super::output;
use super::{AdapterArgs, CliError};
use std::path::PathBuf;
use wgpu_attention::{
    resolve_kernel, sdpa, sdpa_backward, AttentionOptions, AttentionShape, CausalAlignment, Context, DType,
    FusedTiling, KernelChoice, Layout, Mask, Precision, Tensor, Window,
};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum CausalArg {
    TopLeft,
    BottomRight,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum KernelArg {
    Auto,
    Fused,
    Materialized,
    /// Split-K decode (few query rows, many keys).
    Decode,
}

/// Parses `--tiling` against the tiling registry, so a new tiling needs no CLI edit.
pub fn parse_tiling(name: &str) -> Result<FusedTiling, String> {
    wgpu_attention::kernels::flash::parse_tiling("tiling", name).map_err(|e| e.to_string())
}

/// Parses `--precision` (highest, high, medium), as the library spells them.
pub fn parse_precision(name: &str) -> Result<Precision, String> {
    Precision::parse("precision", name).map_err(|e| e.to_string())
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DTypeArg {
    F32,
    F16,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LayoutArg {
    Bhsd,
    Bshd,
}

/// Scale and masks, shared by `run` and `viz`.
#[derive(clap::Args)]
pub struct MaskArgs {
    /// Causal mask and its alignment.
    #[arg(long, value_enum)]
    causal: Option<CausalArg>,
    /// Valid keys per batch element, int32/int64 [B].
    #[arg(long)]
    key_lengths: Option<PathBuf>,
    /// Explicit mask broadcastable to [B, Hq, Lq, Lk]: bool (true = may attend) or float32 (additive).
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Score scale (default 1/sqrt(D)).
    #[arg(long, allow_hyphen_values = true)]
    scale: Option<f32>,
    /// Sliding window LEFT,RIGHT around each query's aligned position (flash-attn's
    /// window_size; -1 leaves a side unbounded), e.g. 1024,0.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_window)]
    window: Option<Window>,
    /// ALiBi slopes, float32 [Hq]: -slope * |p(i) - j| is added to the scaled scores.
    #[arg(long)]
    alibi_slopes: Option<PathBuf>,
    /// Soft-cap the scaled scores at CAP: s -> CAP * tanh(s / CAP) (Gemma 2).
    #[arg(long)]
    softcap: Option<f32>,
}

pub fn parse_window(text: &str) -> Result<Window, String> {
    Window::parse("window", text).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Queries, [B, Hq, Lq, D] (or [B, Lq, Hq, D] with --layout bshd), float32 or float16.
    #[arg(long)]
    q: PathBuf,
    /// Keys, [B, Hkv, Lk, D].
    #[arg(long)]
    k: PathBuf,
    /// Values, [B, Hkv, Lk, Dv].
    #[arg(long)]
    v: PathBuf,
    /// Output file (float32, same layout as the inputs); `-` writes it to standard output.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    masks: MaskArgs,
    #[arg(long, value_enum, default_value = "auto")]
    kernel: KernelArg,
    /// Tile configuration of the fused kernel: auto, or a tiling `info` lists.
    #[arg(long, default_value = "auto", value_parser = parse_tiling)]
    tiling: FusedTiling,
    /// Whether f32 inputs may be multiplied in f16 on tensor cores: highest (never),
    /// high or medium (where the adapter has them). f16 inputs always may.
    #[arg(long, default_value = "highest", value_parser = parse_precision)]
    precision: Precision,
    /// Compute precision.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    /// Memory layout of q, k, v and out.
    #[arg(long, value_enum, default_value = "bhsd")]
    layout: LayoutArg,
    /// Also write the attention weights [B, Hq, Lq, Lk].
    #[arg(long)]
    weights_out: Option<PathBuf>,
    /// With --weights-out: the weights averaged over the query heads, [B, Lq, Lk]
    /// (PyTorch's average_attn_weights=True), without holding every head's.
    #[arg(long, requires = "weights_out")]
    average_weights: bool,
    /// Also write the log-sum-exp per row [B, Hq, Lq].
    #[arg(long)]
    lse_out: Option<PathBuf>,
    /// The backward pass: the output's gradient dO (the output's shape and layout);
    /// writes the gradients named by --dq-out, --dk-out and --dv-out (float32, each in
    /// its input's layout).
    #[arg(long, requires = "dq_out", requires = "dk_out", requires = "dv_out")]
    d_out: Option<PathBuf>,
    /// With --d-out: where dQ goes.
    #[arg(long, requires = "d_out")]
    dq_out: Option<PathBuf>,
    /// With --d-out: where dK goes (summed over the query heads sharing a kv head).
    #[arg(long, requires = "d_out")]
    dk_out: Option<PathBuf>,
    /// With --d-out: where dV goes.
    #[arg(long, requires = "d_out")]
    dv_out: Option<PathBuf>,
}

/// A 4-D float input read on the host, before it goes to the GPU.
pub struct HostInput {
    path: PathBuf,
    /// The array's shape as stored (BHSD or BSHD).
    memory: [usize; 4],
    data: Vec<f32>,
}

impl HostInput {
    pub fn read(path: &std::path::Path) -> Result<Self, CliError> {
        let a = npy::read_float(path)?;
        let memory: [usize; 4] = a.shape.as_slice().try_into().map_err(|_| {
            CliError::bad(format!(
                "{}: expected a 4-D array, got shape {:?}",
                path.display(),
                a.shape
            ))
        })?;
        Ok(HostInput {
            path: path.to_path_buf(),
            memory,
            data: a.data,
        })
    }

    pub fn logical_shape(&self, layout: Layout) -> [usize; 4] {
        layout.logical_shape(self.memory)
    }

    pub fn all_finite(&self) -> bool {
        self.data.iter().all(|x| x.is_finite())
    }

    /// Refuses values that f16 arithmetic would turn into infinities (|x| > 65504),
    /// naming the file and the first one.
    pub fn check_f16_range(&self, why: &str) -> Result<(), CliError> {
        npy::check_f16_range(&self.path, &self.data, why)
    }

    pub fn upload(&self, ctx: &Context, layout: Layout, dtype: DType) -> Result<Tensor, CliError> {
        Ok(Tensor::from_f32_as(
            ctx,
            self.logical_shape(layout),
            layout,
            dtype,
            &self.data,
        )?)
    }
}

pub fn load_4d(ctx: &Context, path: &std::path::Path, layout: Layout, dtype: DType) -> Result<Tensor, CliError> {
    HostInput::read(path)?.upload(ctx, layout, dtype)
}

/// Refuses an output with infinities or NaN from inputs that had none: the options
/// (scale, ALiBi slopes, an additive mask) pushed scores past f32's range, and a file of
/// NaN would be a silent wrong answer.
pub fn check_finite_output(out: &[f32], inputs_finite: bool) -> Result<(), CliError> {
    match out.iter().position(|x| !x.is_finite()) {
        Some(i) if inputs_finite => Err(CliError::bad(format!(
            "the output holds {} at flat index {i} although every input is finite: \
             the options (--scale, --alibi-slopes, an additive --mask) push scores beyond f32's range",
            out[i]
        ))),
        _ => Ok(()),
    }
}

impl MaskArgs {
    /// Options with this scale and these masks (everything else default).
    pub fn options(&self, batch: usize) -> Result<AttentionOptions, CliError> {
        let args = self;
        let key_lengths = match &args.key_lengths {
            None => None,
            Some(path) => {
                let a = npy::read_int(path)?;
                if a.shape != [batch] {
                    return Err(CliError::bad(format!(
                        "{}: key lengths must have shape [{batch}], got {:?}",
                        path.display(),
                        a.shape
                    )));
                }
                let lens = a
                    .data
                    .iter()
                    .map(|&x| {
                        u32::try_from(x).map_err(|_| {
                            CliError::bad(format!("{}: key length {x} is negative or too large", path.display()))
                        })
                    })
                    .collect::<Result<Vec<u32>, _>>()?;
                Some(lens)
            }
        };
        let mask = match &args.mask {
            None => None,
            Some(path) => Some(match npy::read_mask(path)? {
                MaskArray::Bool(a) => Mask::boolean(&a.shape, a.data)?,
                MaskArray::Additive(a) => Mask::additive(&a.shape, a.data)?,
            }),
        };
        let alibi_slopes = match &args.alibi_slopes {
            None => None,
            Some(path) => {
                let a = npy::read_float(path)?;
                if a.shape.len() != 1 {
                    return Err(CliError::bad(format!(
                        "{}: ALiBi slopes must be 1-D [Hq], got shape {:?}",
                        path.display(),
                        a.shape
                    )));
                }
                Some(a.data)
            }
        };
        Ok(AttentionOptions {
            scale: args.scale,
            window: args.window,
            alibi_slopes,
            softcap: args.softcap,
            causal: args.causal.map(|c| match c {
                CausalArg::TopLeft => CausalAlignment::TopLeft,
                CausalArg::BottomRight => CausalAlignment::BottomRight,
            }),
            key_lengths,
            mask,
            ..Default::default()
        })
    }
}

impl From<KernelArg> for KernelChoice {
    fn from(arg: KernelArg) -> Self {
        match arg {
            KernelArg::Auto => KernelChoice::Auto,
            KernelArg::Fused => KernelChoice::Fused,
            KernelArg::Materialized => KernelChoice::Materialized,
            KernelArg::Decode => KernelChoice::Decode,
        }
    }
}

impl From<DTypeArg> for DType {
    fn from(arg: DTypeArg) -> Self {
        match arg {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F16 => DType::F16,
        }
    }
}

fn options_from(args: &RunArgs, batch: usize) -> Result<AttentionOptions, CliError> {
    Ok(AttentionOptions {
        kernel: args.kernel.into(),
        tiling: args.tiling,
        precision: args.precision,
        need_weights: args.weights_out.is_some(),
        average_weights: args.average_weights,
        need_lse: args.lse_out.is_some() || args.d_out.is_some(),
        ..args.masks.options(batch)?
    })
}

pub fn run(adapter: &AdapterArgs, args: &RunArgs) -> Result<(), CliError> {
    let outputs: Vec<&std::path::Path> = std::iter::once(&args.out)
        .chain(&args.weights_out)
        .chain(&args.lse_out)
        .chain(&args.dq_out)
        .chain(&args.dk_out)
        .chain(&args.dv_out)
        .map(|p| p.as_path())
        .collect();
    output::check_outputs(&outputs, true)?;
    let ctx = adapter.context()?;
    let dtype = args.dtype.into();
    let layout = match args.layout {
        LayoutArg::Bhsd => Layout::Bhsd,
        LayoutArg::Bshd => Layout::Bshd,
    };
    let inputs = [&args.q, &args.k, &args.v]
        .map(|path| HostInput::read(path))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let d_out = args.d_out.as_ref().map(|path| HostInput::read(path)).transpose()?;
    let [qh, kh, vh] = [&inputs[0], &inputs[1], &inputs[2]].map(|h| h.logical_shape(layout));
    let options = options_from(args, qh[0])?;
    let shape = AttentionShape::from_qkv(qh, kh, vh)?;
    shape.check_options(&options)?;
    // f16 storage, or f16 products at --precision medium: values past f16's range
    // would turn into infinities silently.
    let kernel = resolve_kernel(&ctx, dtype, &options, &shape)?;
    let why = if dtype == DType::F16 {
        Some("--dtype f16")
    } else if kernel.f16_products() {
        Some("--precision medium on this adapter's tensor-core tiling")
    } else {
        None
    };
    if let Some(why) = why {
        inputs.iter().chain(&d_out).try_for_each(|h| h.check_f16_range(why))?;
    }
    if let Some(d) = &d_out {
        let want = shape.out_shape();
        if d.logical_shape(layout) != want {
            return Err(CliError::bad(format!(
                "{}: dO must have the output's shape {want:?} ({:?} layout), got {:?}",
                d.path.display(),
                layout,
                d.logical_shape(layout)
            )));
        }
    }
    // An additive mask holds no NaN or +inf (Mask::additive refuses them).
    let inputs_finite = inputs.iter().chain(&d_out).all(HostInput::all_finite);
    let [q, k, v] = [&inputs[0], &inputs[1], &inputs[2]].map(|h| h.upload(&ctx, layout, dtype));
    let (q, k, v) = (q?, k?, v?);
    let started = std::time::Instant::now();
    let result = sdpa(&ctx, &q, &k, &v, &options)?;
    let out = result.out.to_f32_vec(&ctx)?;
    let elapsed = started.elapsed();
    check_finite_output(&out, inputs_finite)?;
    let mut files = vec![(
        args.out.as_path(),
        npy::encode_f32(&layout.memory_shape(result.out.shape()), &out)?,
    )];
    if let (Some(path), Some(w)) = (&args.weights_out, &result.weights) {
        let [b, h, lq, lk] = w.shape();
        let shape: &[usize] = if args.average_weights {
            &[b, lq, lk]
        } else {
            &[b, h, lq, lk]
        };
        files.push((path.as_path(), npy::encode_f32(shape, &w.to_f32_vec(&ctx)?)?));
    }
    if let (Some(path), Some(l)) = (&args.lse_out, &result.lse) {
        files.push((path.as_path(), npy::encode_f32(&l.shape()[..3], &l.to_f32_vec(&ctx)?)?));
    }
    if let (Some(d), Some(lse)) = (&d_out, &result.lse) {
        let d = d.upload(&ctx, layout, dtype)?;
        let g = sdpa_backward(&ctx, &q, &k, &v, &result.out, lse, &d, &options)?;
        let paths = [&args.dq_out, &args.dk_out, &args.dv_out];
        for (path, t) in paths.into_iter().zip([&g.dq, &g.dk, &g.dv]) {
            let values = t.to_f32_vec(&ctx)?;
            check_finite_output(&values, inputs_finite)?;
            if let Some(path) = path {
                files.push((
                    path.as_path(),
                    npy::encode_f32(&layout.memory_shape(t.shape()), &values)?,
                ));
            }
        }
    }
    output::write_all(&files)?;
    // On stderr, so `--out -` keeps standard output for the array.
    eprintln!(
        "run: {} {} on {}, {:.1} ms with the output read back (a first call: pipelines compiled)",
        kernel.name(),
        dtype.name(),
        ctx.adapter_info().name,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
