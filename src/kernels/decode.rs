//! Split-K decode (`shaders/flash_decode.wgsl`): attention for few query rows against
//! many keys. The key range of each (batch, kv head) is cut into splits walked by
//! separate workgroups, each writing normalised partial rows and their log-sum-exp;
//! a combine pass merges them (docs/design.md, "Decode"). Three designs of the split
//! pass: [`DecodeDesign`].

use super::kv_texels::TexelGrid;
use super::{dispatch_entries, loop_budget, pipeline, AttentionBindings, Kernel, Slot, Text, COMMON};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::policy::Policy;
use crate::options::FusedTiling;
use crate::problem::AttentionShape;
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../shaders/flash_decode.wgsl");
const SUBGROUP_SOURCE: &str = include_str!("../../shaders/flash_decode_subgroup.wgsl");
const LANES_SOURCE: &str = include_str!("../../shaders/flash_decode_lanes.wgsl");
const DECODE_COMMON: &str = include_str!("../../shaders/decode_common.wgsl");
/// Scoring against Q rows staged in workgroup memory (the tiles and subgroup designs).
const DECODE_SCORES: &str = include_str!("../../shaders/decode_scores.wgsl");
/// How the subgroup design reads K and V: from their buffers, or from a KV cache's
/// texel mirror (`kernels::kv_texels`).
const KV_BUFFERS: &str = include_str!("../../shaders/decode_kv_buffers.wgsl");
const KV_TEXELS: &str = include_str!("../../shaders/decode_kv_texels.wgsl");
/// How the lanes design turns K and V words into elements: of the attention's dtype, or
/// int8 codes with a scale per row (an int8 KV cache, `crate::quantized_kv`).
const LANES_FLOAT: &str = include_str!("../../shaders/decode_lanes_float.wgsl");
const LANES_INT8: &str = include_str!("../../shaders/decode_lanes_int8.wgsl");

/// How a split pass is arranged (docs/design.md, "Decode").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeDesign {
    /// `flash_decode.wgsl`: workgroups of 64 invocations, tiles of 64 keys staged in
    /// workgroup memory between barriers. GPUs, and CPU adapters without subgroups.
    Tiles,
    /// `flash_decode_subgroup.wgsl`: a workgroup is one subgroup of 8 invocations,
    /// blocks of 16 keys (two per lane), softmax by subgroup reductions, no barriers.
    /// CPU adapters with subgroups of at least 8 lanes (lavapipe).
    Subgroup,
    /// `flash_decode_lanes.wgsl`: a workgroup is one subgroup, in groups of 8 or 16
    /// lanes per key, each lane a share of the head dim in 16-byte words; no barrier
    /// and no workgroup memory in the key loop. GPUs with a fixed subgroup size of at
    /// least 8 (up to 64), for head dims up to 128 in whole words (else `Tiles` runs).
    Lanes,
}

/// The environment variable that pins the decode design: `auto`, `tiles`, `subgroup`
/// or `lanes` (read once per context, as `WGPU_ATTENTION_TILING`).
pub const DECODE_VAR: &str = "WGPU_ATTENTION_DECODE";

/// The largest head dim the `Lanes` design serves (a lane keeps its share of 4 Q rows
/// and 4 output rows in registers).
pub const LANES_MAX_HEAD_DIM: usize = 128;

/// Whether the subgroup design reads K and V of `dtype` 16 bytes at a time: both head
/// dims (so every row stride) a multiple of the elements in 16 bytes.
/// `KV_WIDE` of the subgroup design: 1 where K and V are read 16 bytes a load; 2 for
/// f16 head dims that are multiples of 4 but not 8, read 8 bytes (4 elements) a load
/// out of a 16-byte word, 1.25x faster than picking them out of two words on Mesa 25;
/// else 0. (8 bytes a load where 16 would do was 1.25-1.7x slower there.)
fn kv_wide(s: &AttentionShape, dtype: DType) -> u32 {
    if reads_wide(s, dtype) {
        1
    } else if dtype == DType::F16 && s.head_dim.is_multiple_of(4) && s.head_dim_v.is_multiple_of(4) {
        2
    } else {
        0
    }
}

fn reads_wide(s: &AttentionShape, dtype: DType) -> bool {
    let per_load = 16 / dtype.size();
    s.head_dim.is_multiple_of(per_load) && s.head_dim_v.is_multiple_of(per_load)
}

/// Whether the subgroup design walks its keys in one loop whose blocks each choose the
/// masked or the plain body (`ONE_KEY_LOOP`), rather than a masked loop and a plain one
/// (the body inlined twice). Mesa 25.0's lavapipe compiles the one loop in 2.3-3x
/// less time (the 8-row f16 kernel: 10.9-13.5 s to 3.9-5.9 s, cold) and runs it as fast;
/// Mesa 22.3's compiles either in under 2.6 s and runs the one loop 1.04-1.19x slower, so
/// Mesa 22 keeps two. Releases between were not measured and take the one loop, as
/// other drivers do (docs/design.md, "Decode").
pub fn one_key_loop(mesa_version: Option<(u32, u32)>) -> bool {
    !matches!(mesa_version, Some((major, _)) if major <= 22)
}

