//! What `check` found, as the table it prints and the files CI reads: JSON
//! (`--json`) and JUnit XML (`--junit`). docs/ci.md describes both.

use serde_json::json;
use wgpu_attention::wgpu::AdapterInfo;

/// How one case ended.
pub enum CaseStatus {
    Ok,
    /// The result was outside the bound (the summary says where and by how much).
    Failed(String),
    /// The call returned an error (a kernel or driver defect: the grid is valid input).
    Error(String),
}

/// One variant on one case of the grid.
pub struct CaseReport {
    pub variant: String,
    pub case: String,
    pub seed: u64,
    pub max_abs_error: Option<f64>,
    pub bound: Option<f64>,
    pub seconds: f64,
    pub status: CaseStatus,
}

/// The width the `check` table keeps to (full detail is in `--json`).
pub const TABLE_WIDTH: usize = 100;

/// Width of the first column, the variant's label (`backward/coop f32 medium` is 24).
pub const LABEL_WIDTH: usize = 24;

/// Where the case column starts: variant, result, max err and bound come first, so a
/// long case description never pushes the numbers out of their columns.
const CASE_COLUMN: usize = LABEL_WIDTH + 1 + 6 + 1 + 9 + 1 + 9 + 2;

/// The table's header line.
pub fn table_header() -> String {
    format!(
        "{:<LABEL_WIDTH$} {:<6} {:>9} {:>9}  case",
        "variant", "result", "max err", "bound"
    )
}

