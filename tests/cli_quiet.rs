//! Quiet success: on a headless machine (no `XDG_RUNTIME_DIR`), a command that succeeds
//! writes nothing on stderr but what the command itself says (issue 37).

use crate::common;

use common::cli::{bin, scratch, write_npy};
use wgpu_attention::check::Rng;

/// Runs the CLI without `XDG_RUNTIME_DIR` (nor a caller's `NODEVICE_SELECT`) and
/// returns its stderr, asserting success.
fn stderr_of(args: &[&str], dir: &std::path::Path) -> String {
    let output = bin()
        .current_dir(dir)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .args(args)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{args:?}: {stderr}");
    stderr
}

#[test]
fn commands_that_succeed_say_nothing_on_stderr_but_their_own_lines() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("quiet");
    assert_eq!(stderr_of(&["info"], &dir), "", "info");
    let mut rng = Rng::new(29);
    for name in ["q", "k", "v"] {
        write_npy(&dir.join(format!("{name}.npy")), &[1, 2, 4, 8], &rng.vec(64, -1.0, 1.0));
    }
    let stderr = stderr_of(
        &["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
        &dir,
    );
    // One line: which kernel ran, where, and how long it took.
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("run: ") && lines[0].contains(" ms"), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

#[test]
fn the_examples_are_quiet_on_a_headless_machine() {
    // Issue 56: every program but the CLI printed "error: XDG_RUNTIME_DIR is invalid"
    // twice. `cargo test` builds the examples beside the test binaries.
    let Some(_) = common::ctx() else { return };
    let examples = std::env::current_exe()
        .expect("the test binary")
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the profile directory")
        .join("examples");
    let quickstart = examples.join(format!("quickstart{}", std::env::consts::EXE_SUFFIX));
    if !quickstart.exists() {
        common::skip_or_fail(&format!("{} was not built", quickstart.display()));
        return;
    }
    let output = std::process::Command::new(&quickstart)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");
}
