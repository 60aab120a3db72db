//! The command line under hostile use (issue 36): planted links, one file named twice,
//! permissions, FIFOs, unbounded inputs and images, shapes that divide by zero or
//! cannot be allocated, options that overflow. Each case exits 2 with one line naming
//! the problem and writes nothing, or succeeds without harm.

use crate::common;

use common::cli::{bin, files_in, read_f32, scratch, write_npy};
use common::torch_fixture as fixture;
use std::path::{Path, PathBuf};
use std::process::Output;
use wgpu_attention::check::Rng;

/// Random q, k, v `[1, 2, 5, 8]` (seeded) in `dir`; returns their paths.
fn inputs(dir: &Path, seed: u64) -> [PathBuf; 3] {
    let mut rng = Rng::new(seed);
    ["q", "k", "v"].map(|name| {
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, &[1, 2, 5, 8], &rng.vec(80, -1.0, 1.0));
        path
    })
}

/// `run` on the test inputs drawn with `seed`, its other arguments still to come.
fn run_command(dir: &Path, seed: u64) -> std::process::Command {
    let [q, k, v] = inputs(dir, seed);
    let mut command = bin();
    command
        .current_dir(dir)
        .arg("run")
        .arg("--q")
        .arg(q)
        .arg("--k")
        .arg(k)
        .arg("--v")
        .arg(v);
    command
}

fn run(dir: &Path, extra: &[&str]) -> Output {
    run_command(dir, 36).args(extra).output().expect("runs")
}

/// Asserts exit status 2 and one stderr line containing every needle.
fn assert_refused(output: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "'{needle}' missing from: {stderr}");
    }
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "status {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[cfg(unix)]
#[test]
fn a_planted_link_beside_the_output_is_never_followed() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("planted-link");
    std::fs::write(dir.join("victim"), "precious").expect("victim");
    // The old temporary's name, and names like the new ones: none is used.
    for planted in ["out.npy.partial", ".out.npy.tmp", ".out.npy..tmp"] {
        std::os::unix::fs::symlink(dir.join("victim"), dir.join(planted)).expect("symlink");
    }
    assert_ok(&run(&dir, &["--out", "out.npy"]));
    assert_eq!(std::fs::read_to_string(dir.join("victim")).expect("victim"), "precious");
    let meta = std::fs::symlink_metadata(dir.join("out.npy")).expect("output");
    assert!(
        meta.file_type().is_file(),
        "the output must be a regular file, not a link"
    );
    let (shape, _) = read_f32(&dir.join("out.npy"));
    assert_eq!(shape, [1, 2, 5, 8]);
    // No temporary is left behind.
    let expected = [
        ".out.npy..tmp",
        ".out.npy.tmp",
        "k.npy",
        "out.npy",
        "out.npy.partial",
        "q.npy",
        "v.npy",
        "victim",
    ];
    assert_eq!(files_in(&dir), expected);
}

#[test]
fn two_outputs_naming_one_file_are_refused_before_anything_is_written() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("same-file");
    let output = run(&dir, &["--out", "same.npy", "--lse-out", "./same.npy"]);
    assert_refused(&output, &["same.npy", "./same.npy", "the same file"]);
    assert!(!dir.join("same.npy").exists(), "nothing may be written");

    // An existing file, named through a link and through a hard link.
    std::fs::write(dir.join("out.npy"), "old").expect("old output");
    #[cfg(unix)]
    std::os::unix::fs::symlink("out.npy", dir.join("link.npy")).expect("symlink");
    #[cfg(not(unix))]
    std::fs::hard_link(dir.join("out.npy"), dir.join("link.npy")).expect("link");
    std::fs::hard_link(dir.join("out.npy"), dir.join("hard.npy")).expect("hard link");
    for other in ["link.npy", "hard.npy"] {
        let output = run(&dir, &["--out", "out.npy", "--weights-out", other]);
        assert_refused(&output, &["out.npy", other, "the same file"]);
        assert_eq!(std::fs::read_to_string(dir.join("out.npy")).expect("out"), "old");
    }
    // A dangling link to an output that does not exist yet is that output too.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("new.npy", dir.join("dangling.npy")).expect("symlink");
        let output = run(&dir, &["--out", "new.npy", "--weights-out", "dangling.npy"]);
        assert_refused(&output, &["new.npy", "dangling.npy", "the same file"]);
        assert!(!dir.join("new.npy").exists(), "nothing may be written");
    }
}

