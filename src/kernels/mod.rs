//! WGSL kernels: one module per kernel (its pipeline and dispatch), the shared uniform
//! block, and the machinery to assemble, compile and cache shader variants.
//!
//! A kernel's source is a generated header (`enable f16;`, `alias elem = ...;`, and
//! `ELEMS_PER_WORD`, the elements a u32 word holds)
//! followed by the kernel's preludes (`shaders/attention_common.wgsl`, and for the fused
//! kernels `shaders/flash_common.wgsl`) and the kernel's own file. Everything
//! else is specialised with WGSL `override` constants.

pub mod backward_blocked;
pub mod backward_coop;
pub mod backward_passes;
pub(crate) mod backward_plan;
pub mod coop_emulation;
pub mod copy_probe;
pub mod decode;
pub mod flash;
pub mod flash_texel;
pub mod gemm;
pub mod kv_append;
pub mod kv_dequantize;
pub mod kv_texels;
pub mod layer_norm;
pub mod layer_norm_backward;
pub mod loop_budget;
pub mod loop_probe;
pub mod matmul;
pub mod mean_heads;
pub mod merge;
pub mod pack_rows;
pub mod page_table;
pub mod params;
pub mod policy;
pub(crate) mod qk_scores;
pub mod rotary;
pub(crate) mod softmax_rows;
pub mod tune;
pub mod unroll;
pub(crate) mod weights_v;

use crate::error::{Error, Result};
use crate::gpu::{CompiledPipeline, Gpu, PipelineKey};
use crate::tensor::DType;

pub use crate::gpu::Text;
pub use params::AttentionParams;

const COMMON: &str = include_str!("../../shaders/attention_common.wgsl");
/// The 4-rows-per-invocation subgroup helpers (quads, broadcast products, column loads,
/// row-oriented masks) of the CPU-adapter subgroup kernels, forward and backward.
const SUBGROUP_QUADS: &str = include_str!("../../shaders/subgroup_quads.wgsl");
/// The tensor-core kernels' 16-byte staging (`flash_coop.wgsl`, `flash_backward_coop.wgsl`).
const COOP_STAGING: &str = include_str!("../../shaders/coop_staging.wgsl");
/// The rotation rule of rotary embeddings (`rotary.wgsl`, `kv_append.wgsl`).
pub(crate) const ROTARY_COMMON: &str = include_str!("../../shaders/rotary_common.wgsl");

/// One WGSL file and the entry point used from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// File name under `shaders/`.
    pub file: &'static str,
    /// The file's text, or the text generated from it for a variant (unrolled, with the
    /// variant's constants first).
    pub source: Text,
    pub entry: &'static str,
    /// The bindings of `attention_common.wgsl` the entry point uses (a test checks
    /// this against naga's analysis; auto layouts contain exactly these).
    pub slots: &'static [Slot],
    /// Shared WGSL files prepended to `source`, in order.
    pub preludes: &'static [&'static str],
    /// Tells apart kernels built from the same file and entry point with different
    /// preludes or generated text (part of the pipeline cache key); empty for most.
    pub variant: Text,
}

