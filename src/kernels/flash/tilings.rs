//! The registry of fused tilings ([`FUSED_TILINGS`]): each declared once with its
//! name, needs, the adapter classes it is picked for and its launch shape; parsing,
//! picking and the reasons an adapter cannot run one.

use super::super::{loop_budget, Kernel};
use super::coop::*;
use super::variants::*;
use crate::error::{Error, Result};
use crate::gpu::Capabilities;
use crate::kernels::policy::Policy;
use crate::options::FusedTiling;
use crate::problem::AttentionShape;

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
        match (crate::gpu::is_cpu_adapter(info), info.backend) {
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
/// per workgroup, and the override constants the shader takes (`ROWS`: invocations per
/// workgroup; `SG`).
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
    /// The launch for head dims (D, Dv) on an adapter with these capabilities, under
    /// this policy (pins, tuned variants).
    pub(super) launch: fn(u32, u32, &Capabilities, &Policy) -> Launch,
    /// Worst-case loop iterations of one invocation (see `kernels::loop_budget`).
    pub iterations: fn(&AttentionShape) -> u64,
}

/// Every fused tiling, in the picker's order of preference.
pub const FUSED_TILINGS: [TilingSpec; 6] = [
    TilingSpec {
        tiling: FusedTiling::Coop,
        name: "coop",
        about: "tensor cores: FlashAttention-2 blocks with Q·Kᵀ and P·V as 16x16 f16 cooperative-matrix products, f32 softmax (GPUs with EXPERIMENTAL_COOPERATIVE_MATRIX; f16 inputs, or f32 at precision medium)",
        default_on: &[AdapterClass::Gpu],
        needs: Needs::CooperativeMatrix(COOP_MIN_BYTES),
        f16_products: true,
        launch: |d, dv, caps, policy| {
            // The needs check guarantees a fixed subgroup size and a fit.
            let sg = caps.coop_subgroup_size().unwrap_or(32);
            let v = coop_variant_for(d, dv, caps, policy);
            Launch {
                kernel: v.kernel(sg),
                rows: v.br,
                constants: Vec::new(),
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
        launch: |d, dv, caps, _| {
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
        about: "FlashAttention-2 blocks: Q, K/V and probability tiles in workgroup memory, register micro-tiles of S and O (CPU adapters without subgroups)",
        // The CPU pick without subgroups: on llvmpipe GL 2.3x registers at D 64 and 128,
        // 1.3x at 256 (docs/design.md, "Tilings"). Not the GPU pick: on an NVIDIA H200
        // `shared` ran 1.8x faster at D 64, 1.65x at 128 and 1.4x at 256.
        default_on: &[AdapterClass::Cpu],
        needs: Needs::WorkgroupBytes(BLOCKED_MIN_BYTES),
        f16_products: false,
        launch: |d, dv, caps, _| {
            // The needs check guarantees a fit; the narrowest variant otherwise.
            let v = blocked_for(d, dv, caps.max_workgroup_storage)
                .or_else(|| blocked_for(d, dv, u32::MAX))
                .unwrap_or_else(|| BLOCKED_VARIANTS[BLOCKED_VARIANTS.len() - 1].clone());
            Launch {
                kernel: v.kernel,
                rows: v.br,
                constants: Vec::new(),
            }
        },
        iterations: loop_budget::blocked_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Micro,
        name: "micro",
        about: "full f32 on the register-blocked GEMM pattern: 64x64 FlashAttention-2 blocks, 4x4 score and 4x(D/16) output micro-tiles per invocation from double-buffered slabs of Q, K and V in 32 KiB (GPUs without tensor cores; not yet picked anywhere)",
        // Picked nowhere until a GPU measures it against `shared` (docs/design.md,
        // "The micro-tile tiling"): `tune` times it beside the others.
        default_on: &[],
        needs: Needs::WorkgroupBytes(MICRO_BYTES),
        f16_products: false,
        launch: |d, dv, caps, policy| {
            let v = micro_for(d, dv, micro_lanes(caps, policy)).unwrap_or(MICRO[MICRO.len() - 1].clone());
            Launch {
                kernel: v.kernel,
                rows: MICRO_ROWS,
                constants: Vec::new(),
            }
        },
        iterations: loop_budget::micro_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Registers,
        name: "registers",
        about: "one query row per invocation, K/V straight from storage, no barriers (CPU adapters)",
        default_on: &[AdapterClass::Cpu],
        needs: Needs::Nothing,
        f16_products: false,
        launch: |_, _, _, _| Launch::rows_override(REGISTERS, 16),
        iterations: loop_budget::registers_iterations,
    },
    TilingSpec {
        tiling: FusedTiling::Shared,
        name: "shared",
        about: "one query row per invocation, K/V tiles in 16 KiB of workgroup memory (GPUs; CPU adapters in a browser)",
        // The fastest non-tensor-core tiling measured on a GPU (an NVIDIA H200: 7.2, 5.5
        // and 1.9 TFLOP/s at D 64, 128 and 256 against blocked's 3.9, 3.2 and 1.4;
        // docs/design.md, "Measured on a GPU").
        default_on: &[AdapterClass::Gpu, AdapterClass::BrowserCpu],
        needs: Needs::WorkgroupBytes(SHARED_TILE_BYTES),
        f16_products: false,
        launch: |d, dv, caps, _| {
            // 64 rows per workgroup, each over `lanes` invocations.
            let (kernel, lanes) = shared_for(d, dv, caps);
            Launch {
                kernel,
                rows: 64,
                constants: vec![("ROWS", 64 * lanes)],
            }
        },
        iterations: loop_budget::shared_iterations,
    },
];

/// The coop variant for head dims (D, Dv) on an adapter: a tuning table's pick for it
/// ([`crate::kernels::tune`]) where one fits, else the first of [`COOP_VARIANTS`] that fits
/// (the narrowest of the class where none does; the needs check refuses that case).
pub fn coop_variant_for(d: u32, dv: u32, caps: &Capabilities, policy: &Policy) -> CoopVariant {
    let sg = caps.coop_subgroup_size().unwrap_or(32);
    let fits = |v: &CoopVariant| {
        v.dmax >= d.max(dv)
            && v.valid_for(sg)
            && v.bytes_needed() <= caps.max_workgroup_storage
            && v.invocations(sg) <= caps.max_invocations
    };
    policy
        .tuned_coop(d.max(dv))
        .filter(fits)
        .or_else(|| coop_for(d, dv, caps.max_workgroup_storage).filter(fits))
        .or_else(|| {
            COOP_VARIANTS
                .iter()
                .copied()
                .filter(|v| v.dmax >= d.max(dv))
                .min_by_key(|v| (v.dmax, v.workgroup_bytes()))
        })
        .unwrap_or(COOP_VARIANTS[5])
}

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

/// A tiling by the name users type (`"shared".parse::<FusedTiling>()`): `auto` or a
/// registry name, case-insensitively; the error names `tiling`.
impl std::str::FromStr for FusedTiling {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        parse_tiling("tiling", name)
    }
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
                    feature: "EXPERIMENTAL_COOPERATIVE_MATRIX (16x16x16 f16->f32, f16, a fixed subgroup size, SUBGROUP_BARRIER)",
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
    pub fn rows(&self, s: &AttentionShape, caps: &Capabilities, policy: &Policy) -> usize {
        (self.spec().launch)(s.head_dim as u32, s.head_dim_v as u32, caps, policy).rows as usize
    }
}
