//! The fused one-pass kernels and the registry of their tilings.
//!
//! Each tiling is declared once, in [`FUSED_TILINGS`]: its name, what it needs from the
//! adapter, the class of adapter it is picked for, its kernel variants and its
//! loop-iteration model. The picker ([`crate::Context::default_fused_tiling`]),
//! `info`, `bench`, `check`, the CLI's `--tiling`, `WGPU_ATTENTION_TILING` and the
//! tests all read this table (docs/design.md, "Kernel paths and tilings").

use super::flash_texel;
use super::kv_texels::{KvTexels, TexelGrid};
use super::{
    dispatch_entries, groups_for, loop_budget, pipeline, AttentionBindings, AttentionParams, Kernel, Slot, COMMON,
};
use crate::context::{Capabilities, Context};
use crate::error::{Error, Result};
use crate::options::FusedTiling;
use crate::problem::AttentionShape;
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../shaders/flash_attention.wgsl");
const SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Output,
    Slot::Mask,
    Slot::SideWords,
    Slot::Lse,
];

/// K/V read straight from storage, no barriers (CPU adapters).
pub const REGISTERS: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_registers",
    slots: SLOTS,
    preludes: super::FLASH_PRELUDE,
    variant: "",
};

/// K/V tiles staged in 16 KiB of workgroup memory, one query row per invocation.
pub const SHARED: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_shared",
    slots: SLOTS,
    preludes: super::FLASH_PRELUDE,
    variant: "",
};

/// K/V elements loaded once per subgroup and broadcast to its lanes (CPU adapters with
/// subgroups of at least 8 lanes), in three variants by the largest head dim they hold
/// (`MAX_DIM`): per invocation, Q and the accumulator take MAX_DIM vec4s each, in
/// workgroup memory where 8 invocations' fit in 32 KiB (llvmpipe compiles dynamically
/// indexed private arrays into branch ladders: the 128 variant took 15 s to compile
/// cold on Mesa 22.3 with private arrays, 2 s now); at 256 only the accumulator fits,
/// and Q is read from the Q buffer at every block (25 s to compile as a private array).
/// Each in blocks of 16 keys, and (`_WIDE`) of 32, which Mesa 22's llvmpipe runs
/// faster ([`subgroup_keys_per_block`]).
pub const SUBGROUP_64: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 64u;\n",
        SUBGROUP_Q_SHARED,
        SUBGROUP_ACC_SHARED,
        KEYS_16,
    ],
    "[64]",
);
pub const SUBGROUP_128: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 128u;\n",
        SUBGROUP_Q_SHARED,
        SUBGROUP_ACC_SHARED,
        KEYS_16,
    ],
    "[128]",
);
pub const SUBGROUP_256: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 256u;\n",
        SUBGROUP_Q_STORAGE,
        SUBGROUP_ACC_SHARED,
        KEYS_16,
    ],
    "[256]",
);
pub const SUBGROUP_WIDE_64: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 64u;\n",
        SUBGROUP_Q_SHARED,
        SUBGROUP_ACC_SHARED,
        KEYS_32,
    ],
    "[64, 32 keys]",
);
pub const SUBGROUP_WIDE_128: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 128u;\n",
        SUBGROUP_Q_SHARED,
        SUBGROUP_ACC_SHARED,
        KEYS_32,
    ],
    "[128, 32 keys]",
);
pub const SUBGROUP_WIDE_256: Kernel = subgroup_variant(
    &[
        COMMON,
        "const MAX_DIM: u32 = 256u;\n",
        SUBGROUP_Q_STORAGE,
        SUBGROUP_ACC_SHARED,
        KEYS_32,
    ],
    "[256, 32 keys]",
);
const KEYS_16: &str = "const KEYS_PER_BLOCK: u32 = 16u;\n";
const KEYS_32: &str = "const KEYS_PER_BLOCK: u32 = 32u;\n";

/// Keys per block of the subgroup tiling on an adapter: 32 on Mesa 22's llvmpipe,
/// where (1,8,2048,64) f32 ran 1.14-1.21x faster that way (fewer passes over the
/// accumulator in workgroup memory), 16 elsewhere: 32 ran 0.75x on Mesa 25.0, and
/// the versions between were not measured.
pub fn subgroup_keys_per_block(caps: &Capabilities) -> u32 {
    match caps.mesa_version {
        Some((major, _)) if major <= 22 => 32,
        _ => 16,
    }
}

/// Workgroup memory the subgroup tiling needs (its 128 variant: Q and the accumulator
/// of 8 invocations; the 256 variant's accumulator alone is as large; the 64 variant
/// needs half, but the tiling is declared by its largest: it is meant for CPU
/// adapters, which have 32 KiB).
pub const SUBGROUP_WORKGROUP_BYTES: u32 = 2 * 8 * 128 * 16;

