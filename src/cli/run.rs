//! `run`: one attention call on `.npy` inputs, outputs written as float32 `.npy`.

use super::npy::{self, MaskArray};
use super::output;
use super::{AdapterArgs, CliError};
use std::path::PathBuf;
use wgpu_attention::{
    reads_codes, resolve_kernel, sdpa, sdpa_backward, sdpa_quantized, AttentionOptions, AttentionShape,
    CausalAlignment, Context, DType, FusedTiling, KernelChoice, Layout, Mask, Precision, QuantizedKv, Tensor, Window,
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
    #[arg(long, help_heading = "Inputs")]
    q: PathBuf,
    /// Keys, [B, Hkv, Lk, D].
    #[arg(long, help_heading = "Inputs")]
    k: PathBuf,
    /// Values, [B, Hkv, Lk, Dv].
    #[arg(long, help_heading = "Inputs")]
    v: PathBuf,
    /// Memory layout of q, k, v and out.
    #[arg(long, value_enum, default_value = "bhsd", help_heading = "Inputs")]
    layout: LayoutArg,
    /// Runs the backward pass too: the gradient dO of the loss with respect to the output
    /// (an input, shaped and laid out as the output). The gradients go to --dq-out,
    /// --dk-out and --dv-out. (Was --d-out, still accepted until 0.2.)
    #[arg(
        long,
        alias = "d-out",
        value_name = "DO",
        help_heading = "Inputs",
        action = clap::ArgAction::Append,
        requires = "dq_out",
        requires = "dk_out",
        requires = "dv_out"
    )]
    grad: Vec<PathBuf>,
    /// Output file (float32, same layout as the inputs); `-` writes it to standard output.
    #[arg(long, help_heading = "Outputs")]
    out: PathBuf,
    /// Also write the attention weights [B, Hq, Lq, Lk].
    #[arg(long, help_heading = "Outputs")]
    weights_out: Option<PathBuf>,
    /// With --weights-out: the weights averaged over the query heads, [B, Lq, Lk]
    /// (PyTorch's average_attn_weights=True), without holding every head's.
    #[arg(long, requires = "weights_out", help_heading = "Outputs")]
    average_weights: bool,
    /// Also write the log-sum-exp per row [B, Hq, Lq].
    #[arg(long, help_heading = "Outputs")]
    lse_out: Option<PathBuf>,
    /// With --grad: where dQ goes (float32, q's layout).
    #[arg(long, requires = "grad", help_heading = "Outputs")]
    dq_out: Option<PathBuf>,
    /// With --grad: where dK goes (summed over the query heads sharing a kv head).
    #[arg(long, requires = "grad", help_heading = "Outputs")]
    dk_out: Option<PathBuf>,
    /// With --grad: where dV goes.
    #[arg(long, requires = "grad", help_heading = "Outputs")]
    dv_out: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Masks and scale")]
    masks: MaskArgs,
    /// Which path computes it.
    #[arg(long, value_enum, default_value = "auto", help_heading = "Computation")]
    kernel: KernelArg,
    /// Tile configuration of the fused kernel: auto, or a tiling `info` lists.
    #[arg(long, default_value = "auto", value_parser = parse_tiling, help_heading = "Computation")]
    tiling: FusedTiling,
    /// The element type the GPU stores and computes in. Default: the files' (f16 where
    /// q, k, v and dO are all float16 and the adapter has SHADER_F16, else f32).
    #[arg(long, value_enum, help_heading = "Computation")]
    dtype: Option<DTypeArg>,
    /// Whether f32 data may be multiplied in f16 on tensor cores: highest (never), high
    /// or medium (where the adapter has them). f16 data always may.
    #[arg(long, default_value = "highest", value_parser = parse_precision, help_heading = "Computation")]
    precision: Precision,
    /// int8: quantize K and V to int8 on load (one scale per row, as an int8 KV cache
    /// keeps them) and attend to those; head dims must be multiples of 4. Forward only.
    #[arg(long, value_name = "int8", value_parser = ["int8"], conflicts_with = "grad", help_heading = "Computation")]
    kv_dtype: Option<String>,
}

/// A 4-D float input read on the host, before it goes to the GPU.
pub struct HostInput {
    path: PathBuf,
    /// The array's shape as stored (BHSD or BSHD).
    memory: [usize; 4],
    data: Vec<f32>,
    /// Whether the file held float16.
    float16: bool,
}

