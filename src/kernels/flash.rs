//! `shaders/flash_attention.wgsl`: the fused one-pass kernel, in two tilings.

use super::{dispatch, groups_for, pipeline, AttentionBindings, AttentionParams, Kernel, Slot, COMMON};
use crate::context::Context;
use crate::error::Result;
use crate::tensor::DType;

const SOURCE: &str = include_str!("../../shaders/flash_attention.wgsl");
const SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::K,
    Slot::V,
    Slot::Output,
    Slot::Mask,
    Slot::KeyLengths,
    Slot::Lse,
];

/// K/V read straight from storage, no barriers (CPU adapters).
pub const REGISTERS: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_registers",
    slots: SLOTS,
    preludes: super::FLASH_PRELUDE,
    variant: "",
};

/// K/V tiles staged in 16 KiB of workgroup memory (GPUs).
pub const SHARED: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_shared",
    slots: SLOTS,
    preludes: super::FLASH_PRELUDE,
    variant: "",
};

/// K/V elements loaded once per subgroup and broadcast to its lanes (CPU adapters with
/// subgroups of at least 8 lanes), in three variants by the largest head dim they hold
/// (`MAX_DIM`, sizing per-invocation arrays): LLVM compiles the 256 variant in about a
/// minute on lavapipe, the 64 one in seconds, and runs them equally fast.
pub const SUBGROUP: Kernel = SUBGROUP_256;
pub const SUBGROUP_64: Kernel = subgroup_variant(&[COMMON, "const MAX_DIM: u32 = 64u;\n"], "[64]");
pub const SUBGROUP_128: Kernel = subgroup_variant(&[COMMON, "const MAX_DIM: u32 = 128u;\n"], "[128]");
pub const SUBGROUP_256: Kernel = subgroup_variant(&[COMMON, "const MAX_DIM: u32 = 256u;\n"], "[256]");

const fn subgroup_variant(preludes: &'static [&'static str], variant: &'static str) -> Kernel {
    Kernel {
        file: "flash_subgroup.wgsl",
        source: include_str!("../../shaders/flash_subgroup.wgsl"),
        entry: "flash_subgroup",
        slots: SLOTS,
        preludes,
        variant,
    }
}

/// The subgroup kernel variant with the smallest `MAX_DIM` that holds `D` and `Dv`
/// (padded to the 8 lanes).
fn subgroup_for(head_dim: u32, head_dim_v: u32) -> Kernel {
    match head_dim.max(head_dim_v).next_multiple_of(SUBGROUP_LANES) {
        0..=64 => SUBGROUP_64,
        65..=128 => SUBGROUP_128,
        _ => SUBGROUP_256,
    }
}

/// Lanes `flash_subgroup.wgsl` needs in a subgroup.
pub const SUBGROUP_LANES: u32 = 8;

/// Workgroup memory the shared tiling declares.
pub const SHARED_TILE_BYTES: u32 = 16 * 1024;

/// A resolved tile configuration: which entry point and how many query rows per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashConfig {
    pub kernel: Kernel,
    pub rows: u32,
}

impl FlashConfig {
    pub fn name(&self) -> &'static str {
        match self.kernel.entry {
            "flash_shared" => "shared",
            "flash_subgroup" => "subgroup",
            _ => "registers",
        }
    }
}

pub(crate) fn encode(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    config: FlashConfig,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<()> {
    let kernel = if config.kernel.entry == SUBGROUP.entry {
        subgroup_for(params.head_dim, params.head_dim_v)
    } else {
        config.kernel
    };
    let pipeline = pipeline(ctx, &kernel, dtype, &[("ROWS", config.rows)])?;
    let groups = [
        groups_for(params.len_q as usize, config.rows as usize),
        params.bh_count,
        1,
    ];
    dispatch(ctx, encoder, &pipeline, &bindings.select(config.kernel.slots), groups);
    Ok(())
}