/// Lanes `flash_decode_subgroup.wgsl` needs in a subgroup.
pub const SUBGROUP_LANES: u32 = 8;

impl DecodeDesign {
    /// Every design, in the order `bench` and the docs name them.
    pub const ALL: [DecodeDesign; 3] = [DecodeDesign::Tiles, DecodeDesign::Subgroup, DecodeDesign::Lanes];

    /// Parses a design's name; `auto` is `None`.
    pub fn parse(name: &str) -> std::result::Result<Option<DecodeDesign>, String> {
        match name.trim() {
            "auto" => Ok(None),
            name => Self::ALL
                .into_iter()
                .find(|d| d.name() == name)
                .map(Some)
                .ok_or_else(|| format!("'{name}' is not one of auto, tiles, subgroup, lanes")),
        }
    }

    /// [`DECODE_VAR`], parsed (`None` where unset or `auto`).
    pub(crate) fn from_env() -> std::result::Result<Option<DecodeDesign>, String> {
        match std::env::var(DECODE_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err("not valid UTF-8".into()),
            Ok(name) => Self::parse(&name),
        }
    }

    /// The design for a context. A fused tiling asked for (`tiling`, else
    /// `WGPU_ATTENTION_TILING`) decides first: `subgroup` takes `Subgroup` (refused
    /// without 8-lane subgroups), any other `Tiles`. Else one pinned by [`DECODE_VAR`]
    /// or [`crate::Context::use_decode_design`]; else `Subgroup` on CPU adapters with 8-lane
    /// subgroups, `Lanes` on GPUs with a fixed subgroup size of 8 to 64, else `Tiles`.
    pub fn for_context(ctx: &Gpu, policy: &Policy, tiling: FusedTiling) -> Result<DecodeDesign> {
        let lanes_ok = ctx
            .capabilities()
            .subgroups
            .is_some_and(|(min, _)| min >= SUBGROUP_LANES);
        let missing = |feature: &'static str, design: DecodeDesign| Error::MissingFeature {
            adapter: ctx.adapter_info().name.clone(),
            feature,
            needed_for: format!("{} split-K decode", design.name()),
        };
        let tiling = match tiling {
            FusedTiling::Auto => policy.tiling()?,
            asked => asked,
        };
        // A pinned design stands in for the adapter's pick, not for a tiling asked for.
        match policy.decode_design()? {
            _ if tiling != FusedTiling::Auto => {}
            Some(DecodeDesign::Subgroup) if !lanes_ok => {
                return Err(missing("SUBGROUP (with at least 8 lanes)", DecodeDesign::Subgroup))
            }
            Some(DecodeDesign::Lanes) if lanes_subgroup(ctx).is_none() => {
                return Err(missing(
                    "SUBGROUP with a fixed subgroup size of 8 to 64 lanes",
                    DecodeDesign::Lanes,
                ))
            }
            Some(pinned) => return Ok(pinned),
            None => {}
        }
        match tiling {
            FusedTiling::Auto if ctx.is_cpu_adapter() && lanes_ok => Ok(DecodeDesign::Subgroup),
            FusedTiling::Auto if !ctx.is_cpu_adapter() && lanes_subgroup(ctx).is_some() => Ok(DecodeDesign::Lanes),
            FusedTiling::Auto => Ok(DecodeDesign::Tiles),
            FusedTiling::Subgroup if lanes_ok => Ok(DecodeDesign::Subgroup),
            FusedTiling::Subgroup => Err(Error::MissingFeature {
                adapter: ctx.adapter_info().name.clone(),
                feature: "SUBGROUP (with at least 8 lanes)",
                needed_for: "subgroup split-K decode".into(),
            }),
            _ => Ok(DecodeDesign::Tiles),
        }
    }

    /// The split kernel's override constants for a driver (`mesa_version`, as in
    /// [`crate::Capabilities::mesa_version`]): the subgroup design reads K and V 16
    /// bytes at a time (`KV_WIDE`) where every row starts on a multiple of that many
    /// bytes (the layouts make every K stride a multiple of D and every V stride one
    /// of Dv, a paged pool's too, so the head dims decide), and walks its keys in one
    /// loop or two ([`one_key_loop`]).
    pub fn constants(
        self,
        mesa_version: Option<(u32, u32)>,
        s: &AttentionShape,
        dtype: DType,
    ) -> Vec<(&'static str, u32)> {
        match self {
            DecodeDesign::Tiles | DecodeDesign::Lanes => Vec::new(),
            DecodeDesign::Subgroup => vec![
                ("KV_WIDE", kv_wide(s, dtype)),
                ("ONE_KEY_LOOP", u32::from(one_key_loop(mesa_version))),
            ],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DecodeDesign::Tiles => "tiles",
            DecodeDesign::Subgroup => "subgroup",
            DecodeDesign::Lanes => "lanes",
        }
    }

    fn variants(self) -> &'static [SplitVariant; 2] {
        match self {
            DecodeDesign::Tiles | DecodeDesign::Lanes => &SPLIT_VARIANTS,
            DecodeDesign::Subgroup => &SUBGROUP_SPLIT_VARIANTS,
        }
    }

    /// The split kernel for a problem: the smallest row block that holds one kv head's
    /// rows, else the widest (`Lanes` kernels are generated: [`LanesVariant`]).
    pub fn variant_for(self, s: &AttentionShape) -> SplitVariant {
        smallest_holding(self.variants(), s)
    }

    /// Query rows one workgroup of the split pass owns.
    pub fn rows_per_block(self, s: &AttentionShape) -> usize {
        match self {
            DecodeDesign::Lanes => LANES_ROWS,
            _ => self.variant_for(s).rows,
        }
    }

    /// Loop iterations of one invocation walking `keys` keys in one split, for the
    /// 8-row variant (the 4-row one needs fewer). Every loop is counted with its exit
    /// check, the constant-trip ones too, and load4's and qload4's 4-trip tail loops
    /// as if they always ran wherever the kernel calls them (the subgroup design's
    /// reads of K and V have none).
    pub fn iterations(self, s: &AttentionShape, keys: usize) -> u64 {
        let d4 = (s.head_dim as u64).div_ceil(4);
        let tail = 4 + 1;
        match self {
            // Per tile of 64: the tile loop; the score loop over the head dim; the two
            // quads' mask loops; the quad's two softmax passes over 64 keys; the P·V
            // loop over 4 column slots of 64 keys. Around it: the Q load, the block
            // bounds, the accumulator clear, the log-sum-exp loop and the stores
            // (2 quads × 4 column slots × 4 rows).
            DecodeDesign::Tiles => {
                let tiles = (keys as u64).div_ceil(TILE as u64);
                let tile = TILE as u64;
                let per_tile = 1 + (d4 * (1 + tail) + 1) + 2 * (4 + 1) + 2 * (tile + 1) + (4 + 4 * (tile + 1) + 1);
                let stores = (2 + 1) + 2 * (4 + 1) + 2 * 4 * (4 + 1);
                let around = (8 * (1 + tail) + 1) + (8 + 1) + (4 + 1) + (4 + 1) + stores + 1;
                tiles * per_tile + around
            }
            // Per block of 16 keys: the block loop; the score loop over the head dim
            // (at most d4 trips of two K loads, none of which loops: 16-byte words, or
            // kv_quad's two words and selects); the loop over the lane's two keys times
            // two quads, each pair's mask loop over 4 rows; the loop over chunks of V (at
            // most one per 32 columns, sixteen V loads each). Around it: the Q load (8
            // rows × d4 vec4s over 8 lanes), the accumulator clear (2 × 32 slots), the
            // block bounds, the stores (a lane's slots × 2 quads × 4 rows) and the key
            // loops' exits and passes (the masked loop's two exits, the plain one's, the
            // two passes of the loop around them; `ONE_KEY_LOOP`'s one exit is fewer).
            // Lanes runs on GPUs, where no loop cap applies; under one (tests on
            // lavapipe) it is bounded as generously as the design it falls back to:
            // per key (a step walks several; counted as one each, generously), the step
            // loop, two load loops of up to 4 words,
            // the score and P·V loops (4 words of up to 8 elements), up to 4 shuffle
            // steps, mask_quad's row loop and the rescale loop over 32 elements; around
            // it the Q share (4 words × 2 vec4s × two loops of 4), the accumulator clear,
            // up to 4 merges of 32 elements and the stores (4 words × 8 elements × 4 rows).
            DecodeDesign::Lanes => {
                let steps = keys as u64;
                let per_step = 1 + 2 * 5 + 2 * (4 * 9 + 1) + 5 + 5 + 33;
                let around = 4 * 2 * 10 + 33 + 4 * 34 + 4 * 8 * 5 + 8;
                (steps * per_step + around).max(DecodeDesign::Tiles.iterations(s, keys))
            }
            DecodeDesign::Subgroup => {
                let blocks = (keys as u64).div_ceil(2 * u64::from(SUBGROUP_LANES));
                let chunks = (s.head_dim_v as u64).div_ceil(4 * u64::from(SUBGROUP_LANES));
                let per_block = 1 + (d4 + 1) + (2 * 2 * (1 + 4 + 1) + 1) + (chunks + 1);
                // A lane's slots: 4 per chunk of 32 columns, or 8 per chunk of 64 (f16
                // read 16 bytes at a time), whichever is more.
                let slots = (4 * chunks).max(8 * (s.head_dim_v as u64).div_ceil(64));
                let stores = slots * (1 + 2 * (1 + 4 + 1) + 1) + 1;
                let around = (d4 * (1 + tail) + 1) + (2 * 32 + 1) + (8 + 1) + stores + 5;
                blocks * per_block + around
            }
        }
    }
}

