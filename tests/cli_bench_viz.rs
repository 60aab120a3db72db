//! `bench` (JSON fields, --compare, bad input) and `viz` (PNG size, masked keys drawn at
//! weight zero) through the command line.

use crate::common;
use common::cli::{bin, scratch, write_npy};
use std::path::Path;
use wgpu_attention::check::Rng;
use wgpu_attention::heatmap::{colour, render_grid, render_panel, Labels, Panel};

/// (width, height, RGB bytes) of a PNG.
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).expect("png exists")));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn pixel(img: &(u32, u32, Vec<u8>), x: u32, y: u32) -> [u8; 3] {
    let i = ((y * img.0 + x) * 3) as usize;
    [img.2[i], img.2[i + 1], img.2[i + 2]]
}

fn ok(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn viz_draws_masked_keys_at_weight_zero() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("viz");
    let (heads, lq, lk, d) = (2usize, 4usize, 5usize, 8usize);
    let seed = 31;
    let mut rng = Rng::new(seed);
    write_npy(
        &dir.join("q.npy"),
        &[1, heads as u64, lq as u64, d as u64],
        &rng.vec(heads * lq * d, -1.0, 1.0),
    );
    write_npy(
        &dir.join("k.npy"),
        &[1, heads as u64, lk as u64, d as u64],
        &rng.vec(heads * lk * d, -1.0, 1.0),
    );
    write_npy(&dir.join("lens.npy"), &[1], &[3i32]);
    let out = dir.join("png");
    let output = bin()
        .current_dir(&dir)
        .args(["viz", "--q", "q.npy", "--k", "k.npy", "--key-lengths", "lens.npy"])
        .args([
            "--query-labels",
            "I,like,green,tea",
            "--key-labels",
            "I,like,green,<pad>,<pad>",
        ])
        .args(["--out-dir", "png"])
        .output()
        .expect("runs");
    ok(&output);

    // The geometry depends only on the shape and labels, so a panel of any weights gives it.
    let labels = Labels {
        queries: Some(["I", "like", "green", "tea"].map(String::from).to_vec()),
        keys: Some(["I", "like", "green", "<pad>", "<pad>"].map(String::from).to_vec()),
    };
    let dummy = vec![0.5; lq * lk];
    let panel = |h: usize| Panel {
        title: format!("batch 0, head {h}"),
        weights: &dummy,
        len_q: lq,
        len_k: lk,
    };
    let (expected, geometry) = render_panel(&panel(0), &labels).expect("render");
    for h in 0..heads {
        let img = decode_png(&out.join(format!("attention_b0_h{h}.png")));
        assert_eq!(
            (img.0, img.1),
            (expected.width, expected.height),
            "seed {seed}: head {h} size"
        );
        for i in 0..lq {
            for j in 0..lk {
                let (x, y) = geometry.centre(i, j);
                let c = pixel(&img, x, y);
                if j >= 3 {
                    assert_eq!(
                        c,
                        colour(0.0),
                        "seed {seed}: head {h} masked cell ({i},{j}) not drawn at 0"
                    );
                } else {
                    assert_ne!(
                        c,
                        colour(0.0),
                        "seed {seed}: head {h} visible cell ({i},{j}) drawn at 0"
                    );
                }
            }
        }
    }
    let (grid_expected, grid_geometry) = render_grid(&[panel(0), panel(1)], &labels).expect("render");
    let grid = decode_png(&out.join("attention_b0_heads.png"));
    assert_eq!((grid.0, grid.1), (grid_expected.width, grid_expected.height));
    for g in &grid_geometry {
        for i in 0..lq {
            let (x, y) = g.centre(i, 4);
            assert_eq!(pixel(&grid, x, y), colour(0.0), "seed {seed}: grid masked cell ({i},4)");
        }
    }
}

