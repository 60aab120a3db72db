//! The tensor-core tiling's variants as data: a [`CoopVariant`] is three numbers
//! (largest head dim, query rows and keys per tile) and a design axis (fragments as
//! arrays or named values, [`crate::kernels::unroll`]), and its kernel is
//! `flash_coop.wgsl` so generated, behind a one-line prelude of those numbers and the
//! adapter's subgroup size. The picker takes the first variant of a head-dim class that fits the
//! adapter's workgroup memory, unless a tuning table names another
//! ([`crate::kernels::tune`]); tests and `tune` build any other variant the same way.

use super::super::{Kernel, Slot, Text, COMMON, COOP_STAGING};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// One variant of `flash_coop.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopVariant {
    /// Head dims up to this (a multiple of 16).
    pub dmax: u32,
    /// Query rows per workgroup: one 16-row band per subgroup (per `split` subgroups).
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
    /// Subgroups per band (1 or 2): with 2, each holds half the band's output tiles and
    /// computes half of each key tile's score chunks (label `sN` where it differs from
    /// [`CoopVariant::new`]'s default, 2 at DMAX 256 with an even number of 16-key chunks
    /// that divides 16; else 1).
    pub split: u32,
    /// Q chunks kept in workgroup memory (`qs`) instead of registers, re-read every key
    /// tile, with the output tiles' passes through `ss` written out rotating (label
    /// `qN` where it differs from the default, 8 at DMAX 256 without a split; else 0).
    pub qr: u32,
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
        let split = default_split(dmax, bc);
        CoopVariant {
            dmax,
            br,
            bc,
            named: false,
            bands: 1,
            direct: false,
            split,
            qr: default_qr(dmax, bc, split),
        }
    }

    /// The same variant with `split` subgroups per band.
    pub const fn with_split(self, split: u32) -> Self {
        CoopVariant { split, ..self }
    }

    /// The same variant with `qr` of Q's chunks in workgroup memory.
    pub const fn with_qr(self, qr: u32) -> Self {
        CoopVariant { qr, ..self }
    }

    /// Whether its passes of the output tiles through `ss` are written out rotating
    /// (`flash_coop.wgsl`, PASS_ROTATE): with Q chunks in workgroup memory, where every
    /// pass takes whole groups of tiles.
    fn rotates(&self) -> bool {
        let (oh, kh) = (
            self.dmax / 16 / self.split.max(1),
            (self.bc / 16 / self.split.max(1)).max(1),
        );
        self.qr > 0 && oh.is_multiple_of(kh)
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
    /// the rescale flag (16 bytes, as every workgroup variable of a coop kernel), and Q's
    /// last QR chunks (`qs`, rows of 16 QR + 8 halves) where it keeps them there.
    pub const fn workgroup_bytes(&self) -> u32 {
        let staged_rows = if self.direct { self.br } else { 2 * self.bc };
        let qs = if self.qr > 0 {
            2 * self.br * (16 * self.qr + 8)
        } else {
            0
        };
        2 * staged_rows * (self.dmax + 8) + 4 * self.br * (self.bc + 4) + 2 * self.br * (self.bc + 8) + 16 + qs
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
    /// (`band_layout_holds`) and is not retired: two bands of named fragments spill at
    /// every head-dim class on RDNA3 (docs/isa.md), are the default nowhere and no
    /// GPU has timed them, so no pin, table or `tune` reaches them.
    pub fn valid_for(&self, sg: u32) -> bool {
        let (d16, kc) = (self.dmax / 16, self.bc / 16);
        band_layout_holds(self.dmax, self.br, self.bc, sg)
            && matches!(self.bands, 1 | 2)
            && !(self.bands == 2 && self.named)
            && self.br.is_multiple_of(16 * self.bands)
            // Split: each subgroup half the score chunks and output tiles, every pass
            // through `ss` whole (its slots map to output columns by ss_col), and the
            // softmax's lanes per row taken over both subgroups.
            && match self.split {
                1 => true,
                2 => kc.is_multiple_of(2) && d16.is_multiple_of(kc) && self.bc.is_multiple_of(4 * lanes_per_row(2 * sg)),
                _ => false,
            }
            && self.qr < d16
    }

    /// Invocations per workgroup with subgroups of `sg` lanes.
    pub fn invocations(&self, sg: u32) -> u32 {
        self.br / (16 * self.bands.max(1)) * sg * self.split.max(1)
    }

    /// Its kernel for subgroups of `sg` lanes (built once per process and kept): the
    /// generated constants, then the unrolled file.
    pub fn kernel(&self, sg: u32) -> Kernel {
        static BUILT: OnceLock<Mutex<HashMap<(CoopVariant, u32), Kernel>>> = OnceLock::new();
        let mut built = BUILT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let kernel = built.entry((*self, sg)).or_insert_with(|| {
            let constants = generator_prelude(self.dmax, self.br, self.bc, sg, self.bands, self.split);
            Kernel {
                file: "flash_coop.wgsl",
                source: Text::from(format!("{constants}const QR: u32 = {}u;\n{}", self.qr, self.source())),
                entry: "flash_coop",
                slots: if self.direct { COOP_DIRECT_SLOTS } else { COOP_SLOTS },
                preludes: &[COMMON, COOP_STAGING],
                variant: Text::from(format!("[{} sg{sg}]", self.label())),
            }
        });
        kernel.clone()
    }

    /// `flash_coop.wgsl` through the generator ([`crate::kernels::unroll`]), arrayed or
    /// named (the source is the same for every subgroup size).
    fn source(&self) -> String {
        let d16 = self.dmax / 16;
        let kc = (self.bc / 16).max(1);
        let split = self.split.max(1);
        let (oh, kh) = (d16 / split, (kc / split).max(1));
        let consts = [
            ("D16", d16),
            ("KC", kc),
            ("NG", d16.div_ceil(kc)),
            ("BANDS", self.bands),
            ("DIRECT", u32::from(self.direct)),
            ("STAGED", u32::from(!self.direct)),
            ("OH", oh),
            ("KH", kh),
            ("OH_KH", oh.saturating_sub(kh)),
            ("QR", self.qr),
            ("QK", d16 - self.qr.min(d16)),
            ("ROTATE", u32::from(self.rotates())),
            ("SPLIT_ON", u32::from(split > 1)),
            ("LATE_Q", u32::from(late_q(self))),
            ("EARLY_Q", u32::from(!late_q(self))),
        ];
        // The file's directives are tested (tests of this module, shader_validation):
        // an error here is a bug in the file, not in anything a user gave.
        super::super::unroll::expand(SOURCE, self.named, &consts)
            .unwrap_or_else(|e| panic!("shaders/flash_coop.wgsl: {e}"))
    }

    /// `DMAXxBRxBC`, with `sN` and `qN` after it for a split or Q chunks in workgroup
    /// memory other than the default, `r32` for two bands per subgroup, `d` for K and V
    /// loaded from storage and `n` for named fragments, as `tune` and the tuning table
    /// write it (`128x64x32r32dn`, `256x64x32s1`).
    pub fn label(&self) -> String {
        let default = CoopVariant::new(self.dmax, self.br, self.bc);
        let split = if self.split != default.split {
            format!("s{}", self.split)
        } else {
            String::new()
        };
        let qr = if self.qr != default.qr {
            format!("q{}", self.qr)
        } else {
            String::new()
        };
        let named = if self.named { "n" } else { "" };
        let direct = if self.direct { "d" } else { "" };
        let rows = if self.bands != 1 {
            format!("r{}", 16 * self.bands)
        } else {
            String::new()
        };
        format!("{}x{}x{}{split}{qr}{rows}{direct}{named}", self.dmax, self.br, self.bc)
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
        let (label, qr) = match label.split_once('q') {
            Some((shape, qr)) => (shape, Some(qr.parse::<u32>().ok()?)),
            None => (label, None),
        };
        let (label, split) = match label.split_once('s') {
            Some((shape, split)) => (shape, Some(split.parse::<u32>().ok()?)),
            None => (label, None),
        };
        let mut parts = label.split('x').map(|n| n.parse::<u32>().ok());
        let (dmax, br, bc) = (parts.next()??, parts.next()??, parts.next()??);
        let v = CoopVariant::new(dmax, br, bc);
        parts.next().is_none().then_some(
            v.with_split(split.unwrap_or(v.split))
                .with_qr(qr.unwrap_or(v.qr))
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
                // Q's chunks in workgroup memory in the same proportion.
                v.dmax /= 2;
                v.qr /= 2;
            } else if v.br > 16 * v.bands {
                v.br /= 2;
            } else {
                return None;
            }
        }
        Some(v)
    }
}

