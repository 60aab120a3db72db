//! The tensor-core backward tiling's kernels (`shaders/flash_backward_coop.wgsl`, whose
//! opening comment explains the tiling): FlashAttention-2's dQ and dK/dV passes with
//! every product a 16 x 16 x 16 f16 cooperative-matrix multiply-add. A
//! [`CoopBackwardVariant`] is three numbers (largest head dim, rows or keys per
//! workgroup, rows or keys per walked tile) and its kernels are the WGSL behind a
//! one-line prelude generated from them and the adapter's subgroup size, as the
//! forward's [`crate::kernels::flash::CoopVariant`]. [`variant_for`] takes the first
//! variant of the smallest head-dim class that fits the adapter's workgroup memory.

use super::{flash, Kernel, Slot, Text, BACKWARD_COMMON, COMMON, COOP_STAGING};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const SOURCE: &str = include_str!("../../shaders/flash_backward_coop.wgsl");

/// The passes' bindings: the other backward kernels' (`crate::backward`) and Q, dO, K
/// and V again as 16-byte words (the WGSL's WORDS staging).
pub const DQ_SLOTS: &[Slot] = &[
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
    Slot::K4,
    Slot::V4,
    Slot::Q4,
    Slot::DOut4,
];
pub const DKDV_SLOTS: &[Slot] = &[
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
    Slot::K4,
    Slot::V4,
    Slot::Q4,
    Slot::DOut4,
];

/// One variant of `flash_backward_coop.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopBackwardVariant {
    /// Head dims up to this (a multiple of 32: a band's two subgroups take half of dQ's
    /// 16-column tiles each).
    pub dmax: u32,
    /// Query rows (dQ) or keys (dK/dV) per workgroup: one 16-row band per two
    /// subgroups (each holding half of the band's operands and gradients).
    pub br: u32,
    /// Keys (dQ) or query rows (dK/dV) per walked tile (a multiple of 16).
    pub bc: u32,
    /// The owned rows' fragments and the gradient tiles as one named value each, the
    /// loops over them unrolled by the generator ([`crate::kernels::unroll`]); else
    /// arrays indexed by loop counters (label suffix `n`).
    pub named: bool,
}

/// By head-dim class, the variant for NVIDIA's 48 KiB of workgroup memory, then one
/// for 32 KiB (Apple, Intel, lavapipe under emulation). Head dims past 128 keep the
/// `blocked` tiling: a subgroup would hold 4 · 256/16 tiles of 16 x 16 in registers.
/// None has run on tensor cores yet.
pub const VARIANTS: [CoopBackwardVariant; 6] = [
    CoopBackwardVariant::new(32, 64, 32),
    CoopBackwardVariant::new(32, 32, 32),
    CoopBackwardVariant::new(64, 64, 32),
    CoopBackwardVariant::new(64, 32, 32),
    CoopBackwardVariant::new(128, 64, 32),
    CoopBackwardVariant::new(128, 32, 32),
];

impl CoopBackwardVariant {
    pub const fn new(dmax: u32, br: u32, bc: u32) -> Self {
        CoopBackwardVariant {
            dmax,
            br,
            bc,
            named: false,
        }
    }

    /// The same variant with named fragments and gradient tiles.
    pub const fn with_named(self, named: bool) -> Self {
        CoopBackwardVariant { named, ..self }
    }

    /// `DMAXxBRxBC`, with `n` after it for the named form.
    pub fn label(&self) -> String {
        let named = if self.named { "n" } else { "" };
        format!("{}x{}x{}{named}", self.dmax, self.br, self.bc)
    }

    /// Parses [`CoopBackwardVariant::label`]'s form, only for a variant whose WGSL holds
    /// together on 8- or 32-lane subgroups.
    pub fn parse_valid(label: &str) -> Option<Self> {
        let label = label.trim();
        let (shape, named) = match label.strip_suffix('n') {
            Some(arrayed) => (arrayed, true),
            None => (label, false),
        };
        let mut parts = shape.split('x').map(|n| n.parse::<u32>().ok());
        let (dmax, br, bc) = (parts.next()??, parts.next()??, parts.next()??);
        let v = CoopBackwardVariant::new(dmax, br, bc).with_named(named);
        (parts.next().is_none() && (v.valid_for(32) || v.valid_for(8))).then_some(v)
    }

    /// Whether the variant runs a problem of head dims up to `dims` on an adapter with
    /// subgroups of `sg` lanes, `bytes` of workgroup memory and `invocations` per
    /// workgroup.
    pub fn fits(&self, dims: u32, sg: u32, bytes: u32, invocations: u32) -> bool {
        self.dmax >= dims
            && self.valid_for(sg)
            && self.workgroup_bytes() <= bytes
            && self.invocations(sg) <= invocations
    }