/// One split of the key range for a block of `rows` query rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitVariant {
    pub rows: usize,
    pub kernel: Kernel,
}

const fn split_variant(
    rows: usize,
    (file, source, entry): (&'static str, &'static str, &'static str),
    preludes: &'static [&'static str],
    variant: &'static str,
    slots: &'static [Slot],
) -> SplitVariant {
    SplitVariant {
        rows,
        kernel: Kernel {
            file,
            source: Text::Static(source),
            entry,
            slots,
            preludes,
            variant: Text::Static(variant),
        },
    }
}

const TILES_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
];
/// K and V through their 16-byte views only, read whole or element by element.
const SUBGROUP_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K4,
    Slot::V4,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
];
/// The same words from the texel mirror.
const SUBGROUP_TEXEL_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::KTexels,
    Slot::VTexels,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
];
const ROWS_4: &[&str] = &[COMMON, "const DEC_ROWS: u32 = 4u;\n", DECODE_COMMON, DECODE_SCORES];
const ROWS_8: &[&str] = &[COMMON, "const DEC_ROWS: u32 = 8u;\n", DECODE_COMMON, DECODE_SCORES];
const SUBGROUP_ROWS_4: &[&str] = &[
    COMMON,
    "const DEC_ROWS: u32 = 4u;\n",
    DECODE_COMMON,
    DECODE_SCORES,
    KV_BUFFERS,
];
const SUBGROUP_ROWS_8: &[&str] = &[
    COMMON,
    "const DEC_ROWS: u32 = 8u;\n",
    DECODE_COMMON,
    DECODE_SCORES,
    KV_BUFFERS,
];
const TEXEL_ROWS_4: &[&str] = &[
    COMMON,
    "const DEC_ROWS: u32 = 4u;\n",
    DECODE_COMMON,
    DECODE_SCORES,
    KV_TEXELS,
];
const TEXEL_ROWS_8: &[&str] = &[
    COMMON,
    "const DEC_ROWS: u32 = 8u;\n",
    DECODE_COMMON,
    DECODE_SCORES,
    KV_TEXELS,
];
const TILES_FILE: (&str, &str, &str) = ("flash_decode.wgsl", SOURCE, "decode_split");
const SUBGROUP_FILE: (&str, &str, &str) = ("flash_decode_subgroup.wgsl", SUBGROUP_SOURCE, "decode_split_subgroup");