/// Prelude of the attention kernels: uniform block, bindings, masking rules.
pub const ATTENTION_PRELUDE: &[&str] = &[COMMON];
/// Prelude of the backward kernels: the attention prelude plus the gradient bindings
/// and the helpers both backward tilings share.
pub const BACKWARD_PRELUDE: &[&str] = &[COMMON, BACKWARD_COMMON];
pub(crate) const BACKWARD_COMMON: &str = include_str!("../../shaders/backward_common.wgsl");
/// Texel mirrors' bindings and word fetches, for the generated texel kernel
/// (`flash_texel`).
pub(crate) const TEXEL_WORDS: &str = include_str!("../../shaders/texel_words.wgsl");
/// Preludes of `flash_backward_subgroup.wgsl` by the largest head dim it holds: at 64
/// the accumulators and the owned input rows fit 32 KiB of workgroup memory (4
/// arrays), at 128 only the accumulators (2).
pub const BACKWARD_SUBGROUP_64: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    SUBGROUP_QUADS,
    "const MAX_DIM: u32 = 64u;\nconst ARRAYS: u32 = 4u;\n",
];
pub const BACKWARD_SUBGROUP_128: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    SUBGROUP_QUADS,
    "const MAX_DIM: u32 = 128u;\nconst ARRAYS: u32 = 2u;\n",
];
const FLASH_COMMON: &str = include_str!("../../shaders/flash_common.wgsl");
/// The layout of rows over lanes (`row_lanes.wgsl`), after the constants and the
/// `row_sum_lanes` that one of the row preludes below gives it.
const ROW_LANES: &str = include_str!("../../shaders/row_lanes.wgsl");
/// One lane per row, its loops to the run-time head dims (up to 256): CPU adapters,
/// and GPUs without subgroups (where a GPU keeps the row's arrays in scratch memory).
const RUN_TIME_ROW: &str = "const ROW_VEC4: u32 = 64u;\nconst FIXED_ROW: bool = false;\nconst ROW_LANES: u32 = 1u;\n";
/// One lane per row: the row's sums are the lane's own (no workgroup memory for them:
/// `LANE_SLOTS` 0).
const SUM_OF_ONE_LANE: &str =
    "const LANE_SLOTS: u32 = 0u;\nfn row_sum_lanes(x: vec4<f32>) -> vec4<f32> {\n    return x;\n}\n";
