//! `info`: every adapter wgpu sees, its features and the limits that matter here.

use super::{AdapterArgs, CliError};

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(adapter: &AdapterArgs, args: &InfoArgs) -> Result<(), CliError> {
    let adapters = wgpu_attention::enumerate_adapters(adapter.backend.as_deref())?;
    let mut all = Vec::new();
    for a in &adapters {
        let info = a.get_info();
        if let Some(name) = &adapter.adapter {
            if !info.name.to_lowercase().contains(&name.to_lowercase()) {
                continue;
            }
        }
        let mut json = adapter_json(&info, a.features(), &a.limits());
        json["cooperative_matrix"] = cooperative_matrix_json(a);
        all.push(json);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| CliError::bad(e.to_string()))?
        );
        return Ok(());
    }
    if all.is_empty() {
        println!("no adapters found (install a GPU driver, or Mesa's lavapipe: apt-get install mesa-vulkan-drivers)");
    }
    for a in &all {
        println!(
            "{} [{} / {}]",
            a["name"].as_str().unwrap_or("?"),
            a["backend"].as_str().unwrap_or("?"),
            a["device_type"].as_str().unwrap_or("?")
        );
        println!(
            "  driver: {} {}",
            a["driver"].as_str().unwrap_or(""),
            a["driver_info"].as_str().unwrap_or("")
        );
        println!(
            "  f16: {}   subgroups: {}   timestamps: {}",
            a["f16"],
            a["subgroup_sizes"]
                .as_array()
                .map_or("no".to_string(), |s| format!("{}..{}", s[0], s[1])),
            a["timestamp_query"]
        );
        for (k, v) in a["limits"].as_object().into_iter().flatten() {
            println!("  {k}: {v}");
        }
        let coop: Vec<&str> = a["cooperative_matrix"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .collect();
        println!(
            "  cooperative matrices (tensor cores): {}",
            wgpu_attention::CoopConfig::summary(&coop)
        );
        println!("  fused tilings:");
        for t in a["fused_tilings"].as_array().into_iter().flatten() {
            let status = match (t["default"].as_bool(), t["unavailable"].as_str()) {
                (_, Some(why)) => format!("unavailable: {why}"),
                (Some(true), _) => "default".into(),
                _ => "available".into(),
            };
            println!(
                "    {:<10} {status}; {}",
                t["name"].as_str().unwrap_or("?"),
                t["about"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// An adapter's identity, the features this crate cares about and the limits that matter,
/// as printed by `info --json` and recorded in `bench --json` headers.
pub fn adapter_json(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> serde_json::Value {
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
        "fused_tilings": tilings_json(info, features, limits),
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

/// Every registered fused tiling on this adapter: available or why not, and which one
/// the picker takes (the same registry the library reads).
fn tilings_json(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> serde_json::Value {
    use wgpu_attention::kernels::flash::{default_tiling, AdapterClass, FUSED_TILINGS};
    let caps = wgpu_attention::Capabilities::of(info, features, limits);
    let picked = default_tiling(AdapterClass::of(info), &caps);
    FUSED_TILINGS
        .iter()
        .map(|spec| {
            serde_json::json!({
                "name": spec.name,
                "about": spec.about,
                "default": spec.tiling == picked,
                "unavailable": spec.unmet(&info.name, &caps).map(|e| e.to_string()),
            })
        })
        .collect()
}

/// The adapter's cooperative-matrix configurations (`16x16x16 f16->f32`), empty
/// without `EXPERIMENTAL_COOPERATIVE_MATRIX`.
pub fn cooperative_matrix_json(adapter: &wgpu::Adapter) -> serde_json::Value {
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        return serde_json::json!([]);
    }
    adapter
        .cooperative_matrix_properties()
        .iter()
        .map(|p| wgpu_attention::CoopConfig::of(p).label())
        .collect()
}
