//! The kernels `isa` compiles: what a GPU-class adapter can run (the pickers' choices
//! and the tuners' candidates; CI's budget), or every variant the crate can dispatch.

use crate::kernels::{self, backward_blocked, backward_coop, decode, flash, matmul, Kernel};
use crate::tensor::DType;

/// One pipeline to compile: a kernel, its element type and the override values its
/// launch fixes, and the subgroup size it assumes (required of the driver).
#[derive(Clone, Debug)]
pub struct IsaKernel {
    /// The name in `isa`'s table and the budget: `fused/shared f32`,
    /// `fused/coop 64x64x32 f16`, `matmul_coop.wgsl:matmul_coop f16`, ...
    pub label: String,
    /// The full WGSL.
    pub source: String,
    pub entry: String,
    pub constants: Vec<(String, u32)>,
    pub subgroup: Option<u32>,
}

/// The first line `--dump-wgsl` writes, which `--wgsl` reads back: what the file's
/// source needs besides itself to compile as the crate compiles it.
const HEADER: &str = "// isa:";

impl IsaKernel {
    fn new(label: String, kernel: Kernel, dtype: DType) -> Self {
        IsaKernel {
            label,
            source: kernels::shader_source(&kernel, dtype),
            entry: kernel.entry.to_string(),
            constants: Vec::new(),
            subgroup: None,
        }
    }

    /// A WGSL source of the user's (`isa --wgsl`): with override defaults and the
    /// driver's subgroup size, unless its first line is the header [`Self::dumped`]
    /// writes (then its entry point, override values and subgroup size, `entry` first
    /// where given).
    pub fn from_source(label: String, source: String, entry: Option<String>) -> Result<Self, String> {
        let mut kernel = IsaKernel {
            label,
            source,
            entry: String::new(),
            constants: Vec::new(),
            subgroup: None,
        };
        let header = kernel
            .source
            .lines()
            .next()
            .and_then(|l| l.strip_prefix(HEADER))
            .map(str::to_string);
        for field in header.as_deref().unwrap_or("").split_whitespace() {
            let bad = || format!("the '{HEADER}' line: '{field}' is not entry=NAME, NAME=VALUE or subgroup=N");
            let (name, value) = field.split_once('=').ok_or_else(bad)?;
            match name {
                "entry" => kernel.entry = value.to_string(),
                "subgroup" => kernel.subgroup = Some(value.parse().map_err(|_| bad())?),
                _ => kernel
                    .constants
                    .push((name.to_string(), value.parse().map_err(|_| bad())?)),
            }
        }
        if let Some(entry) = entry {
            kernel.entry = entry;
        }
        if kernel.entry.is_empty() {
            return Err("no entry point: give --entry, or a file --dump-wgsl wrote".into());
        }
        Ok(kernel)
    }

    /// The source with a first line naming its entry point, override values and
    /// subgroup size, which [`Self::from_source`] reads back (`isa --dump-wgsl`).
    pub fn dumped(&self) -> String {
        let mut line = format!("{HEADER} entry={}", self.entry);
        for (name, value) in &self.constants {
            line.push_str(&format!(" {name}={value}"));
        }
        if let Some(sg) = self.subgroup {
            line.push_str(&format!(" subgroup={sg}"));
        }
        format!("{line}\n{}", self.source)
    }

    /// A file name for the label (letters, digits, `-`, `_` and `.`; the rest `_`).
    pub fn file_stem(&self) -> String {
        let stem: String = self
            .label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        stem.replace(".wgsl", "")
    }

    /// A kernel under its file and entry name.
    fn plain(kernel: Kernel, dtype: DType) -> Self {
        Self::new(
            format!("{}:{}{} {}", kernel.file, kernel.entry, kernel.variant, dtype.name()),
            kernel,
            dtype,
        )
    }

    fn with_subgroup(mut self, sg: u32) -> Self {
        self.subgroup = Some(sg);
        self
    }

