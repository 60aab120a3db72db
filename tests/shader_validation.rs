//! Every shader variant parses and validates with naga, and the uniform block's WGSL
//! layout matches the Rust struct. Needs no GPU.

use wgpu_attention::kernels::{every_kernel, shader_source, AttentionParams};
use wgpu_attention::DType;

fn validate(source: &str) -> Result<naga::Module, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok(module)
}

#[test]
fn every_kernel_validates_in_f32_and_f16() {
    for kernel in every_kernel() {
        for dtype in [DType::F32, DType::F16] {
            let source = shader_source(&kernel, dtype);
            let module = validate(&source).unwrap_or_else(|e| panic!("{} ({dtype:?}):\n{e}", kernel.file));
            assert!(
                module.entry_points.iter().any(|ep| ep.name == kernel.entry),
                "{} has no entry point {}",
                kernel.file,
                kernel.entry
            );
        }
    }
}

#[test]
fn every_kernel_writes_spirv_under_both_bounds_check_policies() {
    // Validation alone misses naga SPIR-V writer failures, such as the cooperative-matrix
    // trap (an index inside coopLoad's pointer argument: "Expression [N] is not cached").
    for kernel in every_kernel() {
        for dtype in [DType::F32, DType::F16] {
            let source = shader_source(&kernel, dtype);
            let module = naga::front::wgsl::parse_str(&source).expect("parses");
            let info =
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                    .validate(&module)
                    .expect("validates");
            // Overrides take their defaults, as wgpu resolves them before writing SPIR-V,
            // and every other set of values the host passes (the subgroup decode
            // design's 16-byte reads, KV_WIDE = 1).
            for constants in override_sets(&kernel, dtype) {
                let (module, info) = naga::back::pipeline_constants::process_overrides(
                    &module,
                    &info,
                    Some((naga::ShaderStage::Compute, kernel.entry)),
                    &constants,
                )
                .unwrap_or_else(|e| panic!("{}: overrides {constants:?}: {e}", kernel.file));
                write_spirv(&kernel, dtype, &module, &info);
            }
        }
    }
}

/// The override values a kernel is compiled with besides its defaults.
fn override_sets(kernel: &wgpu_attention::kernels::Kernel, dtype: DType) -> Vec<naga::back::PipelineConstants> {
    use wgpu_attention::kernels::decode::{DecodeDesign, SUBGROUP_SPLIT_VARIANTS, SUBGROUP_TEXEL_SPLIT_VARIANTS};
    let mut sets = vec![naga::back::PipelineConstants::default()];
    let subgroup_design = SUBGROUP_SPLIT_VARIANTS.iter().chain(&SUBGROUP_TEXEL_SPLIT_VARIANTS);
    if subgroup_design.into_iter().any(|v| v.kernel == *kernel) {
        let wide = wgpu_attention::AttentionShape::new(1, 8, 2, 1, 64, 128, 128);
        // Mesa 22's two key loops and the one loop of other drivers.
        for mesa in [Some((22, 3)), None] {
            let constants = DecodeDesign::Subgroup.constants(mesa, &wide, dtype);
            assert!(constants.contains(&("KV_WIDE", 1)), "{constants:?}");
            sets.push(constants.iter().map(|&(n, v)| (n.to_string(), f64::from(v))).collect());
        }
    }
    if kernel.file == "flash_texel.wgsl" {
        // Key ranges only (the rules' loop compiled out), on a grid of narrow textures.
        let constants = [
            ("FULL_RULES", 0.0),
            ("PAGED", 0.0),
            ("KV_TEXEL_SHIFT", 10.0),
            ("KV_TEXEL_ROWS", 256.0),
        ];
        sets.push(constants.iter().map(|&(n, v)| (n.to_string(), v)).collect());
    }
    if kernel.file == "matmul_texture.wgsl" {
        // One row group, for layers of at most 8 rows (the default is two).
        let one_group = wgpu_attention::kernels::matmul::texture_row_groups(8);
        assert_eq!(one_group, 1);
        sets.push([("ROW_GROUPS".to_string(), f64::from(one_group))].into_iter().collect());
    }
    sets
}

fn write_spirv(
    kernel: &wgpu_attention::kernels::Kernel,
    dtype: DType,
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
) {
    use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
    for policy in [BoundsCheckPolicy::Restrict, BoundsCheckPolicy::Unchecked] {
        let options = naga::back::spv::Options {
            bounds_check_policies: BoundsCheckPolicies {
                index: policy,
                buffer: policy,
                image_load: policy,
                binding_array: policy,
            },
            ..Default::default()
        };
        let entry = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: kernel.entry.into(),
        };
        let words = naga::back::spv::write_vec(module, info, &options, Some(&entry))
            .unwrap_or_else(|e| panic!("{}:{} ({dtype:?}, {policy:?}): {e}", kernel.file, kernel.entry));
        assert!(words.len() > 5, "{}: empty SPIR-V", kernel.file);
    }
}