/// `flash_subgroup.wgsl`'s Q rows, in workgroup memory (one slot per invocation).
const SUBGROUP_Q_SHARED: &str = "var<workgroup> q_w: array<vec4<f32>, SLOTS * MAX_DIM>;
fn q_octet(t: u32) -> array<vec4<f32>, 8> {
    let b = slot + t * 8u;
    return array<vec4<f32>, 8>(q_w[b], q_w[b + 1u], q_w[b + 2u], q_w[b + 3u], q_w[b + 4u], q_w[b + 5u], q_w[b + 6u], q_w[b + 7u]);
}
fn q_set_octet(t: u32, o: array<vec4<f32>, 8>) {
    let b = slot + t * 8u;
    q_w[b] = o[0];
    q_w[b + 1u] = o[1];
    q_w[b + 2u] = o[2];
    q_w[b + 3u] = o[3];
    q_w[b + 4u] = o[4];
    q_w[b + 5u] = o[5];
    q_w[b + 6u] = o[6];
    q_w[b + 7u] = o[7];
}
";
/// Its accumulator, in workgroup memory.
const SUBGROUP_ACC_SHARED: &str = "var<workgroup> acc_w: array<vec4<f32>, SLOTS * MAX_DIM>;
fn acc_get(d: u32) -> vec4<f32> { return acc_w[slot + d]; }
fn acc_set(d: u32, x: vec4<f32>) { acc_w[slot + d] = x; }
fn acc_octet(t: u32) -> array<vec4<f32>, 8> {
    let b = slot + t * 8u;
    return array<vec4<f32>, 8>(acc_w[b], acc_w[b + 1u], acc_w[b + 2u], acc_w[b + 3u], acc_w[b + 4u], acc_w[b + 5u], acc_w[b + 6u], acc_w[b + 7u]);
}
fn acc_set_octet(t: u32, a: array<vec4<f32>, 8>) {
    let b = slot + t * 8u;
    acc_w[b] = a[0];
    acc_w[b + 1u] = a[1];
    acc_w[b + 2u] = a[2];
    acc_w[b + 3u] = a[3];
    acc_w[b + 4u] = a[4];
    acc_w[b + 5u] = a[5];
    acc_w[b + 6u] = a[6];
    acc_w[b + 7u] = a[7];
}
";
/// Its Q rows, read from the Q buffer at every block (where workgroup memory cannot
/// hold them with the accumulator): a private array indexed by octet compiled for a
/// minute on llvmpipe (a ladder of branches per access).
const SUBGROUP_Q_STORAGE: &str = "fn q_octet(t: u32) -> array<vec4<f32>, 8> {
    let d = t * 8u;
    return array<vec4<f32>, 8>(q_element(q_rows, d), q_element(q_rows, d + 1u), q_element(q_rows, d + 2u), q_element(q_rows, d + 3u),
        q_element(q_rows, d + 4u), q_element(q_rows, d + 5u), q_element(q_rows, d + 6u), q_element(q_rows, d + 7u));
}
fn q_set_octet(t: u32, o: array<vec4<f32>, 8>) {}
";

const fn subgroup_variant(preludes: &'static [&'static str], variant: &'static str) -> Kernel {
    Kernel {
        file: "flash_subgroup.wgsl",
        source: include_str!("../../shaders/flash_subgroup.wgsl"),
        entry: "flash_subgroup",
        slots: SLOTS,
        preludes,
        variant,
    }
}

/// Lanes `flash_subgroup.wgsl` needs in a subgroup.
pub const SUBGROUP_LANES: u32 = 8;

/// Workgroup memory the shared tiling declares.
pub const SHARED_TILE_BYTES: u32 = 16 * 1024;

/// One variant of a block tiling (`flash_blocked.wgsl`, `flash_coop.wgsl`): head dims
/// up to `dmax`, `br` query rows per workgroup and `bc` keys per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockVariant {
    pub dmax: u32,
    pub br: u32,
    pub bc: u32,
    /// Workgroup memory the variant declares, mirroring its WGSL (a test compares this
    /// with naga's layout of the module).
    pub workgroup_bytes: u32,
    pub kernel: Kernel,
}

/// `flash_blocked.wgsl`'s workgroup memory: the Q tile, the K/V tile with rows padded
/// by one vec4, the probability tile and three f32 per row.
const fn blocked_bytes(dmax: u32, br: u32, bc: u32) -> u32 {
    let d4 = dmax / 4;
    16 * br * d4 + 16 * bc * (d4 + 1) + 4 * br * bc + 12 * br
}

