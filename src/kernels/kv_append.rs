//! `shaders/kv_append.wgsl`: new key or value rows written into a KV cache in place.

use super::kv_texels::TexelGrid;
use super::{dispatch_entries, pipeline, Kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::kernels::page_table::PageTable;
use crate::tensor::Tensor;
use bytemuck::{Pod, Zeroable};

pub const KERNEL: Kernel = Kernel {
    file: "kv_append.wgsl",
    source: Text::Static(include_str!("../../shaders/kv_append.wgsl")),
    entry: "kv_append",
    slots: &[],
    preludes: &[super::ROTARY_COMMON],
    variant: Text::Static(""),
};

/// The entry point that quantizes appended rows into an int8 cache.
pub const QUANTIZE: Kernel = Kernel {
    entry: "kv_quantize",
    ..KERNEL
};

/// The entry point that copies appended rows into a cache's texel mirror.
pub const TEXELS: Kernel = Kernel {
    entry: "kv_texels",
    ..KERNEL
};

/// Mirror of WGSL `AppendParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AppendParams {
    pub heads: u32,
    pub new_len: u32,
    pub dim: u32,
    pub batch: u32,
    pub src_b: u32,
    pub src_h: u32,
    pub src_s: u32,
    pub dst_b: u32,
    pub dst_h: u32,
    pub dst_s: u32,
    /// Rows per page of a paged cache; 0 for a contiguous one.
    pub page_size: u32,
    /// Block table entries per batch element.
    pub table_stride: u32,
    /// Elements of each appended row rotated (a rotary embedding; 0: none).
    pub rot_dim: u32,
    /// 1 for GPT-J pairs.
    pub rot_interleaved: u32,
    pub rot_pad0: u32,
    pub rot_pad1: u32,
}

/// Records: rows `0 .. counts[b]` of `src` (`[B, H, n, dim]`, any layout) become rows
/// `starts[b] ..` of `dst` (`[B, H, capacity, dim]`, any layout, the same dtype), or,
/// with a block table, of batch element `b`'s pages in the pool `dst` (`[P, H,
/// page_size, dim]`). With `rotary`, each row's first elements are rotated as they
/// are written, row s of element b at position `starts[b] + s`. The caller has checked
/// shapes and that every row fits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    src: &Tensor,
    dst: &Tensor,
    starts: &[u32],
    counts: &[u32],
    pages: Option<&PageTable>,
    rotary: Option<&crate::kernels::rotary::Rotary>,
) -> Result<()> {
    src.check_context(ctx, "new KV rows")?;
    dst.check_context(ctx, "KV cache")?;
    let pipeline = pipeline(ctx, &KERNEL, src.dtype(), &[])?;
    let dst_rows = (dst.strides(), dst.shape()[2]);
    let (up, cos_sin) = upload(ctx, src, dst_rows, starts, counts, pages, rotary)?;
    let entries = [
        entry(0, up.params.as_entire_binding()),
        entry(1, src.buffer().as_entire_binding()),
        entry(2, dst.buffer().as_entire_binding()),
        entry(3, up.rows_of.as_entire_binding()),
        entry(6, cos_sin.as_entire_binding()),
    ];
    ctx.scoped("recording a KV cache append", || {
        dispatch_entries(ctx, encoder, &pipeline, &entries, up.groups)
    })
}

/// The params, rows and rotary table of an append of `src`'s rows to a cache with
/// element strides `dst_strides` and `dst_rows` rows per batch element (or page).
fn upload(
    ctx: &Gpu,
    src: &Tensor,
    (dst_strides, dst_rows): ([usize; 4], usize),
    starts: &[u32],
    counts: &[u32],
    pages: Option<&PageTable>,
    rotary: Option<&crate::kernels::rotary::Rotary>,
) -> Result<(Uploaded, wgpu::Buffer)> {
    let [batch, heads, new_len, dim] = src.shape();
    let [sb, sh, ss, _] = src.strides();
    let [db, dh, ds, _] = dst_strides;
    let params = AppendParams {
        heads: heads as u32,
        new_len: new_len as u32,
        dim: dim as u32,
        batch: batch as u32,
        src_b: sb as u32,
        src_h: sh as u32,
        src_s: ss as u32,
        dst_b: db as u32,
        dst_h: dh as u32,
        dst_s: ds as u32,
        page_size: pages.map_or(0, |_| dst_rows as u32),
        table_stride: pages.map_or(0, |t| t.pages_per_sequence() as u32),
        rot_dim: rotary.map_or(0, |r| r.dim as u32),
        rot_interleaved: u32::from(rotary.is_some_and(|r| r.style == crate::kernels::rotary::RotaryStyle::GptJ)),
        ..AppendParams::default()
    };
    let table = pages.map_or(&[][..], PageTable::entries);
    let up = Uploaded::new(ctx, &params, starts, counts, table)?;
    // cos and sin of row s of element b at position starts[b] + s (a stand-in pair
    // without a rotation: the binding is always there).
    let cos_sin = match rotary {
        Some(r) => {
            let positions: Vec<u32> = starts
                .iter()
                .flat_map(|&start| (0..new_len as u32).map(move |s| start.saturating_add(s)))
                .collect();
            r.table(&positions)
        }
        None => vec![[1.0, 0.0]],
    };
    let cos_sin = ctx.create_buffer_init(
        "kv append rotary",
        bytemuck::cast_slice(&cos_sin),
        wgpu::BufferUsages::STORAGE,
    )?;
    Ok((up, cos_sin))
}

