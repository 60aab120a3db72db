//! Tuning tables: which tensor-core variant ([`CoopVariant`]) ran fastest on an
//! adapter, per head-dim class, as `wgpu-attention tune` measured it.
//!
//! A context made by [`crate::Context::new`] (or `from_adapter`) reads two tables and
//! takes the entries that name its adapter (PCI vendor, device name and driver, all
//! exactly as wgpu reports them):
//! - the one checked in with the crate (`tune/winners.tsv`, measured winners);
//! - the user's own, which wins where both name the same adapter and class: the file
//!   `WGPU_ATTENTION_TUNE_FILE` names, else `$XDG_CONFIG_HOME/wgpu-attention/tune.tsv`
//!   (`~/.config/wgpu-attention/tune.tsv` without `XDG_CONFIG_HOME`), where it exists.
//!
//! Without an entry the picker's rule applies: the first variant of the class that fits
//! the adapter's workgroup memory ([`crate::kernels::flash::COOP_VARIANTS`]).
//!
//! The format is plain text, one entry per line, tab-separated:
//!
//! ```text
//! # tiling  vendor  device                   driver      variant
//! coop      0x10de  NVIDIA H100 80GB HBM3    580.159.04  128x64x32
//! ```
//!
//! Lines starting with `#` are comments; the variant is `DMAXxBRxBC` (with `n` after it
//! for named fragments, [`CoopVariant::named`]), its DMAX within the head-dim class it
//! serves.

use crate::error::{Error, Result};
use crate::kernels::flash::CoopVariant;
use std::path::PathBuf;

/// The environment variable naming a user tuning table.
pub const TUNE_FILE_VAR: &str = "WGPU_ATTENTION_TUNE_FILE";

/// The checked-in table.
const BUILTIN: &str = include_str!("../../tune/winners.tsv");

/// One measured winner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneEntry {
    /// PCI vendor id (`AdapterInfo::vendor`).
    pub vendor: u32,
    /// Adapter name (`AdapterInfo::name`).
    pub device: String,
    /// Driver description (`AdapterInfo::driver_info`).
    pub driver: String,
    /// The variant that won, for its head-dim class (its `dmax`).
    pub variant: CoopVariant,
}

impl TuneEntry {
    /// The entry for a variant measured on the adapter `info` describes.
    pub fn for_adapter(info: &wgpu::AdapterInfo, variant: CoopVariant) -> Self {
        TuneEntry {
            vendor: info.vendor,
            device: info.name.clone(),
            driver: info.driver_info.clone(),
            variant,
        }
    }

    fn names(&self, info: &wgpu::AdapterInfo) -> bool {
        self.vendor == info.vendor && self.device == info.name && self.driver == info.driver_info
    }

    /// The entry's line in a table (without its newline).
    pub fn line(&self) -> String {
        format!(
            "coop\t{:#06x}\t{}\t{}\t{}",
            self.vendor,
            self.device,
            self.driver,
            self.variant.label()
        )
    }

    /// One line of a table: `None` for a comment or blank line, else the entry, or why
    /// it is not one.
    fn parse_line(line: &str) -> std::result::Result<Option<Self>, String> {
        // Comments are whole lines: device and driver names may hold `#`.
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            return Ok(None);
        }
        // Device and driver are kept exactly as written: they must equal what wgpu
        // reports.
        let fields: Vec<&str> = line.split('\t').collect();
        let [tiling, vendor, device, driver, variant] = fields[..] else {
            return Err(format!(
                "expected 5 tab-separated fields (tiling, vendor, device, driver, variant), found {}",
                fields.len()
            ));
        };
        let (tiling, vendor, variant) = (tiling.trim(), vendor.trim(), variant.trim());
        if tiling != "coop" {
            return Err(format!("unknown tiling '{tiling}' (only coop is tuned)"));
        }
        let vendor = vendor
            .strip_prefix("0x")
            .map_or_else(|| vendor.parse::<u32>(), |hex| u32::from_str_radix(hex, 16))
            .map_err(|_| format!("vendor '{vendor}' is not a number"))?;
        let variant = CoopVariant::parse_valid(variant)
            .ok_or_else(|| format!("'{variant}' is not a valid DMAXxBRxBC variant"))?;
        Ok(Some(TuneEntry {
            vendor,
            device: device.to_string(),
            driver: driver.to_string(),
            variant,
        }))
    }

    /// Same adapter and head-dim class.
    fn same_slot(&self, other: &TuneEntry) -> bool {
        self.vendor == other.vendor
            && self.device == other.device
            && self.driver == other.driver
            && self.variant.dmax == other.variant.dmax
    }
}