/// One variant of a block tiling: its constants as a one-line prelude after
/// `attention_common.wgsl`, and its label (`[DMAXxBRxBC]`) in the pipeline key.
macro_rules! block_variant {
    ($family:ident, $dmax:literal, $br:literal, $bc:literal) => {
        $family(
            $dmax,
            $br,
            $bc,
            &[
                COMMON,
                concat!(
                    "const DMAX: u32 = ",
                    $dmax,
                    "u;\nconst BR: u32 = ",
                    $br,
                    "u;\nconst BC: u32 = ",
                    $bc,
                    "u;\n"
                ),
            ],
            concat!("[", $dmax, "x", $br, "x", $bc, "]"),
        )
    };
}

/// The kernel of a block-tiling variant built from `file`'s `entry`.
const fn block_kernel(
    file: &'static str,
    source: &'static str,
    entry: &'static str,
    preludes: &'static [&'static str],
    variant: &'static str,
) -> Kernel {
    Kernel {
        file,
        source,
        entry,
        slots: SLOTS,
        preludes,
        variant,
    }
}

const fn blocked(dmax: u32, br: u32, bc: u32, prelude: &'static [&'static str], label: &'static str) -> BlockVariant {
    BlockVariant {
        dmax,
        br,
        bc,
        workgroup_bytes: blocked_bytes(dmax, br, bc),
        kernel: block_kernel(
            "flash_blocked.wgsl",
            include_str!("../../shaders/flash_blocked.wgsl"),
            "flash_blocked",
            prelude,
            label,
        ),
    }
}

/// The variants of the GPU tiling, by head-dim class; within a class the first that
/// fits the adapter's workgroup memory is used. 64 invocations each; the register
/// micro-tiles stay at 16 to 64 floats per invocation (MR x MC scores, MR x 4·OC
/// outputs). Sized so that one variant per class fits in 32 KiB (lavapipe, and most
/// GPUs); the wider D ≤ 64 one wants 48 KiB (NVIDIA).
pub const BLOCKED_VARIANTS: [BlockVariant; 4] = [
    block_variant!(blocked, 64, 64, 32),
    block_variant!(blocked, 64, 32, 32),
    block_variant!(blocked, 128, 32, 16),
    block_variant!(blocked, 256, 16, 8),
];

/// Workgroup memory the blocked tiling needs for every head dim: the largest of the
/// smallest variant of each class.
pub const BLOCKED_MIN_BYTES: u32 = 27_264;

/// `flash_coop.wgsl`'s workgroup memory: the f16 Q band and K/V tile (rows padded by
/// 8 halves), the f32 score tile (rows padded by 4), the f16 probability tile (padded
/// by 8), three f32 per row and the `moved` flag.
const fn coop_bytes(dmax: u32, br: u32, bc: u32) -> u32 {
    2 * br * (dmax + 8) + 2 * bc * (dmax + 8) + 4 * br * (bc + 4) + 2 * br * (bc + 8) + 12 * br + 4
}

const fn coop(dmax: u32, br: u32, bc: u32, prelude: &'static [&'static str], label: &'static str) -> BlockVariant {
    BlockVariant {
        dmax,
        br,
        bc,
        workgroup_bytes: coop_bytes(dmax, br, bc),
        kernel: block_kernel(
            "flash_coop.wgsl",
            include_str!("../../shaders/flash_coop.wgsl"),
            "flash_coop",
            prelude,
            label,
        ),
    }
}

/// The variants of the tensor-core tiling, chosen as the blocked ones. One 16-row band
/// per subgroup (BR / 16 subgroups). The first of each class fits NVIDIA's 48 KiB; the
/// narrower ones fit 32 KiB (Apple, lavapipe under emulation).
pub const COOP_VARIANTS: [BlockVariant; 6] = [
    block_variant!(coop, 64, 64, 64),
    block_variant!(coop, 64, 64, 32),
    block_variant!(coop, 128, 64, 32),
    block_variant!(coop, 128, 32, 32),
    block_variant!(coop, 256, 32, 32),
    block_variant!(coop, 256, 16, 32),
];

/// Workgroup memory the coop tiling needs for every head dim (as BLOCKED_MIN_BYTES).
pub const COOP_MIN_BYTES: u32 = 29_124;

/// The variant of `variants` for head dims `d`, `dv` on an adapter granting `bytes` of
/// workgroup memory: the smallest head-dim class that holds both, and in it the first
/// variant that fits.
pub fn variant_for(variants: &[BlockVariant], d: u32, dv: u32, bytes: u32) -> Option<BlockVariant> {
    let need = d.max(dv);
    let class = variants.iter().map(|v| v.dmax).find(|&dmax| need <= dmax)?;
    variants
        .iter()
        .copied()
        .find(|v| v.dmax == class && v.workgroup_bytes <= bytes)
}

/// The blocked variant for head dims `d`, `dv` on an adapter granting `bytes`.
pub fn blocked_for(d: u32, dv: u32, bytes: u32) -> Option<BlockVariant> {
    variant_for(&BLOCKED_VARIANTS, d, dv, bytes)
}

