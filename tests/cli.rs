//! The CLI contract: `run` matches the reference; bad input exits 2 with one line on
//! stderr and writes no output file.

use crate::common;
use common::cli::{bin, read_f32, scratch, write_npy, write_raw_npy};
use std::path::Path;
use wgpu_attention::check::Rng;
use wgpu_attention::reference::attention;
use wgpu_attention::{AttentionOptions, AttentionShape, CausalAlignment, Window};

#[test]
fn run_matches_the_reference_with_masks_and_gqa() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("run");
    let s = AttentionShape {
        batch: 2,
        heads_q: 4,
        heads_kv: 2,
        len_q: 9,
        len_k: 14,
        head_dim: 12,
        head_dim_v: 6,
    };
    let mut rng = Rng::new(77);
    let q = rng.vec(2 * 4 * 9 * 12, -1.0, 1.0);
    let k = rng.vec(2 * 2 * 14 * 12, -1.0, 1.0);
    let v = rng.vec(2 * 2 * 14 * 6, -1.0, 1.0);
    let mask: Vec<bool> = (0..9 * 14).map(|_| rng.uniform(0.0, 1.0) < 0.8).collect();
    write_npy(&dir.join("q.npy"), &[2, 4, 9, 12], &q);
    write_npy(&dir.join("k.npy"), &[2, 2, 14, 12], &k);
    write_npy(&dir.join("v.npy"), &[2, 2, 14, 6], &v);
    write_npy(&dir.join("lens.npy"), &[2], &[14i64, 10]);
    write_npy(&dir.join("mask.npy"), &[9, 14], &mask);
    for (kernel, average) in [("fused", false), ("materialized", false), ("fused", true)] {
        let status = bin()
            .current_dir(&dir)
            .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"])
            .args(average.then_some("--average-weights"))
            .args([
                "--causal",
                "bottom-right",
                "--key-lengths",
                "lens.npy",
                "--mask",
                "mask.npy",
            ])
            .args(["--kernel", kernel, "--weights-out", "w.npy", "--lse-out", "l.npy"])
            .status()
            .expect("runs");
        assert!(status.success(), "{kernel}: {status}");
        let options = AttentionOptions {
            causal: Some(CausalAlignment::BottomRight),
            key_lengths: Some(vec![14, 10]),
            mask: Some(wgpu_attention::Mask::boolean(&[9, 14], mask.clone()).expect("mask")),
            average_weights: average,
            ..Default::default()
        };
        let want = attention(&q, &k, &v, &s, &options).expect("reference");
        let (shape, out) = read_f32(&dir.join("o.npy"));
        assert_eq!(shape, vec![2, 4, 9, 6]);
        let (wshape, weights) = read_f32(&dir.join("w.npy"));
        assert_eq!(wshape, if average { vec![2, 9, 14] } else { vec![2, 4, 9, 14] });
        let (lshape, _) = read_f32(&dir.join("l.npy"));
        assert_eq!(lshape, vec![2, 4, 9]);
        use wgpu_attention::check::{ErrorStats, Tolerance};
        let bound = Tolerance::F32.bound(&s, &want, 0.0);
        let out_err = ErrorStats::of(&out, &want.out);
        assert!(out_err.passes(bound), "{kernel}: output {out_err:?}, bound {bound:e}");
        let weights_err = ErrorStats::within(&weights, &want.weights, Tolerance::weights_bound(&s, &want));
        assert!(weights_err.passes(f64::INFINITY), "{kernel}: weights {weights_err:?}");
    }
}

#[test]
fn run_takes_a_window_alibi_slopes_and_a_softcap() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("run-window");
    let s = AttentionShape::new(1, 2, 1, 3, 40, 8, 8);
    let mut rng = Rng::new(78);
    let q = rng.vec(2 * 3 * 8, -2.0, 2.0);
    let k = rng.vec(40 * 8, -2.0, 2.0);
    let v = rng.vec(40 * 8, -1.0, 1.0);
    let slopes = [0.25f32, 0.0625];
    write_npy(&dir.join("q.npy"), &[1, 2, 3, 8], &q);
    write_npy(&dir.join("k.npy"), &[1, 1, 40, 8], &k);
    write_npy(&dir.join("v.npy"), &[1, 1, 40, 8], &v);
    write_npy(&dir.join("slopes.npy"), &[2], &slopes);
    let options = AttentionOptions {
        window: Some(Window {
            left: Some(9),
            right: None,
        }),
        alibi_slopes: Some(slopes.to_vec()),
        softcap: Some(1.5),
        ..Default::default()
    };
    let want = attention(&q, &k, &v, &s, &options).expect("reference");
    for kernel in ["fused", "materialized", "decode"] {
        let status = bin()
            .current_dir(&dir)
            .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"])
            .args(["--window", "9,-1", "--alibi-slopes", "slopes.npy", "--softcap", "1.5"])
            .args(["--kernel", kernel])
            .status()
            .expect("runs");
        assert!(status.success(), "{kernel}: {status}");
        let (_, out) = read_f32(&dir.join("o.npy"));
        use wgpu_attention::check::{ErrorStats, Tolerance};
        let bound = Tolerance::F32.bound(&s, &want, 0.0);
        let err = ErrorStats::of(&out, &want.out);
        assert!(err.passes(bound), "{kernel}: output {err:?}, bound {bound:e}");
    }
}