#[test]
fn viz_rejects_bad_input_without_writing() {
    let dir = scratch("viz-bad");
    write_npy(&dir.join("w5d.npy"), &[1, 1, 1, 2, 2], &[0.25f32; 4]);
    write_npy(&dir.join("w.npy"), &[2, 3], &[0.5f32; 6]);
    for args in [
        vec!["viz", "--weights", "w5d.npy", "--out-dir", "png"],
        vec!["viz", "--weights", "w.npy", "--key-labels", "a,b", "--out-dir", "png"],
        vec!["viz", "--out-dir", "png"],
    ] {
        let output = bin().current_dir(&dir).args(&args).output().expect("runs");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!dir.join("png").exists(), "{args:?}: wrote output");
    }
    let output = bin()
        .current_dir(&dir)
        .args(["viz", "--weights", "w.npy", "--out-dir", "png"])
        .output()
        .expect("runs");
    ok(&output);
    let img = decode_png(&dir.join("png/attention_b0_h0.png"));
    assert!(img.0 > 0 && img.1 > 0);
}

#[test]
fn bench_json_has_every_field_and_compares() {
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("bench");
    let output = bin()
        .current_dir(&dir)
        .args([
            "bench",
            "--shape",
            "1,2,1,40,24,16,8",
            "--causal",
            "--dtype",
            "f32",
            "--reps",
            "1",
        ])
        .args(["--probe", "64", "--copy-mib", "1", "--json", "b.json"])
        .output()
        .expect("runs");
    ok(&output);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("b.json")).expect("json written")).expect("valid json");
    assert_eq!(doc["schema"], "wgpu-attention-bench/1");
    let run = &doc["runs"][0];
    for field in [
        "name",
        "vendor",
        "device",
        "device_type",
        "backend",
        "driver",
        "driver_info",
        "limits",
    ] {
        assert!(!run["adapter"][field].is_null(), "adapter.{field} missing");
    }
    for field in ["fused_tiling", "gemm_tiling", "timing_clock", "enabled_features"] {
        assert!(run[field].is_string(), "{field} missing");
    }
    for field in ["gemm_gflops", "copy_gbps"] {
        assert!(run["probe"][field].as_f64().is_some_and(|x| x > 0.0), "probe.{field}");
    }
    let rows = run["rows"].as_array().expect("rows");
    // 2 masks x (fused, materialized, cpu-reference).
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in rows {
        assert_eq!(row["status"], "measured", "{row}");
        for field in [
            "batch",
            "heads_q",
            "heads_kv",
            "len_q",
            "len_k",
            "head_dim",
            "head_dim_v",
            "first_ms",
            "median_ms",
            "min_ms",
            "max_ms",
            "gflops",
            "gbps",
            "tokens_per_second",
            "percent_of_probe_gflops",
            "percent_of_probe_gbps",
            "speedup_over_materialized",
            "speedup_over_cpu_reference",
        ] {
            assert!(row[field].as_f64().is_some(), "{field} missing in {row}");
        }
        assert!(row["min_ms"].as_f64() <= row["median_ms"].as_f64());
        assert!(row["median_ms"].as_f64() <= row["max_ms"].as_f64());
        assert_eq!(row["head_dim_v"], 8);
    }
    let output = bin()
        .current_dir(&dir)
        .args(["bench", "--compare", "b.json", "b.json"])
        .output()
        .expect("runs");
    ok(&output);
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(text.matches("1.00x").count(), 6, "{text}");

    for args in [
        vec!["bench", "--suite", "bogus"],
        vec!["bench", "--shape", "1,2,3"],
        vec!["bench", "--compare", "missing.json", "b.json"],
        vec!["bench", "--reps", "0"],
    ] {
        let output = bin().current_dir(&dir).args(&args).output().expect("runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn bench_mha_prints_every_phase_and_the_paired_projection_ratio() {
    if common::ctx().is_none() {
        return;
    }
    let output = bin()
        .args([
            "bench",
            "--mha",
            "1,16,32,4",
            "--reps",
            "2",
            "--probe",
            "32",
            "--copy-mib",
            "1",
        ])
        .output()
        .expect("run bench --mha");
    ok(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for phase in [
        "one packed GEMM",
        "three GEMMs",
        "attention",
        "output projection",
        "LayerNorm",
        "whole layer",
    ] {
        assert!(stdout.contains(phase), "no '{phase}' row in:\n{stdout}");
    }
    assert!(
        stdout.contains("2 pairs run back to back"),
        "no paired ratio line in:\n{stdout}"
    );
    // The layer's parts share 100% between them (alternatives and the whole show "-" or
    // 100%): each share is rounded, so the sum is within half a percent per part.
    let shares: Vec<f64> = stdout
        .lines()
        .filter(|l| !l.starts_with("whole layer") && !l.starts_with("phase"))
        .filter_map(|l| l.split_whitespace().last()?.strip_suffix('%')?.parse().ok())
        .collect();
    assert_eq!(shares.len(), 4, "packed projection, attention, output, norm:\n{stdout}");
    let sum: f64 = shares.iter().sum();
    assert!((sum - 100.0).abs() <= 2.0, "shares sum to {sum}%:\n{stdout}");

    // Heads that do not divide the width: refused before any measuring, exit 2.
    let bad = bin()
        .args(["bench", "--mha", "1,16,30,4", "--reps", "1"])
        .output()
        .expect("run bench --mha");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("multiple of num_heads"), "{stderr}");
    assert!(
        bad.stdout.is_empty(),
        "measured before refusing: {}",
        String::from_utf8_lossy(&bad.stdout)
    );
}

#[test]
fn viz_max_pools_large_weights_into_a_bounded_image() {
    // 3 heads of 2500 x 1700 weights (51 MB of f32): each panel is max-pooled to at
    // most MAX_PANEL_CELLS cells a side (a grid's panels to fewer), so the images stay
    // small, and one peak per head still shows at full colour.
    use wgpu_attention::heatmap::MAX_PANEL_CELLS;
    let dir = scratch("viz-large");
    let (heads, lq, lk) = (3usize, 2500usize, 1700usize);
    let mut rng = Rng::new(33);
    let mut weights = rng.vec(heads * lq * lk, 0.0, 0.01);
    let peaks = [(2499, 1699), (7, 1234), (1800, 0)];
    for (h, &(i, j)) in peaks.iter().enumerate() {
        weights[(h * lq + i) * lk + j] = 1.0;
    }
    write_npy(&dir.join("w.npy"), &[1, heads as u64, lq as u64, lk as u64], &weights);
    let output = bin()
        .current_dir(&dir)
        .args(["viz", "--weights", "w.npy", "--out-dir", "png"])
        .output()
        .expect("runs");
    ok(&output);
    for (h, &(i, j)) in peaks.iter().enumerate() {
        let panel = Panel {
            title: format!("batch 0, head {h}"),
            weights: &weights[h * lq * lk..][..lq * lk],
            len_q: lq,
            len_k: lk,
        };
        let (expected, geometry) = render_panel(&panel, &Labels::default()).expect("render");
        assert_eq!(
            geometry.pool,
            (lq.div_ceil(MAX_PANEL_CELLS), lk.div_ceil(MAX_PANEL_CELLS))
        );
        assert!(
            expected.width < 800 && expected.height < 800,
            "{}x{}",
            expected.width,
            expected.height
        );
        let img = decode_png(&dir.join(format!("png/attention_b0_h{h}.png")));
        assert_eq!((img.0, img.1), (expected.width, expected.height));
        let (x, y) = geometry.centre(i, j);
        assert_eq!(
            pixel(&img, x, y),
            colour(1.0),
            "head {h}: the peak's block is not at full colour"
        );
        let (x, y) = geometry.centre((i + lq / 2) % lq, (j + lk / 2) % lk);
        assert_ne!(
            pixel(&img, x, y),
            colour(1.0),
            "head {h}: a block far from the peak is at full colour"
        );
    }
    let grid = decode_png(&dir.join("png/attention_b0_heads.png"));
    assert!(grid.0 < 1400 && grid.1 < 1400, "grid {}x{}", grid.0, grid.1);
}

#[test]
fn bench_decode_rope_times_whole_steps_and_their_ratio_in_alternation() {
    // Issue 41: a decode step (append + attend) with a rotary embedding against one
    // without, as rows and as a ratio of steps timed in alternation.
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("bench-decode-rope");
    let output = bin()
        .current_dir(&dir)
        .args(["bench", "--decode", "2,4,2,200,32", "--dtype", "f32", "--reps", "2"])
        .args([
            "--kernel",
            "decode+rope",
            "--probe",
            "64",
            "--copy-mib",
            "1",
            "--json",
            "r.json",
        ])
        .output()
        .expect("runs");
    ok(&output);
    let text = String::from_utf8_lossy(&output.stdout);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).expect("json written")).expect("valid json");
    let run = &doc["runs"][0];
    let kernels: Vec<&str> = run["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["kernel"].as_str())
        .collect();
    for want in ["decode-step", "decode-step+rope"] {
        assert!(kernels.contains(&want), "{want} missing: {kernels:?}");
    }
    let paired = &run["paired"][0];
    let ratios = paired["ratios"].as_array().expect("ratios");
    assert_eq!(ratios.len(), 4, "2 x reps pairs: {paired}");
    assert!(
        ratios
            .iter()
            .all(|r| r.as_f64().is_some_and(|r| r > 0.0 && r.is_finite())),
        "{paired}"
    );
    let median = paired["median"].as_f64().expect("median");
    assert!(
        text.contains(&format!("4 pairs in alternation: median {median:.3}")),
        "{text}"
    );
}