impl HostInput {
    pub fn read(path: &std::path::Path) -> Result<Self, CliError> {
        let (a, float16) = npy::read_float_noting_f16(path)?;
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
            float16,
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
        need_lse: args.lse_out.is_some() || !args.grad.is_empty(),
        ..args.masks.options(batch)?
    })
}

pub fn run(adapter: &AdapterArgs, args: &RunArgs) -> Result<(), CliError> {
    // Taken as a list so that the error names both spellings (clap's names only one).
    if args.grad.len() > 1 {
        return Err(CliError::bad(format!(
            "--grad (or its old name --d-out) given {} times: give the gradient dO once",
            args.grad.len()
        )));
    }
    let outputs: Vec<&std::path::Path> = std::iter::once(&args.out)
        .chain(&args.weights_out)
        .chain(&args.lse_out)
        .chain(&args.dq_out)
        .chain(&args.dk_out)
        .chain(&args.dv_out)
        .map(|p| p.as_path())
        .collect();
    output::check_outputs(&outputs, true)?;
    let old_flag = |a: &std::ffi::OsString| a.to_str().is_some_and(|a| a == "--d-out" || a.starts_with("--d-out="));
    if std::env::args_os().any(|a| old_flag(&a)) {
        eprintln!("note: --d-out is now --grad (the gradient dO is an input); --d-out works until 0.2");
    }
    let ctx = adapter.context()?;
    let layout = match args.layout {
        LayoutArg::Bhsd => Layout::Bhsd,
        LayoutArg::Bshd => Layout::Bshd,
    };
    let inputs = [&args.q, &args.k, &args.v]
        .map(|path| HostInput::read(path))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let d_out = args.grad.first().map(|path| HostInput::read(path)).transpose()?;
    let dtype = match args.dtype {
        Some(d) => d.into(),
        // f16 only where nothing is lost: every input (dO too) a float16 file.
        None if inputs.iter().chain(&d_out).all(|h| h.float16) && ctx.capabilities().f16 => DType::F16,
        None => DType::F32,
    };
    let [qh, kh, vh] = [&inputs[0], &inputs[1], &inputs[2]].map(|h| h.logical_shape(layout));
    let options = options_from(args, qh[0])?;
    let shape = AttentionShape::from_qkv(qh, kh, vh)?;
    shape.check_options(&options)?;
    // f16 storage, or f16 products at --precision medium: values past f16's range
    // would turn into infinities silently.
    let kernel = resolve_kernel(&ctx, dtype, &options, &shape)?;
    let why = if dtype == DType::F16 {
        Some("f16 (--dtype f16, or float16 input files)")
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
    // Quantized before the clock starts: the time is attention's.
    let quantized = args
        .kv_dtype
        .as_ref()
        .map(|_| QuantizedKv::quantize(&ctx, &k, &v))
        .transpose()?;
    let started = std::time::Instant::now();
    let (result, kernel_name) = if let Some(kv) = &quantized {
        let name = if reads_codes(&ctx, dtype, &shape, &options)? {
            "decode/lanes on int8 K and V".to_string()
        } else {
            format!("{} on int8 K and V, dequantized", kernel.name())
        };
        (sdpa_quantized(&ctx, &q, kv, &options)?, name)
    } else {
        (sdpa(&ctx, &q, &k, &v, &options)?, kernel.name())
    };
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
    let mut backward_time = None;
    if let (Some(d), Some(lse)) = (&d_out, &result.lse) {
        let d = d.upload(&ctx, layout, dtype)?;
        let started = std::time::Instant::now();
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
        let tiling = wgpu_attention::backward_tiling(&ctx, dtype, &options, &shape)?;
        backward_time = Some((tiling.name(), started.elapsed()));
    }
    output::write_all(&files)?;
    // On stderr, so `--out -` keeps standard output for the array.
    let backward = backward_time.map_or(String::new(), |(tiling, t)| {
        format!(
            "; backward {tiling} {:.1} ms with dQ, dK, dV read back",
            t.as_secs_f64() * 1e3
        )
    });
    eprintln!(
        "run: {} {} on {}, {:.1} ms with the output read back{backward} (first calls: pipelines compiled)",
        kernel_name,
        dtype.name(),
        ctx.adapter_info().name,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
