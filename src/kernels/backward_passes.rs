//! The backward's kernels that give each pass one kind of invocation (docs/design.md,
//! "Backward"): `D = rowsum(dO ∘ O)`, then dQ with one query row per invocation and
//! dK/dV with one key per invocation (`flash_backward.wgsl`, the `rows` tiling: run-time
//! loops on CPU adapters, a head-dim class of constant register arrays on GPUs), the
//! materialized backward's three passes (`backward_materialized.wgsl`), and the CPU
//! adapters' subgroup tiling (`flash_backward_subgroup.wgsl`). `crate::backward` picks
//! among these and the blocked, texel and coop tilings and encodes them.

use crate::gpu::Capabilities;
use crate::gpu::Text;
use crate::kernels::{
    Kernel, Slot, BACKWARD_PRELUDE, BACKWARD_ROWS_128, BACKWARD_ROWS_128_WG, BACKWARD_ROWS_256, BACKWARD_ROWS_256_WG,
    BACKWARD_ROWS_32, BACKWARD_ROWS_64, BACKWARD_ROWS_64_WG, BACKWARD_ROWS_PRELUDE, BACKWARD_SUBGROUP_128,
    BACKWARD_SUBGROUP_64,
};

const SOURCE: &str = include_str!("../../shaders/flash_backward.wgsl");

const fn backward_kernel(entry: &'static str, slots: &'static [Slot]) -> Kernel {
    rows_kernel(entry, slots, BACKWARD_ROWS_PRELUDE, "")
}

const fn rows_kernel(
    entry: &'static str,
    slots: &'static [Slot],
    preludes: &'static [&'static str],
    variant: &'static str,
) -> Kernel {
    pass_kernel(("flash_backward.wgsl", SOURCE), entry, slots, preludes, variant)
}

/// A backward pass's kernel: an entry point of a file (its name and text), with the
/// preludes and variant label of its class.
const fn pass_kernel(
    (file, source): (&'static str, &'static str),
    entry: &'static str,
    slots: &'static [Slot],
    preludes: &'static [&'static str],
    variant: &'static str,
) -> Kernel {
    Kernel {
        file,
        source: Text::Static(source),
        entry,
        slots,
        preludes,
        variant: Text::Static(variant),
    }
}

/// The `rows` passes of a head-dim class on GPUs ([`rows_for`]).
const fn rows_class(preludes: &'static [&'static str], variant: &'static str) -> PassKernels {
    PassKernels {
        dq: rows_kernel("bwd_dq", DQ_SLOTS, preludes, variant),
        dkdv: rows_kernel("bwd_dkdv", DKDV_SLOTS, preludes, variant),
    }
}

/// `rows`' head-dim classes: each lane of a row (key) holds a constant 8 vec4s of
/// each of its arrays, in registers on a GPU; 1, 2, 4 and 8 lanes per row (key).
pub const ROWS_32: PassKernels = rows_class(BACKWARD_ROWS_32, "[32]");
/// [`ROWS_32`]'s class up to D 64: two lanes per row (key).
pub const ROWS_64: PassKernels = rows_class(BACKWARD_ROWS_64, "[64]");
/// Up to D 128: four lanes per row (key).
pub const ROWS_128: PassKernels = rows_class(BACKWARD_ROWS_128, "[128]");
/// Up to D 256: eight lanes per row (key).
pub const ROWS_256: PassKernels = rows_class(BACKWARD_ROWS_256, "[256]");
/// [`ROWS_64`], [`ROWS_128`] and [`ROWS_256`] on GPUs without subgroups: the lanes'
/// partial sums through workgroup memory.
pub const ROWS_64_WG: PassKernels = rows_class(BACKWARD_ROWS_64_WG, "[64 wg]");
/// [`ROWS_128`] without subgroups.
pub const ROWS_128_WG: PassKernels = rows_class(BACKWARD_ROWS_128_WG, "[128 wg]");
/// [`ROWS_256`] without subgroups.
pub const ROWS_256_WG: PassKernels = rows_class(BACKWARD_ROWS_256_WG, "[256 wg]");

/// The `rows` passes for head dims up to `dims` on an adapter, and the lanes per row
/// (key). On a GPU, the head-dim class (its lanes' sums through workgroup memory where
/// the subgroups cannot take them); on CPU adapters the run-time kernels, whose loops
/// walk only the head dims (a register file buys a CPU nothing).
pub fn rows_for(dims: usize, caps: &Capabilities) -> (PassKernels, u32) {
    if caps.cpu {
        return (PassKernels { dq: DQ, dkdv: DKDV }, 1);
    }
    let lanes_fit = |lanes: u32| caps.subgroups.is_some_and(|(min, _)| min >= lanes);
    let (shuffled, in_workgroup, lanes) = match dims {
        0..=32 => return (ROWS_32, 1),
        33..=64 => (ROWS_64, ROWS_64_WG, 2),
        65..=128 => (ROWS_128, ROWS_128_WG, 4),
        _ => (ROWS_256, ROWS_256_WG, 8),
    };
    (if lanes_fit(lanes) { shuffled } else { in_workgroup }, lanes)
}

