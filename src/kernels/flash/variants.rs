//! The fused kernels' variants: the WGSL source, its bindings, and each variant's
//! preludes and workgroup-memory needs (registers, shared, subgroup, blocked, coop).

use super::super::{Kernel, Slot, COMMON, SUBGROUP_QUADS};
use crate::gpu::Capabilities;
use crate::gpu::Text;
use crate::kernels::policy::Policy;

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
    source: Text::Static(SOURCE),
    entry: "flash_registers",
    slots: SLOTS,
    preludes: super::super::FLASH_PRELUDE,
    variant: Text::Static(""),
};

/// K/V tiles staged in 16 KiB of workgroup memory, one query row per invocation, head
/// dims up to 256 (its row's state in scratch memory on a GPU: docs/isa.md).
pub const SHARED: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: Text::Static(SOURCE),
    entry: "flash_shared",
    slots: SLOTS,
    preludes: super::super::FLASH_PRELUDE,
    variant: Text::Static(""),
};

/// [`SHARED`] for head dims up to 64: its row loops run to a constant, so the row's
/// state stays in registers ([`super::super::FLASH_PRELUDE_64`]).
pub const SHARED_64: Kernel = Kernel {
    preludes: super::super::FLASH_PRELUDE_64,
    variant: Text::Static("[64]"),
    ..SHARED
};

/// [`SHARED`] for head dims up to 128 and 256 on GPUs with subgroups: each row split
/// over 2 and 4 lanes ([`super::super::FLASH_PRELUDE_128`]), each lane's share of the
/// row's state in registers.
pub const SHARED_128: Kernel = Kernel {
    preludes: super::super::FLASH_PRELUDE_128,
    variant: Text::Static("[128]"),
    ..SHARED
};
/// [`SHARED_128`]'s split for head dims up to 256: four lanes per row.
pub const SHARED_256: Kernel = Kernel {
    preludes: super::super::FLASH_PRELUDE_256,
    variant: Text::Static("[256]"),
    ..SHARED
};

/// [`SHARED_128`] and [`SHARED_256`] on GPUs without subgroups (WebGPU without the
/// `subgroups` feature, GL): the lanes' partial sums through workgroup memory, taken
/// from the K/V tile ([`super::super::FLASH_PRELUDE_128_WG`]; 4 KiB at 256, so 4 keys
/// per tile instead of 8).
pub const SHARED_128_WG: Kernel = Kernel {
    preludes: super::super::FLASH_PRELUDE_128_WG,
    variant: Text::Static("[128 wg]"),
    ..SHARED
};
/// [`SHARED_128_WG`]'s split for head dims up to 256: four lanes per row.
pub const SHARED_256_WG: Kernel = Kernel {
    preludes: super::super::FLASH_PRELUDE_256_WG,
    variant: Text::Static("[256 wg]"),
    ..SHARED
};

/// The `shared` variant for head dims (D, Dv) on an adapter, and its lanes per query
/// row. On a GPU, the head-dim classes keep the row's state in registers: D ≤ 64 one
/// lane per row, 128 and 256 two and four (subgroup shuffles; through workgroup memory
/// where the subgroups cannot take them: RDNA3 compiles either without scratch,
/// docs/isa.md). CPU adapters run the run-time
/// head-dim kernel: the class's constant 16 vec4s per row cost lavapipe 1.8x at
/// D 32, and a CPU's register file buys nothing. (A D ≤ 128 class with Q in workgroup
/// memory kept its accumulator in scratch under wgpu's bounds checks and ran one wave
/// per SIMD: docs/isa.md.)
pub fn shared_for(d: u32, dv: u32, caps: &Capabilities) -> (Kernel, u32) {
    let lanes_fit = |lanes: u32| caps.subgroups.is_some_and(|(min, _)| min >= lanes);
    match d.max(dv) {
        _ if caps.cpu => (SHARED, 1),
        0..=64 => (SHARED_64, 1),
        65..=128 if lanes_fit(2) => (SHARED_128, 2),
        65..=128 => (SHARED_128_WG, 2),
        129..=256 if lanes_fit(4) => (SHARED_256, 4),
        129..=256 => (SHARED_256_WG, 4),
        _ => (SHARED, 1),
    }
}

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
        SUBGROUP_QUADS,
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
        SUBGROUP_QUADS,
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
        SUBGROUP_QUADS,
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
        SUBGROUP_QUADS,
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
        SUBGROUP_QUADS,
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
        SUBGROUP_QUADS,
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
        source: Text::Static(include_str!("../../../shaders/flash_subgroup.wgsl")),
        entry: "flash_subgroup",
        slots: SLOTS,
        preludes,
        variant: Text::Static(variant),
    }
}