/// Row-block sizes of the `Tiles` design, smallest first: 4 rows fit GQA groups of 4
/// at Lq = 1 (no lane computes a row that does not exist), 8 rows read K and V once
/// for more rows.
pub static SPLIT_VARIANTS: [SplitVariant; 2] = [
    split_variant(4, TILES_FILE, ROWS_4, "[4 rows]", TILES_SLOTS),
    split_variant(8, TILES_FILE, ROWS_8, "[8 rows]", TILES_SLOTS),
];

/// The same for the `Subgroup` design.
pub static SUBGROUP_SPLIT_VARIANTS: [SplitVariant; 2] = [
    split_variant(4, SUBGROUP_FILE, SUBGROUP_ROWS_4, "[4 rows]", SUBGROUP_SLOTS),
    split_variant(8, SUBGROUP_FILE, SUBGROUP_ROWS_8, "[8 rows]", SUBGROUP_SLOTS),
];

/// The `Subgroup` design reading K and V from a KV cache's texel mirror.
pub static SUBGROUP_TEXEL_SPLIT_VARIANTS: [SplitVariant; 2] = [
    split_variant(4, SUBGROUP_FILE, TEXEL_ROWS_4, "[4 rows, texels]", SUBGROUP_TEXEL_SLOTS),
    split_variant(8, SUBGROUP_FILE, TEXEL_ROWS_8, "[8 rows, texels]", SUBGROUP_TEXEL_SLOTS),
];

/// Merges the splits of each row into the output and the log-sum-exp (`DEC_ROWS` is
/// declared but unused there).
pub const COMBINE: Kernel = Kernel {
    file: "flash_decode.wgsl",
    source: Text::Static(SOURCE),
    entry: "decode_combine",
    slots: &[Slot::Params, Slot::Output, Slot::Scores, Slot::Lse],
    preludes: ROWS_4,
    variant: Text::Static(""),
};

/// Keys per tile (`DEC_TILE`) and lanes per workgroup.
pub const TILE: usize = 64;
const LANES: usize = 64;

/// Splits are no shorter than this many keys: below it the combine pass and the
/// partials cost more than the parallelism gains.
const MIN_SPLIT_KEYS: usize = 256;