/// The coop variant for head dims `d`, `dv` on an adapter granting `bytes`.
pub fn coop_for(d: u32, dv: u32, bytes: u32) -> Option<BlockVariant> {
    variant_for(&COOP_VARIANTS, d, dv, bytes)
}

/// The class of adapter a tiling is meant for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterClass {
    /// CPU drivers (lavapipe, llvmpipe, SwiftShader, WARP): SIMD lanes, costly barriers,
    /// storage loads lane by lane.
    Cpu,
    /// A CPU driver behind a browser's WebGPU (SwiftShader in Chromium): there `shared`
    /// runs 1.8× `blocked` (docs/design.md, "Kernel paths and tilings").
    BrowserCpu,
    /// Discrete and integrated GPUs.
    Gpu,
}

impl AdapterClass {
    pub fn of(info: &wgpu::AdapterInfo) -> Self {
        match (crate::context::is_cpu_adapter(info), info.backend) {
            (true, wgpu::Backend::BrowserWebGpu) => AdapterClass::BrowserCpu,
            (true, _) => AdapterClass::Cpu,
            (false, _) => AdapterClass::Gpu,
        }
    }
}

/// What a tiling needs from the adapter beyond core WebGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Nothing,
    /// `SUBGROUP` with subgroups of at least `lanes` lanes, and this much workgroup
    /// memory.
    Subgroups {
        lanes: u32,
        workgroup_bytes: u32,
    },
    /// At least this much workgroup memory.
    WorkgroupBytes(u32),
    /// Tensor cores: `EXPERIMENTAL_COOPERATIVE_MATRIX` with the 16x16x16 f16->f32
    /// configuration, f16, a fixed subgroup size (the kernel's `SG`), this much
    /// workgroup memory and room for 4 subgroups per workgroup.
    CooperativeMatrix(u32),
}

