//! `bench --compare A.json B.json`: two benchmark files row by row, e.g. two vendors,
//! two driver versions, or before and after a change. Run i of A is compared with run i
//! of B; rows match on shape, mask, dtype and kernel family (`fused/subgroup` and
//! `fused/shared` are both `fused`), so different adapters' tilings line up.

use super::CliError;
use serde_json::Value;
use std::path::Path;

/// Version tag of the JSON `bench` writes and `--compare` reads.
pub const SCHEMA: &str = "wgpu-attention-bench/1";

fn load(path: &Path) -> Result<Vec<Value>, CliError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| CliError::bad(format!("cannot read {}: {e}", path.display())))?;
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| CliError::bad(format!("{}: not JSON: {e}", path.display())))?;
    if doc["schema"].as_str() != Some(SCHEMA) {
        return Err(CliError::bad(format!(
            "{}: not a bench file (expected \"schema\": \"{SCHEMA}\")",
            path.display()
        )));
    }
    match doc["runs"].as_array() {
        Some(runs) if !runs.is_empty() => Ok(runs.clone()),
        _ => Err(CliError::bad(format!("{}: has no runs", path.display()))),
    }
}

/// What identifies a row across files.
pub fn row_key(row: &Value) -> String {
    let n = |k: &str| row[k].as_u64().map_or("?".to_string(), |v| v.to_string());
    let kernel = row["kernel"].as_str().unwrap_or("?");
    let family = kernel.split('/').next().unwrap_or(kernel);
    format!(
        "{},{},{},{},{},{},{} {} {} {}",
        n("batch"),
        n("heads_q"),
        n("heads_kv"),
        n("len_q"),
        n("len_k"),
        n("head_dim"),
        n("head_dim_v"),
        row["mask"].as_str().unwrap_or("?"),
        row["dtype"].as_str().unwrap_or("?"),
        family
    )
}

fn adapter_name(run: &Value) -> String {
    format!(
        "{} ({})",
        run["adapter"]["name"].as_str().unwrap_or("?"),
        run["adapter"]["backend"].as_str().unwrap_or("?")
    )
}

pub fn run(a_path: &Path, b_path: &Path) -> Result<(), CliError> {
    let (a_runs, b_runs) = (load(a_path)?, load(b_path)?);
    if a_runs.len() != b_runs.len() {
        return Err(CliError::bad(format!(
            "{} has {} runs and {} has {}: compare files made with the same --all-adapters setting",
            a_path.display(),
            a_runs.len(),
            b_path.display(),
            b_runs.len()
        )));
    }
    for (a, b) in a_runs.iter().zip(&b_runs) {
        outln!("A: {} ({})", adapter_name(a), a_path.display());
        outln!("B: {} ({})", adapter_name(b), b_path.display());
        let probe = |run: &Value, k: &str| run["probe"][k].as_f64().unwrap_or(f64::NAN);
        outln!(
            "probe GEMM GFLOP/s: A {:.2}, B {:.2} (B/A {:.2}); copy GB/s: A {:.2}, B {:.2} (B/A {:.2})",
            probe(a, "gemm_gflops"),
            probe(b, "gemm_gflops"),
            probe(b, "gemm_gflops") / probe(a, "gemm_gflops"),
            probe(a, "copy_gbps"),
            probe(b, "copy_gbps"),
            probe(b, "copy_gbps") / probe(a, "copy_gbps"),
        );
        outln!(
            "{:<60} {:>12} {:>12} {:>10}",
            "row",
            "A median ms",
            "B median ms",
            "B speedup"
        );
        let empty = Vec::new();
        let b_rows = b["rows"].as_array().unwrap_or(&empty);
        let mut matched = 0;
        for row in a["rows"].as_array().unwrap_or(&empty) {
            let key = row_key(row);
            let Some(other) = b_rows.iter().find(|r| row_key(r) == key) else {
                continue;
            };
            matched += 1;
            let (ta, tb) = (row["median_ms"].as_f64(), other["median_ms"].as_f64());
            let cell = |t: Option<f64>| t.map_or("skipped".to_string(), |t| format!("{t:.2}"));
            let ratio = match (ta, tb) {
                (Some(ta), Some(tb)) => format!("{:.2}x", ta / tb),
                _ => "-".to_string(),
            };
            outln!("{key:<60} {:>12} {:>12} {:>10}", cell(ta), cell(tb), ratio);
        }
        if matched == 0 {
            outln!("(no rows in common)");
        }
    }
    Ok(())
}