/// A row split over ROW_LANES consecutive lanes (a power of two no larger than the
/// subgroup): the sum of the lanes' partial sums, by a butterfly of subgroup shuffles
/// that leaves every lane with the same sum (a + b = b + a in floating point, so the
/// row's lanes agree on whatever they compute from it).
const SUM_OVER_LANES: &str = "const LANE_SLOTS: u32 = 0u;
fn row_sum_lanes(x: vec4<f32>) -> vec4<f32> {
    var s = x;
    for (var m = 1u; m < ROW_LANES; m *= 2u) {
        s += subgroupShuffleXor(s, m);
    }
    return s;
}
";
/// A row split over ROW_LANES consecutive lanes on a GPU without subgroups (WebGPU
/// without the `subgroups` feature, GL): each lane's partial sum through workgroup
/// memory, one slot per invocation (`LANE_SLOTS`, from the class's prelude, at least
/// the workgroup's invocations), then every lane of the row adds its row's slots in
/// lane order (the same sum on every lane). Two barriers: the slots are free again,
/// then written. Called in uniform control flow only (the kernels' walks have bounds
/// from the workgroup id and the parameters alone).
const SUM_IN_WORKGROUP: &str = "var<workgroup> lane_sums: array<vec4<f32>, LANE_SLOTS>;
fn row_sum_lanes(x: vec4<f32>) -> vec4<f32> {
    workgroupBarrier();
    lane_sums[lane_slot] = x;
    workgroupBarrier();
    let first = lane_slot - lane;
    var s = lane_sums[first];
    for (var l = 1u; l < ROW_LANES; l++) {
        s += lane_sums[first + l];
    }
    return s;
}
";
/// Prelude of the one-row-per-invocation fused kernels (`registers`, `shared`): the
/// attention prelude plus the online-softmax row state, its loops over the run-time head
/// dims (up to 256).
pub const FLASH_PRELUDE: &[&str] = &[COMMON, RUN_TIME_ROW, SUM_OF_ONE_LANE, ROW_LANES, FLASH_COMMON];
/// The same for head dims up to 64, its row loops of a constant 16 vec4s: the compiler
/// unrolls them and keeps the row's state in registers (`shared`'s D ≤ 64 class on GPUs;
/// docs/isa.md).
pub const FLASH_PRELUDE_64: &[&str] = &[
    COMMON,
    "const ROW_VEC4: u32 = 16u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 1u;\n",
    SUM_OF_ONE_LANE,
    ROW_LANES,
    FLASH_COMMON,
];
/// Head dims up to 128 and 256 on GPUs with subgroups: each row split over 2 and 4
/// lanes, each lane with the D ≤ 64 class's constant 16 vec4s of Q and of the
/// accumulator (in registers; docs/isa.md).
pub const FLASH_PRELUDE_128: &[&str] = &[
    COMMON,
    "const ROW_VEC4: u32 = 16u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 2u;\n",
    SUM_OVER_LANES,
    ROW_LANES,
    FLASH_COMMON,
];
pub const FLASH_PRELUDE_256: &[&str] = &[
    COMMON,
    "const ROW_VEC4: u32 = 16u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 4u;\n",
    SUM_OVER_LANES,
    ROW_LANES,
    FLASH_COMMON,
];
/// [`FLASH_PRELUDE_128`] and [`FLASH_PRELUDE_256`] on GPUs without subgroups: the
/// lanes' sums through workgroup memory, one slot per invocation (64 rows of 2 and 4
/// lanes), carved from the K/V tile's 16 KiB (`flash_attention.wgsl`'s TILE_VEC4).
pub const FLASH_PRELUDE_128_WG: &[&str] = &[
    COMMON,
    "const ROW_VEC4: u32 = 16u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 2u;\nconst LANE_SLOTS: u32 = 128u;\n",
    SUM_IN_WORKGROUP,
    ROW_LANES,
    FLASH_COMMON,
];
pub const FLASH_PRELUDE_256_WG: &[&str] = &[
    COMMON,
    "const ROW_VEC4: u32 = 16u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 4u;\nconst LANE_SLOTS: u32 = 256u;\n",
    SUM_IN_WORKGROUP,
    ROW_LANES,
    FLASH_COMMON,
];
/// Prelude of `flash_backward.wgsl` (the `rows` backward): one row or key per
/// invocation, loops to the run-time head dims.
pub const BACKWARD_ROWS_PRELUDE: &[&str] = &[COMMON, BACKWARD_COMMON, RUN_TIME_ROW, SUM_OF_ONE_LANE, ROW_LANES];
/// Its head-dim classes on GPUs: each lane a constant 8 vec4s of each of the pass's
/// four rows (in registers), one lane per row or key up to D 32, two, four and eight
/// (subgroup shuffles) up to 64, 128 and 256.
pub const BACKWARD_ROWS_32: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 1u;\n",
    SUM_OF_ONE_LANE,
    ROW_LANES,
];
pub const BACKWARD_ROWS_64: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 2u;\n",
    SUM_OVER_LANES,
    ROW_LANES,
];
pub const BACKWARD_ROWS_128: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 4u;\n",
    SUM_OVER_LANES,
    ROW_LANES,
];
pub const BACKWARD_ROWS_256: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 8u;\n",
    SUM_OVER_LANES,
    ROW_LANES,
];
/// [`BACKWARD_ROWS_64`], [`BACKWARD_ROWS_128`] and [`BACKWARD_ROWS_256`] on GPUs
/// without subgroups: the lanes' sums through workgroup memory, one slot per
/// invocation (32 rows or keys of 2, 4 and 8 lanes).
pub const BACKWARD_ROWS_64_WG: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 2u;\nconst LANE_SLOTS: u32 = 64u;\n",
    SUM_IN_WORKGROUP,
    ROW_LANES,
];
pub const BACKWARD_ROWS_128_WG: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 4u;\nconst LANE_SLOTS: u32 = 128u;\n",
    SUM_IN_WORKGROUP,
    ROW_LANES,
];
pub const BACKWARD_ROWS_256_WG: &[&str] = &[
    COMMON,
    BACKWARD_COMMON,
    "const ROW_VEC4: u32 = 8u;\nconst FIXED_ROW: bool = true;\nconst ROW_LANES: u32 = 8u;\nconst LANE_SLOTS: u32 = 256u;\n",
    SUM_IN_WORKGROUP,
    ROW_LANES,
];

/// Every kernel family, each listing its own variants (`kernels()` in its module), so
/// that adding or retiring a variant touches its family alone.
const FAMILIES: [fn() -> Vec<Kernel>; 21] = [
    flash::kernels,
    flash_texel::kernels,
    decode::kernels,
    backward_passes::kernels,
    backward_blocked::kernels,
    backward_coop::kernels,
    matmul::kernels,
    gemm::kernels,
    layer_norm::kernels,
    layer_norm_backward::kernels,
    kv_append::kernels,
    kv_dequantize::kernels,
    merge::kernels,
    rotary::kernels,
    mean_heads::kernels,
    pack_rows::kernels,
    qk_scores::kernels,
    softmax_rows::kernels,
    weights_v::kernels,
    copy_probe::kernels,
    loop_probe::kernels,
];