#[test]
fn uniform_layout_matches_rust() {
    let source = shader_source(&wgpu_attention::kernels::flash::REGISTERS, DType::F32);
    let module = validate(&source).expect("valid shader");
    let (_, ty) = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some("Params"))
        .expect("struct Params in attention_common.wgsl");
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("Params is not a struct");
    };
    assert_eq!(*span as usize, std::mem::size_of::<AttentionParams>(), "struct size");
    use std::mem::offset_of;
    let rust: Vec<(&str, usize)> = vec![
        ("batch", offset_of!(AttentionParams, batch)),
        ("heads_q", offset_of!(AttentionParams, heads_q)),
        ("heads_kv", offset_of!(AttentionParams, heads_kv)),
        ("len_q", offset_of!(AttentionParams, len_q)),
        ("len_k", offset_of!(AttentionParams, len_k)),
        ("head_dim", offset_of!(AttentionParams, head_dim)),
        ("head_dim_v", offset_of!(AttentionParams, head_dim_v)),
        ("scale", offset_of!(AttentionParams, scale)),
        ("q_stride_b", offset_of!(AttentionParams, q_stride_b)),
        ("q_stride_h", offset_of!(AttentionParams, q_stride_h)),
        ("q_stride_s", offset_of!(AttentionParams, q_stride_s)),
        ("has_right", offset_of!(AttentionParams, has_right)),
        ("k_stride_b", offset_of!(AttentionParams, k_stride_b)),
        ("k_stride_h", offset_of!(AttentionParams, k_stride_h)),
        ("k_stride_s", offset_of!(AttentionParams, k_stride_s)),
        ("pos_offset", offset_of!(AttentionParams, pos_offset)),
        ("v_stride_b", offset_of!(AttentionParams, v_stride_b)),
        ("v_stride_h", offset_of!(AttentionParams, v_stride_h)),
        ("v_stride_s", offset_of!(AttentionParams, v_stride_s)),
        ("has_key_lengths", offset_of!(AttentionParams, has_key_lengths)),
        ("o_stride_b", offset_of!(AttentionParams, o_stride_b)),
        ("o_stride_h", offset_of!(AttentionParams, o_stride_h)),
        ("o_stride_s", offset_of!(AttentionParams, o_stride_s)),
        ("mask_kind", offset_of!(AttentionParams, mask_kind)),
        ("m_stride_b", offset_of!(AttentionParams, m_stride_b)),
        ("m_stride_h", offset_of!(AttentionParams, m_stride_h)),
        ("m_stride_q", offset_of!(AttentionParams, m_stride_q)),
        ("m_stride_k", offset_of!(AttentionParams, m_stride_k)),
        ("bh_start", offset_of!(AttentionParams, bh_start)),
        ("bh_count", offset_of!(AttentionParams, bh_count)),
        ("key_begin", offset_of!(AttentionParams, key_begin)),
        ("key_stop", offset_of!(AttentionParams, key_stop)),
        ("splits", offset_of!(AttentionParams, splits)),
        ("right", offset_of!(AttentionParams, right)),
        ("has_left", offset_of!(AttentionParams, has_left)),
        ("left", offset_of!(AttentionParams, left)),
        ("softcap", offset_of!(AttentionParams, softcap)),
        ("has_alibi", offset_of!(AttentionParams, has_alibi)),
        ("align_to_lengths", offset_of!(AttentionParams, align_to_lengths)),
        ("page_size", offset_of!(AttentionParams, page_size)),
        ("table_offset", offset_of!(AttentionParams, table_offset)),
        ("table_stride", offset_of!(AttentionParams, table_stride)),
        ("k_page_stride", offset_of!(AttentionParams, k_page_stride)),
        ("v_page_stride", offset_of!(AttentionParams, v_page_stride)),
    ];
    let wgsl: Vec<(&str, usize)> = members
        .iter()
        .map(|m| (m.name.as_deref().unwrap_or("?"), m.offset as usize))
        .collect();
    assert_eq!(wgsl, rust, "WGSL Params members (name, offset) vs Rust AttentionParams");
}

#[test]
fn mask_kind_constants_match() {
    let source = shader_source(&wgpu_attention::kernels::flash::REGISTERS, DType::F32);
    for (name, value) in [
        ("MASK_NONE", wgpu_attention::kernels::params::MASK_NONE),
        ("MASK_BOOL", wgpu_attention::kernels::params::MASK_BOOL),
        ("MASK_ADDITIVE", wgpu_attention::kernels::params::MASK_ADDITIVE),
    ] {
        let line = format!("const {name}: u32 = {value}u;");
        assert!(source.contains(&line), "WGSL lacks `{line}`");
    }
}

