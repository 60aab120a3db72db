//! Tuning (issue 38): `tune` checks and times every tensor-core variant that fits
//! (emulated on lavapipe), writes the winners into a table, and a context made
//! afterwards with that table in `WGPU_ATTENTION_TUNE_FILE` runs them; a bad table is
//! refused by name. One test per process step, in one function: the environment
//! variable is process-wide.

mod common;

use common::cli::{bin, scratch};
use wgpu_attention::kernels::flash::{coop_variant_for, CoopVariant};
use wgpu_attention::tune::{TuneEntry, TuneTable, TUNE_FILE_VAR};
use wgpu_attention::Context;

#[test]
fn tune_writes_a_table_that_later_contexts_follow() {
    let Some(probe) = common::emulating_ctx() else { return };
    let info = probe.adapter_info().clone();
    drop(probe);
    let dir = scratch("tune");
    // In a directory that does not exist yet, as ~/.config/wgpu-attention on a fresh
    // machine.
    let table = dir.join("config").join("wgpu-attention").join("tune.tsv");
    let json = dir.join("tune.json");
    // A tiny shape: every 64-class variant that fits, each checked, then timed.
    let out = bin()
        .args([
            "tune",
            "--emulate-coop",
            "--shape",
            "1,2,1,20,40,16",
            "--reps",
            "1",
            "--dtype",
            "f16",
        ])
        // Two variants (each emulated kernel is a slow compile on Mesa 25).
        .args(["--variants", "64x16x16,64x32x32"])
        .arg("--table")
        .arg(&table)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parses");
    assert_eq!(doc["schema"], "wgpu-attention-tune/1");
    let rows = doc["rows"].as_array().expect("rows");
    let coop_rows: Vec<&serde_json::Value> = rows.iter().filter(|r| r["tiling"] == "coop").collect();
    assert_eq!(coop_rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|r| r["status"] == "ok"), "{stdout}");
    // The micro-tile tiling at each lane count the adapter allows (the emulating adapter
    // has subgroups of at least 8 lanes), each checked.
    let micro: Vec<&str> = rows
        .iter()
        .filter(|r| r["tiling"] == "micro")
        .filter_map(|r| r["variant"].as_str())
        .collect();
    assert!(micro.contains(&"lanes1") && micro.contains(&"lanes8"), "{stdout}");
    // The table names this adapter and the winner the JSON names.
    let written = TuneTable::parse("tune.tsv", &std::fs::read_to_string(&table).expect("table")).expect("parses");
    let winner = CoopVariant::parse(doc["winners"][0]["variant"].as_str().expect("a winner")).expect("a variant");
    assert_eq!(written.entries, vec![TuneEntry::for_adapter(&info, winner)]);

    // A context made with the table follows it; pin another variant to see it chosen.
    let other = CoopVariant::new(64, 16, 16);
    let pinned = TuneTable {
        entries: vec![TuneEntry::for_adapter(&info, other)],
    };
    std::fs::write(&table, pinned.to_text()).expect("write");
    std::env::set_var(TUNE_FILE_VAR, &table);
    let mut ctx = Context::new().expect("a context");
    assert_eq!(ctx.policy().coop_tuned, vec![other]);
    ctx.emulate_cooperative_matrix().expect("emulates");
    assert_eq!(coop_variant_for(16, 16, ctx.capabilities(), ctx.policy()), other);
    // Head dims past the tuned class take the rule.
    assert_ne!(coop_variant_for(100, 100, ctx.capabilities(), ctx.policy()).dmax, 64);

    // A bad table is refused, naming the file and line.
    std::fs::write(&table, "coop\t0x1\tX\tY\t64x64\n").expect("write");
    let e = Context::new().expect_err("a bad table").to_string();
    assert!(e.contains("tune.tsv") && e.contains("line 1"), "{e}");
    std::env::remove_var(TUNE_FILE_VAR);
}