    fn with_constants(mut self, constants: &[(&'static str, u32)]) -> Self {
        self.constants = constants.iter().map(|&(n, v)| (n.to_string(), v)).collect();
        self
    }
}

/// The subgroup size the tensor-core kernels are built for on GPUs (NVIDIA's, AMD's
/// wave32); the one `isa` requires of them.
pub const GPU_SUBGROUP: u32 = 32;
/// The workgroup memory the tuner's candidates are drawn for: an NVIDIA GPU's 48 KiB
/// (RDNA3's 64 KiB holds more; these are the ones every such GPU runs).
const GPU_WORKGROUP_BYTES: u32 = 48 * 1024;
const GPU_INVOCATIONS: u32 = 1024;

const BOTH: [DType; 2] = [DType::F32, DType::F16];

/// A kernel with a `WORDS` override as both pipelines the host makes of it: WORDS 0
/// (staging element by element) and 1 (`... words`, 16 bytes per load, wherever head
/// dims and strides are whole words: the common case), whose registers differ.
fn with_words(kernel: IsaKernel) -> Vec<IsaKernel> {
    if !kernel.source.contains("override WORDS") {
        return vec![kernel];
    }
    let (name, dtype) = kernel.label.rsplit_once(' ').unwrap_or((&kernel.label, ""));
    let mut words = kernel.clone();
    words.label = format!("{name} words {dtype}");
    words.constants.push(("WORDS".to_string(), 1));
    vec![kernel, words]
}

/// Every kernel a GPU-class adapter (no CPU driver) can run from the pickers, or that
/// `tune` and `tune --backward` time on one: the fused tilings meant for GPUs (`shared`,
/// `coop` with the picker's variants and the tuner's candidates, `micro`), split-K decode
/// (`tiles`, `lanes` at 32 lanes, the combine), the backward (rows, blocked, coop), the
/// materialized path, the GEMMs and the layer's small kernels, each in f32 and f16. Left
/// out: what only CPU adapters run (texel and 8-lane subgroup kernels, `blocked`,
/// `registers`) and the driver probes.
pub fn gpu() -> Vec<IsaKernel> {
    let mut out = Vec::new();
    for dtype in BOTH {
        // 64 rows per workgroup, over 1, 2 and 4 lanes each, summed by subgroup shuffles
        // or through workgroup memory (flash::shared_for; the run-time kernel is for CPU
        // adapters).
        for (class, kernel, invocations) in [
            (" 64", flash::SHARED_64, 64),
            (" 128", flash::SHARED_128, 128),
            (" 256", flash::SHARED_256, 256),
            (" 128 wg", flash::SHARED_128_WG, 128),
            (" 256 wg", flash::SHARED_256_WG, 256),
        ] {
            out.push(
                IsaKernel::new(format!("fused/shared{class} {}", dtype.name()), kernel, dtype)
                    .with_constants(&[("ROWS", invocations)]),
            );
        }
    }
    // The picker's coop variants (f32 inputs run them at precision medium), then the
    // tuner's f16 candidates per head-dim class.
    let mut coop: Vec<(flash::CoopVariant, DType)> = flash::COOP_VARIANTS
        .iter()
        .flat_map(|&v| BOTH.map(|d| (v, d)))
        .collect();
    for class in [64, 128, 256] {
        for v in crate::kernels::tune::coop_candidates(class, GPU_SUBGROUP, GPU_WORKGROUP_BYTES, GPU_INVOCATIONS) {
            if !coop.contains(&(v, DType::F16)) {
                coop.push((v, DType::F16));
            }
        }
    }
    for (v, dtype) in coop {
        // A direct variant runs on f16 storage only (kernels::flash::direct_serves).
        if v.direct && dtype != DType::F16 {
            continue;
        }
        let label = format!("fused/coop {} {}", v.label(), dtype.name());
        out.extend(with_words(
            IsaKernel::new(label, v.kernel(GPU_SUBGROUP), dtype).with_subgroup(GPU_SUBGROUP),
        ));
    }
    for v in flash::MICRO {
        for dtype in BOTH {
            out.push(IsaKernel::new(
                format!("fused/micro {}x{} {}", v.dmax, v.lanes, dtype.name()),
                v.kernel.clone(),
                dtype,
            ));
            out.push(IsaKernel::new(
                format!("fused/micro {}x{} words {}", v.dmax, v.lanes, dtype.name()),
                v.words.clone(),
                dtype,
            ));
        }
    }
    for dtype in BOTH {
        for v in &decode::SPLIT_VARIANTS {
            out.push(IsaKernel::plain(v.kernel.clone(), dtype));
        }
        out.push(IsaKernel::plain(decode::COMBINE, dtype));
        for v in decode::LanesVariant::ALL.iter().filter(|v| v.sg == GPU_SUBGROUP) {
            out.push(
                IsaKernel::new(
                    format!(
                        "decode/lanes {} sg{} lk{}{} {}",
                        v.dmax,
                        v.sg,
                        v.lk,
                        if v.int8 { " int8" } else { "" },
                        dtype.name()
                    ),
                    v.kernel(),
                    dtype,
                )
                .with_subgroup(GPU_SUBGROUP),
            );
        }
    }
    for dtype in BOTH {
        out.push(IsaKernel::plain(crate::kernels::backward_passes::DELTA, dtype));
        // `rows`' head-dim classes: 32 rows (keys) per workgroup, over 1, 2, 4 and 8
        // lanes each, summed by subgroup shuffles or through workgroup memory
        // (backward::rows_for; the run-time kernels are for CPU adapters).
        for (class, lanes) in [
            (crate::kernels::backward_passes::ROWS_32, 1),
            (crate::kernels::backward_passes::ROWS_64, 2),
            (crate::kernels::backward_passes::ROWS_128, 4),
            (crate::kernels::backward_passes::ROWS_256, 8),
            (crate::kernels::backward_passes::ROWS_64_WG, 2),
            (crate::kernels::backward_passes::ROWS_128_WG, 4),
            (crate::kernels::backward_passes::ROWS_256_WG, 8),
        ] {
            for kernel in [class.dq, class.dkdv] {
                out.push(IsaKernel::plain(kernel, dtype).with_constants(&[("ROWS", 32 * lanes)]));
            }
        }
        for v in backward_blocked::VARIANTS
            .iter()
            .chain(&backward_blocked::HALF_TILE_VARIANTS)
        {
            for kernel in [
                v.dq(crate::kernels::backward_passes::DQ_SLOTS),
                v.dkdv(crate::kernels::backward_passes::DKDV_SLOTS),
            ] {
                out.push(IsaKernel::plain(kernel, dtype));
            }
        }
        for v in backward_coop::VARIANTS {
            for kernel in [v.dq(GPU_SUBGROUP), v.dkdv(GPU_SUBGROUP)] {
                out.extend(with_words(
                    IsaKernel::new(
                        format!("backward/coop {} {} {}", v.label(), kernel.entry, dtype.name()),
                        kernel,
                        dtype,
                    )
                    .with_subgroup(GPU_SUBGROUP),
                ));
            }
        }
    }
    for dtype in BOTH {
        for kernel in [
            crate::kernels::backward_passes::MAT_DS,
            crate::kernels::backward_passes::MAT_DQ,
            crate::kernels::backward_passes::MAT_DKDV,
            kernels::qk_scores::KERNEL,
            kernels::softmax_rows::KERNEL,
            kernels::weights_v::KERNEL,
            matmul::TILED,
            matmul::BLOCKED,
            kernels::gemm::F32_OUT,
            kernels::gemm::ELEM_OUT,
            kernels::layer_norm::KERNEL,
            kernels::layer_norm_backward::ROWS,
            kernels::layer_norm_backward::COLUMNS,
            kernels::mean_heads::KERNEL,
            kernels::pack_rows::KERNEL,
            kernels::kv_append::KERNEL,
            kernels::kv_append::QUANTIZE,
            crate::kernels::kv_dequantize::DEQUANTIZE,
            crate::kernels::rotary::KERNEL,
            crate::kernels::merge::FOLD,
            crate::kernels::merge::STORE,
        ] {
            out.push(IsaKernel::plain(kernel, dtype));
        }
        out.push(IsaKernel::plain(matmul::COOP, dtype).with_subgroup(GPU_SUBGROUP));
    }
    out.push(IsaKernel::plain(matmul::COOP_DIRECT, DType::F16).with_subgroup(GPU_SUBGROUP));
    out
}

/// Every kernel variant the crate can dispatch ([`kernels::every_kernel`]) in f32 and
/// f16, the tensor-core ones at 32 lanes, and the GPU set's launches besides.
pub fn all() -> Vec<IsaKernel> {
    let mut out = gpu();
    for kernel in kernels::every_kernel() {
        for dtype in BOTH {
            let mut k = IsaKernel::plain(kernel.clone(), dtype);
            if kernel.source.contains("enable wgpu_cooperative_matrix;") {
                k = k.with_subgroup(GPU_SUBGROUP);
            }
            if !out.iter().any(|o| o.label == k.label) {
                out.push(k);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_label_names_one_kernel() {
        // The budget is keyed by label: two kernels under one name would share a row.
        let all = super::all();
        let mut labels: Vec<&str> = all.iter().map(|k| k.label.as_str()).collect();
        labels.sort_unstable();
        let before = labels.len();
        labels.dedup();
        assert_eq!(labels.len(), before, "duplicate labels in isa::kernels::all()");
    }

    #[test]
    fn a_dumped_kernel_reads_back_as_it_was_compiled() {
        // `isa --dump-wgsl` then `--wgsl`: the same entry, override values and subgroup
        // size, for every GPU kernel with overrides or a subgroup size; distinct files.
        let gpu = super::gpu();
        let mut stems: Vec<String> = gpu.iter().map(|k| k.file_stem()).collect();
        stems.sort_unstable();
        stems.dedup();
        assert_eq!(stems.len(), gpu.len(), "two kernels would dump to one file");
        let mut checked = 0;
        for k in gpu.iter().filter(|k| !k.constants.is_empty() || k.subgroup.is_some()) {
            let back = super::IsaKernel::from_source("copy".into(), k.dumped(), None).expect(&k.label);
            assert_eq!(
                (&back.entry, &back.constants, back.subgroup),
                (&k.entry, &k.constants, k.subgroup)
            );
            checked += 1;
        }
        assert!(checked > 10, "only {checked} kernels with overrides or a subgroup size");
        // A header it cannot read is refused, naming the field; no entry point at all too.
        let bad = "// isa: entry=main ROWS=sixty\nfn main() {}".to_string();
        let err = super::IsaKernel::from_source("x".into(), bad, None).expect_err("a header with a bad value");
        assert!(err.contains("ROWS=sixty"), "{err}");
        assert!(super::IsaKernel::from_source("x".into(), "fn main() {}".into(), None).is_err());
    }
}
