//! Hostile files never crash anything (issue 13 §2): a checked-in corpus of broken
//! `.npy` files (tests/fixtures/hostile_npy/, run on every CI run) and property tests
//! with shrinking that draw headers (any shape text, dtype, data length) and raw bytes
//! for the CLI's `.npy` reader, and raw or structured bytes for the `.safetensors`
//! loader. Every case ends in a clean result or a clean error: the CLI exits 0 with an
//! output that is right (a float32 `.npy` of the queries' shape holding the attention
//! of the queries the file held, computed here) or 2 with one error line, and leaves
//! no other file behind; the loader returns `Err` with a message naming the problem,
//! never panics. Whole multi-tensor `.safetensors` layers with planted defects are in
//! tests/fuzz_safetensors.rs.

use crate::common;
use common::cli::{bin, files_in, read_f32, scratch, write_npy, write_raw_npy};
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

/// The keys and values of [`workdir`], row by row.
const K: [[f32; 2]; 3] = [[0.5, -0.5], [0.25, 1.0], [2.0, -1.0]];
const V: [[f32; 2]; 3] = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];

/// Runs `run` with `q` (and optionally `flag file` as well) and checks the outcome is
/// clean: exit 0 with an output that is a float32 `.npy`, or exit 2 with one `error:`
/// line and no output file; either way no other file is left in the directory (a
/// temporary). Returns the exit code.
fn assert_clean_run(dir: &Path, q: &str, extra: &[&str], what: &str) -> i32 {
    let out = dir.join("o.npy");
    let _ = std::fs::remove_file(&out);
    let before = files_in(dir);
    let output = bin()
        .current_dir(dir)
        .args(["run", "--q", q, "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"])
        .args(extra)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    let mut after = files_in(dir);
    match code {
        Some(0) => {
            assert!(out.exists(), "{what}: exit 0 without an output");
            after.retain(|n| n != "o.npy");
            let file = std::fs::File::open(&out).expect("open the output");
            let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
                .unwrap_or_else(|e| panic!("{what}: exit 0 with an output that is not a valid .npy: {e}"));
            assert_eq!(npy.dtype(), npyz::DType::Plain("<f4".parse().expect("f4")), "{what}");
        }
        Some(2) => {
            let errors: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("error: ") && !l.contains("XDG_RUNTIME_DIR"))
                .collect();
            assert_eq!(errors.len(), 1, "{what}: expected one error line, got:\n{stderr}");
            assert!(!out.exists(), "{what}: an output was written on error");
        }
        other => panic!("{what}: exit {other:?} (a crash?):\n{stderr}"),
    }
    assert_eq!(after, before, "{what}: files left behind (exit {code:?})");
    code.unwrap_or(-1)
}

/// Queries of `shape` ([1, Hq, Lq, 2]) as the file holds them, and whether every one
/// is tame (finite, at most 1e4 in magnitude), so that the run must succeed.
struct Queries {
    shape: [usize; 4],
    values: Vec<f32>,
}

impl Queries {
    fn tame(&self) -> bool {
        self.values.iter().all(|x| x.is_finite() && x.abs() <= 1e4)
    }
}

/// Checks `dir/o.npy` against the attention of `q` over [`K`] and [`V`] at scale
/// 1/sqrt(2), computed here in f64: the queries' shape; rows of tame queries within a
/// bound that grows with the scores; rows of finite queries up to 1e37 (whose scores
/// stay finite in f32) finite and within the values' range; rows holding NaN or an
/// infinity unconstrained.
fn assert_output_is_the_attention(dir: &Path, q: &Queries, what: &str) {
    let (shape, got) = read_f32(&dir.join("o.npy"));
    let want_shape: Vec<u64> = q.shape.iter().map(|&n| n as u64).collect();
    assert_eq!(shape, want_shape, "{what}: output shape");
    assert_eq!(got.len(), q.values.len(), "{what}: output length");
    let scale = 1.0 / 2f64.sqrt();
    for (row, (qr, out)) in q.values.chunks(2).zip(got.chunks(2)).enumerate() {
        if !qr.iter().all(|x| x.is_finite()) {
            continue;
        }
        let big = qr.iter().fold(0f32, |m, x| m.max(x.abs()));
        if big > 1e37 {
            continue;
        }
        let scores: Vec<f64> = K
            .iter()
            .map(|k| (f64::from(qr[0]) * f64::from(k[0]) + f64::from(qr[1]) * f64::from(k[1])) * scale)
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        for c in 0..2 {
            let want: f64 = p.iter().zip(&V).map(|(p, v)| p * f64::from(v[c])).sum::<f64>() / sum;
            let g = f64::from(out[c]);
            let (lo, hi) = (f64::from(V[0][c]), f64::from(V[2][c]));
            assert!(
                g.is_finite() && g >= lo - 1e-4 && g <= hi + 1e-4,
                "{what}: row {row} (q {qr:?}) column {c}: {g} is outside the values' range [{lo}, {hi}]"
            );
            if big <= 1e4 {
                let spread = scores.iter().map(|s| (s - max).abs()).fold(0.0, f64::max);
                let bound = 1e-5 + 4e-6 * (max.abs() + spread);
                assert!(
                    (g - want).abs() <= bound,
                    "{what}: row {row} (q {qr:?}) column {c}: got {g}, want {want} (bound {bound:e})"
                );
            }
        }
    }
}