/// Every kernel the crate dispatches, for shader validation and `isa --set all`: the
/// union of the families' variants, generated ones included (the tensor-core forms for
/// 32-lane subgroups, NVIDIA's).
pub fn every_kernel() -> Vec<Kernel> {
    FAMILIES.iter().flat_map(|family| family()).collect()
}

/// The full WGSL of a kernel for an element type. `enable` directives in the kernel's
/// own file (say `enable wgpu_cooperative_matrix;`) are hoisted above the preludes, as
/// WGSL wants directives before any declaration.
pub fn shader_source(kernel: &Kernel, dtype: DType) -> String {
    let (directives, body): (Vec<&str>, Vec<&str>) = kernel
        .source
        .lines()
        .partition(|line| line.trim_start().starts_with("enable "));
    let elem = match dtype {
        DType::F32 => "alias elem = f32;\nconst ELEMS_PER_WORD: u32 = 1u;\n",
        DType::F16 => "alias elem = f16;\nconst ELEMS_PER_WORD: u32 = 2u;\n",
    };
    let mut header = String::new();
    if dtype == DType::F16 && !directives.iter().any(|d| d.contains("f16")) {
        header.push_str("enable f16;\n");
    }
    for d in directives {
        header.push_str(d.trim());
        header.push('\n');
    }
    format!("{header}{elem}{}\n{}", kernel.preludes.concat(), body.join("\n"))
}

/// Compiles (once per context) the pipeline for a kernel, element type and overrides.
pub(crate) fn pipeline(
    ctx: &Gpu,
    kernel: &Kernel,
    dtype: DType,
    constants: &[(&'static str, u32)],
) -> Result<CompiledPipeline> {
    let caps = ctx.capabilities();
    let key = PipelineKey {
        shader: (kernel.file, kernel.entry, kernel.variant.clone()),
        dtype,
        constants: constants.to_vec(),
        checks: ctx.runtime_checks(),
    };
    ctx.pipeline(key, |key| {
        let mut source = shader_source(kernel, dtype);
        let constants = &key.constants;
        let label = format!("{}:{}{} ({})", kernel.file, kernel.entry, kernel.variant, dtype.name());
        if caps.coop_emulated && source.contains("enable wgpu_cooperative_matrix;") {
            let sg = caps.coop_subgroup_size().unwrap_or(0);
            source = coop_emulation::rewrite(&source, sg)?;
        }
        ctx.scoped(&format!("compiling {label}"), || {
            let module = shader_module(ctx.device(), &label, source, key.checks);
            let constants: Vec<(&str, f64)> = constants.iter().map(|&(n, v)| (n, f64::from(v))).collect();
            Ok(ctx.device().create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    // Off: every kernel writes what it reads.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            }))
        })
    })
}

/// A kernel's shader module, with wgpu's runtime checks or the ones `checks` keeps.
fn shader_module(
    device: &wgpu::Device,
    label: &str,
    source: String,
    checks: crate::gpu::RuntimeChecks,
) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    if checks == crate::gpu::RuntimeChecks::WGPU_DEFAULT {
        return device.create_shader_module(desc);
    }
    // SAFETY (docs/design.md, "Runtime checks"): only this crate's kernels come here.
    // Every loop in them runs to a bound made of the problem's shape and constants
    // (the trip counts `loop_budget` models), so none is infinite without the counter;
    // every index and access stays inside its array and binding by the host's guards
    // (shapes, strides and bindings checked before any dispatch). Integer-division
    // checks stay on.
    #[allow(unsafe_code)]
    unsafe {
        device.create_shader_module_trusted(desc, checks.to_wgpu())
    }
}

/// Records one dispatch with an auto-layout bind group made of `bindings`.
pub(crate) fn dispatch(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    pipeline: &CompiledPipeline,
    bindings: &[(u32, &wgpu::Buffer)],
    groups: [u32; 3],
) -> Result<()> {
    let entries: Vec<wgpu::BindGroupEntry> = bindings
        .iter()
        .map(|&(binding, buffer)| wgpu::BindGroupEntry {
            binding,
            resource: buffer.as_entire_binding(),
        })
        .collect();
    dispatch_entries(ctx, encoder, pipeline, &entries, groups)
}

/// Like [`dispatch`], for bindings that are not all whole buffers (textures).
///
/// The last guard before wgpu: the planners check sizes up front, and this checks the
/// dispatch actually recorded (every bound buffer within the binding limit, every grid
/// axis within the workgroup limit), so a planner that missed a case gives
/// `LimitExceeded`, not a wgpu validation error or a silently wrapped index.
pub(crate) fn dispatch_entries(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    pipeline: &CompiledPipeline,
    entries: &[wgpu::BindGroupEntry],
    groups: [u32; 3],
) -> Result<()> {
    let caps = ctx.capabilities();
    for entry in entries {
        if let wgpu::BindingResource::Buffer(binding) = &entry.resource {
            let bytes = binding.size.map_or(binding.buffer.size() - binding.offset, |s| s.get());
            if bytes > caps.max_storage_binding {
                return Err(Error::LimitExceeded {
                    what: format!("binding {} of a dispatch", entry.binding),
                    limit: "max_storage_buffer_binding_size",
                    unit: "bytes",
                    requested: bytes,
                    max: caps.max_storage_binding,
                });
            }
        }
    }
    if let Some(&most) = groups.iter().max().filter(|&&g| g > caps.max_workgroups_per_dim) {
        return Err(Error::LimitExceeded {
            what: format!(
                "workgroups of a dispatch ({} x {} x {})",
                groups[0], groups[1], groups[2]
            ),
            limit: "max_compute_workgroups_per_dimension",
            unit: "workgroups",
            requested: most.into(),
            max: caps.max_workgroups_per_dim.into(),
        });
    }
    let bind_group = ctx.device().create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.layout,
        entries,
    });
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
    pass.set_pipeline(&pipeline.pipeline);
    pass.set_bind_group(0, &bind_group, &[]);
    pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    Ok(())
}

