//! The register budget CI holds every GPU kernel to (`tune/isa-budget.tsv`): per kernel
//! label, the most VGPRs, spilled registers and scratch bytes RADV may report for it.
//! A kernel that gains scratch or spills, grows past its VGPRs, fails to compile or has
//! no row fails the gate; a budget row nothing measured is only reported (a filter ran).

use super::Row;
use std::collections::BTreeMap;

/// The statistics the budget bounds, by the names RADV reports them under.
pub const BOUNDED: [&str; 4] = ["VGPRs", "Spilled VGPRs", "Spilled SGPRs", "Scratch size"];

/// Per kernel label, the maximum of each [`BOUNDED`] statistic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Budget {
    pub limits: BTreeMap<String, [f64; 4]>,
}

impl Budget {
    /// Parses the TSV: `#` comments, a header `kernel` + the [`BOUNDED`] names, then one
    /// row per kernel. Errors name the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
        let header: Vec<&str> = lines
            .next()
            .ok_or("an empty budget (no header line)")?
            .1
            .split('\t')
            .collect();
        let expected: Vec<&str> = std::iter::once("kernel").chain(BOUNDED).collect();
        if header != expected {
            return Err(format!("the header must be {:?}, not {header:?}", expected.join("\\t")));
        }
        let mut limits = BTreeMap::new();
        for (n, line) in lines {
            let fields: Vec<&str> = line.split('\t').collect();
            let [label, rest @ ..] = fields.as_slice() else {
                unreachable!("split yields one field")
            };
            if rest.len() != BOUNDED.len() {
                return Err(format!(
                    "line {}: {} fields, not {}",
                    n + 1,
                    fields.len(),
                    BOUNDED.len() + 1
                ));
            }
            let mut values = [0.0; 4];
            for (value, field) in values.iter_mut().zip(rest) {
                *value = field
                    .parse::<u64>()
                    .map_err(|_| format!("line {}: '{field}' is not a whole number", n + 1))?
                    as f64;
            }
            if limits.insert(label.to_string(), values).is_some() {
                return Err(format!("line {}: '{label}' has a row already", n + 1));
            }
        }
        Ok(Budget { limits })
    }

    /// The TSV of `rows` as measured (their figures become the limits), with `header`
    /// lines as comments.
    pub fn write(rows: &[Row], header: &[String]) -> String {
        let mut out: String = header.iter().map(|h| format!("# {h}\n")).collect();
        out.push_str(&std::iter::once("kernel").chain(BOUNDED).collect::<Vec<_>>().join("\t"));
        out.push('\n');
        for row in rows.iter().filter(|r| r.result.is_ok()) {
            let values: Vec<String> = BOUNDED
                .iter()
                .map(|s| format!("{}", row.stat(s).unwrap_or(0.0)))
                .collect();
            out.push_str(&format!("{}\t{}\n", row.label, values.join("\t")));
        }
        out
    }

    /// Every way `rows` break the budget, one line each (empty: within it), and the
    /// budget's rows no row measured.
    pub fn check(&self, rows: &[Row]) -> (Vec<String>, Vec<String>) {
        let mut broken = Vec::new();
        for row in rows {
            let Some(limits) = self.limits.get(&row.label) else {
                broken.push(format!("{}: no budget row (add one to the budget file)", row.label));
                continue;
            };
            if let Err(e) = &row.result {
                broken.push(format!("{}: did not compile: {e}", row.label));
                continue;
            }
            for (name, max) in BOUNDED.iter().zip(limits) {
                match row.stat(name) {
                    None => broken.push(format!("{}: the driver reports no '{name}'", row.label)),
                    Some(v) if v > *max => broken.push(format!("{}: {name} {v} > {max}", row.label)),
                    Some(_) => {}
                }
            }
        }
        let unmeasured = self
            .limits
            .keys()
            .filter(|label| !rows.iter().any(|r| &r.label == *label))
            .cloned()
            .collect();
        (broken, unmeasured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::vulkan::{Executable, Statistic};
    use crate::isa::RuntimeChecks;

    fn row(label: &str, vgprs: f64, spilled: f64, scratch: f64) -> Row {
        let stats = [
            ("VGPRs", vgprs),
            ("Spilled VGPRs", spilled),
            ("Spilled SGPRs", 0.0),
            ("Scratch size", scratch),
        ];
        Row {
            label: label.into(),
            checks: RuntimeChecks::WGPU_DEFAULT,
            required_subgroup: None,
            result: Ok(Executable {
                name: "main".into(),
                subgroup_size: 32,
                statistics: stats
                    .iter()
                    .map(|&(name, value)| Statistic {
                        name: name.into(),
                        value,
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn the_gate_fails_on_growth_spills_scratch_and_missing_rows() {
        let budget = Budget::parse(&Budget::write(&[row("a f32", 48.0, 0.0, 0.0)], &["test".into()])).expect("parses");
        assert_eq!(budget.check(&[row("a f32", 48.0, 0.0, 0.0)]).0, Vec::<String>::new());
        assert_eq!(budget.check(&[row("a f32", 40.0, 0.0, 0.0)]).0, Vec::<String>::new());
        for (grown, what) in [
            (row("a f32", 49.0, 0.0, 0.0), "VGPRs 49 > 48"),
            (row("a f32", 48.0, 2.0, 0.0), "Spilled VGPRs 2 > 0"),
            (row("a f32", 48.0, 0.0, 256.0), "Scratch size 256 > 0"),
            (row("b f32", 8.0, 0.0, 0.0), "no budget row"),
        ] {
            let (broken, _) = budget.check(&[grown]);
            assert!(
                broken.len() == 1 && broken[0].contains(what),
                "{broken:?} should say {what}"
            );
        }
        let mut failed = row("a f32", 0.0, 0.0, 0.0);
        failed.result = Err("VK_ERROR_UNKNOWN".into());
        assert!(budget.check(&[failed]).0[0].contains("did not compile"));
        assert_eq!(budget.check(&[]).1, vec!["a f32".to_string()]);
    }

    #[test]
    fn malformed_budgets_are_refused_with_their_line() {
        let header = "kernel\tVGPRs\tSpilled VGPRs\tSpilled SGPRs\tScratch size\n";
        assert!(Budget::parse("").is_err());
        assert!(Budget::parse("kernel\tVGPRs\n").is_err());
        let bad = format!("{header}a\t1\t2\t3\n");
        assert!(Budget::parse(&bad).expect_err("short").contains("line 2"));
        let bad = format!("{header}a\t1\t2\t3\tx\n");
        assert!(Budget::parse(&bad).expect_err("not a number").contains("'x'"));
        let bad = format!("{header}a\t1\t2\t3\t4\na\t1\t2\t3\t4\n");
        assert!(Budget::parse(&bad).expect_err("twice").contains("has a row"));
    }
}