/// `D_i = dO_i · O_i`.
pub const DELTA: Kernel = backward_kernel("bwd_delta", &[Slot::Params, Slot::Scores, Slot::DOut, Slot::ForwardOut]);
pub(crate) const DQ_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
    Slot::Lse,
    Slot::DOut,
    Slot::DQ,
];
pub(crate) const DKDV_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
    Slot::Lse,
    Slot::DOut,
    Slot::DK,
    Slot::DV,
];
/// dQ: one query row per invocation.
pub const DQ: Kernel = backward_kernel("bwd_dq", DQ_SLOTS);
/// dK and dV: one key per invocation.
pub const DKDV: Kernel = backward_kernel("bwd_dkdv", DKDV_SLOTS);

const MATERIALIZED_SOURCE: &str = include_str!("../../shaders/backward_materialized.wgsl");

const fn materialized_kernel(entry: &'static str, slots: &'static [Slot]) -> Kernel {
    pass_kernel(
        ("backward_materialized.wgsl", MATERIALIZED_SOURCE),
        entry,
        slots,
        BACKWARD_PRELUDE,
        "",
    )
}

/// The materialized backward's dX matrix, from the forward's weights.
pub const MAT_DS: Kernel = materialized_kernel(
    "bwd_mat_ds",
    &[
        Slot::Params,
        Slot::Q,
        Slot::K,
        Slot::V,
        Slot::SideWords,
        Slot::Scores,
        Slot::DOut,
        Slot::Probs,
        Slot::DScores,
    ],
);
/// Its dQ, one query row per invocation.
pub const MAT_DQ: Kernel = materialized_kernel(
    "bwd_mat_dq",
    &[Slot::Params, Slot::K, Slot::SideWords, Slot::DScores, Slot::DQ],
);
/// Its dK and dV, one key per invocation.
pub const MAT_DKDV: Kernel = materialized_kernel(
    "bwd_mat_dkdv",
    &[
        Slot::Params,
        Slot::Q,
        Slot::SideWords,
        Slot::DOut,
        Slot::Probs,
        Slot::DScores,
        Slot::DK,
        Slot::DV,
    ],
);

/// The dQ and dK/dV kernels of one backward tiling.
#[derive(Clone, Debug)]
pub struct PassKernels {
    /// The dQ pass: one query row (its lanes) per invocation.
    pub dq: Kernel,
    /// The dK/dV pass: one key (its lanes) per invocation.
    pub dkdv: Kernel,
}

const SUBGROUP_SOURCE: &str = include_str!("../../shaders/flash_backward_subgroup.wgsl");

const fn subgroup_kernel(
    entry: &'static str,
    slots: &'static [Slot],
    preludes: &'static [&'static str],
    variant: &'static str,
) -> Kernel {
    pass_kernel(
        ("flash_backward_subgroup.wgsl", SUBGROUP_SOURCE),
        entry,
        slots,
        preludes,
        variant,
    )
}

/// The CPU-adapter tiling (`flash_backward_subgroup.wgsl`: subgroups of at least 8
/// lanes, 4 owned rows per invocation) for head dims up to 64: the owned rows and the
/// accumulators in 32 KiB of workgroup memory.
pub const SUBGROUP_64: PassKernels = PassKernels {
    dq: subgroup_kernel("bwd_dq_subgroup", DQ_SLOTS, BACKWARD_SUBGROUP_64, "[64]"),
    dkdv: subgroup_kernel("bwd_dkdv_subgroup", DKDV_SLOTS, BACKWARD_SUBGROUP_64, "[64]"),
};
/// The same up to 128: the accumulators in workgroup memory, the owned rows read from
/// their buffers at every block.
pub const SUBGROUP_128: PassKernels = PassKernels {
    dq: subgroup_kernel("bwd_dq_subgroup", DQ_SLOTS, BACKWARD_SUBGROUP_128, "[128]"),
    dkdv: subgroup_kernel("bwd_dkdv_subgroup", DKDV_SLOTS, BACKWARD_SUBGROUP_128, "[128]"),
};

/// The backward's delta, run-time and head-dim-class rows, materialized and subgroup kernels (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    let passes = [
        ROWS_32,
        ROWS_64,
        ROWS_128,
        ROWS_256,
        ROWS_64_WG,
        ROWS_128_WG,
        ROWS_256_WG,
        SUBGROUP_64,
        SUBGROUP_128,
    ];
    [DELTA, MAT_DS, MAT_DQ, MAT_DKDV, DQ, DKDV]
        .into_iter()
        .chain(passes.into_iter().flat_map(|p| [p.dq, p.dkdv]))
        .collect()
}
