//! `info`: every adapter wgpu sees (on the backends and with the name the adapter
//! options or the environment ask for), its features and the limits that matter here.

use super::{AdapterArgs, CliError};
use wgpu_attention::report::{adapter_json, cooperative_matrix};

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(adapter: &AdapterArgs, args: &InfoArgs) -> Result<(), CliError> {
    // The adapters every other command chooses among: `--backend` and `--adapter`, else
    // WGPU_BACKEND and WGPU_ADAPTER_NAME. A filter that matches nothing is bad input
    // (exit 2), naming the filter and the adapters there are. Numbered by position among every adapter on the chosen backends: what
    // `--adapter '#N'` (or `BACKEND:#N`) takes, also when a name filter leaves some out.
    let numbered = adapter.selector()?.numbered_adapters()?;
    let numbers: Vec<String> = numbered.iter().map(|(n, _)| format!("#{n}")).collect();
    let mut all = Vec::new();
    for (_, a) in &numbered {
        all.push(adapter_json(
            &a.get_info(),
            a.features(),
            &a.limits(),
            &cooperative_matrix(a),
        ));
    }
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| CliError::bad(e.to_string()))?
        );
        return Ok(());
    }
    if all.is_empty() {
        outln!("no adapters found (install a GPU driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)");
    }
    for (number, a) in numbers.iter().zip(&all) {
        outln!(
            "{number} {} [{} / {}]",
            a["name"].as_str().unwrap_or("?"),
            a["backend"].as_str().unwrap_or("?"),
            a["device_type"].as_str().unwrap_or("?")
        );
        outln!(
            "  driver: {} {}",
            a["driver"].as_str().unwrap_or(""),
            a["driver_info"].as_str().unwrap_or("")
        );
        outln!(
            "  f16: {}   subgroups: {}   timestamps: {}",
            a["f16"],
            a["subgroup_sizes"]
                .as_array()
                .map_or("no".to_string(), |s| format!("{}..{}", s[0], s[1])),
            a["timestamp_query"]
        );
        for (k, v) in a["limits"].as_object().into_iter().flatten() {
            outln!("  {k}: {v}");
        }
        let coop: Vec<&str> = a["cooperative_matrix"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .collect();
        outln!(
            "  cooperative matrices (tensor cores): {}",
            wgpu_attention::CoopConfig::summary(&coop)
        );
        outln!("  fused tilings:");
        for t in a["fused_tilings"].as_array().into_iter().flatten() {
            let status = match (t["default_for"].as_array(), t["unavailable"].as_str()) {
                (_, Some(why)) => format!("unavailable: {why}"),
                (Some(inputs), _) if !inputs.is_empty() => format!(
                    "default for {}",
                    inputs
                        .iter()
                        .filter_map(|i| i.as_str())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
                _ => "available".into(),
            };
            let line = format!(
                "    {:<10} {status}; {}",
                t["name"].as_str().unwrap_or("?"),
                t["about"].as_str().unwrap_or("")
            );
            outln!("{}", fit(&line));
        }
    }
    Ok(())
}

/// Lines of `info` end at this column; `--json` holds every word.
pub const INFO_WIDTH: usize = 120;

/// `line` cut to [`INFO_WIDTH`] characters, ending in an ellipsis where it was longer.
fn fit(line: &str) -> String {
    if line.chars().count() <= INFO_WIDTH {
        return line.to_string();
    }
    let cut: String = line.chars().take(INFO_WIDTH - 12).collect();
    format!("{} … (--json)", cut.trim_end())
}