/// What the CLI must make of queries written with `descr`, `shape` text and `data`
/// beside [`workdir`]'s k and v: `Err(must)` where they are not usable queries (`must`:
/// whether exit 2 is certain; a dtype spelt without a byte order npyz may read or
/// refuse), else the queries the file holds (data past them ignored or refused).
fn expected_queries(descr: &str, shape: &str, data: &[u8]) -> Result<(Queries, bool), bool> {
    let (order, kind) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (Some(c), &descr[1..]),
        _ => (None, descr),
    };
    let item = match kind {
        "f4" => 4,
        "f2" => 2,
        _ => return Err(true),
    };
    // '|' (no byte order), '=' (native) and none at all: npyz may take them or not.
    let certain = matches!(order, Some('<' | '>'));
    let dims: Option<Vec<usize>> = shape
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<usize>().ok())
        .collect();
    let Some(dims) = dims else { return Err(true) };
    let [1, hq, lq, 2] = dims[..] else { return Err(true) };
    // Zero-sized queries are refused, as are headers claiming more than the data holds.
    let Some(count) = hq.checked_mul(lq).and_then(|n| n.checked_mul(2)) else {
        return Err(true);
    };
    if count == 0 || data.len() / item < count {
        return Err(true);
    }
    let values = data[..count * item]
        .chunks(item)
        .map(|b| match (item, order == Some('>')) {
            (4, false) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            (4, true) => f32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            (_, false) => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            (_, true) => half::f16::from_be_bytes([b[0], b[1]]).to_f32(),
        })
        .collect();
    let exact = data.len() == count * item;
    if !certain {
        return Err(false);
    }
    Ok((
        Queries {
            shape: [1, hq, lq, 2],
            values,
        },
        exact,
    ))
}