#[cfg(unix)]
#[test]
fn a_replaced_output_keeps_its_mode_and_a_linked_output_keeps_its_link() {
    use std::os::unix::fs::PermissionsExt;
    let Some(_) = common::ctx() else { return };
    let dir = scratch("mode-kept");
    let out = dir.join("out.npy");
    std::fs::write(&out, "old").expect("old output");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_ok(&run(&dir, &["--out", "out.npy"]));
    let mode = std::fs::metadata(&out).expect("output").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");
    assert_eq!(read_f32(&out).0, [1, 2, 5, 8]);

    // An output that is a link to a regular file: the file is replaced, the link stays.
    std::fs::create_dir(dir.join("real")).expect("dir");
    std::fs::write(dir.join("real/target.npy"), "old").expect("target");
    std::os::unix::fs::symlink("real/target.npy", dir.join("via-link.npy")).expect("symlink");
    assert_ok(&run(&dir, &["--out", "via-link.npy"]));
    let meta = std::fs::symlink_metadata(dir.join("via-link.npy")).expect("link");
    assert!(meta.file_type().is_symlink(), "the link was replaced by a file");
    assert_eq!(read_f32(&dir.join("real/target.npy")).0, [1, 2, 5, 8]);
    assert_eq!(files_in(&dir.join("real")), ["target.npy"]);
}

#[cfg(unix)]
#[test]
fn inputs_from_a_fifo_or_stdin_are_read_once() {
    use std::io::Write;
    let Some(_) = common::ctx() else { return };
    let dir = scratch("fifo");
    let [q, k, v] = inputs(&dir, 7);
    let expected = {
        let output = run(&dir, &["--out", "regular.npy"]);
        assert_ok(&output);
        read_f32(&dir.join("regular.npy")).1
    };
    // Standard input.
    let mut child = bin()
        .args(["run", "--q", "/dev/stdin", "--k"])
        .arg(&k)
        .arg("--v")
        .arg(&v)
        .arg("--out")
        .arg(dir.join("stdin.npy"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let bytes = std::fs::read(&q).expect("q bytes");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&bytes)
        .expect("feed stdin");
    assert_ok(&child.wait_with_output().expect("wait"));
    assert_eq!(read_f32(&dir.join("stdin.npy")).1, expected);
    // A named pipe, fed by a thread.
    let fifo = dir.join("q.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        common::skip_or_fail("mkfifo is not available");
        return;
    }
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, bytes))
    };
    let output = bin()
        .arg("run")
        .arg("--q")
        .arg(&fifo)
        .arg("--k")
        .arg(&k)
        .arg("--v")
        .arg(&v)
        .arg("--out")
        .arg(dir.join("fifo.npy"))
        .output()
        .expect("runs");
    writer.join().expect("writer").expect("write to fifo");
    assert_ok(&output);
    assert_eq!(read_f32(&dir.join("fifo.npy")).1, expected);
}

/// Width and height of a PNG file.
fn png_size(path: &Path) -> (u32, u32) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).expect("png")));
    let reader = decoder.read_info().expect("png header");
    let info = reader.info();
    (info.width, info.height)
}

#[test]
fn viz_bounds_long_labels_and_many_heads() {
    let dir = scratch("viz-bounds");
    let mut rng = Rng::new(11);
    let weights = dir.join("w.npy");
    let heads = 200;
    write_npy(&weights, &[1, heads, 4, 4], &rng.vec(heads as usize * 16, 0.0, 1.0));
    let long = vec!["x".repeat(5000); 4].join(",");
    let output = bin()
        .arg("viz")
        .arg("--weights")
        .arg(&weights)
        .arg("--out-dir")
        .arg(dir.join("images"))
        .args(["--query-labels", &long, "--key-labels", &long])
        .output()
        .expect("runs");
    assert_ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("heads 0-15 of 200") && stderr.contains("--heads"),
        "{stderr}"
    );
    let files = files_in(&dir.join("images"));
    assert_eq!(files.len(), 17, "16 heads and their grid: {files:?}");
    for name in ["attention_b0_h0.png", "attention_b0_heads.png"] {
        let (w, h) = png_size(&dir.join("images").join(name));
        assert!(w <= 4096 && h <= 4096, "{name}: {w} x {h}");
    }
    // A chosen selection, and one that a grid cannot hold.
    let select = |spec: &str, out: &str| {
        bin()
            .arg("viz")
            .arg("--weights")
            .arg(&weights)
            .arg("--out-dir")
            .arg(dir.join(out))
            .args(["--heads", spec])
            .output()
            .expect("runs")
    };
    assert_ok(&select("3,150-151,199", "chosen"));
    assert_eq!(
        files_in(&dir.join("chosen")),
        [
            "attention_b0_h150.png",
            "attention_b0_h151.png",
            "attention_b0_h199.png",
            "attention_b0_h3.png",
            "attention_b0_heads.png"
        ]
    );
    assert_refused(&select("0-70", "too-many"), &["--heads", "71 heads", "at most 64"]);
    assert_refused(&select("200", "missing"), &["--heads", "head", "200"]);
    assert!(!dir.join("too-many").exists() && !dir.join("missing").exists());
}

