//! Command-line interface: argument parsing, exit codes, and one module per command.
//!
//! Exit status: 0 on success, 1 when `check` finds a wrong result, 2 on bad input or
//! an adapter that cannot do what was asked (one line on stderr, no output written).
//! A reader that closes standard output early (`wgpu-attention check --json r.json |
//! head`) stops the printing, not the command: it still writes its files and exits with
//! its own status (Rust's `println!` would panic).

/// `println!` through [`write_stdout`], which skips lines once the reader has closed
/// standard output.
macro_rules! outln {
    () => {
        $crate::cli::write_stdout(format_args!(""))?
    };
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))?
    };
}

mod bench;
mod bench_compare;
mod check;
mod check_report;
mod demo;
mod info;
mod input;
mod isa;
mod mha;
mod npy;
mod output;
mod run;
mod tune;
mod tune_backward;
mod tune_scoring;
mod viz;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use wgpu_attention::{AdapterSelector, Context};

/// A CLI failure and its exit status.
#[derive(Debug)]
pub enum CliError {
    /// Bad input or unsupported request: exit 2.
    Bad(String),
    /// A check found wrong results: exit 1.
    Failed(String),
}

/// Set once standard output's reader has gone: later lines are dropped.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to standard output; once its reader has closed it, nothing (the
/// command goes on to its files and exit status). Other write errors are bad output.
pub fn write_stdout(line: std::fmt::Arguments) -> Result<(), CliError> {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(CliError::bad(format!("cannot write to standard output: {e}"))),
    }
}

impl CliError {
    pub fn bad(msg: impl Into<String>) -> Self {
        CliError::Bad(msg.into())
    }
}

impl From<wgpu_attention::Error> for CliError {
    fn from(e: wgpu_attention::Error) -> Self {
        CliError::Bad(e.to_string())
    }
}

#[derive(Parser)]
#[command(
    name = "wgpu-attention",
    version,
    about = "Scaled dot-product attention as WGSL kernels on any GPU"
)]
struct Cli {
    #[command(flatten)]
    adapter: AdapterArgs,
    #[command(subcommand)]
    command: Command,
}

/// Adapter choice, shared by every command.
#[derive(clap::Args, Clone, Debug)]
pub struct AdapterArgs {
    /// Use the adapter whose name contains this (case-insensitive), or the one `info`
    /// numbers so (`1`, `#1`); either may follow a backend (`vulkan:llvmpipe`, `gl:0`,
    /// as two drivers can share a name). Else WGPU_ADAPTER_NAME.
    #[arg(long, global = true, value_name = "NAME|N|BACKEND:NAME", help_heading = "Adapter")]
    adapter: Option<String>,
    /// Backend(s): vulkan, gl, metal, dx12 (comma-separated); else WGPU_BACKEND.
    #[arg(long, global = true, help_heading = "Adapter")]
    backend: Option<String>,
}

impl AdapterArgs {
    /// The selector these options and the environment make: `--backend` checked by name
    /// (an unknown backend refused, naming the flag), then `WGPU_ADAPTER_NAME` and
    /// `WGPU_BACKEND` where the options leave a field empty.
    pub fn selector(&self) -> Result<AdapterSelector, CliError> {
        if let Some(list) = &self.backend {
            AdapterSelector::parse_backends("--backend", list)?;
        }
        if self.adapter.as_deref().is_some_and(|a| a.trim().is_empty()) {
            return Err(CliError::bad("--adapter: empty (give a name, #N or BACKEND:NAME)"));
        }
        Ok(AdapterSelector {
            name: self.adapter.clone(),
            backend: self.backend.clone(),
        }
        .with_env()?)
    }

    pub fn context(&self) -> Result<Context, CliError> {
        Ok(Context::with_selector(self.selector()?)?)
    }
}

#[derive(Subcommand)]
enum Command {
    /// List every adapter wgpu sees, with features and limits.
    Info(info::InfoArgs),
    /// Check every kernel variant against the CPU reference over a fixed grid.
    Check(check::CheckArgs),
    /// One attention call on .npy inputs.
    Run(Box<run::RunArgs>),
    /// A multi-head attention layer (projections, heads, post-norm) on .npy inputs.
    Mha(Box<mha::MhaArgs>),
    /// Attention on the adapter checked against the CPU, then a multi-head attention
    /// layer over two padded sentences, its heads drawn as heatmaps (PNG).
    Demo(demo::DemoArgs),
    /// Time attention kernels against a GEMM and copy roofline probe.
    Bench(bench::BenchArgs),
    /// Attention-weight heatmaps as PNG, from q/k or from a weights .npy.
    Viz(viz::VizArgs),
    /// Time every fused tiling and tensor-core variant the adapter runs (each checked
    /// against the CPU reference) and keep the fastest variants in a tuning table.
    Tune(tune::TuneArgs),
    /// What a GPU compiler makes of each kernel (registers, spills, scratch, occupancy),
    /// on a Vulkan adapter or on RADV's null hardware with no GPU; a budget gate for CI.
    Isa(isa::IsaArgs),
}

pub fn main() -> ExitCode {
    // Before any thread: no libwayland "error:" lines on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Info(args) => info::run(&cli.adapter, &args),
        Command::Check(args) => check::run(&cli.adapter, &args),
        Command::Run(args) => run::run(&cli.adapter, &args),
        Command::Mha(args) => mha::run(&cli.adapter, &args),
        Command::Demo(args) => demo::run(&cli.adapter, &args),
        Command::Bench(args) => bench::run(&cli.adapter, &args),
        Command::Viz(args) => viz::run(&cli.adapter, &args),
        Command::Tune(args) => tune::run(&cli.adapter, &args),
        Command::Isa(args) => isa::run(&cli.adapter, &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Bad(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(CliError::Failed(msg)) => {
            eprintln!("FAILED: {msg}");
            ExitCode::from(1)
        }
    }
}