    /// `flash_backward_coop.wgsl` through the generator, arrayed or named (the same
    /// for every subgroup size).
    fn source(&self) -> String {
        let (d16, wc) = (self.dmax / 16, (self.bc / 16).max(1));
        let consts = [
            ("D16", d16),
            ("WC", wc),
            ("NG", d16.div_ceil(wc)),
            ("DH", d16 / 2),
            ("NGH", (d16 / 2).div_ceil(wc)),
        ];
        // The file's directives are tested (shader_validation, the backward tests): an
        // error here is a bug in the file, not in anything a user gave.
        super::unroll::expand(SOURCE, self.named, &consts)
            .unwrap_or_else(|e| panic!("shaders/flash_backward_coop.wgsl: {e}"))
    }

    /// Workgroup memory the variant declares, mirroring its WGSL (a test compares this
    /// with naga's layout): two walked tiles of rows of DMAX + 8 halves, the scores and
    /// dP (f32 rows of BC + 4) and P and dX (f16 rows of BC + 8) of every band.
    pub const fn workgroup_bytes(&self) -> u32 {
        2 * 2 * self.bc * (self.dmax + 8) + 2 * 4 * self.br * (self.bc + 4) + 2 * 2 * self.br * (self.bc + 8)
    }

    /// Whether the WGSL holds together for subgroups of `sg` lanes: the forward's band
    /// layout (`flash::band_layout_holds`) at head dims up to 128, in an even number of
    /// 16-column tiles (dQ's are split between a band's two subgroups).
    pub fn valid_for(&self, sg: u32) -> bool {
        self.dmax <= 128 && self.dmax.is_multiple_of(32) && flash::band_layout_holds(self.dmax, self.br, self.bc, sg)
    }

    /// Invocations per workgroup with subgroups of `sg` lanes: two subgroups per band.
    pub fn invocations(&self, sg: u32) -> u32 {
        2 * (self.br / 16) * sg
    }

    /// The dQ pass for subgroups of `sg` lanes.
    pub fn dq(&self, sg: u32) -> Kernel {
        self.kernel("bwd_dq_coop", sg, DQ_SLOTS)
    }

    /// The dK/dV pass for subgroups of `sg` lanes.
    pub fn dkdv(&self, sg: u32) -> Kernel {
        self.kernel("bwd_dkdv_coop", sg, DKDV_SLOTS)
    }

    /// A pass's kernel (its text, the generated constants then the unrolled file, built
    /// once per process and kept).
    fn kernel(&self, entry: &'static str, sg: u32, slots: &'static [Slot]) -> Kernel {
        /// A variant's source and label by subgroup size.
        type Built = HashMap<(CoopBackwardVariant, u32), (Text, Text)>;
        static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (source, variant) = built
            .entry((*self, sg))
            .or_insert_with(|| {
                let constants = flash::generator_prelude(self.dmax, self.br, self.bc, sg, 1, 1);
                (
                    Text::from(format!("{constants}{}", self.source())),
                    Text::from(format!("[{} sg{sg}]", self.label())),
                )
            })
            .clone();
        Kernel {
            file: "flash_backward_coop.wgsl",
            source,
            entry,
            slots,
            preludes: &[COMMON, BACKWARD_COMMON, COOP_STAGING],
            variant,
        }
    }
}

/// The variant for head dims up to `dims` on an adapter with subgroups of `sg` lanes
/// granting `bytes` of workgroup memory and `max_invocations` per workgroup: the
/// smallest head-dim class that holds them, and in it the first that fits.
pub fn variant_for(dims: u32, sg: u32, bytes: u32, max_invocations: u32) -> Option<CoopBackwardVariant> {
    let class = VARIANTS.iter().map(|v| v.dmax).find(|&dmax| dims <= dmax)?;
    VARIANTS.iter().copied().find(|v| {
        v.dmax == class && v.valid_for(sg) && v.workgroup_bytes() <= bytes && v.invocations(sg) <= max_invocations
    })
}