/// Lanes `flash_subgroup.wgsl` needs in a subgroup.
pub const SUBGROUP_LANES: u32 = 8;

/// Workgroup memory the shared tiling declares.
pub const SHARED_TILE_BYTES: u32 = 16 * 1024;

/// One variant of the blocked tiling (`flash_blocked.wgsl`): head dims
/// up to `dmax`, `br` query rows per workgroup and `bc` keys per tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockVariant {
    pub dmax: u32,
    pub br: u32,
    pub bc: u32,
    /// Workgroup memory the variant declares, mirroring its WGSL (a test compares this
    /// with naga's layout of the module).
    pub workgroup_bytes: u32,
    pub kernel: Kernel,
}

/// `flash_blocked.wgsl`'s workgroup memory, mirroring its declarations: the Q tile and the
/// K tile with rows padded to an odd count of vec4s, the V tile (`split`; else one
/// vec4: V shares the K tile), the probabilities (BR rows of `ps` vec4s: BC / 4 and
/// padding), the partial row maxima (BR rows of `pms` f32) and one rescale factor per
/// row.
pub const fn blocked_bytes(dmax: u32, br: u32, bc: u32, split: bool, ps: u32, pms: u32) -> u32 {
    let d4 = dmax / 4;
    let v_tile = if split { 16 * bc * d4 } else { 16 };
    16 * br * (d4 + 1) + 16 * bc * (d4 + 1) + v_tile + 16 * br * ps + 4 * br * pms + 4 * br
}

/// The bindings of the blocked kernels that read K and V as 16-byte words: K and V
/// through their `array<vec4<u32>>` views only (eight storage buffers at most, WebGPU's
/// default limit).
pub(super) const WORD_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K4,
    Slot::V4,
    Slot::Output,
    Slot::Mask,
    Slot::SideWords,
    Slot::Lse,
];

/// How `flash_blocked.wgsl` reads four elements of a K or V row (`kv_quad`): element by
/// element, zero past `len` (any head dim and stride).
const KV_ELEMENTS: &str = "fn kv_quad(is_k: bool, row: u32, t: u32, len: u32) -> vec4<f32> {
    return load4(is_k, row, t, len);
}
";

/// The same as one 16-byte load, from K and V bound again as words (`k4`, `v4`), where
/// the host found every quad to lie inside one word of a buffer of whole words: head
/// dims and strides multiples of 4 elements (an f16 quad is half a word).
const KV_WORDS: &str = "@group(0) @binding(9) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> v4: array<vec4<u32>>;
fn kv_quad(is_k: bool, row: u32, t: u32, len: u32) -> vec4<f32> {
    let e = row + 4u * t;
    let at = e / (4u * ELEMS_PER_WORD);
    var w: vec4<u32>;
    if is_k {
        w = k4[at];
    } else {
        w = v4[at];
    }
    if ELEMS_PER_WORD == 1u {
        return bitcast<vec4<f32>>(w);
    }
    let h = select(w.xy, w.zw, (e / 4u) % 2u == 1u);
    return vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
}
";

/// One variant of the blocked tiling: its launch shape and memory ([`BlockVariant`],
/// reading K and V element by element), its twin reading them as 16-byte words, and the
/// layout constants beyond the tile (`split`: K and V have tiles of their own; `pms`:
/// f32 per row of the partial maxima, padded against bank conflicts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedVariant {
    pub variant: BlockVariant,
    pub words: Kernel,
    pub split: bool,
    pub mrs: u32,
    pub mro: u32,
    pub ps: u32,
    pub pms: u32,
}

macro_rules! blocked_variant {
    ($dmax:literal, $br:literal, $bc:literal, $split:literal, $mrs:literal, $mro:literal, $ps:literal, $pms:literal, $label:literal) => {{
        const CONSTS: &str = concat!(
            "const DMAX: u32 = ",
            $dmax,
            "u;\nconst BR: u32 = ",
            $br,
            "u;\nconst BC: u32 = ",
            $bc,
            "u;\nconst SPLIT: bool = ",
            $split,
            ";\nconst MRS: u32 = ",
            $mrs,
            "u;\nconst MRO: u32 = ",
            $mro,
            "u;\nconst PS: u32 = ",
            $ps,
            "u;\nconst PMS: u32 = ",
            $pms,
            "u;\n"
        );
        const SOURCE: &str = include_str!("../../../shaders/flash_blocked.wgsl");
        BlockedVariant {
            variant: BlockVariant {
                dmax: $dmax,
                br: $br,
                bc: $bc,
                workgroup_bytes: blocked_bytes($dmax, $br, $bc, $split, $ps, $pms),
                kernel: Kernel {
                    file: "flash_blocked.wgsl",
                    source: Text::Static(SOURCE),
                    entry: "flash_blocked",
                    slots: SLOTS,
                    preludes: &[COMMON, CONSTS, KV_ELEMENTS],
                    variant: Text::Static(concat!("[", $label, "]")),
                },
            },
            words: Kernel {
                file: "flash_blocked.wgsl",
                source: Text::Static(SOURCE),
                entry: "flash_blocked",
                slots: WORD_SLOTS,
                preludes: &[COMMON, CONSTS, KV_WORDS],
                variant: Text::Static(concat!("[", $label, " words]")),
            },
            split: $split,
            mrs: $mrs,
            mro: $mro,
            ps: $ps,
            pms: $pms,
        }
    }};
}