/// How the key range is split for one problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeSplit {
    /// How each split pass is arranged.
    pub design: DecodeDesign,
    /// Keys `0 .. keys` are split (the params' `key_stop`).
    pub keys: usize,
    pub splits: usize,
    /// Keys per split, whole tiles; the last split may be shorter or empty.
    pub split_keys: usize,
}

impl DecodeSplit {
    /// Bytes of the partial results: `splits` rows of Dv f32 and one lse per row.
    pub fn partial_bytes(&self, s: &AttentionShape) -> u64 {
        let rows = (s.batch * s.heads_q * s.len_q) as u64;
        4 * self.splits as u64 * rows * (s.head_dim_v as u64 + 1)
    }
}

/// Keys per split for `splits` splits of `keys` keys (`split_keys_for` in the WGSL).
pub fn split_keys(keys: usize, splits: usize) -> usize {
    keys.div_ceil(splits.max(1)).next_multiple_of(TILE)
}

/// Of `variants` (by rows, smallest first), the smallest whose row block holds one kv
/// head's rows, else the widest.
fn smallest_holding(variants: &[SplitVariant; 2], s: &AttentionShape) -> SplitVariant {
    let rows = s.heads_q / s.heads_kv.max(1) * s.len_q;
    variants
        .iter()
        .find(|v| v.rows >= rows)
        .unwrap_or(&variants[variants.len() - 1])
        .clone()
}

/// Row blocks of one (batch, kv head): its Hq / Hkv query heads times Lq rows, in
/// blocks of the design's rows.
pub fn row_blocks(design: DecodeDesign, s: &AttentionShape) -> usize {
    (s.heads_q / s.heads_kv.max(1) * s.len_q).div_ceil(design.rows_per_block(s))
}

/// Rows of a `Lanes` block: one quad (a lane keeps 4 rows of Q and output).
const LANES_ROWS: usize = 4;

/// The bindings of `flash_decode_lanes.wgsl`: K and V as 16-byte words only.
const LANES_SLOTS: &[Slot] = SUBGROUP_SLOTS;
/// Its int8 form: the codes as 16-byte words, and the rows' scales.
const LANES_INT8_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K4,
    Slot::V4,
    Slot::Mask,
    Slot::SideWords,
    Slot::Scores,
    Slot::KScales,
    Slot::VScales,
];

/// One kernel of the `Lanes` design: head dims up to `dmax` (64 or 128), subgroups of
/// `sg` lanes, `lk` lanes to a key, K and V of the attention's dtype or (`int8`) int8
/// codes with row scales (`LW`, a lane's words of a row, follows from these and the
/// element type in the WGSL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LanesVariant {
    pub dmax: u32,
    pub sg: u32,
    pub lk: u32,
    pub int8: bool,
}

/// A variant reading K and V of the attention's dtype (for [`LanesVariant::ALL`]).
const fn float_lanes(dmax: u32, sg: u32, lk: u32) -> LanesVariant {
    LanesVariant {
        dmax,
        sg,
        lk,
        int8: false,
    }
}

/// A variant reading an int8 KV cache.
const fn int8_lanes(dmax: u32, sg: u32, lk: u32) -> LanesVariant {
    LanesVariant {
        dmax,
        sg,
        lk,
        int8: true,
    }
}

impl LanesVariant {
    /// Every kernel the design builds on the subgroup sizes tests and GPUs meet (8:
    /// lavapipe; 32: NVIDIA, AMD's wave32; 64: AMD's wave64), for validation.
    pub const ALL: [LanesVariant; 19] = [
        float_lanes(64, 8, 4),
        float_lanes(128, 8, 4),
        float_lanes(64, 32, 8),
        float_lanes(64, 32, 16),
        float_lanes(128, 32, 16),
        float_lanes(64, 64, 8),
        float_lanes(64, 64, 16),
        float_lanes(128, 64, 16),
        float_lanes(64, 16, 8),
        float_lanes(64, 16, 16),
        float_lanes(128, 16, 16),
        int8_lanes(64, 8, 4),
        int8_lanes(128, 8, 4),
        int8_lanes(64, 16, 4),
        int8_lanes(128, 16, 8),
        int8_lanes(64, 32, 4),
        int8_lanes(128, 32, 8),
        int8_lanes(64, 64, 4),
        int8_lanes(128, 64, 8),
    ];

    /// The variant for head dims `d`, `dv` of K and V stored as `kv` on subgroups of
    /// `sg` lanes: the smaller head-dim class that holds both, and 16 lanes to a key
    /// where the subgroup and the class's words allow (half the registers a lane needs,
    /// so twice the subgroups in flight), else 8; int8 rows are 4 or 8 words, one
    /// lane each; on 8-lane subgroups (lavapipe, where the design runs only when
    /// pinned, or for an int8 cache) 4, so that two key groups share a subgroup and CI
    /// runs their merge as 32-lane GPUs do.
    pub fn for_problem(d: usize, dv: usize, kv: KvElements, sg: u32) -> Option<LanesVariant> {
        let need = d.max(dv);
        if need > LANES_MAX_HEAD_DIM || sg < 8 {
            return None;
        }
        let dmax = if need <= 64 { 64 } else { 128 };
        let words = dmax / kv.per_word();
        let lk = match (sg, kv) {
            (8, _) => 4,
            (_, KvElements::Int8) => words,
            _ if words >= 16 => 16,
            _ => 8,
        };
        Some(LanesVariant {
            dmax,
            sg,
            lk,
            int8: kv == KvElements::Int8,
        })
    }