/// One kernel launch shape of a tiling for a problem: the kernel variant, query rows
/// per workgroup, and the override constants the shader takes (`ROWS`, `SG`).
#[derive(Clone, Debug)]
pub struct Launch {
    pub kernel: Kernel,
    pub rows: u32,
    pub constants: Vec<(&'static str, u32)>,
}

impl Launch {
    /// A kernel that takes its rows per workgroup as the `ROWS` override.
    fn rows_override(kernel: Kernel, rows: u32) -> Self {
        Launch {
            kernel,
            rows,
            constants: vec![("ROWS", rows)],
        }
    }
}

/// One fused tiling, declared once.
pub struct TilingSpec {
    pub tiling: FusedTiling,
    /// What users type (`--tiling`, `WGPU_ATTENTION_TILING`) and see (`fused/NAME`).
    pub name: &'static str,
    /// One line for `info` and the docs.
    pub about: &'static str,
    /// Picked by default on these classes of adapter, in registry order, when its needs
    /// are met; `registers` is the fallback everywhere.
    pub default_on: &'static [AdapterClass],
    pub needs: Needs,
    /// Computes the products in f16 (tensor cores): used for f16 inputs, and for f32
    /// inputs only at `Precision::Medium` (docs/design.md, "Precision").
    pub f16_products: bool,
    /// The launch for head dims (D, Dv) on an adapter with these capabilities.
    launch: fn(u32, u32, &Capabilities) -> Launch,
    /// Worst-case loop iterations of one invocation (see `kernels::loop_budget`).
    pub iterations: fn(&AttentionShape) -> u64,
}

/// Every fused tiling, in the picker's order of preference.
pub const FUSED_TILINGS: [TilingSpec; 5] = [
    TilingSpec {
        tiling: FusedTiling::Coop,
        name: "coop",
        about: "tensor cores: FlashAttention-2 blocks with Q·Kᵀ and P·V as 16x16 f16 cooperative-matrix products, f32 softmax (GPUs with EXPERIMENTAL_COOPERATIVE_MATRIX; f16 inputs, or f32 at precision medium)",
        default_on: &[AdapterClass::Gpu],
        needs: Needs::CooperativeMatrix(COOP_MIN_BYTES),
        f16_products: true,
        launch: |d, dv, caps| {
            // The needs check guarantees a fit and a fixed subgroup size.
            let v = coop_for(d, dv, caps.max_workgroup_storage)
                .or_else(|| coop_for(d, dv, u32::MAX))
                .unwrap_or(COOP_VARIANTS[5]);
            Launch {
                kernel: v.kernel,
                rows: v.br,
                constants: vec![("SG", caps.coop_subgroup_size().unwrap_or(32))],
            }
        },
        iterations: loop_budget::coop_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Subgroup,
        name: "subgroup",
        about: "8-lane subgroups (CPU adapters): K/V as texel fetches, 16-32 query rows per subgroup, keys across lanes, where head dims are whole 16-byte words; else K/V loaded by one lane and broadcast, 4 query rows per invocation",
        default_on: &[AdapterClass::Cpu, AdapterClass::BrowserCpu],
        needs: Needs::Subgroups {
            lanes: SUBGROUP_LANES,
            workgroup_bytes: SUBGROUP_WORKGROUP_BYTES,
        },
        f16_products: false,
        launch: |d, dv, caps| {
            let wide = subgroup_keys_per_block(caps) == 32;
            let kernel = match (d.max(dv).next_multiple_of(SUBGROUP_LANES), wide) {
                (0..=64, false) => SUBGROUP_64,
                (65..=128, false) => SUBGROUP_128,
                (_, false) => SUBGROUP_256,
                (0..=64, true) => SUBGROUP_WIDE_64,
                (65..=128, true) => SUBGROUP_WIDE_128,
                (_, true) => SUBGROUP_WIDE_256,
            };
            Launch::rows_override(kernel, 32)
        },
        iterations: loop_budget::subgroup_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Blocked,
        name: "blocked",
        about: "FlashAttention-2 blocks: Q, K/V and probability tiles in workgroup memory, register micro-tiles of S and O (GPUs; CPU adapters without subgroups)",
        // Also the CPU pick without subgroups: on llvmpipe GL 2.3x registers at D 64 and
        // 128, 1.3x at 256 (docs/design.md, "Tilings").
        default_on: &[AdapterClass::Gpu, AdapterClass::Cpu],
        needs: Needs::WorkgroupBytes(BLOCKED_MIN_BYTES),
        f16_products: false,
        launch: |d, dv, caps| {
            // The needs check guarantees a fit; the narrowest variant otherwise.
            let v = blocked_for(d, dv, caps.max_workgroup_storage)
                .or_else(|| blocked_for(d, dv, u32::MAX))
                .unwrap_or(BLOCKED_VARIANTS[3]);
            Launch {
                kernel: v.kernel,
                rows: v.br,
                constants: Vec::new(),
            }
        },
        iterations: loop_budget::blocked_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Registers,
        name: "registers",
        about: "one query row per invocation, K/V straight from storage, no barriers (CPU adapters)",
        default_on: &[AdapterClass::Cpu],
        needs: Needs::Nothing,
        f16_products: false,
        launch: |_, _, _| Launch::rows_override(REGISTERS, 16),
        iterations: loop_budget::registers_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Shared,
        name: "shared",
        about: "one query row per invocation, K/V tiles in 16 KiB of workgroup memory (GPUs with little workgroup memory; CPU adapters in a browser)",
        default_on: &[AdapterClass::Gpu, AdapterClass::BrowserCpu],
        needs: Needs::WorkgroupBytes(SHARED_TILE_BYTES),
        f16_products: false,
        launch: |_, _, _| Launch::rows_override(SHARED, 64),
        iterations: loop_budget::shared_iterations,
    },
];

/// The registry entry of a tiling (`Auto` has none).
pub fn spec(tiling: FusedTiling) -> Option<&'static TilingSpec> {
    FUSED_TILINGS.iter().find(|s| s.tiling == tiling)
}

/// The names users may type, for messages.
pub fn tiling_names() -> String {
    FUSED_TILINGS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// Parses a tiling name (`auto` or a registry name), case-insensitively; `what` names
/// where it came from in the error (`tiling`, `WGPU_ATTENTION_TILING`).
pub fn parse_tiling(what: &str, name: &str) -> Result<FusedTiling> {
    let name = name.trim().to_lowercase();
    if name.is_empty() || name == "auto" {
        return Ok(FusedTiling::Auto);
    }
    FUSED_TILINGS
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.tiling)
        .ok_or_else(|| Error::invalid(what, format!("'{name}' is not one of auto, {}", tiling_names())))
}

/// The tiling picked when none is asked for on an adapter of `class` with `caps`: the
/// first registry entry meant for that class whose needs are met (and, for tilings with
/// f16 products, only where `f16_products` allows them), else `registers`.
pub fn default_tiling(class: AdapterClass, caps: &Capabilities, f16_products: bool) -> FusedTiling {
    FUSED_TILINGS
        .iter()
        .find(|spec| {
            spec.default_on.contains(&class) && (f16_products || !spec.f16_products) && spec.unmet("", caps).is_none()
        })
        .map_or(FusedTiling::Registers, |spec| spec.tiling)
}

