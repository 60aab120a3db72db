//! Hostile files never crash anything (issue 13 §2): a checked-in corpus of broken
//! `.npy` files (tests/fixtures/hostile_npy/, run on every CI run) and property tests
//! with shrinking that draw headers (any shape text, dtype, data length) and raw bytes
//! for the CLI's `.npy` reader, and raw or structured bytes for the `.safetensors`
//! loader. Every case ends in a clean result or a clean error: the CLI exits 0 or 2
//! with one error line and no output file; the loader returns `Err`, never panics.

mod common;
use common::cli::{bin, scratch, write_npy, write_raw_npy};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use wgpu_attention::mha::load_safetensors;

/// A directory with valid k.npy and v.npy `[1, 1, 3, 2]` beside the file under test.
fn workdir(name: &str) -> PathBuf {
    let dir = scratch(name);
    write_npy(&dir.join("k.npy"), &[1, 1, 3, 2], &[0.5f32, -0.5, 0.25, 1.0, 2.0, -1.0]);
    write_npy(&dir.join("v.npy"), &[1, 1, 3, 2], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    dir
}

/// Runs `run` with `q` (and optionally `flag file` as well) and checks the outcome is
/// clean: exit 0 with an output, or exit 2 with one `error:` line and no output file.
/// Returns the exit code.
fn assert_clean_run(dir: &Path, q: &str, extra: &[&str], what: &str) -> i32 {
    let out = dir.join("o.npy");
    let _ = std::fs::remove_file(&out);
    let output = bin()
        .current_dir(dir)
        .args(["run", "--q", q, "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"])
        .args(extra)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    match code {
        Some(0) => assert!(out.exists(), "{what}: exit 0 without an output"),
        Some(2) => {
            let errors: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("error: ") && !l.contains("XDG_RUNTIME_DIR"))
                .collect();
            assert_eq!(errors.len(), 1, "{what}: expected one error line, got:\n{stderr}");
            assert!(!out.exists(), "{what}: an output was written on error");
            assert!(!dir.join("o.npy.partial").exists(), "{what}: a partial file was left");
        }
        other => panic!("{what}: exit {other:?} (a crash?):\n{stderr}"),
    }
    code.unwrap_or(-1)
}

#[test]
fn every_file_of_the_hostile_corpus_is_a_clean_error() {
    if common::ctx().is_none() {
        return;
    }
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile_npy");
    let dir = workdir("hostile-corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 15, "the corpus went missing");
    for file in files {
        let name = file.file_name().expect("name").to_string_lossy().into_owned();
        std::fs::copy(&file, dir.join("bad.npy")).expect("copy");
        // As the queries, as key lengths and as a mask: each reader path.
        for extra in [&[][..], &["--key-lengths", "bad.npy"], &["--mask", "bad.npy"]] {
            let q = if extra.is_empty() { "bad.npy" } else { "k.npy" };
            let code = assert_clean_run(&dir, q, extra, &format!("{name} {extra:?}"));
            assert_eq!(code, 2, "{name} {extra:?} was accepted");
        }
    }
}

#[test]
fn paths_that_are_not_utf8_work() {
    use std::os::unix::ffi::OsStrExt;
    if common::ctx().is_none() {
        return;
    }
    let dir = workdir("non-utf8");
    let q = std::ffi::OsStr::from_bytes(b"q\xff\xfe.npy");
    let out = std::ffi::OsStr::from_bytes(b"o\xff.npy");
    write_npy(&dir.join(q), &[1, 1, 2, 2], &[0.5f32, 0.25, -1.0, 1.0]);
    let status = bin()
        .current_dir(&dir)
        .args(["run", "--k", "k.npy", "--v", "v.npy"])
        .arg("--q")
        .arg(q)
        .arg("--out")
        .arg(out)
        .status()
        .expect("runs");
    assert!(status.success(), "{status}");
    assert!(dir.join(out).exists(), "no output at the non-UTF-8 path");
}

/// Shape tuples as a header might spell them: small, zero, huge, negative, NaN, empty.
fn shape_text() -> impl Strategy<Value = String> {
    let dim = prop_oneof![
        (0u64..6).prop_map(|n| n.to_string()),
        Just("0".to_string()),
        Just("1073741824".to_string()),
        Just("18446744073709551615".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("-1".to_string()),
        Just("nan".to_string()),
        Just("1.5".to_string()),
    ];
    prop::collection::vec(dim, 0..6).prop_map(|dims| match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    })
}

fn descr() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<f4".to_string()),
        Just("<f2".to_string()),
        Just("<f8".to_string()),
        Just(">f4".to_string()),
        Just("|b1".to_string()),
        Just("<i8".to_string()),
        Just("<c8".to_string()),
        Just("|O".to_string()),
        "[<>|]?[a-zA-Z][0-9]{0,3}",
    ]
}

proptest! {
    // Each case starts a process: few cases, shrunk on failure.
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn npy_headers_of_any_shape_and_dtype_give_clean_outcomes(
        descr in descr(),
        shape in shape_text(),
        data in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        if common::ctx().is_some() {
            let dir = workdir("fuzz-npy-header");
            write_raw_npy(&dir.join("q.npy"), &descr, &shape, &data);
            assert_clean_run(&dir, "q.npy", &[], &format!("descr {descr:?} shape {shape} data {} bytes", data.len()));
        }
    }

    #[test]
    fn raw_bytes_as_npy_give_clean_errors(
        with_magic in any::<bool>(),
        bytes in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        if common::ctx().is_some() {
            let dir = workdir("fuzz-npy-bytes");
            let mut file = if with_magic { b"\x93NUMPY\x01\x00".to_vec() } else { Vec::new() };
            file.extend_from_slice(&bytes);
            std::fs::write(dir.join("q.npy"), &file).expect("write");
            let code = assert_clean_run(&dir, "q.npy", &[], &format!("{} bytes", file.len()));
            prop_assert_eq!(code, 2);
        }
    }
}

/// A `.safetensors` file: the JSON header's length (u64 LE), the header, the data.
fn safetensors_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn raw_bytes_never_panic_the_weights_loader(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        prop_assert!(load_safetensors(&bytes, 2, None, "").is_err());
    }

    #[test]
    fn weights_headers_of_any_shape_never_panic_the_loader(
        name in prop_oneof![
            Just("in_proj_weight"), Just("in_proj_bias"), Just("out_proj.weight"),
            Just("q_proj.weight"), Just("q_proj_weight"), Just("norm.weight"),
        ],
        dtype in prop_oneof![Just("F32"), Just("F16"), Just("BF16"), Just("F64"), Just("I64"), Just("U8")],
        shape in prop::collection::vec(prop_oneof![0u64..5, Just(1u64 << 40), Just(u64::MAX)], 0..4),
        offsets in (0u64..64, 0u64..64),
        data in prop::collection::vec(any::<u8>(), 0..64),
        heads in 1usize..4,
    ) {
        let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
        let header = format!(
            "{{\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}}}",
            shape.join(","), offsets.0, offsets.1
        );
        // Ok is possible only for a consistent file; a panic fails the test.
        let _ = load_safetensors(&safetensors_file(&header, &data), heads, None, "");
    }
}