    /// Its kernel (built once per process and kept): the variant's constants, then the
    /// file.
    pub fn kernel(&self) -> Kernel {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static BUILT: OnceLock<Mutex<HashMap<LanesVariant, Kernel>>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let kernel = built.entry(*self).or_insert_with(|| {
            let constants = format!(
                "const DEC_ROWS: u32 = 4u;\nconst DMAX: u32 = {}u;\nconst SG: u32 = {}u;\nconst LK: u32 = {}u;\n\
                 const LW: u32 = max(1u, DMAX / (LK * EW));\n",
                self.dmax, self.sg, self.lk
            );
            Kernel {
                file: "flash_decode_lanes.wgsl",
                source: Text::from(constants + LANES_SOURCE),
                entry: "decode_split_lanes",
                slots: if self.int8 { LANES_INT8_SLOTS } else { LANES_SLOTS },
                preludes: if self.int8 {
                    &[COMMON, LANES_INT8, DECODE_COMMON, KV_BUFFERS]
                } else {
                    &[COMMON, LANES_FLOAT, DECODE_COMMON, KV_BUFFERS]
                },
                variant: Text::from(format!(
                    "[{} lk{} sg{}{}]",
                    self.dmax,
                    self.lk,
                    self.sg,
                    if self.int8 { " int8" } else { "" }
                )),
            }
        });
        kernel.clone()
    }
}

/// How K and V are stored, as the lanes design reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvElements {
    /// The attention's own dtype.
    Float(DType),
    /// int8 codes with an f32 scale per row (`crate::quantized_kv`).
    Int8,
}

impl KvElements {
    /// Elements in a 16-byte word.
    pub fn per_word(self) -> u32 {
        match self {
            KvElements::Float(dtype) => 16 / dtype.size() as u32,
            KvElements::Int8 => 16,
        }
    }
}

/// The fixed subgroup size the `Lanes` design builds for, where the adapter has one
/// of 8 to 64 lanes (the sizes [`LanesVariant::ALL`] validates).
pub(crate) fn lanes_subgroup(ctx: &Gpu) -> Option<u32> {
    match ctx.capabilities().subgroups {
        Some((min, max)) if min == max && (8..=64).contains(&min) && min.is_power_of_two() => Some(min),
        _ => None,
    }
}

/// Whether the `Lanes` design serves a problem: head dims up to 128 whose rows and
/// every K and V stride are whole 16-byte words, in buffers of whole words.
pub(crate) fn lanes_fit(kv: KvElements, params: &super::AttentionParams, bindings: &AttentionBindings) -> bool {
    let per_word = kv.per_word();
    let dims = (params.head_dim, params.head_dim_v);
    dims.0.max(dims.1) as usize <= LANES_MAX_HEAD_DIM
        && super::flash::words_fit(per_word, dims, &params.kv_strides())
        && [bindings.k, bindings.v]
            .iter()
            .all(|b| b.size() >= 16 && b.size().is_multiple_of(16))
}

/// Workgroups that keep the adapter busy: CPU adapters run a few threads; GPUs
/// thousands of lanes, and a `Lanes` workgroup is one subgroup, so it wants more of
/// them (about 32 per compute unit of a 128-unit GPU: memory-bound loops need many in
/// flight). wgpu reports no compute-unit count, so these are per class, not per GPU.
fn target_workgroups(ctx: &Gpu, design: DecodeDesign) -> usize {
    match design {
        _ if ctx.is_cpu_adapter() => 32,
        DecodeDesign::Lanes => 4096,
        _ => 2048,
    }
}

/// Splits no shorter than this: `Lanes` walks a split's keys in steps of a subgroup's
/// key groups and merges nothing through workgroup memory, so shorter splits cost it
/// less (its partials are then about 6% of an f16 cache's bytes at D 128).
fn min_split_keys(design: DecodeDesign) -> usize {
    match design {
        DecodeDesign::Lanes => 128,
        _ => MIN_SPLIT_KEYS,
    }
}