/// Runs `run` on queries written as `descr`, `shape` and `data` and checks the outcome
/// against [`expected_queries`].
fn assert_run_as_expected(dir: &Path, descr: &str, shape: &str, data: &[u8], what: &str) {
    write_raw_npy(&dir.join("q.npy"), descr, shape, data);
    let code = assert_clean_run(dir, "q.npy", &[], what);
    match expected_queries(descr, shape, data) {
        Err(true) => assert_eq!(code, 2, "{what}: unusable queries were accepted"),
        Err(false) => {}
        Ok((q, exact)) => {
            // Non-finite or huge queries may be refused, and data past the array.
            if q.tame() && exact {
                assert_eq!(code, 0, "{what}: usable queries were refused");
            }
            if code == 0 {
                assert_output_is_the_attention(dir, &q, what);
            }
        }
    }
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
    std::fs::rename(dir.join(out), dir.join("o.npy")).expect("rename");
    let q = Queries {
        shape: [1, 1, 2, 2],
        values: vec![0.5, 0.25, -1.0, 1.0],
    };
    assert_output_is_the_attention(&dir, &q, "non-UTF-8 paths");
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

/// A query value: mostly ordinary, sometimes huge, tiny, signed zero or not finite.
fn query_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        12 => -3.0f32..3.0,
        1 => prop_oneof![Just(1e5f32), Just(-2e4), Just(1e30), Just(-3e38)],
        1 => prop_oneof![Just(1e-40f32), Just(-0.0), Just(6e-8)],
        1 => prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)],
    ]
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
        let Some(_) = common::ctx() else { return Ok(()) };
        let dir = workdir("fuzz-npy-header");
        let what = format!("descr {descr:?} shape {shape} data {} bytes", data.len());
        assert_run_as_expected(&dir, &descr, &shape, &data, &what);
    }

    #[test]
    fn well_formed_npy_queries_give_their_attention(
        descr in prop_oneof![Just("<f4"), Just(">f4"), Just("<f2"), Just(">f2")],
        hq in 1usize..4,
        lq in 1usize..6,
        values in prop::collection::vec(query_value(), 64),
        cut in prop_oneof![6 => Just(0i64), 1 => -3i64..0, 1 => 1i64..9],
    ) {
        let Some(_) = common::ctx() else { return Ok(()) };
        let dir = workdir("fuzz-npy-wellformed");
        let big_endian = descr.starts_with('>');
        let mut data = Vec::new();
        for &x in &values[..hq * lq * 2] {
            match (descr.ends_with('4'), big_endian) {
                (true, false) => data.extend_from_slice(&x.to_le_bytes()),
                (true, true) => data.extend_from_slice(&x.to_be_bytes()),
                (false, false) => data.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                (false, true) => data.extend_from_slice(&half::f16::from_f32(x).to_be_bytes()),
            }
        }
        // A few bytes short (refused), or a few past the array.
        let len = (data.len() as i64 + cut).max(0) as usize;
        data.resize(len, 0x7f);
        let shape = format!("(1, {hq}, {lq}, 2)");
        let what = format!("descr {descr} shape {shape} cut {cut} values {:?}", &values[..hq * lq * 2]);
        assert_run_as_expected(&dir, descr, &shape, &data, &what);
    }

    #[test]
    fn raw_bytes_as_npy_give_clean_errors(
        with_magic in any::<bool>(),
        bytes in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let Some(_) = common::ctx() else { return Ok(()) };
        let dir = workdir("fuzz-npy-bytes");
        let mut file = if with_magic { b"\x93NUMPY\x01\x00".to_vec() } else { Vec::new() };
        file.extend_from_slice(&bytes);
        std::fs::write(dir.join("q.npy"), &file).expect("write");
        let code = assert_clean_run(&dir, "q.npy", &[], &format!("{} bytes", file.len()));
        prop_assert_eq!(code, 2);
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
        // Random bytes are not a safetensors file: the format's error, named as such.
        let e = load_safetensors(&bytes, 2, None, "").expect_err("random bytes loaded");
        prop_assert!(e.to_string().starts_with("invalid weights file: "), "{}", e);
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
        // One tensor never makes a layer: always an error, and the one the format or
        // the layer's rules give (a panic fails the test too).
        let what = format!("header {header}, {} bytes of data, {heads} heads", data.len());
        let message = match load_safetensors(&safetensors_file(&header, &data), heads, None, "") {
            Ok(loaded) => panic!("{what}: one tensor loaded as a layer: {:?}", loaded.config),
            Err(e) => e.to_string(),
        };
        let item: u128 = match dtype {
            "F64" | "I64" => 8,
            "F32" => 4,
            "F16" | "BF16" => 2,
            _ => 1,
        };
        let count = shape.iter().try_fold(1u64, |n, d| n.checked_mul(d.parse::<u64>().expect("u64")));
        let bytes = count.map(|n| u128::from(n) * item).filter(|&b| b * 8 <= u128::from(u64::MAX));
        let (begin, end) = offsets;
        let expected: &[&str] = if begin != 0 || end < begin {
            &["invalid weights file", "invalid offset for tensor"]
        } else if bytes.is_none() {
            &["invalid weights file", "overflow"]
        } else if bytes != Some(u128::from(end - begin)) {
            &["invalid weights file", "invalid shape, data type, or offset"]
        } else if data.len() as u64 != end {
            &["invalid weights file", "incomplete metadata"]
        } else {
            match name {
                "in_proj_weight" => &["weights tensor '", "_proj"],
                "q_proj_weight" => &["weights tensor '", "_proj_weight'"],
                "q_proj.weight" if message.contains("multiple of") => &["q_proj.weight", "heads"],
                "q_proj.weight" => &["weights tensor '", "_proj.weight'"],
                _ => &["found none of", "is the prefix right?"],
            }
        };
        for phrase in expected {
            prop_assert!(message.contains(phrase), "{}: the error does not say {:?}: {}", what, phrase, message);
        }
    }
}