/// Records the quantization of rows `0 .. counts[b]` of `src` (`[B, H, n, dim]`, any
/// layout; rotated as [`encode`] rotates them) into rows `starts[b] ..` of an int8
/// cache: `codes` with element strides `dst_strides` (four codes to a 32-bit word),
/// `scales` one f32 per row in the codes' row order. The caller has checked shapes,
/// that `dim` is a multiple of 4 and that every row fits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_quantize(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    src: &Tensor,
    (codes, scales): (&wgpu::Buffer, &wgpu::Buffer),
    dst_strides: [usize; 4],
    starts: &[u32],
    counts: &[u32],
    rotary: Option<&crate::kernels::rotary::Rotary>,
) -> Result<()> {
    src.check_context(ctx, "new KV rows")?;
    let pipeline = pipeline(ctx, &QUANTIZE, src.dtype(), &[])?;
    let (mut up, cos_sin) = upload(ctx, src, (dst_strides, 0), starts, counts, None, rotary)?;
    // One invocation per row here, not per element.
    let max = ctx.capabilities().max_workgroups_per_dim as usize;
    up.groups[0] = src.shape()[2].div_ceil(64).clamp(1, max) as u32;
    let entries = [
        entry(0, up.params.as_entire_binding()),
        entry(1, src.buffer().as_entire_binding()),
        entry(3, up.rows_of.as_entire_binding()),
        entry(6, cos_sin.as_entire_binding()),
        entry(7, codes.as_entire_binding()),
        entry(8, scales.as_entire_binding()),
    ];
    ctx.scoped("recording an int8 KV cache append", || {
        dispatch_entries(ctx, encoder, &pipeline, &entries, up.groups)
    })
}

/// Records the copy of rows `starts[b] .. starts[b] + counts[b]` of every (b, h) pair
/// (b below `starts.len()`) of the cache `cache` into its texel mirror `texels` (the
/// words that hold them, docs/design.md "KV cache"), after they were written: of a
/// contiguous cache (`[B, H, capacity, dim]`, any layout), or with a block table of
/// batch element b's pages in the pool `cache` (`[P, H, page_size, dim]`).
pub(crate) fn encode_texels(
    ctx: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    cache: &Tensor,
    texels: &wgpu::TextureView,
    starts: &[u32],
    counts: &[u32],
    pages: Option<&PageTable>,
) -> Result<()> {
    let [_, heads, rows, dim] = cache.shape();
    let batch = starts.len();
    let [db, dh, ds, _] = cache.strides();
    let params = AppendParams {
        heads: heads as u32,
        new_len: counts.iter().copied().max().unwrap_or(0),
        dim: dim as u32,
        batch: batch as u32,
        dst_b: db as u32,
        dst_h: dh as u32,
        dst_s: ds as u32,
        page_size: pages.map_or(0, |_| rows as u32),
        table_stride: pages.map_or(0, |t| t.pages_per_sequence() as u32),
        ..AppendParams::default()
    };
    let constants = TexelGrid::for_context(ctx).constants("TEXEL_SHIFT", "TEXEL_ROWS");
    let pipeline = pipeline(ctx, &TEXELS, cache.dtype(), &constants)?;
    let table = pages.map_or(&[][..], PageTable::entries);
    let up = Uploaded::new(ctx, &params, starts, counts, table)?;
    let entries = [
        entry(0, up.params.as_entire_binding()),
        entry(3, up.rows_of.as_entire_binding()),
        entry(4, cache.buffer().as_entire_binding()),
        entry(5, wgpu::BindingResource::TextureView(texels)),
    ];
    ctx.scoped("recording a KV cache texel mirror update", || {
        dispatch_entries(ctx, encoder, &pipeline, &entries, up.groups)
    })
}

fn entry(binding: u32, resource: wgpu::BindingResource<'_>) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry { binding, resource }
}

/// A dispatch's uploaded params and rows (`starts`, `counts`, then any block table),
/// and its grid: one workgroup row per (b, h) pair.
struct Uploaded {
    params: wgpu::Buffer,
    rows_of: wgpu::Buffer,
    groups: [u32; 3],
}

impl Uploaded {
    fn new(ctx: &Gpu, params: &AppendParams, starts: &[u32], counts: &[u32], table: &[u32]) -> Result<Uploaded> {
        let pairs = params.batch as usize * params.heads as usize;
        let max = ctx.capabilities().max_workgroups_per_dim as usize;
        // (batch, head) pairs fill grid rows y, then planes z.
        let (rows, planes) = (pairs.min(max), pairs.div_ceil(max));
        if planes > max {
            return Err(Error::LimitExceeded {
                what: format!(
                    "KV cache append over {} x {} (batch, head) pairs",
                    params.batch, params.heads
                ),
                limit: "max_compute_workgroups_per_dimension squared",
                unit: "workgroups",
                requested: pairs as u64,
                max: (max * max) as u64,
            });
        }
        let rows_of: Vec<u32> = starts.iter().chain(counts).chain(table).copied().collect();
        // Enough workgroups per row that each invocation takes a handful of elements
        // (the grid-stride loop stays far below llvmpipe's loop cap).
        let per_pair = (params.new_len as usize * params.dim as usize)
            .div_ceil(64)
            .clamp(1, max) as u32;
        Ok(Uploaded {
            params: ctx.create_buffer_init(
                "kv append params",
                bytemuck::bytes_of(params),
                wgpu::BufferUsages::UNIFORM,
            )?,
            rows_of: ctx.create_buffer_init(
                "kv append rows",
                bytemuck::cast_slice(&rows_of),
                wgpu::BufferUsages::STORAGE,
            )?,
            groups: [per_pair, rows as u32, planes as u32],
        })
    }
}

/// The KV append's kernels: rows, int8 rows, texel mirrors (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL, QUANTIZE, TEXELS]
}
