//! The tensor-core tiling's variants as data: a [`CoopVariant`] is three numbers
//! (largest head dim, query rows and keys per tile) and a design axis (fragments as
//! arrays or named values, [`crate::kernels::unroll`]), and its kernel is
//! `flash_coop.wgsl` so generated, behind a one-line prelude of those numbers and the
//! adapter's subgroup size. The picker takes the first variant of a head-dim class that fits the
//! adapter's workgroup memory, unless a tuning table names another
//! ([`crate::tune`]); tests and `tune` build any other variant the same way.

use super::super::{Kernel, Slot, COMMON, COOP_STAGING};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// One variant of `flash_coop.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopVariant {
    /// Head dims up to this (a multiple of 16).
    pub dmax: u32,
    /// Query rows per workgroup: one 16-row band per subgroup.
    pub br: u32,
    /// Keys per tile (a multiple of 16).
    pub bc: u32,
    /// The Q fragments and output tiles as one named value each, the loops over them
    /// unrolled by the generator; else arrays indexed by loop counters (label suffix `n`).
    pub named: bool,
    /// 16-row bands per subgroup, 1 or 2: with 2, each staged K and V fragment feeds
    /// two products (label `rROWS`, ROWS = 16 bands, before any `d` or `n`).
    pub bands: u32,
    /// K and V fragments loaded straight from their storage buffers, nothing staged
    /// (label suffix `d`, before any `n`). Runs only where [`direct_serves`] holds; its
    /// staged twin (the same variant without it) runs elsewhere.
    pub direct: bool,
}

/// The picker's variants, by head-dim class; within a class the first that fits the
/// adapter's workgroup memory is used. The first of each class wants NVIDIA's 48 KiB,
/// the second fits 32 KiB (Apple, Intel, lavapipe under emulation). None has run on
/// tensor cores yet: `wgpu-attention tune` measures them all.
pub const COOP_VARIANTS: [CoopVariant; 6] = [
    CoopVariant::new(64, 64, 64),
    CoopVariant::new(64, 64, 32),
    CoopVariant::new(128, 64, 48),
    CoopVariant::new(128, 64, 32),
    CoopVariant::new(256, 64, 32),
    CoopVariant::new(256, 32, 16),
];

/// Workgroup memory the coop tiling needs for every head dim: the largest of the
/// smallest variant of each class.
pub const COOP_MIN_BYTES: u32 = 31_760;
// The coop tiling must fit lavapipe's 32 KiB, where CI emulates it.
const _: () = assert!(COOP_MIN_BYTES <= 32 * 1024);

/// The bindings `flash_coop.wgsl` uses: the fused kernels' and K, V as 16-byte words.
pub const COOP_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Output,
    Slot::Mask,
    Slot::SideWords,
    Slot::Lse,
    Slot::K4,
    Slot::V4,
];

/// The bindings of a direct variant, which reads K and V only as f16 rows: all but
/// the words.
pub const COOP_DIRECT_SLOTS: &[Slot] = COOP_SLOTS.split_at(COOP_SLOTS.len() - 2).0;

const SOURCE: &str = include_str!("../../../shaders/flash_coop.wgsl");

impl CoopVariant {
    pub const fn new(dmax: u32, br: u32, bc: u32) -> Self {
        CoopVariant {
            dmax,
            br,
            bc,
            named: false,
            bands: 1,
            direct: false,
        }
    }

    /// The same variant with K and V fragments loaded from storage, or staged.
    pub const fn with_direct(self, direct: bool) -> Self {
        CoopVariant { direct, ..self }
    }

    /// The same variant with `bands` 16-row bands per subgroup.
    pub const fn with_bands(self, bands: u32) -> Self {
        CoopVariant { bands, ..self }
    }

    /// The same variant with named fragments.
    pub const fn with_named(self, named: bool) -> Self {
        CoopVariant { named, ..self }
    }

    /// Workgroup memory the variant declares, mirroring its WGSL (a test compares this
    /// with naga's layout): the K and V tile (rows of DMAX + 8 halves; direct, Q's BR
    /// rows only), the f32 score rows (BC + 4), the f16 probability rows (BC + 8) and
    /// the rescale flag (16 bytes, as every workgroup variable of a coop kernel).
    pub const fn workgroup_bytes(&self) -> u32 {
        let staged_rows = if self.direct { self.br } else { 2 * self.bc };
        2 * staged_rows * (self.dmax + 8) + 4 * self.br * (self.bc + 4) + 2 * self.br * (self.bc + 8) + 16
    }

    /// Workgroup memory the adapter must grant for the variant to be usable: its own,
    /// and for a direct variant also its staged twin's, which runs wherever the direct
    /// one does not serve a problem ([`direct_serves`]).
    pub const fn bytes_needed(&self) -> u32 {
        let own = self.workgroup_bytes();
        let twin = self.with_direct(false).workgroup_bytes();
        if own > twin {
            own
        } else {
            twin
        }
    }

