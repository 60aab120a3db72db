//! The fused kernels' variants: the WGSL source, its bindings, and each variant's
//! preludes and workgroup-memory needs (registers, shared, subgroup, blocked, coop).

use super::super::{Kernel, Slot, COMMON};
use crate::context::Capabilities;

pub(super) const SOURCE: &str = include_str!("../../../shaders/flash_attention.wgsl");
pub(super) const SLOTS: &[Slot] = &[
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
    preludes: super::super::FLASH_PRELUDE,
    variant: "",
};

/// K/V tiles staged in 16 KiB of workgroup memory, one query row per invocation.
pub const SHARED: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_shared",
    slots: SLOTS,
    preludes: super::super::FLASH_PRELUDE,
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
        source: include_str!("../../../shaders/flash_subgroup.wgsl"),
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

/// One variant of the blocked tiling (`flash_blocked.wgsl`): head dims
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
            include_str!("../../../shaders/flash_blocked.wgsl"),
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
