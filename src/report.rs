//! Adapter reports as JSON (`info --json`, `bench --json` headers, Python's
//! `Context.info`): one builder, so every front end reports the same fields.

/// An adapter's identity, the features this crate cares about, its cooperative-matrix
/// configurations and the limits that matter, as printed by `info --json` and recorded
/// in `bench --json` headers.
pub fn adapter_json(
    info: &wgpu::AdapterInfo,
    features: wgpu::Features,
    limits: &wgpu::Limits,
    coop: &[crate::CoopConfig],
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
    coop: &[crate::CoopConfig],
) -> serde_json::Value {
    use crate::kernels::flash::{default_tiling, AdapterClass, FUSED_TILINGS};
    let mut caps = crate::Capabilities::of(info, features, limits);
    caps.cooperative_matrix = coop.to_vec();
    let class = AdapterClass::of(info);
    // f16 inputs (and f32 at precision medium) only where the adapter has f16.
    let mut picked = vec![("f32", default_tiling(class, &caps, false))];
    if caps.f16 {
        picked.push(("f16", default_tiling(class, &caps, true)));
    }
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
pub fn cooperative_matrix(adapter: &wgpu::Adapter) -> Vec<crate::CoopConfig> {
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        return Vec::new();
    }
    adapter
        .cooperative_matrix_properties()
        .iter()
        .map(crate::CoopConfig::of)
        .collect()
}