/// A tuning table: entries in order, the first for an adapter and class winning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TuneTable {
    /// The entries, in order of precedence.
    pub entries: Vec<TuneEntry>,
}

impl TuneTable {
    /// Parses the text form; `source` names it in errors (a path, `built-in`).
    pub fn parse(source: &str, text: &str) -> Result<Self> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let bad = |reason: String| Error::invalid(format!("tuning table {source}, line {}", n + 1), reason);
            if let Some(entry) = TuneEntry::parse_line(line).map_err(bad)? {
                entries.push(entry);
            }
        }
        Ok(TuneTable { entries })
    }

    /// `text`, a table's text from `source`, with `entries` set in it: an entry for the
    /// same adapter and class as one of them is replaced where it stands, the others are
    /// appended, and every other line (comments, other adapters) is kept as it was.
    pub fn merged_text(source: &str, text: &str, entries: &[TuneEntry]) -> Result<String> {
        Self::parse(source, text)?;
        let mut placed = vec![false; entries.len()];
        let mut out = if text.trim().is_empty() {
            Self::default().to_text()
        } else {
            String::new()
        };
        for line in text.lines() {
            let old = TuneEntry::parse_line(line).ok().flatten();
            let new = old.and_then(|old| entries.iter().position(|e| e.same_slot(&old)));
            match new {
                Some(i) if !placed[i] => {
                    placed[i] = true;
                    out.push_str(&entries[i].line());
                }
                // A later line for a slot just replaced: the reader ignored it already.
                Some(_) => continue,
                None => out.push_str(line),
            }
            out.push('\n');
        }
        for (e, placed) in entries.iter().zip(placed) {
            if !placed {
                out.push_str(&e.line());
                out.push('\n');
            }
        }
        Ok(out)
    }

    /// The text form (parses back to the same table).
    pub fn to_text(&self) -> String {
        let mut out =
            String::from("# wgpu-attention tuning table: tiling, vendor, device, driver, variant (DMAXxBRxBC)\n");
        for e in &self.entries {
            out.push_str(&e.line());
            out.push('\n');
        }
        out
    }

    /// The checked-in table.
    pub fn builtin() -> Self {
        // A test parses it; a bad edit fails there, not in users' contexts.
        Self::parse("built-in", BUILTIN).unwrap_or_default()
    }

    /// Where the user's table is looked for (see the module docs); `None` where no
    /// home or configuration directory is known. `WGPU_ATTENTION_TUNE_FILE` set but
    /// empty is refused, naming it (it would otherwise mean "no table" unnoticed);
    /// `XDG_CONFIG_HOME` empty or relative is ignored, as the XDG specification says.
    pub fn user_path() -> Result<Option<PathBuf>> {
        if let Some(path) = crate::gpu::env_path(TUNE_FILE_VAR)? {
            return Ok(Some(path));
        }
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|home| PathBuf::from(home).join(".config"))
            });
        Ok(config.map(|c| c.join("wgpu-attention").join("tune.tsv")))
    }

    /// The user's table followed by the checked-in one (so the user's entries win). A
    /// user table that is absent counts as empty; one that cannot be read or parsed is
    /// an error that names it. On the web there is no user table.
    pub fn load() -> Result<Self> {
        let mut table = Self::user()?;
        table.entries.extend(Self::builtin().entries);
        Ok(table)
    }

    /// The user's table, or an empty one where there is none.
    #[cfg(not(target_arch = "wasm32"))]
    fn user() -> Result<Self> {
        let Some(path) = Self::user_path()? else {
            return Ok(Self::default());
        };
        match read_table_text(&path)? {
            Some(text) => Self::parse(&path.display().to_string(), &text),
            None => Ok(Self::default()),
        }
    }

    /// No user table on the web.
    #[cfg(target_arch = "wasm32")]
    fn user() -> Result<Self> {
        Ok(Self::default())
    }

    /// Adds or replaces (same adapter and class) an entry, keeping the others.
    pub fn set(&mut self, entry: TuneEntry) {
        self.entries.retain(|e| !e.same_slot(&entry));
        self.entries.push(entry);
    }

    /// The variants this table picks for an adapter: the first entry per class.
    pub fn coop_variants_for(&self, info: &wgpu::AdapterInfo) -> Vec<CoopVariant> {
        let mut picked: Vec<CoopVariant> = Vec::new();
        for e in self.entries.iter().filter(|e| e.names(info)) {
            if !picked.iter().any(|v| v.dmax == e.variant.dmax) {
                picked.push(e.variant);
            }
        }
        picked
    }
}