#[test]
fn bench_decode_reports_tokens_per_second() {
    // Issue 14: `bench --decode` gives tokens per second (B·Lq over the median) beside
    // GB/s, in the table and the JSON, for the decode row and the fused one.
    if common::ctx().is_none() {
        return;
    }
    let dir = scratch("bench-decode");
    let output = bin()
        .current_dir(&dir)
        .args(["bench", "--decode", "3,4,2,300,32", "--dtype", "f32", "--reps", "1"])
        .args(["--probe", "64", "--copy-mib", "1", "--json", "d.json"])
        // The adapter's decode design beside the tiled one, and the fused kernel.
        .args(["--kernel", "decode+tiles"])
        .output()
        .expect("runs");
    ok(&output);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.lines().any(|l| l.trim_end().ends_with("tok/s")), "{text}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("d.json")).expect("json written")).expect("valid json");
    let rows = doc["runs"][0]["rows"].as_array().expect("rows");
    let kernels: Vec<&str> = rows.iter().filter_map(|r| r["kernel"].as_str()).collect();
    assert!(
        kernels.contains(&"decode") && kernels.contains(&"decode/tiles"),
        "{kernels:?}"
    );
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in rows {
        assert_eq!(row["status"], "measured", "{row}");
        assert_eq!(
            (row["batch"].as_u64(), row["len_q"].as_u64()),
            (Some(3), Some(1)),
            "{row}"
        );
        let median_s = row["median_ms"].as_f64().expect("median") / 1e3;
        let tokens = row["tokens_per_second"].as_f64().expect("tokens_per_second");
        assert!(
            (tokens * median_s - 3.0).abs() < 1e-9,
            "{tokens} tok/s at {median_s} s: {row}"
        );
        // The table's last column is the same figure.
        // The kernel's row under the case's line.
        let line = text
            .lines()
            .skip_while(|l| !l.starts_with("3,4,2,1,300,32,32 "))
            .find(|l| l.trim_start().starts_with(row["kernel"].as_str().expect("kernel")))
            .expect("the row's line");
        let printed: f64 = line
            .split_whitespace()
            .last()
            .expect("a last column")
            .parse()
            .expect("tok/s is a number");
        assert!(
            (printed - tokens).abs() <= 0.05 + 1e-9 * tokens,
            "{line} against {tokens}"
        );
        // Both rows read the cache: neither copies K and V per call (the fused texel
        // kernel would copy them into a texel mirror from plain tensors), so what a
        // call allocates is well under K's bytes (3·2·300·32 f32).
        let allocated = row["allocated_bytes"].as_u64().expect("allocated_bytes");
        assert!(allocated < 3 * 2 * 300 * 32 * 4, "{allocated} bytes a call: {row}");
    }
}