#[test]
fn tune_backward_checks_and_times_the_backward_variants_it_is_given() {
    // One named variant (each emulated pass is a slow compile): checked against the f64
    // reference gradients, timed, and named the winner of its class.
    let Some(probe) = common::emulating_ctx() else { return };
    drop(probe);
    let json = scratch("tune-backward").join("tune-backward.json");
    let out = bin()
        .env_remove(TUNE_FILE_VAR)
        .args(["tune", "--backward", "--emulate-coop", "--shape", "1,2,1,20,40,16"])
        .args(["--reps", "1", "--dtype", "f16", "--variants", "32x32x32n", "--json"])
        .arg(&json)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parses");
    assert_eq!(doc["schema"], "wgpu-attention-tune-backward/1");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(rows[0]["variant"], "32x32x32n", "{stdout}");
    assert_eq!(rows[0]["status"], "ok", "{stdout}");
    assert!(rows[0]["gflops"].as_f64().is_some_and(|g| g > 0.0), "{stdout}");
    assert_eq!(doc["winners"][0]["variant"], "32x32x32n", "{stdout}");
}

#[test]
fn tune_past_its_deadline_reports_what_it_measured() {
    // A deadline of 0 s: no candidate is started, and the (empty) report is still
    // written, for the forward and the backward alike.
    let Some(_) = common::emulating_ctx() else { return };
    let dir = scratch("tune-deadline");
    for backward in [false, true] {
        let json = dir.join(format!("tune-{backward}.json"));
        let mut cmd = bin();
        cmd.env_remove(TUNE_FILE_VAR)
            .args([
                "tune",
                "--emulate-coop",
                "--shape",
                "1,2,1,20,40,16",
                "--reps",
                "1",
                "--deadline",
                "0",
            ])
            .arg("--json")
            .arg(&json);
        if backward {
            cmd.arg("--backward");
        }
        let out = cmd.output().expect("runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("deadline: 0 s passed"), "{stdout}");
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parses");
        assert_eq!(doc["rows"].as_array().map(Vec::len), Some(0), "{stdout}");
    }
}

#[test]
fn tune_refuses_bad_arguments_before_measuring() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("tune-bad");
    let bad = dir.join("bad.tsv");
    std::fs::write(&bad, "not a table\n").expect("write");
    for (args, needle) in [
        (vec!["tune", "--dtype", "f64"], "--dtype"),
        (vec!["tune", "--reps", "0"], "--reps"),
        (vec!["tune", "--shape", "1,2,3"], "--shape"),
        (vec!["tune", "--variants", "64x16"], "--variants"),
        (vec!["tune", "--backward", "--variants", "64x40x32"], "backward"),
        (vec!["tune", "--table", bad.to_str().expect("utf-8")], "bad.tsv"),
    ] {
        // (The other test sets the table variable in this process for a while.)
        let out = bin().env_remove(TUNE_FILE_VAR).args(&args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn tune_merges_its_winner_into_the_table_as_it_is_when_written() {
    // Issue 55: a run that read the table at its start and rewrote it whole at its end
    // dropped what another run wrote meanwhile, and every comment. The test holds the
    // table's lock while `tune` measures, adds an entry as a concurrent run would, then
    // lets it write: both entries and the comment must survive.
    use std::io::BufRead;
    let Some(probe) = common::emulating_ctx() else { return };
    let info = probe.adapter_info().clone();
    drop(probe);
    let dir = scratch("tune-merge");
    let table = dir.join("tune.tsv");
    let elsewhere = TuneEntry {
        vendor: 0x10de,
        device: "NVIDIA H200".into(),
        driver: "580.159.04".into(),
        variant: CoopVariant::new(128, 64, 48),
    };
    std::fs::write(&table, "# kept: a comment of the table's owner\n").expect("write");
    let lock = std::fs::File::create(dir.join(".tune.tsv.lock")).expect("lock file");
    lock.lock().expect("lock");
    let mut child = bin()
        .env_remove(TUNE_FILE_VAR)
        .args([
            "tune",
            "--emulate-coop",
            "--shape",
            "1,1,1,8,16,16",
            "--reps",
            "1",
            "--dtype",
            "f16",
        ])
        .args(["--variants", "64x16x16", "--table"])
        .arg(&table)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    // Once a row is printed, tune has read the table and is measuring.
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut printed = String::new();
    while !printed.contains("coop") {
        let mut line = String::new();
        if stdout.read_line(&mut line).expect("reads") == 0 {
            break;
        }
        printed.push_str(&line);
    }
    let mut text = std::fs::read_to_string(&table).expect("table");
    text.push_str(&elsewhere.line());
    text.push('\n');
    std::fs::write(&table, text).expect("write");
    lock.unlock().expect("unlock");
    let out = child.wait_with_output().expect("ends");
    assert!(
        out.status.success(),
        "{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&table).expect("table");
    assert!(text.starts_with("# kept: a comment of the table's owner\n"), "{text}");
    let written = TuneTable::parse("tune.tsv", &text).expect("parses");
    assert_eq!(
        written.entries,
        vec![elsewhere, TuneEntry::for_adapter(&info, CoopVariant::new(64, 16, 16))],
        "{text}"
    );
}

#[test]
fn tune_refuses_tables_that_are_no_regular_file_before_measuring() {
    // Issue 55: /dev/zero grew without bound, a FIFO hung, a dangling link failed only
    // after measuring; impossible variants were accepted. Issue 64: a table in a
    // directory the user cannot write in failed only after measuring.
    let Some(_) = common::ctx() else { return };
    let dir = scratch("tune-hostile");
    let dangling = dir.join("dangling.tsv");
    std::os::unix::fs::symlink(dir.join("no-such-dir").join("t.tsv"), &dangling).expect("link");
    let fifo = dir.join("fifo.tsv");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    let big = dir.join("big.tsv");
    std::fs::write(&big, "#".repeat(2 << 20)).expect("write");
    let mut cases = vec![
        (
            vec!["tune".into(), "--table".into(), "/dev/zero".into()],
            "not a regular file",
        ),
        (
            vec!["tune".into(), "--table".into(), dangling.display().to_string()],
            "dangling",
        ),
        (
            vec!["tune".into(), "--table".into(), big.display().to_string()],
            "larger than",
        ),
        // A directory no one may write in, root included (CI runs as root, to whom
        // permission bits are no bar): refused before measuring, not after.
        (
            vec!["tune".into(), "--table".into(), "/proc/wgpu-attention/t.tsv".into()],
            "cannot write /proc/wgpu-attention/t.tsv: /proc",
        ),
        (vec!["tune".into(), "--variants".into(), "0x0x0".into()], "--variants"),
        (
            vec!["tune".into(), "--variants".into(), "64x48x16".into()],
            "--variants",
        ),
    ];
    if made.is_ok_and(|s| s.success()) {
        cases.push((
            vec!["tune".into(), "--table".into(), fifo.display().to_string()],
            "not a regular file",
        ));
    }
    for (args, needle) in cases {
        let started = std::time::Instant::now();
        let out = bin().env_remove(TUNE_FILE_VAR).args(&args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("coop"),
            "{args:?} measured"
        );
        assert!(started.elapsed().as_secs() < 60, "{args:?}");
    }
    // The library reads the user's table through the same function (TuneTable::load).
    for path in [std::path::PathBuf::from("/dev/zero"), big, dangling] {
        let e = wgpu_attention::tune::read_table_text(&path).expect_err("refused");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }
    assert_eq!(
        wgpu_attention::tune::read_table_text(&dir.join("absent.tsv")).expect("absent"),
        None
    );
}

/// `tune` with `args` (no user table from this process's environment): its output.
fn tune(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    bin()
        .current_dir(dir)
        .env_remove(TUNE_FILE_VAR)
        .arg("tune")
        .args(args)
        .output()
        .expect("runs")
}

/// Asserts a refusal: exit 2, one `error:` line holding every needle, no row measured.
fn assert_refused(out: &std::process::Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "'{needle}' missing from: {stderr}");
    }
    assert!(!stdout.contains("check"), "a refused run printed its table: {stdout}");
}

#[test]
fn tune_refuses_a_run_that_would_measure_nothing_asked_for() {
    // Issue 64 item 3: `--tilings coop` without tensor cores, `--variants` without
    // `--emulate-coop`, variants outside the shape's head-dim class: a header, an empty
    // table and JSON, exit 0.
    let Some(ctx) = common::ctx() else { return };
    if ctx.capabilities().coop_subgroup_size().is_some() {
        common::skip_or_fail("needs an adapter without tensor cores (lavapipe)");
        return;
    }
    let dir = scratch("tune-nothing");
    let shape = ["--shape", "1,2,1,20,40,16", "--reps", "1", "--json", "t.json"];
    let emulating = common::emulating_ctx().is_some();
    let mut cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["--tilings", "coop"], vec!["--tilings coop", "--emulate-coop"]),
        (vec!["--variants", "64x16x16"], vec!["--variants", "--emulate-coop"]),
    ];
    if emulating {
        cases.extend([
            (
                vec!["--emulate-coop", "--variants", "128x64x32"],
                vec!["128x64x32", "head dims"],
            ),
            (vec!["--emulate-coop", "--variants", "16x16x16"], vec!["16x16x16"]),
            (
                vec!["--emulate-coop", "--tilings", "registers", "--variants", "64x16x16"],
                vec!["--variants", "--tilings leaves out coop"],
            ),
            (
                vec!["--emulate-coop", "--variants", "64x16x16,128x32x32"],
                vec!["128x32x32"],
            ),
        ]);
    }
    for (extra, needles) in cases {
        let mut args = shape.to_vec();
        args.extend(&extra);
        assert_refused(&tune(&dir, &args), &needles);
        assert!(!dir.join("t.json").exists(), "{extra:?} wrote its JSON");
    }
}