/// A count of key splits as `WGPU_ATTENTION_KEY_SPLITS` ([`crate::KEY_SPLITS_VAR`])
/// and `tune --key-splits` spell it: plain decimal digits (no sign, no spaces), 1 to
/// [`crate::MAX_KEY_SPLITS`]; `what` names the source in the error.
pub fn parse_key_splits(what: &str, text: &str) -> Result<u32> {
    let max = crate::kernels::policy::MAX_KEY_SPLITS;
    Some(text)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u32>().ok())
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| Error::invalid(what, format!("'{text}' is not a count of 1 to {max} (plain digits)")))
}

/// The largest tuning table read: a table holds a line per GPU, driver and head-dim
/// class, so anything larger is not one (and `/dev/zero` must not fill the memory).
pub const MAX_TABLE_BYTES: u64 = 1 << 20;

/// The text of the tuning table at `path`, or `None` where there is none. Only a regular
/// file (or a link to one) of at most [`MAX_TABLE_BYTES`] is read: a device or FIFO
/// would never end or never start, and a dangling link is refused by name rather than
/// taken for "no table".
#[cfg(not(target_arch = "wasm32"))]
pub fn read_table_text(path: &std::path::Path) -> Result<Option<String>> {
    use std::io::Read;
    let bad = |reason: String| Error::invalid(format!("tuning table {}", path.display()), reason);
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match std::fs::symlink_metadata(path) {
                Ok(_) => Err(bad("is a link to nothing (a dangling link)".into())),
                Err(_) => Ok(None),
            };
        }
        Err(e) => return Err(bad(format!("cannot be read: {e}"))),
    };
    if !meta.is_file() {
        return Err(bad("is not a regular file (a device, FIFO or directory)".into()));
    }
    let too_big = || bad(format!("is larger than {MAX_TABLE_BYTES} bytes: not a tuning table"));
    if meta.len() > MAX_TABLE_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TABLE_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| bad(format!("cannot be read: {e}")))?;
    if text.len() as u64 > MAX_TABLE_BYTES {
        return Err(too_big());
    }
    Ok(Some(text))
}

/// The variants `tune` tries for head dims up to `dmax` with subgroups of `sg` lanes
/// on an adapter granting `bytes` of workgroup memory and `invocations` per workgroup:
/// every query-row count of 1 to 4 bands and key tile of 16 to 64 that holds together
/// and fits, with one or two bands per subgroup, fragments as arrays and as named values,
/// K and V staged or loaded from storage (direct: `tune` skips those for a problem
/// they cannot serve, where their staged twins would run; so a direct candidate's twin
/// must fit as well).
pub fn coop_candidates(dmax: u32, sg: u32, bytes: u32, invocations: u32) -> Vec<CoopVariant> {
    coop_forms(dmax, sg, bytes, invocations)
        .into_iter()
        .filter(|v| !spills_on_rdna3(v) || (v.dmax == 256 && crate::kernels::flash::COOP_VARIANTS.contains(v)))
        .collect()
}

/// Whether a GPU compiler spills the form's registers to memory or keeps arrays in
/// scratch: RDNA3's does (`isa --radv-null navi31`, docs/isa.md, 2026-12-07) for two
/// bands of named fragments at every head-dim class (retired since:
/// [`CoopVariant::valid_for`]), for named fragments or two bands
/// past D 64, for every form at D 256 (where [`coop_candidates`] keeps only the
/// picker's variants, [`COOP_VARIANTS`], for want of any other), and, staging 16 bytes
/// per load (`WORDS`, the common case), for the staged forms of 16-row workgroups
/// walking tiles past 16 keys (and any past D 64), two bands but at 64 rows and up to
/// 48 keys, and at D 128 tiles of 48 keys or more with fewer than 64 rows. A unit test
/// holds the candidates to CI's register budget (`tune/isa-budget.tsv`): no spills,
/// no scratch, either way of staging.
///
/// [`COOP_VARIANTS`]: crate::kernels::flash::COOP_VARIANTS
pub fn spills_on_rdna3(v: &CoopVariant) -> bool {
    let two_bands = v.bands == 2;
    let any_staging = (two_bands && v.named) || (v.dmax > 64 && (two_bands || v.named)) || v.dmax > 128;
    let words = !v.direct
        && ((v.br == 16 && (v.bc > 16 || v.dmax > 64))
            || (two_bands && !(v.br == 64 && v.bc <= 48))
            || (v.dmax > 64 && v.br < 64 && v.bc >= 48));
    any_staging || words
}