/// Buffers bound at the fixed binding numbers of `attention_common.wgsl`.
pub(crate) struct AttentionBindings<'a> {
    pub params: &'a wgpu::Buffer,
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    pub output: &'a wgpu::Buffer,
    pub mask: &'a wgpu::Buffer,
    /// Key lengths, then ALiBi slopes (`side_words` in the WGSL).
    pub side_words: &'a wgpu::Buffer,
    pub scores: &'a wgpu::Buffer,
    pub lse: &'a wgpu::Buffer,
    /// A KV cache's texel mirror of `k` and `v`, where the kernel reads them from it.
    pub kv_texels: Option<&'a kv_texels::KvTexels>,
    /// Bound at the K4 and V4 slots instead of K and V where those are shorter than
    /// one 16-byte word (the kernel then reads no words).
    pub words_stand_in: Option<&'a wgpu::Buffer>,
    /// An int8 KV cache's K and V row scales, where `k` and `v` are its codes.
    pub kv_scales: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
}

/// Binding numbers, as declared in `attention_common.wgsl` (9-12 in
/// `decode_kv_buffers.wgsl` and `decode_kv_texels.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    Params = 0,
    Q = 1,
    K = 2,
    V = 3,
    Output = 4,
    Mask = 5,
    SideWords = 6,
    Scores = 7,
    Lse = 8,
    /// K again, as 16-byte units (`array<vec4<u32>>`).
    K4 = 9,
    /// V again, as 16-byte units.
    V4 = 10,
    /// K's texel mirror (`kernels::kv_texels`).
    KTexels = 11,
    /// V's texel mirror.
    VTexels = 12,
    /// The output's gradient (`flash_backward.wgsl`).
    DOut = 13,
    /// The gradients the backward pass writes.
    DQ = 14,
    DK = 15,
    DV = 16,
    /// The forward's output, read only (`flash_backward.wgsl`'s `o_in`).
    ForwardOut = 17,
    /// The forward's attention weights, read by the materialized backward.
    Probs = 18,
    /// The materialized backward's dX matrix.
    DScores = 19,
    /// Q again, as 16-byte units (the tensor-core backward, `flash_backward_coop.wgsl`).
    Q4 = 22,
    /// The output's gradient again, as 16-byte units.
    DOut4 = 23,
    /// An int8 KV cache's K row scales (`decode_lanes_int8.wgsl`).
    KScales = 24,
    /// Its V row scales.
    VScales = 25,
}