/// The names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    names
}

/// Runs the CLI expecting exit 2, one stderr line containing `needle` (the reason, in
/// the CLI's wording: `|` separates several phrases that must all be there), and no
/// output or other file left behind.
fn expect_bad_input(dir: &Path, args: &[&str], needle: &str) {
    let out_file = dir.join("o.npy");
    let _ = std::fs::remove_file(&out_file);
    let before = files_in(dir);
    let output = bin().current_dir(dir).args(args).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: ") && !l.contains("XDG_RUNTIME_DIR"))
        .collect();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(ours.len(), 1, "{args:?}: expected one error line, got {stderr}");
    for phrase in needle.split('|') {
        assert!(
            ours[0].contains(phrase),
            "{args:?}: '{}' should say '{phrase}'",
            ours[0]
        );
    }
    assert!(!out_file.exists(), "{args:?}: an output file was written");
    assert!(!dir.join("o.npy.partial").exists(), "{args:?}: a partial file was left");
    assert_eq!(files_in(dir), before, "{args:?}: files left behind");
}

#[test]
fn bad_input_exits_2_with_one_line_and_no_output() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("bad");
    let mut rng = Rng::new(5);
    write_npy(&dir.join("q.npy"), &[1, 2, 3, 4], &rng.vec(24, -1.0, 1.0));
    write_npy(&dir.join("k5.npy"), &[1, 2, 5, 4], &rng.vec(40, -1.0, 1.0));
    write_npy(&dir.join("k3d.npy"), &[2, 5, 4], &rng.vec(40, -1.0, 1.0));
    write_npy(&dir.join("v6.npy"), &[1, 2, 6, 4], &rng.vec(48, -1.0, 1.0));
    write_npy(&dir.join("ints.npy"), &[1, 2, 5, 4], &[1i32; 40]);
    write_npy(&dir.join("lens.npy"), &[3], &[1i32, 2, 3]);
    write_npy(&dir.join("neg.npy"), &[1], &[-1i64]);
    write_npy(&dir.join("mask.npy"), &[4, 5], &[true; 20]);
    write_npy(&dir.join("slopes3.npy"), &[3], &[0.5f32; 3]);
    std::fs::write(dir.join("garbage.npy"), b"not a numpy file").expect("write");
    let base = ["run", "--q", "q.npy", "--k", "k5.npy", "--out", "o.npy"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v: Vec<&'static str> = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    expect_bad_input(
        &dir,
        &with(&["--v", "missing.npy"]),
        "cannot open missing.npy|No such file",
    );
    expect_bad_input(&dir, &with(&["--v", "garbage.npy"]), "garbage.npy|not a valid .npy");
    expect_bad_input(
        &dir,
        &with(&["--v", "ints.npy"]),
        "ints.npy|dtype i4 is not float32 or float16",
    );
    expect_bad_input(&dir, &with(&["--v", "v6.npy"]), "sequence length of v|expected 5|got 6");
    expect_bad_input(
        &dir,
        &[
            "run", "--q", "q.npy", "--k", "k3d.npy", "--v", "k5.npy", "--out", "o.npy",
        ],
        "k3d.npy|expected a 4-D array|[2, 5, 4]",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--key-lengths", "lens.npy"]),
        "lens.npy|key lengths must have shape [1]|got [3]",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--key-lengths", "neg.npy"]),
        "neg.npy|key length -1 is negative",
    );
    // [4, 5] against [B, Hq, Lq, Lk] = [1, 2, 3, 5]: axis 2 holds 4 where 1 or 3 would do.
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--mask", "mask.npy"]),
        "mask (axis 2|to broadcast to [1, 2, 3, 5]|got 4",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--scale", "inf"]),
        "invalid scale|inf is not finite",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--window", "7"]),
        "'7' is not LEFT,RIGHT",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--softcap", "0"]),
        "invalid softcap|0 is not a finite number above 0",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--alibi-slopes", "slopes3.npy"]),
        "ALiBi slopes|expected 2 entries (one per query head)|got 3",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--alibi-slopes", "mask.npy"]),
        "mask.npy|dtype b1 is not float32 or float16",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--adapter", "no-such-gpu"]),
        "no GPU adapter matches|no-such-gpu",
    );
    // Headers that lie (issue 17 §1.2): a shape whose product wraps to 0 in 64 bits used
    // to pass every size check and hang; one claiming gigabytes, or more than the file
    // holds, must be refused before anything is allocated.
    write_raw_npy(&dir.join("wrap.npy"), "<f4", "(1073741824, 1073741824, 16, 1)", &[]);
    write_raw_npy(&dir.join("huge.npy"), "<f4", "(4, 4, 1000000, 64)", &[0; 64]);
    write_raw_npy(&dir.join("short.npy"), "<f4", "(1, 2, 5, 4)", &[0; 40]);
    let started = std::time::Instant::now();
    for wrap in [["--q", "wrap.npy"], ["--k", "wrap.npy"], ["--v", "wrap.npy"]] {
        let mut args = vec![
            "run", "--q", "q.npy", "--k", "k5.npy", "--v", "k5.npy", "--out", "o.npy",
        ];
        let at = args.iter().position(|&a| a == wrap[0]).expect("flag") + 1;
        args[at] = wrap[1];
        expect_bad_input(&dir, &args, "wrap.npy|overflows");
    }
    assert!(
        started.elapsed().as_secs() < 20,
        "wrapped shapes took {:?}",
        started.elapsed()
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "huge.npy"]),
        "huge.npy|header claims [4, 4, 1000000, 64]",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "short.npy"]),
        "short.npy|header claims [1, 2, 5, 4]|holds 40 bytes",
    );
    expect_bad_input(
        &dir,
        &with(&["--v", "k5.npy", "--tiling", "bogus"]),
        "'bogus' is not one of|blocked",
    );
    // check's reports: an unwritable path is refused before the grid runs.
    let started = std::time::Instant::now();
    expect_bad_input(&dir, &["check", "--json", "."], "cannot write .|is a directory");
    expect_bad_input(
        &dir,
        &["check", "--junit", "no-dir/r.xml"],
        "cannot write no-dir/r.xml|no-dir does not exist",
    );
    assert!(
        started.elapsed().as_secs() < 20,
        "check ran before refusing its report path"
    );
    // Unknown flags are usage errors, also exit 2.
    let output = bin().args(["run", "--bogus"]).output().expect("runs");
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn outputs_that_are_not_plain_files_keep_what_they_are() {
    // Issue 13 §4: `--out /dev/full` (as root) once replaced the device node with a
    // regular file and exited 0, because the output was renamed over the path.
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("targets");
    let mut rng = Rng::new(8);
    write_npy(&dir.join("q.npy"), &[1, 1, 3, 4], &rng.vec(12, -1.0, 1.0));
    write_npy(&dir.join("k.npy"), &[1, 1, 5, 4], &rng.vec(20, -1.0, 1.0));
    let run = |out: &str| {
        bin()
            .current_dir(&dir)
            .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "k.npy", "--out", out])
            .output()
            .expect("runs")
    };
    // A link to /dev/full: written through, fails with ENOSPC, the link survives.
    let link = dir.join("full.npy");
    std::os::unix::fs::symlink("/dev/full", &link).expect("symlink");
    let output = run("full.npy");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("full.npy") && stderr.contains("No space left"),
        "{stderr}"
    );
    let meta = std::fs::symlink_metadata(&link).expect("link still there");
    assert!(meta.file_type().is_symlink(), "the link was replaced");
    assert!(!dir.join("full.npy.partial").exists());
    // A link to a regular file: written through, the link stays a link.
    let real = dir.join("real.npy");
    // Longer than the output, so a missing truncate would leave a corrupt tail.
    std::fs::write(&real, vec![7u8; 4096]).expect("write");
    std::os::unix::fs::symlink(&real, dir.join("via.npy")).expect("symlink");
    assert_eq!(run("via.npy").status.code(), Some(0));
    assert!(std::fs::symlink_metadata(dir.join("via.npy"))
        .expect("link")
        .file_type()
        .is_symlink());
    assert_eq!(read_f32(&real).0, vec![1, 1, 3, 4]);
    assert!(std::fs::metadata(&real).expect("target").len() < 4096, "old tail kept");
    // A dangling link: its target is created.
    std::os::unix::fs::symlink(dir.join("new-target.npy"), dir.join("dangling.npy")).expect("symlink");
    assert_eq!(run("dangling.npy").status.code(), Some(0));
    assert_eq!(read_f32(&dir.join("new-target.npy")).0, vec![1, 1, 3, 4]);
    // A directory, and a path whose directory does not exist: exit 2, nothing left.
    std::fs::create_dir(dir.join("adir")).expect("mkdir");
    // (Issue 56: a missing directory was said to be "not a directory".)
    std::fs::write(dir.join("afile"), b"x").expect("write");
    for (out, reason) in [
        ("adir", "is a directory"),
        ("missing/o.npy", "missing does not exist"),
        ("afile/o.npy", "afile is not a directory"),
    ] {
        let output = run(out);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{out}: {stderr}");
        assert!(stderr.contains(out) && stderr.contains(reason), "{out}: {stderr}");
    }
    assert!(dir.join("adir").is_dir());
    assert!(!dir.join("adir.partial").exists());
}