#[test]
fn bench_refuses_shapes_that_divide_by_zero_or_cannot_be_allocated() {
    let refused = |shape: &str, needles: &[&str]| {
        let output = bin()
            .args(["bench", "--shape", shape, "--kernel", "cpu"])
            .output()
            .expect("runs");
        assert_refused(&output, needles);
    };
    refused("1,1,2,1,1,4", &["--shape", "multiple of 2"]);
    refused("1,1,0,1,1,4", &["--shape", "key/value heads", "at least 1"]);
    refused("1,0,1,1,1,4", &["--shape", "query heads", "at least 1"]);
    let Some(_) = common::ctx() else { return };
    // 1e9 keys of 256: 1 TB of host data. Refused per row, before any allocation.
    let output = bin()
        .args([
            "bench",
            "--shape",
            "1,1,1,1,1000000000,256",
            "--kernel",
            "fused",
            "--dtype",
            "f32",
        ])
        .args(["--reps", "1", "--probe", "32", "--copy-mib", "1"])
        .output()
        .expect("runs");
    assert_ok(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("refused:") && stdout.contains("max_buffer_size"),
        "{stdout}"
    );
}

#[test]
fn mha_reads_weights_no_further_than_their_header_declares() {
    let dir = scratch("mha-bounded");
    let query = fixture("self_query.npy");
    let mha = |weights: &Path| {
        bin()
            .args(["mha", "--num-heads", "4", "--weights"])
            .arg(weights)
            .arg("--query")
            .arg(&query)
            .arg("--out")
            .arg(dir.join("out.npy"))
            .output()
            .expect("runs")
    };
    // An endless input: refused at once (its header is not JSON), not read to exhaustion.
    #[cfg(unix)]
    assert_refused(&mha(Path::new("/dev/zero")), &["/dev/zero", "not a safetensors file"]);
    // A header length beyond the format's limit.
    let huge = dir.join("huge.safetensors");
    std::fs::write(&huge, u64::MAX.to_le_bytes()).expect("write");
    assert_refused(&mha(&huge), &["header length", "beyond"]);
    // Extra bytes after the data, and data cut short.
    let good = std::fs::read(fixture("self.safetensors")).expect("fixture");
    let longer = dir.join("longer.safetensors");
    std::fs::write(&longer, [&good[..], &[0u8; 64]].concat()).expect("write");
    assert_refused(&mha(&longer), &["declares", "holds"]);
    let shorter = dir.join("shorter.safetensors");
    std::fs::write(&shorter, &good[..good.len() - 4]).expect("write");
    assert_refused(&mha(&shorter), &["declares", "holds"]);
    assert!(!dir.join("out.npy").exists());
}

