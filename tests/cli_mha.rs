//! `wgpu-attention mha` end to end on the PyTorch fixture, and its bad-input contract.

use crate::common;

use common::cli::{bin, read_f32, scratch};
use common::torch_fixture as fixture;
use std::path::Path;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn run_ok(args: &[&str]) {
    let output = bin().args(args).output().expect("runs");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn mha_matches_pytorch_with_tokens_post_norm_and_both_weight_shapes() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("mha");
    let (out, weights) = (dir.join("out.npy"), dir.join("w.npy"));
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    // Self-attention, pad mask from token ids, weights averaged over heads.
    run_ok(&[
        "mha",
        "--weights",
        &s(&fixture("self.safetensors")),
        "--num-heads",
        "4",
        "--query",
        &s(&fixture("self_query.npy")),
        "--tokens",
        &s(&fixture("self_tokens.npy")),
        "--pad-id",
        "0",
        "--out",
        &s(&out),
        "--weights-out",
        &s(&weights),
    ]);
    let (shape, got) = read_f32(&out);
    assert_eq!(shape, [2, 5, 16]);
    assert!(max_diff(&got, &read_f32(&fixture("self_out.npy")).1) < 2e-5);
    let (shape, got) = read_f32(&weights);
    assert_eq!(shape, [2, 5, 5]);
    assert!(max_diff(&got, &read_f32(&fixture("self_weights.npy")).1) < 2e-5);

    // Hugging Face names under a prefix, causal, post-norm, per-head weights.
    run_ok(&[
        "mha",
        "--weights",
        &s(&fixture("postnorm.safetensors")),
        "--prefix",
        "encoder.layers.0.",
        "--num-heads",
        "3",
        "--query",
        &s(&fixture("postnorm_query.npy")),
        "--causal",
        "top-left",
        "--post-norm",
        "--out",
        &s(&out),
        "--weights-out",
        &s(&weights),
        "--per-head",
    ]);
    assert!(max_diff(&read_f32(&out).1, &read_f32(&fixture("postnorm_out.npy")).1) < 2e-5);
    let (shape, got) = read_f32(&weights);
    assert_eq!(shape, [2, 3, 6, 6]);
    assert!(max_diff(&got, &read_f32(&fixture("postnorm_weights_per_head.npy")).1) < 2e-5);

    // Cross-attention with separate key and value files and an explicit bool mask.
    run_ok(&[
        "mha",
        "--weights",
        &s(&fixture("cross.safetensors")),
        "--num-heads",
        "2",
        "--query",
        &s(&fixture("cross_query.npy")),
        "--key",
        &s(&fixture("cross_key.npy")),
        "--value",
        &s(&fixture("cross_value.npy")),
        "--mask",
        &s(&fixture("cross_mask.npy")),
        "--out",
        &s(&out),
    ]);
    assert!(max_diff(&read_f32(&out).1, &read_f32(&fixture("cross_out.npy")).1) < 2e-5);
}

#[test]
fn mha_bad_input_exits_2_and_writes_nothing() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("mha-bad");
    let out = dir.join("out.npy");
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let (weights, query) = (s(&fixture("self.safetensors")), s(&fixture("self_query.npy")));
    let base = ["mha", "--weights", &weights, "--query", &query, "--out"];
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--num-heads".into(), "3".into()], "multiple of num_heads"),
        (
            vec!["--num-heads".into(), "4".into(), "--post-norm".into()],
            "norm.weight",
        ),
        (
            vec!["--num-heads".into(), "4".into(), "--prefix".into(), "enc.".into()],
            "enc.in_proj_weight",
        ),
        (
            vec![
                "--num-heads".into(),
                "4".into(),
                "--tokens".into(),
                s(&fixture("gqa_key_lengths.npy")),
                "--pad-id".into(),
                "0".into(),
            ],
            "token ids must have shape [2, 5]",
        ),
        (
            vec!["--num-heads".into(), "4".into(), "--key".into(), query.clone()],
            "--value",
        ),
    ];
    for (extra, needle) in cases {
        let output = bin().args(base).arg(&out).args(&extra).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{extra:?}: stderr should mention '{needle}': {stderr}"
        );
        assert!(!out.exists(), "{extra:?}: wrote an output file");
    }
    // A query of the wrong width.
    let output = bin()
        .args(["mha", "--weights", &weights, "--num-heads", "4", "--query"])
        .arg(fixture("cross_key.npy"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("[B, S, 16]"));
    assert!(!out.exists());
}

#[test]
fn demo_runs_padded_sentences_through_the_layer_and_draws_its_heads() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("demo");
    let output = bin().args(["demo", "--heatmaps"]).arg(&dir).output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for needle in [
        "output [2, 5, 512]",
        "weights [2, 8, 5, 5]",
        "largest weight on padding, over every head and query: 0\n",
        "sentence 1: tok5 tok2 tok1 <pad> <pad>  (3 tokens, 2 padding)",
        "sentence 2: tok1 tok3 tok1 tok4 <pad>  (4 tokens, 1 padding)",
    ] {
        assert!(
            stdout.contains(needle),
            "demo output should contain '{needle}':\n{stdout}"
        );
    }
    // One image per (sentence, head) and a grid per sentence.
    let pngs = std::fs::read_dir(&dir)
        .expect("heatmap dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    assert_eq!(pngs, 2 * (8 + 1));
    // Named and titled by what a user sees: sentences and heads counted from 1, no
    // project jargon (issue 56: "seed003_sentence1_b0_h0.png" titled "batch 0").
    for sentence in [1, 2] {
        assert!(dir.join(format!("sentence{sentence}_heads.png")).exists());
        for head in 1..=8 {
            assert!(dir.join(format!("sentence{sentence}_head{head}.png")).exists());
        }
    }
    for jargon in ["seed", "batch"] {
        assert!(!stdout.to_lowercase().contains(jargon), "{jargon}: {stdout}");
    }
    let help = bin().args(["demo", "--help"]).output().expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("heatmaps") && help.contains("layer"), "{help}");
    assert!(!help.to_lowercase().contains("seed"), "{help}");
}

#[test]
fn mha_refuses_a_norm_it_would_leave_out_unless_told() {
    let Some(_) = common::ctx() else { return };
    let dir = scratch("mha-norm-flag");
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let weights = s(&fixture("postnorm.safetensors"));
    let query = s(&fixture("postnorm_query.npy"));
    let out = dir.join("out.npy");
    let base = [
        "mha",
        "--weights",
        &weights,
        "--num-heads",
        "4",
        "--prefix",
        "encoder.layers.0.",
        "--query",
        &query,
        "--out",
    ];
    let output = bin().args(base).arg(&out).output().expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("encoder.layers.0.norm.weight")
            && stderr.contains("--post-norm")
            && stderr.contains("--ignore-norm"),
        "{stderr}"
    );
    assert!(!out.exists());
    run_ok(&[&base[..], &[out.to_str().expect("utf-8"), "--ignore-norm"]].concat());
    assert!(out.exists());
    // --post-norm on a file without norm weights says where it looked.
    let plain = s(&fixture("self.safetensors"));
    let output = bin()
        .args(["mha", "--weights", &plain, "--num-heads", "4", "--query"])
        .arg(fixture("self_query.npy"))
        .arg("--out")
        .arg(dir.join("o2.npy"))
        .arg("--post-norm")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("norm1.weight") && stderr.contains("no norm weights"),
        "{stderr}"
    );
}
