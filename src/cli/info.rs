//! `info`: every adapter wgpu sees (on the backends and with the name the adapter
//! options or the environment ask for), its features and the limits that matter here.

use super::{AdapterArgs, CliError};

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(adapter: &AdapterArgs, args: &InfoArgs) -> Result<(), CliError> {
    // The adapters every other command chooses among: `--backend` and `--adapter`, else
    // WGPU_BACKEND and WGPU_ADAPTER_NAME. A filter that matches nothing is bad input
    // (exit 2), naming the filter and the adapters there are.
    let selector = wgpu_attention::AdapterSelector {
        name: adapter.adapter.clone(),
        backend: adapter.backend.clone(),
    }
    .with_env();
    let adapters = selector.adapters()?;
    let mut all = Vec::new();
    for a in &adapters {
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
    for a in &all {
        outln!(
            "{} [{} / {}]",
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
            outln!(
                "    {:<10} {status}; {}",
                t["name"].as_str().unwrap_or("?"),
                t["about"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// An adapter's identity, the features this crate cares about, its cooperative-matrix
/// configurations and the limits that matter, as printed by `info --json` and recorded
/// in `bench --json` headers.
pub fn adapter_json(
    info: &wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    coop: &[wgpu_attention::CoopConfig],
) -> serde_json::Value {
    let subgroups = features
        .contains(wgpu::Features::SUBGROUP)
        .then(|| serde_json::json!([info.subgroup_min_size, info.subgroup_max_size]));
    serde_json::json!({
        "name": info.name,
        "backend": format!("{:?}", info.backend),
        "device_type": format!("{:?}", info.device_type),
        "vendor": format!("0x{:04x}", info.vendor),
        "device": format!("0x{:04x}", info.device),
        "driver": info.driver,
        "driver_info": info.driver_info,
        "f16": features.contains(wgpu::Features::SHADER_F16),
        "subgroup_sizes": subgroups,
        "timestamp_query": features.contains(wgpu::Features::TIMESTAMP_QUERY),
        "timestamp_query_inside_encoders": features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS),
        "cooperative_matrix": coop.iter().map(|c| c.label()).collect::<Vec<_>>(),
        "fused_tilings": tilings_json(info, features, limits, coop),
        "limits": {
            "max_compute_workgroup_storage_size": limits.max_compute_workgroup_storage_size,
            "max_compute_invocations_per_workgroup": limits.max_compute_invocations_per_workgroup,
            "max_compute_workgroups_per_dimension": limits.max_compute_workgroups_per_dimension,
            "max_storage_buffer_binding_size": limits.max_storage_buffer_binding_size,
            "max_storage_buffers_per_shader_stage": limits.max_storage_buffers_per_shader_stage,
            "max_buffer_size": limits.max_buffer_size,
        },
    })
}

/// Every registered fused tiling on this adapter: available or why not, and for which
/// inputs the picker takes it (`f32`: f32 at the default precision; `f16`: f16, or f32
/// at precision medium), from the same registry the library reads.
fn tilings_json(
    info: &wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    coop: &[wgpu_attention::CoopConfig],
) -> serde_json::Value {
    use wgpu_attention::kernels::flash::{default_tiling, AdapterClass, FUSED_TILINGS};
    let mut caps = wgpu_attention::Capabilities::of(info, features, limits);
    caps.cooperative_matrix = coop.to_vec();
    let class = AdapterClass::of(info);
    let picked = [
        ("f32", default_tiling(class, &caps, false)),
        ("f16", default_tiling(class, &caps, true)),
    ];
    FUSED_TILINGS
        .iter()
        .map(|spec| {
            let default_for: Vec<&str> = picked
                .iter()
                .filter(|&&(_, tiling)| tiling == spec.tiling)
                .map(|&(inputs, _)| inputs)
                .collect();
            serde_json::json!({
                "name": spec.name,
                "about": spec.about,
                "default_for": default_for,
                "unavailable": spec.unmet(&info.name, &caps).map(|e| e.to_string()),
            })
        })
        .collect()
}

/// The adapter's cooperative-matrix configurations (`16x16x16 f16->f32`), empty
/// without `EXPERIMENTAL_COOPERATIVE_MATRIX`.
pub fn cooperative_matrix(adapter: &wgpu::Adapter) -> Vec<wgpu_attention::CoopConfig> {
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        return Vec::new();
    }
    adapter
        .cooperative_matrix_properties()
        .iter()
        .map(wgpu_attention::CoopConfig::of)
        .collect()
}