impl TilingSpec {
    /// Why this adapter cannot run the tiling, if it cannot.
    pub fn unmet(&self, adapter: &str, caps: &Capabilities) -> Option<Error> {
        match self.needs {
            Needs::Nothing => None,
            Needs::Subgroups { lanes, workgroup_bytes } => {
                if caps.subgroups.is_none_or(|(min, _)| min < lanes) {
                    return Some(Error::MissingFeature {
                        adapter: adapter.into(),
                        feature: "SUBGROUP (with at least 8 lanes)",
                        needed_for: format!("the {} fused tiling", self.name),
                    });
                }
                self.unmet_bytes(caps, workgroup_bytes)
            }
            Needs::WorkgroupBytes(bytes) => self.unmet_bytes(caps, bytes),
            Needs::CooperativeMatrix(bytes) => match caps.coop_subgroup_size() {
                None => Some(Error::MissingFeature {
                    adapter: adapter.into(),
                    feature: "EXPERIMENTAL_COOPERATIVE_MATRIX (16x16x16 f16->f32, f16, a fixed subgroup size)",
                    needed_for: format!("the {} fused tiling", self.name),
                }),
                Some(sg) if 4 * sg > caps.max_invocations => Some(Error::LimitExceeded {
                    what: format!("the {} fused tiling (4 subgroups of {sg})", self.name),
                    limit: "max_compute_invocations_per_workgroup",
                    unit: "invocations",
                    requested: (4 * sg).into(),
                    max: caps.max_invocations.into(),
                }),
                Some(_) => self.unmet_bytes(caps, bytes),
            },
        }
    }

    fn unmet_bytes(&self, caps: &Capabilities, bytes: u32) -> Option<Error> {
        (caps.max_workgroup_storage < bytes).then(|| Error::LimitExceeded {
            what: format!("the {} fused tiling", self.name),
            limit: "max_compute_workgroup_storage_size",
            unit: "bytes",
            requested: bytes.into(),
            max: caps.max_workgroup_storage.into(),
        })
    }
}

/// A resolved fused tiling (one the context can run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashConfig {
    pub tiling: FusedTiling,
}

impl FlashConfig {
    pub fn spec(&self) -> &'static TilingSpec {
        spec(self.tiling).unwrap_or(&FUSED_TILINGS[1])
    }

    pub fn name(&self) -> &'static str {
        self.spec().name
    }

    /// Query rows one workgroup owns for this problem's head dims on this adapter.
    pub fn rows(&self, s: &AttentionShape, caps: &Capabilities) -> usize {
        (self.spec().launch)(s.head_dim as u32, s.head_dim_v as u32, caps).rows as usize
    }
}