#[test]
fn a_dash_writes_the_output_to_stdout() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("stdout");
    let mut rng = Rng::new(78);
    write_npy(&dir.join("q.npy"), &[1, 2, 3, 4], &rng.vec(24, -1.0, 1.0));
    write_npy(&dir.join("k.npy"), &[1, 2, 5, 4], &rng.vec(40, -1.0, 1.0));
    write_npy(&dir.join("v.npy"), &[1, 2, 5, 4], &rng.vec(40, -1.0, 1.0));
    let run = |out: &str, extra: &[&str]| {
        bin()
            .current_dir(&dir)
            .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", out])
            .args(extra)
            .output()
            .expect("runs")
    };
    let piped = run("-", &[]);
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    assert!(run("o.npy", &[]).status.success());
    assert_eq!(
        piped.stdout,
        std::fs::read(dir.join("o.npy")).expect("o.npy"),
        "stdout differs from the file"
    );
    // Two outputs cannot share standard output.
    let both = run("-", &["--lse-out", "-"]);
    assert_eq!(both.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(stderr.contains("standard output"), "{stderr}");
    assert!(both.stdout.is_empty(), "something was written to stdout");
}

#[test]
fn a_dash_is_refused_where_stdout_carries_a_report() {
    // `check` and `bench` print their tables to stdout: a report there would be
    // unreadable, so '-' is refused before any work.
    for args in [
        &["check", "--json", "-"][..],
        &["bench", "--json", "-", "--shape", "1,1,1,4,4,8"],
    ] {
        let output = bin().args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("standard output"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: work was done");
    }
}

/// A reader that closes standard output early (`wgpu-attention info | head`) stops the
/// printing, not the command: no panic (Rust's `println!` panics on a closed pipe), the
/// command's files are still written and its status is its own.
#[test]
fn a_closed_stdout_ends_the_printing_not_the_command() {
    let dir = scratch("closed-stdout");
    let report = dir.join("b.json");
    let bench = [
        "bench",
        "--shape",
        "1,1,1,8,8,8",
        "--kernel",
        "fused",
        "--dtype",
        "f32",
        "--reps",
        "1",
        "--json",
    ];
    let bench: Vec<&str> = bench.iter().copied().chain(report.to_str()).collect();
    let has_adapter = common::ctx().is_some();
    let runs: Vec<&[&str]> = [&["info"][..], &["info", "--json"][..]]
        .into_iter()
        .chain(has_adapter.then_some(&bench[..]))
        .collect();
    for args in runs {
        let mut child = bin()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // Closed before the command has written anything: its first write fails.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
    if has_adapter {
        let written = std::fs::read_to_string(&report).expect("the bench report was written");
        assert!(written.contains("\"median_ms\""), "{written}");
    }
}

#[test]
fn run_computes_in_the_dtype_of_its_files_unless_told() {
    // Issue 56: float16 files were computed in f32 unless --dtype f16 said otherwise.
    let Some(ctx) = common::ctx() else { return };
    if !ctx.capabilities().f16 {
        common::skip_or_fail("needs SHADER_F16");
        return;
    }
    let dir = scratch("dtype-follows-files");
    let mut rng = Rng::new(56);
    for name in ["q", "k", "v"] {
        let halves: Vec<half::f16> = rng
            .vec(2 * 3 * 8, -1.0, 1.0)
            .into_iter()
            .map(half::f16::from_f32)
            .collect();
        write_npy(&dir.join(format!("{name}16.npy")), &[1, 2, 3, 8], &halves);
        write_npy(
            &dir.join(format!("{name}32.npy")),
            &[1, 2, 3, 8],
            &rng.vec(2 * 3 * 8, -1.0, 1.0),
        );
    }
    let ran_in = |files: &str, extra: &[&str]| {
        let out = bin()
            .current_dir(&dir)
            .args(["run", "--out", "o.npy"])
            .args(["--q", &format!("q{files}.npy"), "--k", &format!("k{files}.npy")])
            .args(["--v", &format!("v{files}.npy")])
            .args(extra)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    assert!(ran_in("16", &[]).contains(" f16 on "), "float16 files run in f16");
    assert!(ran_in("32", &[]).contains(" f32 on "), "float32 files run in f32");
    assert!(ran_in("16", &["--dtype", "f32"]).contains(" f32 on "), "--dtype wins");
    // Mixed files compute in f32, where nothing is rounded away.
    let mixed = bin()
        .current_dir(&dir)
        .args([
            "run", "--out", "o.npy", "--q", "q16.npy", "--k", "k32.npy", "--v", "v32.npy",
        ])
        .output()
        .expect("runs");
    assert!(
        String::from_utf8_lossy(&mixed.stderr).contains(" f32 on "),
        "mixed files run in f32"
    );
}

/// `run --kv-dtype int8`: K and V quantized on load, the output within what int8 can
/// move it from the unquantized attention, the path named on stderr; `--grad` refused.
#[test]
fn run_quantizes_k_and_v_to_int8_when_asked() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("run-int8");
    let s = AttentionShape::new(1, 4, 2, 1, 40, 16, 16);
    let seed = 5420;
    let mut rng = Rng::new(seed);
    let q = rng.vec(4 * 16, -1.0, 1.0);
    let k = rng.vec(2 * 40 * 16, -1.0, 1.0);
    let v = rng.vec(2 * 40 * 16, -1.0, 1.0);
    write_npy(&dir.join("q.npy"), &[1, 4, 1, 16], &q);
    write_npy(&dir.join("k.npy"), &[1, 2, 40, 16], &k);
    write_npy(&dir.join("v.npy"), &[1, 2, 40, 16], &v);
    for kernel in ["decode", "fused"] {
        let output = bin()
            .current_dir(&dir)
            .args(["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"])
            .args(["--kv-dtype", "int8", "--kernel", kernel])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{kernel}: {stderr}");
        assert!(stderr.contains("int8 K and V"), "{kernel}: {stderr}");
        let want = attention(&q, &k, &v, &s, &AttentionOptions::default()).expect("reference");
        // Each score moves by at most δ = scale · Σ|q| · (largest K scale / 2); each
        // value by half the largest V scale (docs/design.md, "int8 KV cache").
        let (_, k_scales) = wgpu_attention::reference::int8::quantize_rows(&k, 16);
        let (_, v_scales) = wgpu_attention::reference::int8::quantize_rows(&v, 16);
        let top = |x: &[f32]| x.iter().fold(0.0f64, |m, &s| m.max(f64::from(s)));
        let q_sum = q
            .chunks(16)
            .map(|r| r.iter().map(|x| f64::from(x.abs())).sum::<f64>())
            .fold(0.0, f64::max);
        let delta = 0.25 * q_sum * top(&k_scales) / 2.0;
        let bound = ((2.0 * delta).exp() - 1.0) * want.max_abs_value + top(&v_scales) / 2.0 + 1e-5;
        let (_, out) = read_f32(&dir.join("o.npy"));
        let err = wgpu_attention::check::ErrorStats::of(&out, &want.out);
        assert!(err.passes(bound), "seed {seed} {kernel}: {err:?}, bound {bound:e}");
    }
    expect_bad_input(
        &dir,
        &[
            "run",
            "--q",
            "q.npy",
            "--k",
            "k.npy",
            "--v",
            "v.npy",
            "--out",
            "o.npy",
            "--kv-dtype",
            "int8",
            "--grad",
            "q.npy",
        ],
        "cannot be used with",
    );
}