#[test]
fn options_that_overflow_are_errors_not_nan_files() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("overflowing-options");
    let slopes = dir.join("slopes.npy");
    write_npy(&slopes, &[2], &[-1e38f32, 0.5]);
    let s = slopes.to_str().expect("utf-8");
    assert_refused(
        &run(&dir, &["--out", "o.npy", "--alibi-slopes", s]),
        &["ALiBi slopes", "entry 0", "1e30"],
    );
    assert_refused(
        &run(&dir, &["--out", "o.npy", "--scale", "3.4e38"]),
        &["output holds", "--scale"],
    );
    assert!(!dir.join("o.npy").exists());

    // A key/value head count that wraps when multiplied by the head dim.
    let output = bin()
        .args([
            "mha",
            "--num-heads",
            "2",
            "--num-kv-heads",
            "9223372036854775809",
            "--weights",
        ])
        .arg(fixture("gqa.safetensors"))
        .arg("--query")
        .arg(fixture("gqa_query.npy"))
        .arg("--out")
        .arg(dir.join("o.npy"))
        .output()
        .expect("runs");
    assert_refused(&output, &["num_kv_heads", "9223372036854775809"]);
    assert!(!dir.join("o.npy").exists());
}

#[test]
fn f32_values_beyond_f16_range_are_refused_under_dtype_f16() {
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_lacking(ctx, "SHADER_F16", true);
        return;
    }
    let dir = scratch("f16-range");
    let mut rng = Rng::new(5);
    let mut data = rng.vec(80, -1.0, 1.0);
    data[17] = -70000.0;
    let big = dir.join("big.npy");
    write_npy(&big, &[1, 2, 5, 8], &data);
    let [_, k, v] = inputs(&dir, 5);
    let output = bin()
        .arg("run")
        .arg("--q")
        .arg(&big)
        .arg("--k")
        .arg(&k)
        .arg("--v")
        .arg(&v)
        .args(["--dtype", "f16", "--out"])
        .arg(dir.join("o.npy"))
        .output()
        .expect("runs");
    assert_refused(&output, &["big.npy", "-70000", "index 17", "f16"]);
    assert!(!dir.join("o.npy").exists());
}

/// `run` on the test inputs with `var` set to `value` (issue 64 item 8).
fn run_with_env(dir: &Path, var: &str, value: &str) -> Output {
    run_command(dir, 64)
        .env(var, value)
        .args(["--out", "out.npy"])
        .output()
        .expect("runs")
}

#[test]
fn every_variable_refuses_an_empty_or_malformed_value_naming_itself() {
    // Issue 64 item 8: WGPU_ATTENTION_TILING= meant auto where the other variables
    // refused an empty value; WGPU_ATTENTION_KEY_SPLITS took `+2` and ` 2 `;
    // WGPU_BACKEND=vulkan,bogus ignored `bogus`; WGPU_BACKEND= and WGPU_ADAPTER_NAME=
    // meant unset. One rule now: set but empty is refused, in the same words.
    let Some(_) = common::ctx() else { return };
    let dir = scratch("env-empty");
    let empty = "is set but empty";
    for (var, value, needle) in [
        ("WGPU_ATTENTION_TILING", "", empty),
        ("WGPU_ATTENTION_TILING", "  ", empty),
        ("WGPU_ATTENTION_KEY_SPLITS", "", empty),
        ("WGPU_ATTENTION_KEY_SPLITS", "+2", "'+2' is not a count"),
        ("WGPU_ATTENTION_KEY_SPLITS", " 2 ", "' 2 ' is not a count"),
        ("WGPU_ATTENTION_KEY_SPLITS", "0x2", "is not a count"),
        ("WGPU_ATTENTION_COOP_BACKWARD", "", empty),
        ("WGPU_ATTENTION_COOP_GEMM", "", empty),
        ("WGPU_ATTENTION_DECODE", "", empty),
        ("WGPU_ATTENTION_RUNTIME_CHECKS", "", empty),
        ("WGPU_ATTENTION_TUNE_FILE", "", empty),
        ("WGPU_BACKEND", "", empty),
        ("WGPU_BACKEND", "vulkan,bogus", "'bogus' is not a backend"),
        ("WGPU_BACKEND", "vulkan,", "'' is not a backend"),
        ("WGPU_ADAPTER_NAME", "", empty),
    ] {
        let output = run_with_env(&dir, var, value);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{var}={value:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{var}={value:?}: {stderr}");
        assert!(
            lines[0].contains(var) && lines[0].contains(needle),
            "{var}={value:?}: {stderr}"
        );
        assert!(!dir.join("out.npy").exists(), "{var}={value:?} wrote an output");
    }
    // The same values well formed still run.
    assert_ok(&run_with_env(&dir, "WGPU_ATTENTION_KEY_SPLITS", "2"));
}

#[test]
fn variant_labels_backends_and_the_grad_alias_are_taken_only_as_written() {
    // Issue 64 item 8: `--variants 128x64x32r16` was taken as 128x64x32 (only r32
    // exists); `--backend vulkan,bogus` ignored `bogus`; `--grad X --d-out Y` named only
    // --grad.
    let Some(_) = common::ctx() else { return };
    let dir = scratch("labels");
    for variants in ["64x16x16r16", "064x16x16", "64x16x16r48", " 64x16x16"] {
        let output = bin()
            .current_dir(&dir)
            .args([
                "tune",
                "--shape",
                "1,1,1,4,4,8",
                "--reps",
                "1",
                "--tilings",
                "registers",
            ])
            .args(["--variants", variants])
            .output()
            .expect("runs");
        assert_refused(&output, &["--variants", variants]);
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("registers"),
            "{variants} measured"
        );
    }
    let output = bin()
        .args(["--backend", "vulkan,bogus", "info"])
        .output()
        .expect("runs");
    assert_refused(&output, &["--backend", "'bogus'"]);
    std::fs::write(dir.join("g1.npy"), "").expect("write");
    let output = run(
        &dir,
        &[
            "--out", "out.npy", "--grad", "g1.npy", "--d-out", "g2.npy", "--dq-out", "dq.npy", "--dk-out", "dk.npy",
            "--dv-out", "dv.npy",
        ],
    );
    assert_refused(&output, &["--grad", "--d-out"]);
    assert!(!dir.join("out.npy").exists());
}