impl Slot {
    /// The WGSL variable name bound at this slot.
    pub fn wgsl_name(self) -> &'static str {
        match self {
            Slot::Params => "p",
            Slot::Q => "q",
            Slot::K => "k",
            Slot::V => "v",
            Slot::Output => "output",
            Slot::Mask => "mask_words",
            Slot::SideWords => "side_words",
            Slot::Scores => "scores",
            Slot::Lse => "lse",
            Slot::K4 => "k4",
            Slot::V4 => "v4",
            Slot::KTexels => "k_texels",
            Slot::VTexels => "v_texels",
            Slot::DOut => "d_out",
            Slot::DQ => "dq",
            Slot::DK => "dk",
            Slot::DV => "dv",
            Slot::ForwardOut => "o_in",
            Slot::Probs => "probs",
            Slot::DScores => "d_scores",
            Slot::Q4 => "q4",
            Slot::DOut4 => "do4",
            Slot::KScales => "k_scales",
            Slot::VScales => "v_scales",
        }
    }
}

impl<'a> AttentionBindings<'a> {
    /// The bind group entries for the slots a kernel uses; `Invalid` for a texel slot
    /// without a mirror (a planner bug, not user input).
    pub(crate) fn select(&self, slots: &[Slot]) -> Result<Vec<wgpu::BindGroupEntry<'a>>> {
        slots
            .iter()
            .map(|&slot| {
                let buffer = match slot {
                    Slot::Params => self.params,
                    Slot::Q => self.q,
                    Slot::K => self.k,
                    Slot::V => self.v,
                    Slot::K4 => self.words_stand_in.unwrap_or(self.k),
                    Slot::V4 => self.words_stand_in.unwrap_or(self.v),
                    Slot::Output => self.output,
                    Slot::Mask => self.mask,
                    Slot::SideWords => self.side_words,
                    Slot::Scores => self.scores,
                    Slot::Lse => self.lse,
                    Slot::KScales | Slot::VScales => {
                        let (k, v) = self.kv_scales.ok_or_else(|| {
                            Error::invalid(
                                "attention bindings",
                                "a kernel reads int8 row scales but none were given",
                            )
                        })?;
                        if slot == Slot::KScales {
                            k
                        } else {
                            v
                        }
                    }
                    Slot::DOut
                    | Slot::DQ
                    | Slot::DK
                    | Slot::DV
                    | Slot::ForwardOut
                    | Slot::Probs
                    | Slot::DScores
                    | Slot::Q4
                    | Slot::DOut4 => {
                        return Err(Error::invalid(
                            "attention bindings",
                            "the backward pass binds its gradients itself",
                        ))
                    }
                    Slot::KTexels | Slot::VTexels => {
                        let texels = self.kv_texels.ok_or_else(|| {
                            Error::invalid(
                                "attention bindings",
                                "a kernel reads K and V texels but no mirror was given",
                            )
                        })?;
                        let view = if slot == Slot::KTexels {
                            texels.keys()
                        } else {
                            texels.values()
                        };
                        return Ok(wgpu::BindGroupEntry {
                            binding: slot as u32,
                            resource: wgpu::BindingResource::TextureView(view),
                        });
                    }
                };
                Ok(wgpu::BindGroupEntry {
                    binding: slot as u32,
                    resource: buffer.as_entire_binding(),
                })
            })
            .collect()
    }
}

/// Workgroups needed to cover `n` items with `per_group` items per workgroup.
pub(crate) fn groups_for(n: usize, per_group: usize) -> u32 {
    n.div_ceil(per_group) as u32
}
