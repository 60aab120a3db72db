//! Helpers for the tests that drive the command-line binary.

use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `wgpu-attention` binary built for this test run, or the one
/// `WGPU_ATTENTION_BIN` names (to run the CLI tests against another build, e.g. to show
/// a regression test failing on the binary before its fix).
pub fn bin() -> Command {
    match std::env::var_os("WGPU_ATTENTION_BIN") {
        Some(path) => Command::new(path),
        None => Command::new(env!("CARGO_BIN_EXE_wgpu-attention")),
    }
}

/// A fresh, empty temporary directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-attention-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes `data` as a C-order `.npy` of `shape`.
pub fn write_npy<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[u64], data: &[T]) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut file)
        .begin_nd()
        .expect("npy header");
    w.extend(data.iter().copied()).expect("npy data");
    w.finish().expect("npy finish");
}

/// Reads a float32 `.npy`: its shape and data.
pub fn read_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file)).expect("valid npy");
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec::<f32>().expect("f32 data"))
}

/// Writes a `.npy` with a hand-made header (`descr` like `<f4`, `shape` as Python writes
/// it, e.g. `(2, 3)`) followed by `data`: for headers that lie about their data.
pub fn write_raw_npy(path: &Path, descr: &str, shape: &str, data: &[u8]) {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header, padded with spaces to 64, then '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).expect("write npy");
}

/// The names of the files in `dir`, sorted (what a command left behind).
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