/// `info` (with `args`, no backend or name from the environment unless given): its
/// `#N name [Backend` lines, exit code and stderr.
fn info_lines(args: &[&str], backend: Option<&str>) -> (Option<i32>, Vec<String>, String) {
    let mut cmd = bin();
    cmd.env_remove("WGPU_ADAPTER_NAME").arg("info").args(args);
    match backend {
        Some(b) => cmd.env("WGPU_BACKEND", b),
        None => cmd.env_remove("WGPU_BACKEND"),
    };
    let out = cmd.output().expect("runs");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.split(" / ").next().unwrap_or(l).to_string())
        .collect();
    (
        out.status.code(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_number_info_prints_is_the_one_adapter_takes_with_or_without_a_backend() {
    // Issue 64 item 7: `info` printed `#1 llvmpipe … [Gl / Cpu]`, but `--adapter 'gl:#1'`
    // was refused and `gl:#0` picked it; with WGPU_BACKEND=vulkan, `--adapter '#1'`'s
    // error listed the GL adapter the filter excludes, unnumbered.
    let (code, every, stderr) = info_lines(&[], None);
    assert_eq!(code, Some(0), "{stderr}");
    let backend_of = |line: &str| line.rsplit('[').next().unwrap_or("").to_lowercase();
    if every.len() < 2 || every.iter().all(|l| backend_of(l) == backend_of(&every[0])) {
        common::skip_or_fail(&format!(
            "needs adapters on two backends (lavapipe and llvmpipe GL); found {every:?}"
        ));
        return;
    }
    for (n, line) in every.iter().enumerate() {
        assert!(line.starts_with(&format!("#{n} ")), "{every:?}");
        let backend = backend_of(line);
        for name in [format!("#{n}"), format!("{backend}:#{n}")] {
            let (code, got, stderr) = info_lines(&["--adapter", &name], None);
            assert_eq!(code, Some(0), "--adapter {name}: {stderr}");
            assert_eq!(got, vec![line.clone()], "--adapter {name}");
        }
    }
    // Past the backend chosen: the error lists, numbered, only what that backend has.
    let (_, vulkan, _) = info_lines(&[], Some("vulkan"));
    let past = format!("#{}", vulkan.len());
    // `info` lists them; `tune` (any command) makes a context from them.
    for command in [&["info"][..], &["tune", "--shape", "1,1,1,4,4,8", "--reps", "1"][..]] {
        let out = bin()
            .env_remove("WGPU_ADAPTER_NAME")
            .env("WGPU_BACKEND", "vulkan")
            .args(["--adapter", &past])
            .args(command)
            .output()
            .expect("runs");
        assert_refused(&out, &[&format!("adapter {past}"), "#0 "]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("(Gl)"),
            "{command:?} lists an adapter WGPU_BACKEND excludes: {stderr}"
        );
    }
}