#[test]
fn kernel_slots_are_exactly_the_bindings_each_entry_point_uses() {
    for kernel in every_kernel().into_iter().filter(|k| !k.slots.is_empty()) {
        let source = shader_source(&kernel, DType::F32);
        let module = validate(&source).expect("valid shader");
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .expect("valid shader");
        let (index, _) = module
            .entry_points
            .iter()
            .enumerate()
            .find(|(_, e)| e.name == kernel.entry)
            .expect("entry point exists");
        let uses = info.get_entry_point(index);
        let mut used: Vec<String> = module
            .global_variables
            .iter()
            .filter(|(h, g)| g.binding.is_some() && !uses[*h].is_empty())
            .map(|(_, g)| g.name.clone().unwrap_or_default())
            .collect();
        let mut declared: Vec<String> = kernel.slots.iter().map(|s| s.wgsl_name().to_string()).collect();
        used.sort();
        declared.sort();
        assert_eq!(used, declared, "{}:{} bindings", kernel.file, kernel.entry);
    }
}

/// (name, offset) of each member of WGSL struct `name` in a kernel's source, and its size.
fn wgsl_struct(kernel: &wgpu_attention::kernels::Kernel, name: &str) -> (Vec<(String, usize)>, usize) {
    let module = validate(&shader_source(kernel, DType::F32)).expect("valid shader");
    let (_, ty) = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("struct {name} in {}", kernel.file));
    let naga::TypeInner::Struct { members, span } = &ty.inner else {
        panic!("{name} is not a struct");
    };
    let members = members
        .iter()
        .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
        .collect();
    (members, *span as usize)
}

#[test]
fn linear_and_packing_uniforms_match_rust() {
    use std::mem::{offset_of, size_of};
    use wgpu_attention::kernels::matmul::{LinearParams, TEXTURE, TILED};
    use wgpu_attention::kernels::pack_rows::{PackParams, KERNEL as PACK};
    let linear = [
        ("m", offset_of!(LinearParams, m)),
        ("n", offset_of!(LinearParams, n)),
        ("k", offset_of!(LinearParams, k)),
        ("has_bias", offset_of!(LinearParams, has_bias)),
        ("seg1", offset_of!(LinearParams, seg1)),
        ("seg2", offset_of!(LinearParams, seg2)),
        ("w_row0", offset_of!(LinearParams, w_row0)),
        ("x_stride", offset_of!(LinearParams, x_stride)),
        ("x_layer_rows", offset_of!(LinearParams, x_layer_rows)),
        ("w_layer_rows", offset_of!(LinearParams, w_layer_rows)),
        ("w_texture_row0", offset_of!(LinearParams, w_texture_row0)),
        ("pad0", offset_of!(LinearParams, pad0)),
    ];
    let linear: Vec<(String, usize)> = linear.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    for kernel in [TILED, TEXTURE] {
        assert_eq!(
            wgsl_struct(&kernel, "LinearParams"),
            (linear.clone(), size_of::<LinearParams>()),
            "{}",
            kernel.file
        );
    }
    let pack = [
        ("rows", offset_of!(PackParams, rows)),
        ("cols", offset_of!(PackParams, cols)),
        ("stride", offset_of!(PackParams, stride)),
        ("row0", offset_of!(PackParams, row0)),
        ("layer_rows", offset_of!(PackParams, layer_rows)),
    ];
    let (wgsl, size) = wgsl_struct(&PACK, "PackParams");
    assert_eq!(size, size_of::<PackParams>(), "PackParams size");
    let named: Vec<(String, usize)> = pack.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    assert_eq!(wgsl[..named.len()], named[..], "PackParams members before the padding");
}

/// Bytes of workgroup memory a kernel's WGSL declares.
fn declared_workgroup_bytes(kernel: &wgpu_attention::kernels::Kernel) -> u32 {
    let source = shader_source(kernel, DType::F32);
    let module = validate(&source).expect("valid shader");
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).expect("layout");
    module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| layouter[g.ty].size)
        .sum()
}

#[test]
fn subgroup_variants_fit_the_workgroup_memory_the_tiling_declares() {
    // The subgroup tiling's need is one figure for all its variants (the picker checks
    // it); no variant may declare more, or it would fail on an adapter that meets it.
    use wgpu_attention::kernels::flash::{SUBGROUP_128, SUBGROUP_256, SUBGROUP_64, SUBGROUP_WORKGROUP_BYTES};
    let declared: Vec<u32> = [SUBGROUP_64, SUBGROUP_128, SUBGROUP_256]
        .iter()
        .map(declared_workgroup_bytes)
        .collect();
    assert!(declared.iter().all(|&b| b <= SUBGROUP_WORKGROUP_BYTES), "{declared:?}");
    assert_eq!(declared.iter().max(), Some(&SUBGROUP_WORKGROUP_BYTES), "{declared:?}");
}

#[test]
fn block_variants_declare_the_workgroup_memory_the_host_budgets() {
    // The host picks a variant by BlockVariant::workgroup_bytes; it must be what the
    // WGSL declares, or a variant could exceed the adapter's limit.
    use wgpu_attention::kernels::flash::{BLOCKED_VARIANTS, COOP_VARIANTS};
    for variant in BLOCKED_VARIANTS.into_iter().chain(COOP_VARIANTS) {
        let declared = declared_workgroup_bytes(&variant.kernel);
        assert_eq!(
            declared, variant.workgroup_bytes,
            "{} {}",
            variant.kernel.file, variant.kernel.variant
        );
    }
}
