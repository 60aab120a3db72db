//! `run --grad` (issue 39; `--d-out` before issue 56): the gradients written as .npy
//! match the f64 reference; a missing gradient output or a dO of the wrong shape is
//! refused before any work.

use crate::common;

use common::cli::{bin, read_f32, scratch, write_npy};
use wgpu_attention::check::Rng;
use wgpu_attention::reference::attention_backward;
use wgpu_attention::{AttentionOptions, AttentionShape, CausalAlignment};

#[test]
fn run_writes_the_gradients_the_reference_computes() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("backward");
    let s = AttentionShape::new(1, 4, 2, 11, 9, 8, 6);
    let mut rng = Rng::new(3995);
    let q = rng.vec(4 * 11 * 8, -1.0, 1.0);
    let k = rng.vec(2 * 9 * 8, -1.0, 1.0);
    let v = rng.vec(2 * 9 * 6, -1.0, 1.0);
    let d_out = rng.vec(4 * 11 * 6, -1.0, 1.0);
    write_npy(&dir.join("q.npy"), &[1, 4, 11, 8], &q);
    write_npy(&dir.join("k.npy"), &[1, 2, 9, 8], &k);
    write_npy(&dir.join("v.npy"), &[1, 2, 9, 6], &v);
    write_npy(&dir.join("do.npy"), &[1, 4, 11, 6], &d_out);
    let base = [
        "run",
        "--q",
        "q.npy",
        "--k",
        "k.npy",
        "--v",
        "v.npy",
        "--out",
        "o.npy",
        "--causal",
        "bottom-right",
    ];
    let out = bin()
        .current_dir(&dir)
        .args(base)
        .args([
            "--grad", "do.npy", "--dq-out", "dq.npy", "--dk-out", "dk.npy", "--dv-out", "dv.npy",
        ])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The report names the backward too (issue 56: it named only the forward).
    assert!(stderr.contains("; backward "), "{stderr}");
    let options = AttentionOptions {
        causal: Some(CausalAlignment::BottomRight),
        ..Default::default()
    };
    let want = attention_backward(&q, &k, &v, &d_out, &s, &options).expect("reference");
    for (name, shape, w) in [
        ("dq.npy", vec![1u64, 4, 11, 8], &want.dq),
        ("dk.npy", vec![1, 2, 9, 8], &want.dk),
        ("dv.npy", vec![1, 2, 9, 6], &want.dv),
    ] {
        let (got_shape, got) = read_f32(&dir.join(name));
        assert_eq!(got_shape, shape, "{name}");
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(w.iter())
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        // Within the f32 rule of docs/design.md ("Backward") with room: these inputs'
        // magnitudes are within a few times the gradients' largest entry.
        assert!(worst <= 1e-5 * scale.max(1e-3), "{name}: {worst:.3e} of {scale:.3e}");
    }

    // Refused before any work, nothing written.
    for (extra, needle) in [
        (
            vec!["--d-out", "do.npy", "--dq-out", "a.npy", "--dk-out", "b.npy"],
            "--dv-out",
        ),
        (vec!["--dq-out", "a.npy"], "--grad"),
        (
            vec![
                "--d-out", "q.npy", "--dq-out", "a.npy", "--dk-out", "b.npy", "--dv-out", "c.npy",
            ],
            "output's shape",
        ),
    ] {
        let out = bin().current_dir(&dir).args(base).args(&extra).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
        for name in ["a.npy", "b.npy", "c.npy"] {
            assert!(!dir.join(name).exists(), "{extra:?} wrote {name}");
        }
    }

    // The old spelling still works for a release, with a note saying the new one.
    let out = bin()
        .current_dir(&dir)
        .args(base)
        .args([
            "--d-out", "do.npy", "--dq-out", "dq2.npy", "--dk-out", "dk2.npy", "--dv-out", "dv2.npy",
        ])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("--d-out is now --grad"), "{stderr}");
    assert_eq!(read_f32(&dir.join("dq2.npy")), read_f32(&dir.join("dq.npy")));
}
