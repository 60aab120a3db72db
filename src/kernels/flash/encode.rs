//! A fused tiling's dispatch: its plan (the texel kernel where the subgroup tiling
//! reads K and V as texels, else the tiling's buffer kernel, in the form the problem
//! allows), then its recording.

use super::super::flash_texel;
use super::super::kv_texels::{KvTexels, TexelGrid};
use super::super::{dispatch_entries, groups_for, pipeline, AttentionBindings, AttentionParams, Kernel};
use super::variants::blocked_words;
use super::FlashConfig;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::policy::Policy;
use crate::options::FusedTiling;
use crate::tensor::DType;

/// A fused dispatch, decided whole before anything is recorded: every choice the
/// tiling's [`super::Launch`] leaves to the problem (the texel kernel where K and V are
/// read as texels, the blocked kernels' 16-byte-word twins, the coop kernel's word
/// staging and its direct or staged form) is made here, and [`encode`] only records it.
#[derive(Clone, Debug)]
pub(crate) struct FusedPlan {
    pub kernel: Kernel,
    pub constants: Vec<(&'static str, u32)>,
    /// Query rows per workgroup.
    pub rows: u32,
    /// K or V is shorter than one 16-byte word: a placeholder is bound at the coop
    /// kernel's word slots, and the kernel reads K and V element by element.
    pub word_placeholder: bool,
}

/// The plan of one fused dispatch of a problem (`config`'s tiling) on these bindings.
pub(crate) fn plan(
    ctx: &Gpu,
    policy: &Policy,
    dtype: DType,
    config: FlashConfig,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> FusedPlan {
    // The texel kernel reads the mirror the bindings carry (a KV cache's, or one
    // texel_mirror made); none means K and V outgrew the device's textures, and the
    // buffer kernel serves.
    if let (Some(variant), Some(_)) = (texel_variant(ctx, dtype, config, params), bindings.kv_texels) {
        let mut constants = TexelGrid::for_context(ctx)
            .constants("KV_TEXEL_SHIFT", "KV_TEXEL_ROWS")
            .to_vec();
        constants.push(("FULL_RULES", u32::from(params.full_rules())));
        constants.push(("PAGED", u32::from(params.page_size > 0)));
        return FusedPlan {
            kernel: variant.kernel(),
            constants,
            rows: variant.rows,
            word_placeholder: false,
        };
    }
    let launch = (config.spec().launch)(params.head_dim, params.head_dim_v, ctx.capabilities(), policy);
    let mut plan = FusedPlan {
        kernel: match blocked_words(&launch.kernel) {
            Some(words) if kv_in_words(params, bindings) => words,
            _ => launch.kernel,
        },
        constants: launch.constants,
        rows: launch.rows,
        word_placeholder: false,
    };
    if config.spec().tiling == FusedTiling::Coop {
        // The coop kernel reads K and V as words where it can (its WORDS override). A
        // buffer shorter than one 16-byte word cannot be bound as words.
        let whole = |b: &wgpu::Buffer| b.size() >= 16;
        plan.word_placeholder = !whole(bindings.k) || !whole(bindings.v);
        let stand_in = plan.word_placeholder || bindings.words_stand_in.is_some();
        let words = !stand_in && coop_words(dtype, params);
        let caps = ctx.capabilities();
        let variant = super::coop_variant_for(params.head_dim, params.head_dim_v, caps, policy);
        if super::coop::direct_serves(&variant, dtype == DType::F16, words, params) {
            // Nothing staged: the WORDS paths are not in its source.
        } else {
            if variant.direct {
                // Its fragments would leave the rows: the staged twin runs.
                plan.kernel = variant
                    .with_direct(false)
                    .kernel(caps.coop_subgroup_size().unwrap_or(32));
            }
            plan.constants.push(("WORDS", u32::from(words)));
        }
    }
    plan
}

/// Records one fused dispatch of a problem: its [`plan`], compiled and bound.
pub(crate) fn encode(
    ctx: &Gpu,
    policy: &Policy,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    config: FlashConfig,
    bindings: &AttentionBindings,
    params: &AttentionParams,
) -> Result<()> {
    let plan = plan(ctx, policy, dtype, config, bindings, params);
    let placeholder;
    let mut bindings = AttentionBindings { ..*bindings };
    if plan.word_placeholder {
        placeholder = ctx.create_buffer("coop word placeholder", 16, crate::tensor::tensor_usage())?;
        bindings.words_stand_in = Some(&placeholder);
    }
    let pipeline = pipeline(ctx, &plan.kernel, dtype, &plan.constants)?;
    let groups = [
        groups_for(params.len_q as usize, plan.rows as usize),
        params.bh_count,
        1,
    ];
    dispatch_entries(ctx, encoder, &pipeline, &bindings.select(plan.kernel.slots)?, groups)
}

/// Whether the coop kernel stages K and V in 16-byte words for a problem: head dims and
/// every K and V stride whole words (a paged cache's page strides too).
fn coop_words(dtype: DType, params: &AttentionParams) -> bool {
    let per_word = 16 / dtype.size() as u32;
    super::coop::words_fit(per_word, (params.head_dim, params.head_dim_v), &params.kv_strides())
}

/// Whether every four elements of a K or V row that start a row's quad lie inside one
/// 16-byte word of a buffer of whole words, so that the blocked kernels may read them
/// with one load (their `words` twins): head dims, row, head, batch and page strides
/// multiples of 4 elements, and both buffers whole 16-byte words (ours always are;
/// `Tensor::from_buffer` may wrap others).
fn kv_in_words(params: &AttentionParams, bindings: &AttentionBindings) -> bool {
    let quads = super::coop::words_fit(4, (params.head_dim, params.head_dim_v), &params.kv_strides());
    let words = [bindings.k, bindings.v]
        .iter()
        .all(|b| b.size() >= 16 && b.size().is_multiple_of(16));
    quads && words
}

/// The subgroup tiling's texel kernel for a problem, where it serves it.
fn texel_variant(
    ctx: &Gpu,
    dtype: DType,
    config: FlashConfig,
    params: &AttentionParams,
) -> Option<flash_texel::TexelVariant> {
    if config.spec().tiling != FusedTiling::Subgroup {
        return None;
    }
    let strides = params.kv_strides();
    flash_texel::variant_for(
        dtype,
        (params.head_dim, params.head_dim_v),
        &strides,
        params.full_rules(),
        ctx.capabilities(),
    )
}

/// Records the copy of plain K and V buffers into a texel mirror where the fused
/// dispatches of a problem will read one (the texel kernel, without a KV cache's
/// mirror), so that every dispatch of the problem (key ranges, head chunks) shares one
/// copy; `None` where they read none.
pub(crate) fn texel_mirror(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    config: FlashConfig,
    params: &AttentionParams,
    (k, v): (&wgpu::Buffer, &wgpu::Buffer),
) -> Result<Option<KvTexels>> {
    if texel_variant(ctx, dtype, config, params).is_none() {
        return Ok(None);
    }
    KvTexels::copy_of(ctx, encoder, k, v)
}