#[test]
fn tune_key_splits_rows_name_the_splits_that_ran() {
    // Issue 64 item 4: splits are whole 64-key tiles, so `--key-splits 2` at Lk 40 ran
    // unsplit but was labelled and recorded as 2; a repeated count was measured twice.
    let Some(_) = common::ctx() else { return };
    let dir = scratch("tune-splits");
    let out = tune(
        &dir,
        &[
            "--shape",
            "1,2,1,20,200,16",
            "--shape",
            "1,2,1,20,40,16",
            "--reps",
            "1",
            "--tilings",
            "registers",
            "--key-splits",
            "1,2,4",
            "--json",
            "t.json",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("t.json")).expect("json")).expect("parses");
    let ran: Vec<(u64, u64)> = doc["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["shape"][4].as_u64().expect("Lk"),
                r["key_splits"].as_u64().expect("splits"),
            )
        })
        .collect();
    // At Lk 200 each count runs (4 ranges of 64, 64, 64, 8 keys); at Lk 40 one range,
    // measured once and said so.
    assert_eq!(ran, [(200, 1), (200, 2), (200, 4), (40, 1)], "{stdout}");
    assert!(stdout.contains("--key-splits 2 runs as 1"), "{stdout}");
    // A count that runs at no shape, and a count given twice, are refused.
    for (splits, needle) in [("2", "--key-splits 2"), ("1,2,2", "listed twice"), ("+2", "'+2'")] {
        assert_refused(
            &tune(
                &dir,
                &["--shape", "1,2,1,20,40,16", "--reps", "1", "--key-splits", splits],
            ),
            &[needle],
        );
    }
}

