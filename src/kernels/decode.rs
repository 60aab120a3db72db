//! Split-K decode (`shaders/flash_decode.wgsl`): attention for few query rows against
//! many keys. The key range of each (batch, kv head) is cut into splits walked by
//! separate workgroups, each writing normalised partial rows and their log-sum-exp;
//! a combine pass merges them (docs/design.md, "Decode").

use super::{dispatch, loop_budget, pipeline, AttentionBindings, Kernel, Slot, COMMON};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::problem::AttentionShape;
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../shaders/flash_decode.wgsl");

/// One split of the key range for a block of `rows` query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitVariant {
    pub rows: usize,
    pub kernel: Kernel,
}

const fn split_variant(rows: usize, preludes: &'static [&'static str], variant: &'static str) -> SplitVariant {
    SplitVariant {
        rows,
        kernel: Kernel {
            file: "flash_decode.wgsl",
            source: SOURCE,
            entry: "decode_split",
            slots: &[
                Slot::Params,
                Slot::Q,
                Slot::K,
                Slot::V,
                Slot::Mask,
                Slot::SideWords,
                Slot::Scores,
            ],
            preludes,
            variant,
        },
    }
}

/// Row-block sizes, smallest first: 4 rows fit GQA groups of 4 at Lq = 1 (no lane
/// computes a row that does not exist), 8 rows read K and V once for more rows.
pub const SPLIT_VARIANTS: [SplitVariant; 2] = [
    split_variant(4, &[COMMON, "const DEC_ROWS: u32 = 4u;\n"], "[4 rows]"),
    split_variant(8, &[COMMON, "const DEC_ROWS: u32 = 8u;\n"], "[8 rows]"),
];

/// The variant for a problem: the smallest whose block holds one kv head's rows, else
/// the widest.
pub fn split_variant_for(s: &AttentionShape) -> SplitVariant {
    let rows = s.heads_q / s.heads_kv.max(1) * s.len_q;
    *SPLIT_VARIANTS
        .iter()
        .find(|v| v.rows >= rows)
        .unwrap_or(&SPLIT_VARIANTS[SPLIT_VARIANTS.len() - 1])
}

/// Merges the splits of each row into the output and the log-sum-exp (`DEC_ROWS` is
/// declared but unused there).
pub const COMBINE: Kernel = Kernel {
    file: "flash_decode.wgsl",
    source: SOURCE,
    entry: "decode_combine",
    slots: &[Slot::Params, Slot::Output, Slot::Scores, Slot::Lse],
    preludes: &[COMMON, "const DEC_ROWS: u32 = 4u;\n"],
    variant: "",
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

/// Row blocks of one (batch, kv head): its Hq / Hkv query heads times Lq rows, in
/// blocks of the variant's rows.
pub fn row_blocks(s: &AttentionShape) -> usize {
    (s.heads_q / s.heads_kv.max(1) * s.len_q).div_ceil(split_variant_for(s).rows)
}

/// Loop iterations of one invocation walking `keys` keys (every loop counted with its
/// exit check, the constant-trip ones too), for the 8-row variant (the 4-row one needs
/// fewer). Per tile: the tile loop; the score loop over the head dim (each trip with
/// load4's 4-trip tail loop and its exit, as if the tail always ran); the two quads'
/// mask loops; the quad's two softmax passes over 64 keys;
/// the P·V loop over 4 column slots of 64 keys. Around it: the Q load (with qload4's
/// tail), the block bounds, the accumulator clear, the log-sum-exp loop and the stores
/// (2 quads × 4 column slots × 4 rows).
pub fn iterations(s: &AttentionShape, keys: usize) -> u64 {
    let d4 = (s.head_dim as u64).div_ceil(4);
    let tiles = (keys as u64).div_ceil(TILE as u64);
    let tile = TILE as u64;
    let per_tile = 1 + (d4 * (1 + 5) + 1) + 2 * (4 + 1) + 2 * (tile + 1) + (4 + 4 * (tile + 1) + 1);
    let stores = (2 + 1) + 2 * (4 + 1) + 2 * 4 * (4 + 1);
    let around = (8 * (1 + 5) + 1) + (8 + 1) + (4 + 1) + (4 + 1) + stores + 1;
    tiles * per_tile + around
}

/// Workgroups that keep the adapter busy: GPUs run thousands of lanes, CPU adapters a
/// few threads.
fn target_workgroups(ctx: &Context) -> usize {
    if ctx.is_cpu_adapter() {
        32
    } else {
        2048
    }
}

/// The split count for a problem whose rows see keys `0 .. keys` at most (`Lk`, or the
/// longest key length: a KV cache's unused capacity gets no splits): enough workgroups
/// to fill the adapter, splits of at least [`MIN_SPLIT_KEYS`] keys, and each split
/// within the driver's loop cap.
pub fn choose_split(ctx: &Context, s: &AttentionShape, keys: usize) -> Result<DecodeSplit> {
    let keys = keys.clamp(1, s.len_k.max(1));
    let blocks = s.batch * s.heads_kv * row_blocks(s);
    let wanted = target_workgroups(ctx).div_ceil(blocks.max(1));
    let most_useful = keys.div_ceil(MIN_SPLIT_KEYS);
    let mut splits = wanted.min(most_useful).max(1);
    if let Some(cap) = ctx.loop_cap() {
        if iterations(s, TILE) > cap {
            return Err(loop_budget::over_cap(
                format!("decode attention (D {})", s.head_dim),
                iterations(s, TILE),
                cap,
            ));
        }
        // The longest split (whole tiles) that fits the cap.
        let mut fit = TILE;
        while fit + TILE <= keys && iterations(s, fit + TILE) <= cap {
            fit += TILE;
        }
        splits = splits.max(keys.div_ceil(fit));
        while iterations(s, split_keys(keys, splits)) > cap {
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
        keys,
        splits,
        split_keys: split_keys(keys, splits),
    })
}

/// Records the split pass and the combine pass. `bindings.scores` must hold the
/// partials ([`DecodeSplit::partial_bytes`]); `bindings.params` covers every (batch,
/// head), with `splits` set to `split.splits`.
pub(crate) fn encode(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    bindings: &AttentionBindings,
    shape: &AttentionShape,
    split: DecodeSplit,
) -> Result<()> {
    let max_groups = ctx.capabilities().max_workgroups_per_dim as usize;
    let row_groups = shape.batch * shape.heads_kv * row_blocks(shape);
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
    let split_kernel = split_variant_for(shape).kernel;
    let split_pipeline = pipeline(ctx, &split_kernel, dtype, &[])?;
    dispatch(
        ctx,
        encoder,
        &split_pipeline,
        &bindings.select(split_kernel.slots),
        [split.splits as u32, row_groups as u32, 1],
    )?;
    let combine_pipeline = pipeline(ctx, &COMBINE, dtype, &[])?;
    dispatch(
        ctx,
        encoder,
        &combine_pipeline,
        &bindings.select(COMBINE.slots),
        [
            shape.head_dim_v.div_ceil(LANES) as u32,
            combine_y as u32,
            combine_z as u32,
        ],
    )
}
