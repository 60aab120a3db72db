//! `wgpu-attention`: command-line front end of the library (see `--help`).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
