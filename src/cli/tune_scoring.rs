//! What `tune` and `tune --backward` share: the deadline, a timed row as the winner
//! picking sees it, the winners per head-dim class, and shape labels.

use super::{write_stdout, CliError};
use wgpu_attention::{AttentionShape, DType};

/// A shape as the tables write it: `B,Hq,Hkv,Lq,Lk,D,Dv`.
pub(super) fn shape_label(s: &AttentionShape) -> String {
    format!(
        "{},{},{},{},{},{},{}",
        s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_k, s.head_dim, s.head_dim_v
    )
}

/// `--deadline`: when `tune` starts no more candidates.
pub(super) struct Deadline {
    start: std::time::Instant,
    seconds: Option<u64>,
}

impl Deadline {
    pub(super) fn new(seconds: Option<u64>) -> Self {
        Deadline {
            start: std::time::Instant::now(),
            seconds,
        }
    }

    /// Whether the deadline has passed (saying so, with the `rows` measured by then).
    pub(super) fn passed(&self, rows: usize) -> Result<bool, CliError> {
        let Some(seconds) = self.seconds else { return Ok(false) };
        if self.start.elapsed().as_secs() < seconds {
            return Ok(false);
        }
        write_stdout(format_args!(
            "deadline: {seconds} s passed; no more candidates started ({rows} rows measured)"
        ))?;
        Ok(true)
    }
}

/// One timed row as [`winners`] sees it.
pub(super) struct Scored<'a, V> {
    pub variant: V,
    /// The head-dim class it competes in.
    pub class: u32,
    pub dtype: DType,
    /// `ok`, `WRONG ..`, or why not.
    pub status: &'a str,
    pub gflops: Option<f64>,
}

/// Per class, the variant with the highest mean GFLOP/s over its `ok` rows (f16 rows
/// where the class has any; a variant wrong anywhere left out), and that mean.
pub(super) fn winners<V: Copy + Ord>(rows: &[Scored<V>]) -> Vec<(V, f64)> {
    let mut classes: Vec<u32> = rows.iter().map(|r| r.class).collect();
    classes.sort_unstable();
    classes.dedup();
    let wrong = |v: V| rows.iter().any(|r| r.variant == v && r.status.starts_with("WRONG"));
    let mut out = Vec::new();
    for class in classes {
        let of_class: Vec<&Scored<V>> = rows
            .iter()
            .filter(|r| r.class == class && r.status == "ok" && !wrong(r.variant))
            .collect();
        let dtype = if of_class.iter().any(|r| r.dtype == DType::F16) {
            DType::F16
        } else {
            DType::F32
        };
        let mut variants: Vec<V> = of_class.iter().map(|r| r.variant).collect();
        variants.sort_unstable();
        variants.dedup();
        let score = |v: &V| {
            let figures: Vec<f64> = of_class
                .iter()
                .filter(|r| r.variant == *v && r.dtype == dtype)
                .filter_map(|r| r.gflops)
                .collect();
            figures.iter().sum::<f64>() / figures.len().max(1) as f64
        };
        if let Some(best) = variants.iter().max_by(|a, b| score(a).total_cmp(&score(b))) {
            out.push((*best, score(best)));
        }
    }
    out
}