/// `text` broken at spaces (or `+`, which joins masks) into lines of at most `width -
/// indent` characters, every line after the first indented by `indent` spaces.
pub fn wrap(text: &str, indent: usize, width: usize) -> String {
    let room = width.saturating_sub(indent).max(20);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    // Split after each space or '+', keeping the separator with the piece before it.
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        if c == ' ' || c == '+' {
            pieces.push(&text[start..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    pieces.push(&text[start..]);
    for piece in pieces {
        if !line.is_empty() && line.chars().count() + piece.trim_end().chars().count() > room {
            lines.push(std::mem::take(&mut line).trim_end().to_string());
        }
        line.push_str(piece);
    }
    lines.push(line.trim_end().to_string());
    lines.join(&format!("\n{}", " ".repeat(indent)))
}

impl CaseReport {
    /// The row: variant, result, max error, bound, then the case (wrapped under its
    /// column); a failure's reason follows on lines of its own.
    pub fn table_line(&self) -> String {
        let num = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2e}"));
        let (result, why) = match &self.status {
            CaseStatus::Ok => ("ok", None),
            CaseStatus::Failed(why) => ("FAIL", Some(why)),
            CaseStatus::Error(why) => ("ERROR", Some(why)),
        };
        let mut line = format!(
            "{:<LABEL_WIDTH$} {result:<6} {:>9} {:>9}  {}",
            self.variant,
            num(self.max_abs_error),
            num(self.bound),
            wrap(&self.case, CASE_COLUMN, TABLE_WIDTH)
        );
        if let Some(why) = why {
            let detail = format!("seed {}: {why}", self.seed);
            line += &format!("\n    {}", wrap(&detail, 4, TABLE_WIDTH));
        }
        line
    }
}

/// Everything one `check` run found on one adapter.
pub struct Report {
    pub adapter: AdapterInfo,
    pub seed: u64,
    /// Variants the adapter cannot run, with the reason.
    pub skipped: Vec<(String, String)>,
    pub cases: Vec<CaseReport>,
}

impl Report {
    pub fn new(adapter: AdapterInfo, seed: u64) -> Self {
        Report {
            adapter,
            seed,
            skipped: Vec::new(),
            cases: Vec::new(),
        }
    }

    /// Name, backend, type and driver: two lavapipes from different Mesa releases
    /// share a name and differ only in `driver_info`.
    pub fn adapter_line(&self) -> String {
        let a = &self.adapter;
        format!(
            "{} ({:?}, {:?}; driver {} {})",
            a.name, a.backend, a.device_type, a.driver, a.driver_info
        )
    }

    /// The last line of `check`: every case counted, skips included.
    pub fn summary_line(&self) -> String {
        let (passed, failed) = self.counts();
        format!("{passed} passed, {failed} failed, {} skipped", self.skipped.len())
    }

    /// (passed, failed or errored) cases.
    pub fn counts(&self) -> (usize, usize) {
        let passed = self.cases.iter().filter(|c| matches!(c.status, CaseStatus::Ok)).count();
        (passed, self.cases.len() - passed)
    }

    pub fn to_json(&self) -> Vec<u8> {
        let (passed, failed) = self.counts();
        let a = &self.adapter;
        let cases: Vec<_> = self
            .cases
            .iter()
            .map(|c| {
                let (status, message) = match &c.status {
                    CaseStatus::Ok => ("ok", None),
                    CaseStatus::Failed(m) => ("failed", Some(m)),
                    CaseStatus::Error(m) => ("error", Some(m)),
                };
                json!({
                    "variant": c.variant,
                    "case": c.case,
                    "seed": c.seed,
                    "status": status,
                    "max_abs_error": c.max_abs_error,
                    "bound": c.bound,
                    "seconds": c.seconds,
                    "message": message,
                })
            })
            .collect();
        let skipped: Vec<_> = self
            .skipped
            .iter()
            .map(|(variant, reason)| json!({ "variant": variant, "reason": reason }))
            .collect();
        let doc = json!({
            "adapter": {
                "name": a.name,
                "backend": format!("{:?}", a.backend),
                "device_type": format!("{:?}", a.device_type),
                "driver": a.driver,
                "driver_info": a.driver_info,
            },
            "seed": self.seed,
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
            "cases": cases,
        });
        let mut bytes = serde_json::to_vec_pretty(&doc).expect("a JSON value always serialises");
        bytes.push(b'\n');
        bytes
    }

    /// One `<testsuite>` for the adapter; a `<testcase>` per case (class = variant), and
    /// one skipped `<testcase>` per variant the adapter cannot run.
    pub fn to_junit(&self) -> Vec<u8> {
        let errors = self
            .cases
            .iter()
            .filter(|c| matches!(c.status, CaseStatus::Error(_)))
            .count();
        let failures = self
            .cases
            .iter()
            .filter(|c| matches!(c.status, CaseStatus::Failed(_)))
            .count();
        let tests = self.cases.len() + self.skipped.len();
        let seconds: f64 = self.cases.iter().map(|c| c.seconds).sum();
        let suite = xml_escape(&format!("wgpu-attention check on {}", self.adapter_line()));
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        x += &format!(
            "<testsuites name=\"wgpu-attention check\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{}\" time=\"{seconds:.3}\">\n",
            self.skipped.len()
        );
        x += &format!(
            "  <testsuite name=\"{suite}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{}\" time=\"{seconds:.3}\">\n",
            self.skipped.len()
        );
        x += &format!(
            "    <properties><property name=\"seed\" value=\"{}\"/></properties>\n",
            self.seed
        );
        for c in &self.cases {
            let head = format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                xml_escape(&c.variant),
                xml_escape(&c.case),
                c.seconds
            );
            x += &match &c.status {
                CaseStatus::Ok => format!("{head}/>\n"),
                CaseStatus::Failed(m) => format!(
                    "{head}>\n      <failure message=\"{}\">seed {}</failure>\n    </testcase>\n",
                    xml_escape(m),
                    c.seed
                ),
                CaseStatus::Error(m) => format!(
                    "{head}>\n      <error message=\"{}\">seed {}</error>\n    </testcase>\n",
                    xml_escape(m),
                    c.seed
                ),
            };
        }
        for (variant, reason) in &self.skipped {
            x += &format!(
                "    <testcase classname=\"{}\" name=\"every case\" time=\"0\">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                xml_escape(variant),
                xml_escape(reason)
            );
        }
        x += "  </testsuite>\n</testsuites>\n";
        x.into_bytes()
    }
}

/// Escapes text for an XML attribute or element; drops characters XML 1.0 cannot hold.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(' '),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        let info = AdapterInfo::new(
            wgpu_attention::wgpu::DeviceType::Cpu,
            wgpu_attention::wgpu::Backend::Vulkan,
        );
        let mut r = Report::new(info, 7);
        r.adapter.name = "llvmpipe <LLVM & co>".into();
        r.skipped
            .push(("fused/coop f16".into(), "needs \"tensor cores\"".into()));
        for (i, status) in [
            CaseStatus::Ok,
            CaseStatus::Failed("max abs err 1e-2 > 1e-5".into()),
            CaseStatus::Error("the device\nwas lost".into()),
        ]
        .into_iter()
        .enumerate()
        {
            r.cases.push(CaseReport {
                variant: "fused/subgroup f32".into(),
                case: format!("B1 case {i}"),
                seed: 40 + i as u64,
                max_abs_error: (i < 2).then_some(1e-3),
                bound: (i < 2).then_some(1e-5),
                seconds: 0.5,
                status,
            });
        }
        r
    }

    #[test]
    fn table_lines_keep_their_columns_within_the_width() {
        let long =
            "B1 Hq2 Hkv2 Lq17 Lk31 D111 Dv111 Bshd causal BottomRight+key-lengths+bool-mask+window 4,4+softcap 1.22";
        let mut r = sample();
        r.cases[1].case = long.into();
        r.cases[1].status = CaseStatus::Failed(format!("max abs err 1e-2 > 1e-5 at {}", "x ".repeat(80)));
        for case in &r.cases {
            let text = case.table_line();
            for line in text.lines() {
                assert!(
                    line.chars().count() <= TABLE_WIDTH,
                    "{} chars: {line}",
                    line.chars().count()
                );
            }
            // The numbers sit in their columns whatever the case's length.
            let first = text.lines().next().expect("a line");
            assert_eq!(&first[..LABEL_WIDTH], format!("{:<LABEL_WIDTH$}", case.variant));
            let result = match case.status {
                CaseStatus::Ok => "ok    ",
                CaseStatus::Failed(_) => "FAIL  ",
                CaseStatus::Error(_) => "ERROR ",
            };
            assert_eq!(&first[LABEL_WIDTH + 1..LABEL_WIDTH + 7], result, "{first}");
        }
        let failed = r.cases[1].table_line();
        // Nothing of the case or the reason is lost by wrapping (which breaks lines at
        // spaces and after '+').
        let squeezed: String = failed.split_whitespace().collect();
        assert!(squeezed.contains("window4,4+softcap1.22"), "{failed}");
        assert!(squeezed.contains(&"x".repeat(80)), "{failed}");
        assert!(failed.lines().count() >= 3, "{failed}");
        assert!(table_header().chars().count() <= TABLE_WIDTH);
    }

    #[test]
    fn the_summary_counts_skips_too() {
        assert_eq!(sample().summary_line(), "1 passed, 2 failed, 1 skipped");
    }

    #[test]
    fn json_counts_every_case_and_skip() {
        let r = sample();
        assert_eq!(r.counts(), (1, 2));
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).expect("valid JSON");
        assert_eq!(v["passed"], 1);
        assert_eq!(v["failed"], 2);
        assert_eq!(v["seed"], 7);
        assert_eq!(v["cases"].as_array().expect("cases").len(), 3);
        assert_eq!(v["cases"][1]["status"], "failed");
        assert_eq!(v["cases"][2]["status"], "error");
        assert_eq!(v["cases"][2]["max_abs_error"], serde_json::Value::Null);
        assert_eq!(v["skipped"][0]["variant"], "fused/coop f16");
        assert_eq!(v["adapter"]["name"], "llvmpipe <LLVM & co>");
    }

    #[test]
    fn junit_is_escaped_and_counts_match() {
        let x = String::from_utf8(sample().to_junit()).expect("UTF-8");
        assert!(x.contains(r#"tests="4" failures="1" errors="1" skipped="1""#), "{x}");
        assert!(x.contains("llvmpipe &lt;LLVM &amp; co&gt;"), "{x}");
        assert!(
            x.contains(r#"<skipped message="needs &quot;tensor cores&quot;"/>"#),
            "{x}"
        );
        assert!(x.contains("the device&#10;was lost"), "{x}");
        assert_eq!(x.matches("<testcase ").count(), 4);
        assert_eq!(x.matches("</testcase>").count() + 1, 4, "one self-closed ok case");
        assert!(!x.contains("LLVM & co"), "raw ampersand leaked: {x}");
    }

    #[test]
    fn xml_escape_drops_control_characters() {
        assert_eq!(xml_escape("a\u{1}b\tc"), "ab c");
    }
}