/// The split count for a problem whose rows see keys `0 .. keys` at most (`Lk`, or the
/// longest key length: a KV cache's unused capacity gets no splits): enough workgroups
/// to fill the adapter, splits of at least `MIN_SPLIT_KEYS` keys, and each split
/// within the driver's loop cap.
pub fn choose_split(ctx: &Gpu, design: DecodeDesign, s: &AttentionShape, keys: usize) -> Result<DecodeSplit> {
    let keys = keys.clamp(1, s.len_k.max(1));
    let iterations = |keys| design.iterations(s, keys);
    let blocks = s.batch * s.heads_kv * row_blocks(design, s);
    let wanted = target_workgroups(ctx, design).div_ceil(blocks.max(1));
    let most_useful = keys.div_ceil(min_split_keys(design));
    let mut splits = wanted.min(most_useful).max(1);
    if let Some(cap) = ctx.loop_cap() {
        if iterations(TILE) > cap {
            return Err(loop_budget::over_cap(
                format!("decode attention (D {})", s.head_dim),
                iterations(TILE),
                cap,
            ));
        }
        // The longest split (whole tiles) that fits the cap.
        let mut fit = TILE;
        while fit + TILE <= keys && iterations(fit + TILE) <= cap {
            fit += TILE;
        }
        splits = splits.max(keys.div_ceil(fit));
        while iterations(split_keys(keys, splits)) > cap {
            splits += 1;
        }
    }
    let max_groups = ctx.capabilities().max_workgroups_per_dim as usize;
    if splits > max_groups {
        return Err(Error::LimitExceeded {
            what: format!("decode splits for {} keys", s.len_k),
            limit: "max_compute_workgroups_per_dimension",
            unit: "workgroups",
            requested: splits as u64,
            max: max_groups as u64,
        });
    }
    Ok(DecodeSplit {
        design,
        keys,
        splits,
        split_keys: split_keys(keys, splits),
    })
}