/// Every form [`coop_candidates`] draws from, spilling ones included (the loop budget
/// bounds any variant a context may be pinned to).
pub fn coop_forms(dmax: u32, sg: u32, bytes: u32, invocations: u32) -> Vec<CoopVariant> {
    let mut out = Vec::new();
    for direct in [false, true] {
        for (bands, named) in [(1, false), (1, true), (2, false), (2, true)] {
            for br in [16, 32, 48, 64] {
                for bc in [16, 32, 48, 64] {
                    let v = CoopVariant::new(dmax, br, bc)
                        .with_named(named)
                        .with_bands(bands)
                        .with_direct(direct);
                    if v.valid_for(sg) && v.bytes_needed() <= bytes && v.invocations(sg) <= invocations {
                        out.push(v);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(name: &str, driver: &str) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: name.into(),
            vendor: 0x10de,
            driver_info: driver.into(),
            ..wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan)
        }
    }

    #[test]
    fn no_candidate_spills_in_cis_register_budget() {
        // The budget (`isa --radv-null navi31 --budget`, CI) bounds every kernel of
        // `isa`'s GPU set, these candidates among them, in both ways of staging; a row
        // of 0 spilled registers and 0 scratch means the compiler keeps it so.
        let budget = include_str!("../../tune/isa-budget.tsv");
        let clean = |label: &str| {
            budget
                .lines()
                .map(|l| l.split('\t').collect::<Vec<_>>())
                .find(|f| f[0] == label)
                .map(|f| f.len() == 5 && f[2] == "0" && f[3] == "0" && f[4] == "0")
        };
        let mut checked = 0;
        for class in [64, 128] {
            for v in coop_candidates(class, 32, 48 * 1024, 1024) {
                // Direct forms stage nothing: no WORDS twin.
                for words in if v.direct { &[""][..] } else { &["", " words"][..] } {
                    let label = format!("fused/coop {}{words} f16", v.label());
                    assert_eq!(clean(&label), Some(true), "{label}: its budget row");
                    checked += 1;
                }
            }
        }
        assert!(checked > 40, "only {checked} candidates");
    }

    #[test]
    fn tables_round_trip_and_pick_per_adapter_and_class() {
        let h100 = adapter("NVIDIA H100 #2", " 580.159.04");
        let mut table = TuneTable::default();
        table.set(TuneEntry::for_adapter(&h100, CoopVariant::new(128, 64, 32)));
        table.set(TuneEntry::for_adapter(&h100, CoopVariant::new(64, 64, 64)));
        // Replaces the 128 entry, keeps the 64 one.
        table.set(TuneEntry::for_adapter(&h100, CoopVariant::new(128, 32, 16)));
        assert_eq!(table.entries.len(), 2);
        let text = table.to_text();
        assert_eq!(TuneTable::parse("t", &text).expect("parses"), table, "{text}");
        let mut picked = table.coop_variants_for(&h100);
        picked.sort();
        assert_eq!(
            picked,
            vec![CoopVariant::new(64, 64, 64), CoopVariant::new(128, 32, 16)]
        );
        // Another driver release or device gets nothing.
        assert!(table.coop_variants_for(&adapter("NVIDIA H100", "575.1")).is_empty());
        assert!(table
            .coop_variants_for(&adapter("NVIDIA H200", "580.159.04"))
            .is_empty());
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        for (text, needle) in [
            ("coop\t0x10de\tX\t1\n", "5 tab-separated"),
            ("blocked\t0x10de\tX\t1\t64x64x32\n", "unknown tiling"),
            ("coop\tnvidia\tX\t1\t64x64x32\n", "vendor"),
            ("# ok\n\ncoop\t0x10de\tX\t1\t64x64x33\n", "line 3"),
            ("coop\t0x10de\tX\t1\t128x96x32\n", "valid"),
            // Sizes whose byte count would overflow u32 are refused, not wrapped.
            ("coop\t0x10de\tX\t1\t16x16x4294967280\n", "valid"),
            ("coop\t0x10de\tX\t1\t64x16x134217728\n", "valid"),
        ] {
            let e = TuneTable::parse("t", text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        assert!(TuneTable::parse("built-in", BUILTIN).is_ok());
    }

    #[test]
    fn merging_keeps_every_other_line_and_replaces_the_slot_in_place() {
        let h100 = adapter("NVIDIA H100", "580.159.04");
        let h200 = adapter("NVIDIA H200", "580.159.04");
        let text = format!(
            "# owner's note\n{}\n\n# another note\n{}\n",
            TuneEntry::for_adapter(&h100, CoopVariant::new(64, 64, 64)).line(),
            TuneEntry::for_adapter(&h200, CoopVariant::new(64, 64, 32)).line()
        );
        let new = [
            TuneEntry::for_adapter(&h100, CoopVariant::new(64, 32, 32)),
            TuneEntry::for_adapter(&h100, CoopVariant::new(128, 64, 48)),
        ];
        let merged = TuneTable::merged_text("t", &text, &new).expect("merges");
        assert_eq!(
            merged,
            format!(
                "# owner's note\n{}\n\n# another note\n{}\n{}\n",
                new[0].line(),
                TuneEntry::for_adapter(&h200, CoopVariant::new(64, 64, 32)).line(),
                new[1].line()
            )
        );
        // An empty table gets the header; a bad one is refused, not rewritten.
        assert!(TuneTable::merged_text("t", "", &new)
            .expect("merges")
            .starts_with("# wgpu-attention"));
        assert!(TuneTable::merged_text("t", "nonsense\n", &new).is_err());
    }

    #[test]
    fn the_checked_in_table_holds_the_h200_winners() {
        // Measured 2026-11-28 (docs/benchmarks.md, "NVIDIA H200").
        let h200 = adapter("NVIDIA H200", "580.159.04");
        assert_eq!(
            TuneTable::builtin().coop_variants_for(&h200),
            vec![CoopVariant::new(64, 64, 32), CoopVariant::new(128, 64, 48)]
        );
    }

    #[test]
    fn candidates_leave_out_the_forms_that_spill() {
        // D 64: every form but two bands of named fragments; D 128: one band, arrayed,
        // staged or direct; D 256: the picker's variants only.
        let d64 = coop_candidates(64, 32, 48 * 1024, 1024);
        assert!(d64.iter().any(|v| v.named) && d64.iter().any(|v| v.bands == 2));
        assert!(!d64.iter().any(|v| v.named && v.bands == 2));
        let d128 = coop_candidates(128, 32, 48 * 1024, 1024);
        assert!(d128.iter().all(|v| !v.named && v.bands == 1) && d128.iter().any(|v| v.direct));
        assert!(coop_forms(128, 32, 48 * 1024, 1024).len() > d128.len());
        let d256 = coop_candidates(256, 32, 48 * 1024, 1024);
        assert!(!d256.is_empty());
        assert!(d256.iter().all(|v| crate::kernels::flash::COOP_VARIANTS.contains(v)));
    }

    #[test]
    fn candidates_hold_together_and_fit() {
        let all = coop_forms(128, 32, 48 * 1024, 1024);
        assert!(all.contains(&CoopVariant::new(128, 64, 32)) && all.contains(&CoopVariant::new(128, 64, 48)));
        // Every shape in both forms of its fragments, with one band per subgroup or two,
        // staged or direct (the twin a direct variant falls back to must fit too).
        // (Two bands of named fragments are retired: CoopVariant::valid_for.)
        let staged: Vec<_> = all.iter().filter(|v| !v.direct).collect();
        let one_band = |named| staged.iter().filter(|v| v.bands == 1 && v.named == named).count();
        assert!(one_band(true) > 0 && one_band(true) == one_band(false), "{all:?}");
        assert!(staged.iter().all(|v| all.contains(&v.with_direct(true))), "{all:?}");
        assert!(all.contains(&CoopVariant::new(128, 64, 32).with_bands(2)));
        assert!(!all.iter().any(|v| v.bands == 2 && v.named), "{all:?}");
        assert!(all.iter().all(|v| v.with_direct(false).workgroup_bytes() <= 48 * 1024));
        assert!(!all.contains(&CoopVariant::new(128, 64, 64).with_direct(true)));
        assert!(all.iter().all(|v| v.br.is_multiple_of(16 * v.bands)));
        // lavapipe under emulation (32 KiB, 8 lanes): at least 30 candidates at D 64.
        assert!(coop_forms(64, 8, 32 * 1024, 256).len() >= 30);
        for v in &all {
            assert!(v.valid_for(32) && v.workgroup_bytes() <= 48 * 1024, "{v:?}");
        }
        assert!(coop_forms(256, 32, 16 * 1024, 1024).is_empty());
    }
}