/// Every variant `tune --backward` times for head-dim class `dmax` on such an adapter:
/// rows (dQ) or keys (dK/dV) per workgroup of 1 to 4 bands, walked tiles of 16 to 64,
/// each arrayed and named.
pub fn candidates(dmax: u32, sg: u32, bytes: u32, invocations: u32) -> Vec<CoopBackwardVariant> {
    let mut out = Vec::new();
    for named in [false, true] {
        for br in [16, 32, 48, 64] {
            for bc in [16, 32, 48, 64] {
                let v = CoopBackwardVariant::new(dmax, br, bc).with_named(named);
                if v.fits(dmax, sg, bytes, invocations) {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// Loop trips of one invocation of a pass under the emulation of cooperative matrices
/// (`kernels::coop_emulation`, the only place a loop cap meets these kernels), every
/// loop counted with its exit check, on subgroups of `sg` lanes: a fragment load or
/// store is 256/sg trips, a multiply-add 256/sg times 16 plus 2. `walked` tiles of the
/// other side (the dQ pass's keys; the dK/dV pass's rows, times the query heads of a
/// group) each cost a stage, the band's two products, the element-wise step and the
/// gradient products (`per_tile`); around them, the owned rows' fragments and the
/// gradients' stores. Counted as if each subgroup did both halves' work (both
/// products, every gradient tile, the band's two operands staged in full): an upper
/// bound on what one half does.
fn iterations(v: &CoopBackwardVariant, sg: u32, walked: u64, gradients: u64) -> u64 {
    let sg = u64::from(sg.clamp(1, 16));
    let (br, bc, dmax) = (u64::from(v.br), u64::from(v.bc), u64::from(v.dmax));
    let looped = |n: u64| n + 1;
    let slots = 256 / sg;
    let nt = (2 * br / 16 * sg).max(1); // two subgroups per band
    let (d16, wc) = (dmax / 16, bc / 16);
    let rows = (16 / sg).max(1);
    let quads = bc / 4;
    let (load, store, mma) = (looped(slots), looped(slots), slots * 18 + 1);
    let stage = |n: u64| looped((n * dmax).div_ceil(nt));
    let products = looped(wc) + wc * (looped(d16) + d16 * (load + mma) + store);
    let gradient = looped(wc) + wc * (load + looped(d16) + d16 * (load + mma));
    let elementwise = looped(rows) + rows * looped(quads);
    let per_tile = 1 + 2 * stage(bc) + 2 * products + elementwise + gradients * gradient;
    let rounds = d16.div_ceil(wc.max(1));
    let store_band = looped(rounds) + rounds * (looped(wc) + wc * store + looped(rows * quads * 4));
    let around = 2 * stage(br) + 2 * (looped(d16) + d16 * load) + looped(rows) + gradients * (looped(d16) + store_band);
    1 + walked * per_tile + around
}

/// Loop trips of one invocation of the dQ pass over a range of `keys` keys (its walk starts within
/// the range, so it takes at most this many tiles).
pub fn dq_iterations(v: &CoopBackwardVariant, sg: u32, keys: usize) -> u64 {
    iterations(v, sg, keys.div_ceil(v.bc as usize) as u64, 1)
}

/// Loop trips of one invocation of the dK/dV pass over a range of `rows` query rows of each of
/// `group` query heads (with its group loop and the two binary searches for the rows
/// its keys are visible to).
pub fn dkdv_iterations(v: &CoopBackwardVariant, sg: u32, rows: usize, group: u64) -> u64 {
    let tiles = rows.div_ceil(v.bc as usize) as u64;
    let searches = 2 * (u64::from(usize::BITS - rows.leading_zeros()) + 2);
    iterations(v, sg, group * tiles, 2) + searches + group + 1
}

/// The tensor-core backward's variants, arrayed and named, for 32-lane subgroups (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    VARIANTS
        .iter()
        .flat_map(|v| [v.with_named(false), v.with_named(true)])
        .flat_map(|v| [v.dq(32), v.dkdv(32)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_holds_together_on_the_subgroup_sizes_it_meets() {
        for v in VARIANTS {
            for sg in [8, 16, 32, 64] {
                assert!(v.valid_for(sg), "{v:?} on {sg} lanes");
            }
        }
        // Each class has a variant for 48 KiB and one for lavapipe's 32 KiB.
        for class in [32, 64, 128] {
            let pick = |bytes| variant_for(class, 32, bytes, 1024).map(|v| v.br);
            assert_eq!(pick(48 * 1024), Some(64), "class {class}");
            assert_eq!(pick(32 * 1024), Some(32), "class {class}");
        }
        assert_eq!(variant_for(129, 32, 1 << 20, 1024), None);
        assert_eq!(variant_for(40, 8, 32 * 1024, 1024).map(|v| v.dmax), Some(64));
        // Two subgroups per band: 8 of 64 lanes pass no 256-invocation limit, 4 do (the
        // 32-row variant is taken); at 128 invocations none fits.
        assert_eq!(variant_for(64, 64, 48 * 1024, 256).map(|v| v.br), Some(32));
        assert_eq!(variant_for(64, 64, 48 * 1024, 128), None);
    }

    #[test]
    fn candidates_come_in_both_forms_and_labels_round_trip() {
        let all = candidates(128, 32, 48 * 1024, 1024);
        assert!(all.contains(&VARIANTS[4]) && all.contains(&VARIANTS[4].with_named(true)));
        assert_eq!(2 * all.iter().filter(|v| v.named).count(), all.len());
        for v in &all {
            assert!(v.workgroup_bytes() <= 48 * 1024 && v.valid_for(32), "{v:?}");
            assert_eq!(CoopBackwardVariant::parse_valid(&v.label()), Some(*v));
        }
        assert!(candidates(256, 32, 48 * 1024, 1024).is_empty());
        assert_eq!(CoopBackwardVariant::parse_valid("64x40x32"), None);
    }
}