/// Subgroups per band by default: 2 at DMAX 256 where a tile's 16-key chunks split
/// evenly and every pass through `ss` is whole (256x64x32: 16 Q fragments and 16
/// output tiles per subgroup spilled on RDNA3; docs/isa.md).
const fn default_split(dmax: u32, bc: u32) -> u32 {
    let (d16, kc) = (dmax / 16, bc / 16);
    if dmax == 256 && kc > 0 && kc.is_multiple_of(2) && d16.is_multiple_of(kc) {
        2
    } else {
        1
    }
}

/// Q chunks in workgroup memory by default: 8 at DMAX 256 without a split (256x32x16;
/// docs/isa.md), where the passes through `ss` rotate.
const fn default_qr(dmax: u32, bc: u32, split: u32) -> u32 {
    if dmax == 256 && split == 1 && bc == 16 {
        8
    } else {
        0
    }
}

/// Whether the Q fragments are loaded after the resume, each used at once by the
/// "warm" chain (`flash_coop.wgsl`, LATE_Q): at DMAX 256 (one band), where it takes RDNA3's
/// spills away, and in the named forms (24-48 fewer VGPRs at D 64). Elsewhere it
/// costs registers (128x64x48: 216 to 240 VGPRs) and is left out (docs/isa.md).
fn late_q(v: &CoopVariant) -> bool {
    (v.dmax == 256 && v.bands == 1) || (v.named && !v.direct)
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

/// The generated constants that open a tensor-core kernel's source: DMAX, BR, BC, the
/// subgroup size SG, LPR / RPL, the element-wise step's lanes per row and rows per
/// lane, BANDS, the 16-row bands per subgroup, and SPLIT, the subgroups per band (the
/// forward's axes; 1 for the backward). A band's rows are shared by its SPLIT
/// subgroups' lanes.
pub(crate) fn generator_prelude(dmax: u32, br: u32, bc: u32, sg: u32, bands: u32, split: u32) -> String {
    let lanes = sg * split.max(1);
    let lpr = lanes_per_row(lanes);
    let rpl = if lanes < 16 { 16 / lanes.max(1) } else { 1 } * bands;
    format!(
        "const DMAX: u32 = {dmax}u;\nconst BR: u32 = {br}u;\nconst BC: u32 = {bc}u;\nconst SG: u32 = {sg}u;\n\
         const LPR: u32 = {lpr}u;\nconst RPL: u32 = {rpl}u;\nconst BANDS: u32 = {bands}u;\nconst SPLIT: u32 = {split}u;\n"
    )
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