pub(crate) fn encode(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    config: FlashConfig,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<()> {
    if let Some(variant) = texel_variant(ctx, dtype, config, params) {
        if encode_texel(ctx, encoder, dtype, variant, bindings, params)? {
            return Ok(());
        }
    }
    let launch = (config.spec().launch)(params.head_dim, params.head_dim_v, ctx.capabilities());
    let pipeline = pipeline(ctx, &launch.kernel, dtype, &launch.constants)?;
    let groups = [
        groups_for(params.len_q as usize, launch.rows as usize),
        params.bh_count,
        1,
    ];
    dispatch_entries(ctx, encoder, &pipeline, &bindings.select(SLOTS)?, groups)
}

/// The subgroup tiling's texel kernel for a problem, where it serves it.
fn texel_variant(
    ctx: &Context,
    dtype: DType,
    config: FlashConfig,
    params: &AttentionParams,
) -> Option<flash_texel::TexelVariant> {
    if config.spec().tiling != FusedTiling::Subgroup {
        return None;
    }
    let strides = [
        params.k_stride_b,
        params.k_stride_h,
        params.k_stride_s,
        params.k_page_stride,
        params.v_stride_b,
        params.v_stride_h,
        params.v_stride_s,
        params.v_page_stride,
    ];
    flash_texel::variant_for(
        dtype,
        (params.head_dim, params.head_dim_v),
        &strides,
        full_rules(params),
        ctx.capabilities(),
    )
}

/// Records the copy of plain K and V buffers into a texel mirror where the fused
/// dispatches of a problem will read one (the texel kernel, without a KV cache's
/// mirror), so that every dispatch of the problem (key ranges, head chunks) shares one
/// copy; `None` where they read none.
pub(crate) fn texel_mirror(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    config: FlashConfig,
    params: &AttentionParams,
    (k, v): (&wgpu::Buffer, &wgpu::Buffer),
) -> Result<Option<KvTexels>> {
    if texel_variant(ctx, dtype, config, params).is_none() {
        return Ok(None);
    }
    KvTexels::copy_of(ctx, encoder, k, v)
}

/// Whether a problem has rules beyond visible key ranges: explicit masks, soft-capping
/// or ALiBi (the WGSL's `only_key_ranges()` is false).
fn full_rules(params: &AttentionParams) -> bool {
    params.mask_kind != 0 || params.softcap != 0.0 || params.has_alibi != 0
}

/// Records the texel kernel's dispatch, reading the mirror the bindings carry (a KV
/// cache's, or one [`texel_mirror`] made); `false` (nothing recorded) where they carry
/// none.
fn encode_texel(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    variant: flash_texel::TexelVariant,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<bool> {
    // Plan::encode makes the mirror (texel_mirror) wherever this kernel will run; none
    // means K and V outgrew the device's textures.
    let Some(texels) = bindings.kv_texels else {
        return Ok(false);
    };
    let grid = TexelGrid::for_context(ctx);
    let mut constants = grid.constants("KV_TEXEL_SHIFT", "KV_TEXEL_ROWS").to_vec();
    constants.push(("FULL_RULES", u32::from(full_rules(params))));
    constants.push(("PAGED", u32::from(params.page_size > 0)));
    let pipeline = pipeline(ctx, &variant.kernel(), dtype, &constants)?;
    let groups = [
        groups_for(params.len_q as usize, variant.rows as usize),
        params.bh_count,
        1,
    ];
    let bindings = AttentionBindings {
        kv_texels: Some(texels),
        ..*bindings
    };
    dispatch_entries(ctx, encoder, &pipeline, &bindings.select(flash_texel::SLOTS)?, groups)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(subgroups: Option<(u32, u32)>, workgroup_bytes: u32) -> Capabilities {
        Capabilities::for_tests(subgroups, workgroup_bytes, None)
    }

    #[test]
    fn subgroup_key_blocks_follow_the_mesa_release() {
        let mut c = caps(Some((8, 8)), 32768);
        assert_eq!(crate::context::mesa_version("Mesa 22.3.6 (LLVM 15.0.6)"), Some((22, 3)));
        assert_eq!(
            crate::context::mesa_version("4.5 (Core Profile) Mesa 25.0.7-2~bpo12+1"),
            Some((25, 0))
        );
        assert_eq!(crate::context::mesa_version("NVIDIA 550.54"), None);
        assert_eq!(crate::context::mesa_version("Mesa x"), None);
        assert_eq!(subgroup_keys_per_block(&c), 16);
        c.mesa_version = Some((22, 3));
        assert_eq!(subgroup_keys_per_block(&c), 32);
        let launch = (spec(FusedTiling::Subgroup).expect("registered").launch)(64, 64, &c);
        assert_eq!(launch.kernel, SUBGROUP_WIDE_64);
        c.mesa_version = Some((25, 0));
        assert_eq!(subgroup_keys_per_block(&c), 16);
        let launch = (spec(FusedTiling::Subgroup).expect("registered").launch)(200, 64, &c);
        assert_eq!(launch.kernel, SUBGROUP_256);
    }

    #[test]
    fn blocks_of_16_keys_bound_the_subgroup_model_past_the_shortest_ranges() {
        // The model takes the larger count of the two block sizes; past 32 keys it is
        // the 16-key one, so picking 32 on Mesa 22 never shortens its dispatches.
        for d in [8, 64, 128, 256] {
            for lk in (32..2000).step_by(7) {
                let s = AttentionShape::new(1, 1, 1, 1, lk, d, d);
                let (k16, k32) = (
                    loop_budget::subgroup_iterations_per(&s, 16),
                    loop_budget::subgroup_iterations_per(&s, 32),
                );
                assert!(k16 >= k32, "D {d}, {lk} keys: {k16} < {k32}");
                let texel = super::flash_texel::iterations(lk as u64);
                let both = if d <= 128 { k16.max(texel) } else { k16 };
                assert_eq!(loop_budget::subgroup_iterations(&s), both);
                // Head dims the texel kernel never serves keep the buffer kernel's model.
                let odd = AttentionShape::new(1, 1, 1, 1, lk, d + 2, d + 2);
                assert_eq!(
                    loop_budget::subgroup_iterations(&odd),
                    loop_budget::subgroup_iterations_per(&odd, 16)
                );
            }
        }
    }

    fn with_tensor_cores(mut caps: Capabilities) -> Capabilities {
        caps.cooperative_matrix = vec![crate::context::CoopConfig {
            m: 16,
            n: 16,
            k: 16,
            ab: "f16",
            c: "f32",
        }];
        caps
    }

    #[test]
    fn picker_chooses_gpu_tilings_for_gpus_and_cpu_tilings_for_cpu_adapters() {
        // An NVIDIA H100 through Vulkan without tensor cores enabled: 48 KiB, subgroups of 32.
        let h100 = caps(Some((32, 32)), 48 * 1024);
        assert_eq!(default_tiling(AdapterClass::Gpu, &h100, true), FusedTiling::Blocked);
        // With them: tensor cores where f16 products are allowed, else exact f32.
        let h100_coop = with_tensor_cores(h100);
        assert_eq!(default_tiling(AdapterClass::Gpu, &h100_coop, true), FusedTiling::Coop);
        assert_eq!(
            default_tiling(AdapterClass::Gpu, &h100_coop, false),
            FusedTiling::Blocked
        );
        // Tensor cores but no fixed subgroup size (the kernel's SG): not coop.
        let varying = with_tensor_cores(caps(Some((32, 64)), 64 * 1024));
        assert_eq!(default_tiling(AdapterClass::Gpu, &varying, true), FusedTiling::Blocked);
        // A GPU at WebGPU's default 16 KiB: the small shared tiling.
        let webgpu = caps(Some((4, 128)), 16 * 1024);
        assert_eq!(default_tiling(AdapterClass::Gpu, &webgpu, true), FusedTiling::Shared);
        // Less than that: registers, which runs anywhere.
        assert_eq!(
            default_tiling(AdapterClass::Gpu, &caps(None, 8192), true),
            FusedTiling::Registers
        );
        // lavapipe: 32 KiB, subgroups of 8.
        let lavapipe = caps(Some((8, 8)), 32 * 1024);
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &lavapipe, true),
            FusedTiling::Subgroup
        );
        // llvmpipe GL and SwiftShader: no subgroups, 32 KiB.
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &caps(None, 32 * 1024), true),
            FusedTiling::Blocked
        );
        // SwiftShader in a browser: shared.
        assert_eq!(
            default_tiling(AdapterClass::BrowserCpu, &caps(None, 32 * 1024), true),
            FusedTiling::Shared
        );
        // A CPU adapter with less workgroup memory than blocked needs: registers.
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &caps(None, 16 * 1024), true),
            FusedTiling::Registers
        );
    }

    #[test]
    fn coop_says_which_need_is_missing() {
        let spec = spec(FusedTiling::Coop).expect("registered");
        let plain = caps(Some((32, 32)), 48 * 1024);
        assert!(matches!(spec.unmet("gpu", &plain), Some(Error::MissingFeature { .. })));
        let small = with_tensor_cores(caps(Some((32, 32)), 16 * 1024));
        assert!(matches!(spec.unmet("gpu", &small), Some(Error::LimitExceeded { .. })));
        let wide = with_tensor_cores(caps(Some((128, 128)), 48 * 1024));
        assert!(matches!(spec.unmet("gpu", &wide), Some(Error::LimitExceeded { .. })));
        assert!(spec.unmet("gpu", &with_tensor_cores(plain)).is_none());
    }

    /// The largest of the smallest variant of each head-dim class.
    fn min_bytes(variants: &[BlockVariant]) -> u32 {
        let mut classes: Vec<u32> = variants.iter().map(|v| v.dmax).collect();
        classes.dedup();
        classes
            .iter()
            .map(|&d| {
                variants
                    .iter()
                    .filter(|v| v.dmax == d)
                    .map(|v| v.workgroup_bytes)
                    .min()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn block_tilings_need_exactly_what_their_widest_class_takes() {
        assert_eq!(BLOCKED_MIN_BYTES, min_bytes(&BLOCKED_VARIANTS));
        assert_eq!(COOP_MIN_BYTES, min_bytes(&COOP_VARIANTS));
        // Every head dim up to 256 finds a variant at that budget; the wide D <= 64 one
        // only with 48 KiB.
        for d in [1, 8, 63, 64, 65, 128, 129, 256] {
            let v = blocked_for(d, d, BLOCKED_MIN_BYTES).map(|v| v.dmax);
            assert!(v.is_some_and(|dmax| dmax >= d), "D = {d}: {v:?}");
            let v = coop_for(d, d, COOP_MIN_BYTES).map(|v| v.dmax);
            assert!(v.is_some_and(|dmax| dmax >= d), "coop, D = {d}: {v:?}");
        }
        assert_eq!(blocked_for(64, 64, 48 * 1024).map(|v| v.br), Some(64));
        assert_eq!(blocked_for(64, 64, 32 * 1024).map(|v| v.br), Some(32));
        assert!(blocked_for(257, 1, u32::MAX).is_none());
        assert_eq!(coop_for(64, 64, 48 * 1024).map(|v| v.bc), Some(64));
        assert_eq!(coop_for(64, 64, COOP_MIN_BYTES).map(|v| v.bc), Some(32));
        assert_eq!(coop_for(128, 128, 48 * 1024).map(|v| v.br), Some(64));
        assert_eq!(coop_for(256, 256, 48 * 1024).map(|v| v.br), Some(32));
        assert!(coop_for(1, 257, u32::MAX).is_none());
        // One 16-row band per subgroup, at most 4 subgroups; tiles of whole 16-key chunks.
        for v in COOP_VARIANTS {
            assert!(v.br % 16 == 0 && v.br / 16 <= 4 && v.bc % 16 == 0, "{v:?}");
        }
    }
}
