//! The GPU backward tiling's kernels (`shaders/flash_backward_blocked.wgsl`, whose
//! opening comment explains the tiling): both operands of every product in workgroup
//! memory, tiles of `tile` rows and keys, `invocations` per workgroup. The variants
//! differ only in those sizes and in their tiles' element type: the inputs' own
//! ([`VARIANTS`]), or f16 for f32 inputs at a precision below `Highest`
//! ([`HALF_TILE_VARIANTS`]: f32 problems then get f16's tile sizes). [`variant_for`]
//! takes the first that holds the head dims and fits the adapter's workgroup memory.

use super::{Kernel, Slot, BACKWARD_COMMON, COMMON};
use crate::gpu::Text;
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../shaders/flash_backward_blocked.wgsl");
/// The same with f16 enabled for f32 inputs' f16 tiles (a directive must come first).
const HALF_TILE_SOURCE: &str = concat!(
    "enable f16;\n",
    include_str!("../../shaders/flash_backward_blocked.wgsl")
);

/// One size of the kernels: head dims up to `dims`, `tile` rows and keys per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockedVariant {
    pub dims: u32,
    pub tile: u32,
    pub invocations: u32,
    /// Whether f32 inputs take it with f32 tiles (f16 inputs take every variant).
    pub f32: bool,
    /// Whether its tiles hold f16 whatever the inputs' dtype.
    pub half_tiles: bool,
    preludes: &'static [&'static str],
    name: &'static str,
}

macro_rules! variant {
    ($dims:literal, $tile:literal, $invocations:literal) => {
        variant!($dims, $tile, $invocations, true, false, "elem", "")
    };
    ($dims:literal, $tile:literal, $invocations:literal, f16 tiles) => {
        variant!($dims, $tile, $invocations, true, true, "f16", "h")
    };
    ($dims:literal, $tile:literal, $invocations:literal, $f32:literal, $half:literal, $tile_elem:literal, $suffix:literal) => {
        BlockedVariant {
            dims: $dims,
            tile: $tile,
            invocations: $invocations,
            f32: $f32,
            half_tiles: $half,
            preludes: &[
                COMMON,
                BACKWARD_COMMON,
                concat!(
                    "const DMAX: u32 = ",
                    $dims,
                    "u;\nconst T: u32 = ",
                    $tile,
                    "u;\nconst NT: u32 = ",
                    $invocations,
                    "u;\nalias tile_elem = ",
                    $tile_elem,
                    ";\n"
                ),
            ],
            name: concat!("[", $dims, "x", $tile, $suffix, "]"),
        }
    };
}

/// Largest tiles first within each head-dim bound; a tile's memory depends on the
/// dtype (input tiles hold the inputs' elements), so f16 gets larger tiles: at D 64,
/// 32 rows (48 KiB GPUs, and f16 in 32 KiB), 16 (f32 in 32 KiB), 8 (WebGPU's default 16
/// KiB); at D 128, 32 (f16 in 48 KiB), 16 (f32 in 48 KiB, f16 in 32), 8; at D 256, 16
/// (f16 in 48 KiB), 8 (f16 in 32 KiB). f32 at D 256 keeps the rows tiling: on an H200
/// the 8-row variant ran it 1.24× slower (docs/benchmarks.md, "On a GPU"). Every variant keeps `tile²/4` score owners and
/// `tile · dims/4` products to share among its invocations, with dims/4 dividing the
/// invocations (the WGSL's mapping).
pub const VARIANTS: [BlockedVariant; 8] = [
    variant!(64, 32, 128),
    variant!(64, 16, 64),
    variant!(64, 8, 32),
    variant!(128, 32, 128),
    variant!(128, 16, 128),
    variant!(128, 8, 32),
    variant!(256, 16, 128),
    variant!(256, 8, 64, false, false, "elem", ""),
];

