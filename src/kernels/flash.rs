//! `shaders/flash_attention.wgsl`: the fused one-pass kernel, in two tilings.

use super::{dispatch, groups_for, pipeline, AttentionBindings, AttentionParams, Kernel, Slot};
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
};

/// K/V tiles staged in 16 KiB of workgroup memory (GPUs).
pub const SHARED: Kernel = Kernel {
    file: "flash_attention.wgsl",
    source: SOURCE,
    entry: "flash_shared",
    slots: SLOTS,
    preludes: super::FLASH_PRELUDE,
};

/// K/V elements loaded once per subgroup and broadcast to its lanes (CPU adapters with
/// subgroups of at least 8 lanes).
pub const SUBGROUP: Kernel = Kernel {
    file: "flash_subgroup.wgsl",
    source: include_str!("../../shaders/flash_subgroup.wgsl"),
    entry: "flash_subgroup",
    slots: SLOTS,
    preludes: super::ATTENTION_PRELUDE,
};

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
    let pipeline = pipeline(ctx, &config.kernel, dtype, &[("ROWS", config.rows)])?;
    let groups = [
        groups_for(params.len_q as usize, config.rows as usize),
        params.bh_count,
        1,
    ];
    dispatch(ctx, encoder, &pipeline, &bindings.select(config.kernel.slots), groups);
    Ok(())
}