    /// Whether the variant's WGSL holds together for subgroups of `sg` lanes
    /// (`band_layout_holds`).
    pub fn valid_for(&self, sg: u32) -> bool {
        band_layout_holds(self.dmax, self.br, self.bc, sg)
            && matches!(self.bands, 1 | 2)
            && self.br.is_multiple_of(16 * self.bands)
    }

    /// Invocations per workgroup with subgroups of `sg` lanes.
    pub fn invocations(&self, sg: u32) -> u32 {
        self.br / (16 * self.bands.max(1)) * sg
    }

    /// Its kernel for subgroups of `sg` lanes (built once per process and kept).
    pub fn kernel(&self, sg: u32) -> Kernel {
        static BUILT: OnceLock<Mutex<HashMap<(CoopVariant, u32), Kernel>>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *built.entry((*self, sg)).or_insert_with(|| {
            let constants = generator_prelude(self.dmax, self.br, self.bc, sg, self.bands);
            let preludes: &'static [&'static str] = Box::leak(Box::new([COMMON, COOP_STAGING, constants]));
            Kernel {
                file: "flash_coop.wgsl",
                source: self.source(),
                entry: "flash_coop",
                slots: if self.direct { COOP_DIRECT_SLOTS } else { COOP_SLOTS },
                preludes,
                variant: leak(format!("[{} sg{sg}]", self.label())),
            }
        })
    }

    /// `flash_coop.wgsl` through the generator ([`crate::kernels::unroll`]), arrayed or
    /// named (the source is the same for every subgroup size).
    fn source(&self) -> &'static str {
        let d16 = self.dmax / 16;
        let kc = (self.bc / 16).max(1);
        let consts = [
            ("D16", d16),
            ("KC", kc),
            ("NG", d16.div_ceil(kc)),
            ("BANDS", self.bands),
            ("DIRECT", u32::from(self.direct)),
            ("STAGED", u32::from(!self.direct)),
        ];
        // The file's directives are tested (tests of this module, shader_validation):
        // an error here is a bug in the file, not in anything a user gave.
        let source = super::super::unroll::expand(SOURCE, self.named, &consts)
            .unwrap_or_else(|e| panic!("shaders/flash_coop.wgsl: {e}"));
        leak(source)
    }

    /// `DMAXxBRxBC`, with `r32` after it for two bands per subgroup, `d` for K and V
    /// loaded from storage and `n` for named fragments, as `tune` and the tuning table
    /// write it (`128x64x32r32dn`).
    pub fn label(&self) -> String {
        let named = if self.named { "n" } else { "" };
        let direct = if self.direct { "d" } else { "" };
        let rows = if self.bands != 1 {
            format!("r{}", 16 * self.bands)
        } else {
            String::new()
        };
        format!("{}x{}x{}{rows}{direct}{named}", self.dmax, self.br, self.bc)
    }

    /// Parses [`CoopVariant::label`]'s form.
    pub fn parse(label: &str) -> Option<Self> {
        let label = label.trim();
        let (label, named) = match label.strip_suffix('n') {
            Some(arrayed) => (arrayed, true),
            None => (label, false),
        };
        let (label, direct) = match label.strip_suffix('d') {
            Some(staged) => (staged, true),
            None => (label, false),
        };
        let (label, bands) = match label.split_once('r') {
            Some((shape, rows)) => {
                let rows = rows.parse::<u32>().ok()?;
                (shape, (rows.is_multiple_of(16) && rows > 0).then_some(rows / 16)?)
            }
            None => (label, 1),
        };
        let mut parts = label.split('x').map(|n| n.parse::<u32>().ok());
        let (dmax, br, bc) = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(
            CoopVariant::new(dmax, br, bc)
                .with_named(named)
                .with_bands(bands)
                .with_direct(direct),
        )
    }

    /// Parses [`CoopVariant::label`]'s form, only for a variant whose WGSL holds
    /// together on 8- or 32-lane subgroups (`0x0x0` parses, but is no variant).
    pub fn parse_valid(label: &str) -> Option<Self> {
        Self::parse(label).filter(|v| v.valid_for(32) || v.valid_for(8))
    }

    /// The same code at constants that fit `bytes` of workgroup memory (for the
    /// emulation on lavapipe's 32 KiB): the head-dim class halved, then the query rows,
    /// until it fits; BC, and so the tile loop's shape, is kept.
    pub fn shrunk_to(&self, bytes: u32) -> Option<Self> {
        let mut v = *self;
        while v.workgroup_bytes() > bytes {
            if v.dmax > 16 {
                v.dmax /= 2;
            } else if v.br > 16 * v.bands {
                v.br /= 2;
            } else {
                return None;
            }
        }
        Some(v)
    }
}

