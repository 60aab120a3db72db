//! The SPIR-V wgpu-hal 30 writes for this crate's pipelines, reproduced outside wgpu so
//! that a Vulkan driver's compiler can be asked what it made of it (`isa`) and so that
//! `spirv-val` can judge it (`tests/shader_validation.rs`). One function, both users.

use naga::back::spv::{Capability, DebugInfo, Options, SourceLanguage, WriterFlags, ZeroInitializeWorkgroupMemoryMode};
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};

pub use crate::gpu::RuntimeChecks;

/// The naga SPIR-V options wgpu-hal 30 (`vulkan/adapter.rs`, `naga_options`) uses on a
/// Vulkan 1.3 device with the features a shader needs, as `device.rs`'s
/// `compile_stage` adjusts them for our pipelines (no zeroed workgroup memory): SPIR-V
/// 1.6, the capabilities Vulkan always has plus subgroups, f16 and cooperative matrices
/// (with the Vulkan memory model) where the shader uses them, bounds checks on indices,
/// on buffers unless the device has `robustBufferAccess2` and on image loads unless it
/// has robust image access (`robust`), all off where `checks` drops them, the loop
/// counter as `checks` says, and the `DEBUG` flag with the source attached as a debug build or
/// `InstanceFlags::DEBUG` gives. Every binding keeps its number, as in the pipeline
/// layout's binding map that wgpu-hal passes.
pub fn hal_options<'a>(
    module: &naga::Module,
    source: &'a str,
    checks: RuntimeChecks,
    robust: Robustness,
    debug: bool,
) -> Options<'a> {
    let mut capabilities = vec![
        Capability::Shader,
        Capability::Matrix,
        Capability::Sampled1D,
        Capability::Image1D,
        Capability::ImageQuery,
        Capability::DerivativeControl,
        Capability::StorageImageExtendedFormats,
        Capability::SampledCubeArray,
        Capability::SampleRateShading,
    ];
    if source.contains("subgroup") {
        capabilities.extend([
            Capability::GroupNonUniform,
            Capability::GroupNonUniformVote,
            Capability::GroupNonUniformArithmetic,
            Capability::GroupNonUniformBallot,
            Capability::GroupNonUniformShuffle,
            Capability::GroupNonUniformShuffleRelative,
            Capability::GroupNonUniformQuad,
        ]);
    }
    if source.contains("enable f16;") {
        capabilities.push(Capability::Float16);
    }
    if source.contains("enable wgpu_cooperative_matrix;") {
        capabilities.extend([Capability::CooperativeMatrixKHR, Capability::VulkanMemoryModel]);
    }
    // wgpu-hal's naga_options (adapter.rs), and compile_stage: without bounds checks
    // every policy is Unchecked.
    let policy = |checked: bool| {
        if checked {
            BoundsCheckPolicy::Restrict
        } else {
            BoundsCheckPolicy::Unchecked
        }
    };
    let index = policy(checks.bounds_checks);
    let buffers = policy(checks.bounds_checks && !robust.buffers);
    let images = policy(checks.bounds_checks && !robust.images);
    let mut flags = WriterFlags::LABEL_VARYINGS | WriterFlags::FORCE_POINT_SIZE;
    flags.set(WriterFlags::DEBUG, debug);
    Options {
        lang_version: (1, 6),
        flags,
        capabilities: Some(capabilities.into_iter().collect()),
        bounds_check_policies: BoundsCheckPolicies {
            index,
            buffer: buffers,
            image_load: images,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: checks.loop_bounding,
        ray_query_initialization_tracking: true,
        use_storage_input_output_16: source.contains("enable f16;"),
        fake_missing_bindings: false,
        binding_map: module
            .global_variables
            .iter()
            .filter_map(|(_, g)| g.binding)
            .map(|b| {
                let info = naga::back::spv::BindingInfo {
                    descriptor_set: b.group,
                    binding: b.binding,
                    binding_array_size: None,
                };
                (b, info)
            })
            .collect(),
        debug_info: debug.then_some(DebugInfo {
            source_code: source,
            file_name: "shader",
            language: SourceLanguage::WGSL,
        }),
        task_dispatch_limits: None,
        mesh_shader_primitive_indices_clamp: true,
        trace_ray_argument_validation: true,
        emit_int_div_checks: true,
    }
}

/// What the device guarantees of out-of-bounds accesses, which decides the checks
/// wgpu-hal writes: none on buffers where it has `robustBufferAccess2`
/// (`VK_EXT_robustness2`), none on image loads where it has robust image access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Robustness {
    pub buffers: bool,
    pub images: bool,
}

/// A module ready for a driver: its SPIR-V words and the descriptor bindings its
/// pipeline layout needs.
pub struct Spirv {
    pub words: Vec<u32>,
    pub bindings: Vec<Binding>,
}

/// One descriptor binding of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub group: u32,
    pub binding: u32,
    pub kind: BindingKind,
}

/// What a binding holds, as Vulkan's descriptor types tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    StorageBuffer,
    UniformBuffer,
    SampledImage,
    StorageImage,
    Sampler,
}

/// Parses, validates, fixes the overrides of and writes one entry point of a WGSL
/// source as wgpu-hal would for a device with `robust`, with `checks`
/// (and names for debuggers where `debug`: what `InstanceFlags::DEBUG` gives).
pub fn write(
    source: &str,
    entry: &str,
    constants: &[(&str, f64)],
    checks: RuntimeChecks,
    robust: Robustness,
    debug: bool,
) -> Result<Spirv, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let constants: naga::back::PipelineConstants = constants.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, entry)),
        &constants,
    )
    .map_err(|e| format!("overrides {constants:?}: {e}"))?;
    let options = hal_options(&module, source, checks, robust, debug);
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.into(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())?;
    Ok(Spirv {
        words,
        bindings: bindings(&module),
    })
}

/// The descriptor bindings a module declares (a layout may hold more than an entry
/// point uses).
pub fn bindings(module: &naga::Module) -> Vec<Binding> {
    module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let b = g.binding?;
            let kind = match g.space {
                naga::AddressSpace::Storage { .. } => BindingKind::StorageBuffer,
                naga::AddressSpace::Uniform => BindingKind::UniformBuffer,
                naga::AddressSpace::Handle => match &module.types[g.ty].inner {
                    naga::TypeInner::Image {
                        class: naga::ImageClass::Storage { .. },
                        ..
                    } => BindingKind::StorageImage,
                    naga::TypeInner::Image { .. } => BindingKind::SampledImage,
                    naga::TypeInner::Sampler { .. } => BindingKind::Sampler,
                    _ => return None,
                },
                _ => return None,
            };
            Some(Binding {
                group: b.group,
                binding: b.binding,
                kind,
            })
        })
        .collect()
}

/// Whether a module written with `debug` carries wgpu-hal's loop counter: naga names
/// the variable it adds to every loop `loop_bound` (in `OpName`, written only with
/// debug names).
pub fn has_loop_bound(words: &[u32]) -> bool {
    let bytes: &[u8] = bytemuck::cast_slice(words);
    bytes.windows(b"loop_bound".len()).any(|w| w == b"loop_bound")
}