/// The variants with f16 tiles, for f32 inputs at a precision below `Highest`: f16's
/// sizes of [`VARIANTS`].
pub const HALF_TILE_VARIANTS: [BlockedVariant; 8] = [
    variant!(64, 32, 128, f16 tiles),
    variant!(64, 16, 64, f16 tiles),
    variant!(64, 8, 32, f16 tiles),
    variant!(128, 32, 128, f16 tiles),
    variant!(128, 16, 128, f16 tiles),
    variant!(128, 8, 32, f16 tiles),
    variant!(256, 16, 128, f16 tiles),
    variant!(256, 8, 64, f16 tiles),
];

impl BlockedVariant {
    /// Score owners: one row (key) and one quad of keys (rows) each.
    fn owners(&self) -> u32 {
        self.tile * self.tile / 4
    }

    /// Invocations per score owner, each summing a slice of the head dims (the WGSL's
    /// SPLIT).
    fn split(&self) -> u32 {
        (self.invocations / self.owners()).max(1)
    }

    /// Workgroup memory for inputs of `dtype`: four input tiles of `tile` padded rows,
    /// the P and dX tiles, and the slices' partial sums.
    pub fn workgroup_bytes(&self, dtype: DType) -> u32 {
        let elem = if self.half_tiles || dtype == DType::F16 { 2 } else { 4 };
        let row = self.dims / 4 + 1;
        let slices = self.owners() * (self.split() - 1) + 1;
        4 * elem * 4 * self.tile * row + 16 * 2 * self.owners() + 16 * 2 * slices
    }
    fn kernel(&self, entry: &'static str, slots: &'static [Slot]) -> Kernel {
        Kernel {
            file: "flash_backward_blocked.wgsl",
            source: Text::Static(if self.half_tiles { HALF_TILE_SOURCE } else { SOURCE }),
            entry,
            slots,
            preludes: self.preludes,
            variant: Text::Static(self.name),
        }
    }

    /// The dQ pass.
    pub fn dq(&self, slots: &'static [Slot]) -> Kernel {
        self.kernel("bwd_dq_blocked", slots)
    }

    /// The dK/dV pass.
    pub fn dkdv(&self, slots: &'static [Slot]) -> Kernel {
        self.kernel("bwd_dkdv_blocked", slots)
    }
}

/// The first variant holding head dims up to `dims` for inputs of `dtype` within
/// `max_workgroup_storage` bytes and `max_invocations` invocations, if any; with
/// `half_tiles` (f32 inputs whose products may round to f16, on an adapter with f16),
/// among the f16-tile variants.
pub fn variant_for(
    dims: u32,
    dtype: DType,
    half_tiles: bool,
    max_workgroup_storage: u32,
    max_invocations: u32,
) -> Option<&'static BlockedVariant> {
    let table: &'static [BlockedVariant] = if half_tiles && dtype == DType::F32 {
        &HALF_TILE_VARIANTS
    } else {
        &VARIANTS
    };
    table.iter().find(|v| {
        dims <= v.dims
            && (v.f32 || dtype == DType::F16)
            && v.workgroup_bytes(dtype) <= max_workgroup_storage
            && v.invocations <= max_invocations
    })
}

/// Loop iterations of one invocation of the dQ pass over `keys` keys (a loop cap's
/// count, every loop's exit check included): the owned rows' stage, the accumulators
/// cleared, per tile of walked keys the stage, the score owners' dot products over
/// both head dims and the products, then the stores.
pub fn dq_iterations(v: &BlockedVariant, (d4, dv4): (u64, u64), keys: usize) -> u64 {
    let tiles = keys.div_ceil(v.tile as usize) as u64;
    1 + stage(v) + accumulators(v) + 1 + tiles * per_tile(v, d4, dv4) + stores(v)
}

/// The same for the dK/dV pass over `rows` query rows of each of `group` query heads,
/// with the two binary searches for the rows its keys are visible to.
pub fn dkdv_iterations(v: &BlockedVariant, (d4, dv4): (u64, u64), rows: usize, group: u64) -> u64 {
    let tiles = rows.div_ceil(v.tile as usize) as u64;
    let searches = 2 * (u64::from(usize::BITS - rows.leading_zeros()) + 2);
    1 + stage(v) + accumulators(v) + searches + (group + 1) + group * (1 + tiles * per_tile(v, d4, dv4)) + stores(v)
}