/// A generated string kept for the life of the process (kernels hold `&'static str`;
/// a handful of variants are ever built).
pub(crate) fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Lanes per band row in the tensor-core kernels' element-wise steps (the forward's
/// softmax, the backward's P and dX) for subgroups of `sg` lanes.
const fn lanes_per_row(sg: u32) -> u32 {
    if sg > 16 {
        sg / 16
    } else {
        1
    }
}

/// Whether a tensor-core kernel's band layout holds together for subgroups of `sg`
/// lanes (`flash_coop.wgsl` and `flash_backward_coop.wgsl` share it): head dims up to
/// at most 256 in whole 16-wide chunks, 1 to 8 bands, whole 16-wide tiles of up to 256
/// keys or rows, the owned rows staged through the walked tiles (BR <= 2 BC), the
/// element-wise step's column quads shared evenly by a row's lanes, and subgroups that
/// divide a band (narrow) or a multiple of it (wide).
pub(crate) fn band_layout_holds(dmax: u32, br: u32, bc: u32, sg: u32) -> bool {
    let lpr = lanes_per_row(sg);
    sg > 0
        && sg <= 128
        && dmax <= 256
        && br <= 128
        && bc <= 256
        && (16 % sg == 0 || sg.is_multiple_of(16))
        && dmax.is_multiple_of(16)
        && dmax > 0
        && br.is_multiple_of(16)
        && br > 0
        && bc.is_multiple_of(16)
        && bc > 0
        && br <= 2 * bc
        && bc.is_multiple_of(4 * lpr)
}

/// The one-line generator prelude of a tensor-core kernel (kept for the life of the
/// process): DMAX, BR, BC, the subgroup size SG, LPR / RPL, the element-wise step's
/// lanes per row and rows per lane, and BANDS, the 16-row bands per subgroup (the
/// forward's axis; 1 for the backward).
pub(crate) fn generator_prelude(dmax: u32, br: u32, bc: u32, sg: u32, bands: u32) -> &'static str {
    let lpr = lanes_per_row(sg);
    let rpl = if sg < 16 { 16 / sg.max(1) } else { 1 } * bands;
    leak(format!(
        "const DMAX: u32 = {dmax}u;\nconst BR: u32 = {br}u;\nconst BC: u32 = {bc}u;\nconst SG: u32 = {sg}u;\n\
         const LPR: u32 = {lpr}u;\nconst RPL: u32 = {rpl}u;\nconst BANDS: u32 = {bands}u;\n"
    ))
}

/// The variant of [`COOP_VARIANTS`] for head dims `d`, `dv` on an adapter granting
/// `bytes` of workgroup memory: the smallest head-dim class that holds both, and in it
/// the first variant that fits.
pub fn coop_for(d: u32, dv: u32, bytes: u32) -> Option<CoopVariant> {
    let need = d.max(dv);
    let class = COOP_VARIANTS.iter().map(|v| v.dmax).find(|&dmax| need <= dmax)?;
    COOP_VARIANTS
        .iter()
        .copied()
        .find(|v| v.dmax == class && v.workgroup_bytes() <= bytes)
}

/// Whether a direct variant (K and V fragments loaded from storage) serves a dispatch:
/// every fragment it loads must lie inside real K and V rows and start 16-byte aligned
/// (the kernel has no staged fallback, so that its registers carry no staging). That
/// takes f16 storage, K and V strides of whole words (`words`, as the staged path
/// reads them), head dims of exactly DMAX, contiguous rows, and key tiles that start at
/// multiples of BC (no left window, a dispatch's first key one) in a key count that is
/// a multiple of BC, with no key lengths (rows past them may hold anything, NaN too).
pub fn direct_serves(v: &CoopVariant, f16_storage: bool, words: bool, params: &super::super::AttentionParams) -> bool {
    v.direct
        && f16_storage
        && words
        && params.head_dim == v.dmax
        && params.head_dim_v == v.dmax
        && params.page_size == 0
        && params.has_key_lengths == 0
        && params.has_left == 0
        && params.len_k > 0
        && params.len_k.is_multiple_of(v.bc)
        && params.key_begin.is_multiple_of(v.bc)
}

/// Whether the 16-byte word path serves a problem: head dims and every K and V stride
/// (row, head, batch, page) whole words of `elems_per_word` elements.
pub fn words_fit(elems_per_word: u32, head_dims: (u32, u32), strides: &[u32]) -> bool {
    head_dims.0.is_multiple_of(elems_per_word)
        && head_dims.1.is_multiple_of(elems_per_word)
        && strides.iter().all(|s| s.is_multiple_of(elems_per_word))
}