/// The variants of the GPU tiling, by head-dim class; within a class the first that
/// fits the adapter's workgroup memory is used. 128 invocations each (the mappings are
/// in `flash_blocked.wgsl`): (DMAX, BR, BC, K and V in tiles of their own, rows per
/// score invocation, rows per output invocation, vec4s per row of `probs`, f32 per row
/// of `pmax`). The first of the 64, 128 and 256 classes wants 48 KiB (NVIDIA) and keeps
/// every invocation busy; the others fit 32 KiB (lavapipe, llvmpipe, most GPUs) and
/// give fewer invocations 4-row register tiles: on llvmpipe GL, (1,8,1024,64) f32 ran
/// 1.3x faster with 64x32x32 so than with 2 rows each, and 64x64x16 faster again
/// (fewer K and V loads per row). The D <= 32 class runs the 48 KiB D <= 64 variant's
/// mappings in 32 KiB (so lavapipe tests them). Paddings: see the bank-conflict test.
pub const BLOCKED: [BlockedVariant; 7] = [
    blocked_variant!(32, 64, 32, true, 4, 4, 8, 10, "32x64x32"),
    blocked_variant!(64, 64, 32, true, 4, 4, 8, 10, "64x64x32"),
    blocked_variant!(64, 64, 16, true, 4, 4, 5, 5, "64x64x16"),
    blocked_variant!(128, 32, 16, true, 1, 2, 4, 4, "128x32x16"),
    blocked_variant!(128, 32, 16, false, 4, 4, 5, 5, "128x32x16 shared"),
    blocked_variant!(256, 16, 8, true, 1, 1, 2, 2, "256x16x8"),
    blocked_variant!(256, 16, 8, false, 2, 2, 3, 3, "256x16x8 shared"),
];

/// [`BLOCKED`]'s launch shapes, in its order.
pub static BLOCKED_VARIANTS: std::sync::LazyLock<[BlockVariant; 7]> =
    std::sync::LazyLock::new(|| BLOCKED.map(|b| b.variant));

/// Workgroup memory the blocked tiling needs for every head dim: the largest of the
/// smallest variant of each class.
pub const BLOCKED_MIN_BYTES: u32 = 32_512;

/// The twin of a blocked or micro-tile kernel that reads K and V as 16-byte words
/// (`None` for any other kernel).
pub fn blocked_words(kernel: &Kernel) -> Option<Kernel> {
    let blocked = BLOCKED
        .iter()
        .find(|v| v.variant.kernel == *kernel)
        .map(|v| v.words.clone());
    blocked.or_else(|| MICRO.iter().find(|v| v.kernel == *kernel).map(|v| v.words.clone()))
}

/// The variant of `variants` for head dims `d`, `dv` on an adapter granting `bytes` of
/// workgroup memory: the smallest head-dim class that holds both, and in it the first
/// variant that fits.
pub fn variant_for(variants: &[BlockVariant], d: u32, dv: u32, bytes: u32) -> Option<BlockVariant> {
    let need = d.max(dv);
    let class = variants.iter().map(|v| v.dmax).find(|&dmax| need <= dmax)?;
    variants
        .iter()
        .find(|v| v.dmax == class && v.workgroup_bytes <= bytes)
        .cloned()
}

/// The blocked variant for head dims `d`, `dv` on an adapter granting `bytes`.
pub fn blocked_for(d: u32, dv: u32, bytes: u32) -> Option<BlockVariant> {
    variant_for(&*BLOCKED_VARIANTS, d, dv, bytes)
}

/// One variant of the f32 micro-tile tiling (`flash_micro.wgsl`): head dims up to
/// `dmax` (64, 128 or 256) and `lanes`, the lanes over which a row's maximum and sum
/// are reduced by subgroup shuffles (1: through workgroup memory only; 8 or 16: the
/// adapter's subgroups hold at least that many). Each comes with a twin that reads K
/// and V as 16-byte words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MicroVariant {
    pub dmax: u32,
    pub lanes: u32,
    pub kernel: Kernel,
    pub words: Kernel,
}