/// Rows (keys) per product invocation: the WGSL's RB.
fn rows_per_invocation(v: &BlockedVariant) -> u64 {
    u64::from(v.tile * v.dims / 4 / v.invocations)
}

/// A tile's stage: its trips, each with two 4-element loads whose tail loops (5
/// trips) run where a head dim ends mid-vec4.
fn stage(v: &BlockedVariant) -> u64 {
    11 * u64::from(v.tile * v.dims / 4).div_ceil(u64::from(v.invocations)) + 1
}

fn accumulators(v: &BlockedVariant) -> u64 {
    rows_per_invocation(v) + 1
}

/// One walked tile: its trip, the stage, the score owners (two dot-product loops
/// each) and the products (a loop over the accumulators per quad).
fn per_tile(v: &BlockedVariant, d4: u64, dv4: u64) -> u64 {
    let (tile, nt) = (u64::from(v.tile), u64::from(v.invocations));
    let owners = (tile * tile / 4).div_ceil(nt) * (1 + (d4 + 1) + (dv4 + 1)) + 1 + u64::from(v.split()) + 1;
    let products = tile / 4 * (1 + rows_per_invocation(v) + 1) + 1;
    1 + stage(v) + owners + products
}

/// The owned rows' stores: per accumulator row, 4 elements.
fn stores(v: &BlockedVariant) -> u64 {
    rows_per_invocation(v) * (1 + 5) + 1
}

/// The blocked backward's sizes, whole and half tiles (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    VARIANTS
        .iter()
        .chain(&HALF_TILE_VARIANTS)
        .flat_map(|v| {
            [
                v.dq(super::backward_passes::DQ_SLOTS),
                v.dkdv(super::backward_passes::DKDV_SLOTS),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_keeps_the_mapping_the_wgsl_assumes() {
        for v in VARIANTS.iter().chain(&HALF_TILE_VARIANTS) {
            let d4 = v.dims / 4;
            assert_eq!(v.invocations % d4, 0, "{v:?}: dims/4 must divide the invocations");
            assert_eq!(v.tile % (v.invocations / d4), 0, "{v:?}: products per invocation");
            assert_eq!(v.tile % 4, 0, "{v:?}: quads");
        }
    }

    #[test]
    fn gpus_get_the_largest_tiles_and_small_memories_smaller_ones() {
        let tile = |dims, dtype, bytes| variant_for(dims, dtype, false, bytes, 1024).map(|v| v.tile);
        let (f32, f16) = (DType::F32, DType::F16);
        assert_eq!(tile(64, f32, 49152), Some(32));
        assert_eq!(tile(64, f32, 32768), Some(16));
        assert_eq!(tile(64, f16, 32768), Some(32));
        assert_eq!(tile(64, f32, 16384), Some(8));
        assert_eq!(tile(128, f32, 49152), Some(16));
        assert_eq!(tile(128, f16, 49152), Some(32));
        assert_eq!(tile(128, f32, 32768), Some(8));
        assert_eq!(tile(128, f16, 32768), Some(16));
        assert_eq!(tile(256, f32, 49152), None);
        assert_eq!(tile(256, f16, 49152), Some(16));
        assert_eq!(tile(256, f16, 32768), Some(8));
        assert_eq!(tile(257, f16, 1 << 20), None);
        assert_eq!(variant_for(64, f32, false, 49152, 64).map(|v| v.tile), Some(16));
        // f32 at a precision below highest: f16's tiles.
        let half = |dims, bytes| variant_for(dims, f32, true, bytes, 1024).map(|v| (v.tile, v.half_tiles));
        assert_eq!(half(128, 49152), Some((32, true)));
        assert_eq!(half(256, 49152), Some((16, true)));
        assert_eq!(half(128, 32768), Some((16, true)));
        assert_eq!(
            variant_for(128, f16, true, 49152, 1024).map(|v| v.half_tiles),
            Some(false)
        );
    }
}