#[test]
fn tune_refusals_leave_the_file_system_untouched() {
    // Issue 64 items 5 and 6: `--table`'s directories were made before another flag was
    // refused; an empty table path was found only after every candidate was measured,
    // and WGPU_ATTENTION_TUNE_FILE= meant "no table" for contexts.
    let Some(_) = common::ctx() else { return };
    let dir = scratch("tune-untouched");
    let shape = ["--shape", "1,2,1,20,40,16", "--reps", "1", "--tilings", "registers"];
    for (extra, needle) in [
        (vec!["--dtype", "f64", "--table", "new/sub/t.tsv"], "--dtype"),
        (vec!["--variants", "64x16", "--table", "new/sub/t.tsv"], "--variants"),
        (
            vec!["--table", "new/sub/t.tsv", "--json", "new/sub/t.tsv"],
            "the same file",
        ),
        (vec!["--key-splits", "2", "--table", "new/sub/t.tsv"], "--key-splits"),
        (vec!["--table", ""], "--table"),
    ] {
        let mut args = shape.to_vec();
        args.extend(&extra);
        assert_refused(&tune(&dir, &args), &[needle]);
        assert!(
            common::cli::files_in(&dir).is_empty(),
            "{extra:?} left {:?}",
            common::cli::files_in(&dir)
        );
    }
    // The variable set but empty: refused naming it, for `--table user` and for the
    // context every command makes.
    for extra in [&["--table", "user"][..], &[][..]] {
        let out = bin()
            .current_dir(&dir)
            .env(TUNE_FILE_VAR, "")
            .arg("tune")
            .args(shape)
            .args(extra)
            .output()
            .expect("runs");
        assert_refused(&out, &[TUNE_FILE_VAR, "empty"]);
    }
    // A run that succeeds makes the table's directories.
    let out = tune(&dir, &[&shape[..], &["--table", "new/sub/t.tsv"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("new/sub/t.tsv").is_file());
}
