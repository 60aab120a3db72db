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

impl CaseReport {
    pub fn table_line(&self) -> String {
        let num = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2e}"));
        let result = match &self.status {
            CaseStatus::Ok => "ok".to_string(),
            CaseStatus::Failed(why) => format!("FAIL (seed {}): {why}", self.seed),
            CaseStatus::Error(why) => format!("ERROR (seed {}): {why}", self.seed),
        };
        format!(
            "{:<20} {:<58} {:>10} {:>10}  {result}",
            self.variant,
            self.case,
            num(self.max_abs_error),
            num(self.bound)
        )
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