/// A decode call's two passes, decided whole before anything is recorded (as the
/// fused forward's `FusedPlan`): the split kernel the design and the problem lead to
/// (the lanes variant where it serves, the texel kernel where a KV cache's mirror is
/// bound, else the design's variant), its constants, and both passes' grids.
#[derive(Clone, Debug)]
pub(crate) struct DecodePlan {
    pub split_kernel: Kernel,
    pub constants: Vec<(&'static str, u32)>,
    /// Workgroups of the split pass: (splits, row blocks of every (batch, kv head), 1).
    pub split_groups: [u32; 3],
    /// Workgroups of the combine pass: (output columns, rows in 65535s, the rest).
    pub combine_groups: [u32; 3],
}

/// The plan of a decode call on these bindings (`split` as [`choose_split`] chose it);
/// an error where int8 K and V meet a problem the lanes design does not serve, or a
/// grid outgrows the device's workgroups per dimension.
pub(crate) fn plan(
    ctx: &Gpu,
    dtype: DType,
    bindings: &AttentionBindings,
    params: &super::AttentionParams,
    shape: &AttentionShape,
    split: &DecodeSplit,
) -> Result<DecodePlan> {
    // `Lanes` serves head dims up to 128 in whole words; elsewhere `Tiles`, on the same
    // splits (choose_split bounded them for both). Only `Lanes` reads int8 K and V
    // (bound with their scales); the caller has checked that it serves them.
    let kv = match bindings.kv_scales {
        Some(_) => KvElements::Int8,
        None => KvElements::Float(dtype),
    };
    let lanes = match (split.design, lanes_subgroup(ctx)) {
        (DecodeDesign::Lanes, Some(sg)) if lanes_fit(kv, params, bindings) => {
            LanesVariant::for_problem(shape.head_dim, shape.head_dim_v, kv, sg)
        }
        _ => None,
    };
    if kv == KvElements::Int8 && lanes.is_none() {
        return Err(Error::invalid(
            "int8 KV decode",
            "only the lanes design reads int8 K and V, and it does not serve this problem",
        ));
    }
    let design = match (split.design, lanes) {
        (DecodeDesign::Lanes, None) => DecodeDesign::Tiles,
        (design, _) => design,
    };
    let max_groups = ctx.capabilities().max_workgroups_per_dim as usize;
    let row_groups = shape.batch * shape.heads_kv * row_blocks(design, shape);
    let rows = shape.batch * shape.heads_q * shape.len_q;
    let combine_y = rows.min(65535);
    let combine_z = rows.div_ceil(65535);
    for (what, groups) in [
        ("decode row blocks", row_groups),
        ("decode combine rows", combine_y),
        ("decode combine row groups", combine_z),
    ] {
        if groups > max_groups {
            return Err(Error::LimitExceeded {
                what: what.into(),
                limit: "max_compute_workgroups_per_dimension",
                unit: "workgroups",
                requested: groups as u64,
                max: max_groups as u64,
            });
        }
    }
    // A KV cache's texel mirror, where it has one, serves the subgroup design.
    let texels = design == DecodeDesign::Subgroup && bindings.kv_texels.is_some();
    let mut constants = design.constants(ctx.capabilities().mesa_version, shape, dtype);
    let split_kernel = if let Some(v) = lanes {
        v.kernel()
    } else if texels {
        constants.extend(TexelGrid::for_context(ctx).constants("KV_TEXEL_SHIFT", "KV_TEXEL_ROWS"));
        smallest_holding(&SUBGROUP_TEXEL_SPLIT_VARIANTS, shape).kernel
    } else {
        design.variant_for(shape).kernel
    };
    Ok(DecodePlan {
        split_kernel,
        constants,
        split_groups: [split.splits as u32, row_groups as u32, 1],
        combine_groups: [
            shape.head_dim_v.div_ceil(LANES) as u32,
            combine_y as u32,
            combine_z as u32,
        ],
    })
}

/// Records the split pass and the combine pass of a decode call: its [`plan`],
/// compiled and bound. `bindings.scores` must hold the partials
/// ([`DecodeSplit::partial_bytes`]); `bindings.params` covers every (batch, head), with
/// `splits` set to `split.splits`.
pub(crate) fn encode(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    bindings: &AttentionBindings,
    params: &super::AttentionParams,
    shape: &AttentionShape,
    split: DecodeSplit,
) -> Result<()> {
    let plan = plan(ctx, dtype, bindings, params, shape, &split)?;
    let split_pipeline = pipeline(ctx, &plan.split_kernel, dtype, &plan.constants)?;
    let split_entries = bindings.select(plan.split_kernel.slots)?;
    dispatch_entries(ctx, encoder, &split_pipeline, &split_entries, plan.split_groups)?;
    let combine_pipeline = pipeline(ctx, &COMBINE, dtype, &[])?;
    let combine_entries = bindings.select(COMBINE.slots)?;
    dispatch_entries(ctx, encoder, &combine_pipeline, &combine_entries, plan.combine_groups)
}

/// Split-K decode's kernels: the tiles and subgroup splits (buffers and texels), the lanes variants, the combine (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    SPLIT_VARIANTS
        .iter()
        .chain(&SUBGROUP_SPLIT_VARIANTS)
        .chain(&SUBGROUP_TEXEL_SPLIT_VARIANTS)
        .map(|v| v.kernel.clone())
        .chain([COMBINE])
        .chain(LanesVariant::ALL.iter().map(|v| v.kernel()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn designs_parse_by_name_and_lanes_variants_fit_their_registers() {
        assert_eq!(DecodeDesign::parse("auto"), Ok(None));
        for d in DecodeDesign::ALL {
            assert_eq!(DecodeDesign::parse(d.name()), Ok(Some(d)));
        }
        assert!(DecodeDesign::parse("tile").expect_err("no such").contains("lanes"));
        // 16 lanes to a key where 32-lane subgroups and the class's words allow it.
        let v = |d, dtype, sg| LanesVariant::for_problem(d, d, KvElements::Float(dtype), sg).map(|v| (v.dmax, v.lk));
        assert_eq!(v(128, DType::F16, 32), Some((128, 16)));
        assert_eq!(v(128, DType::F32, 32), Some((128, 16)));
        assert_eq!(v(64, DType::F16, 32), Some((64, 8)));
        assert_eq!(v(64, DType::F32, 32), Some((64, 16)));
        assert_eq!(v(128, DType::F16, 8), Some((128, 4)));
        assert_eq!(v(129, DType::F32, 32), None);
        assert_eq!(v(64, DType::F32, 4), None);
        // On GPUs a lane holds at most 16 elements of a row: 4 rows of Q and of output
        // in 32 vec4 registers (lavapipe's 8-lane subgroups take 32, for the merge).
        for kv in [
            KvElements::Float(DType::F32),
            KvElements::Float(DType::F16),
            KvElements::Int8,
        ] {
            for sg in [8, 16, 32, 64] {
                for d in [8, 64, 100, 128] {
                    let Some(l) = LanesVariant::for_problem(d, d, kv, sg) else {
                        continue;
                    };
                    let per_lane = l.dmax / l.lk;
                    let most = if sg == 8 { 32 } else { 16 };
                    assert!((4..=most).contains(&per_lane), "{l:?}: {per_lane}");
                    assert!(l.lk <= sg, "{l:?}");
                    assert!(LanesVariant::ALL.contains(&l), "{l:?} is not validated");
                }
            }
        }
    }

    #[test]
    fn only_mesa_22_and_older_walk_keys_in_two_loops() {
        assert!(!one_key_loop(Some((22, 3))));
        assert!(!one_key_loop(Some((21, 0))));
        assert!(one_key_loop(Some((23, 1))));
        assert!(one_key_loop(Some((25, 0))));
        assert!(one_key_loop(None));
        let s = AttentionShape::new(1, 8, 2, 1, 64, 128, 128);
        let loops = |mesa| DecodeDesign::Subgroup.constants(mesa, &s, DType::F32);
        assert!(loops(Some((22, 3))).contains(&("ONE_KEY_LOOP", 0)));
        assert!(loops(Some((25, 0))).contains(&("ONE_KEY_LOOP", 1)));
        assert!(DecodeDesign::Tiles.constants(None, &s, DType::F32).is_empty());
    }
}