/// Workgroup memory every micro-tile variant declares: two 8 KiB halves of slabs and the
/// 64 x 64 f32 probability tile (a test compares this with naga's layout).
pub const MICRO_BYTES: u32 = 2 * 512 * 16 + 64 * 64 * 4;

/// Query rows per workgroup of the micro-tile tiling.
pub const MICRO_ROWS: u32 = 64;

/// `flash_micro.wgsl`'s reductions of a row's maximum and sum over its owners' lanes:
/// none (every partial through workgroup memory) ...
const LANES_NONE: &str = "fn lanes_max(x: vec4<f32>) -> vec4<f32> { return x; }
fn lanes_sum(x: vec4<f32>) -> vec4<f32> { return x; }
";
/// ... or subgroup shuffles over RL aligned lanes (8 or 16).
const LANES_SHUFFLE: &str = "fn lanes_max(x: vec4<f32>) -> vec4<f32> {
    var r = max(x, subgroupShuffleXor(x, 1u));
    r = max(r, subgroupShuffleXor(r, 2u));
    r = max(r, subgroupShuffleXor(r, 4u));
    if RL > 8u {
        r = max(r, subgroupShuffleXor(r, 8u));
    }
    return r;
}
fn lanes_sum(x: vec4<f32>) -> vec4<f32> {
    var r = x + subgroupShuffleXor(x, 1u);
    r += subgroupShuffleXor(r, 2u);
    r += subgroupShuffleXor(r, 4u);
    if RL > 8u {
        r += subgroupShuffleXor(r, 8u);
    }
    return r;
}
";

macro_rules! micro_variant {
    ($dmax:literal, $rl:literal, $lanes:expr) => {{
        const CONSTS: &str = concat!("const DMAX: u32 = ", $dmax, "u;\nconst RL: u32 = ", $rl, "u;\n");
        const SOURCE: &str = include_str!("../../../shaders/flash_micro.wgsl");
        MicroVariant {
            dmax: $dmax,
            lanes: $rl,
            kernel: Kernel {
                file: "flash_micro.wgsl",
                source: Text::Static(SOURCE),
                entry: "flash_micro",
                slots: SLOTS,
                preludes: &[COMMON, CONSTS, $lanes, KV_ELEMENTS],
                variant: Text::Static(concat!("[", $dmax, " lanes ", $rl, "]")),
            },
            words: Kernel {
                file: "flash_micro.wgsl",
                source: Text::Static(SOURCE),
                entry: "flash_micro",
                slots: WORD_SLOTS,
                preludes: &[COMMON, CONSTS, $lanes, KV_WORDS],
                variant: Text::Static(concat!("[", $dmax, " lanes ", $rl, " words]")),
            },
        }
    }};
}

/// Every micro-tile variant: head-dim classes 64, 128 and 256, each reducing over 1, 8
/// or 16 lanes.
pub const MICRO: [MicroVariant; 9] = [
    micro_variant!(64, 1, LANES_NONE),
    micro_variant!(64, 8, LANES_SHUFFLE),
    micro_variant!(64, 16, LANES_SHUFFLE),
    micro_variant!(128, 1, LANES_NONE),
    micro_variant!(128, 8, LANES_SHUFFLE),
    micro_variant!(128, 16, LANES_SHUFFLE),
    micro_variant!(256, 1, LANES_NONE),
    micro_variant!(256, 8, LANES_SHUFFLE),
    micro_variant!(256, 16, LANES_SHUFFLE),
];

/// The lanes a micro-tile variant may reduce over on an adapter: the most of 16, 8 and
/// 1 that its smallest subgroup holds (a pinned count where the adapter allows it:
/// `Policy::micro_lanes`, set by `tune`).
pub fn micro_lanes(caps: &Capabilities, policy: &Policy) -> u32 {
    let most = match caps.subgroups {
        Some((min, _)) if min >= 16 => 16,
        Some((min, _)) if min >= 8 => 8,
        _ => 1,
    };
    policy
        .micro_lanes
        .filter(|&l| l <= most && matches!(l, 1 | 8 | 16))
        .unwrap_or(most)
}

/// The micro-tile variant for head dims `d`, `dv` reducing over `lanes` (the smallest
/// class that holds both; `None` past 256).
pub fn micro_for(d: u32, dv: u32, lanes: u32) -> Option<MicroVariant> {
    let need = d.max(dv);
    MICRO.iter().find(|v| need <= v.dmax && v.lanes == lanes).cloned()
}
