//! A KV cache's texel mirror: its K and V buffers' 16-byte words, in order, in two
//! rgba32uint 2D-array textures, kept equal to the buffers by every append
//! (`kv_texels` in `shaders/kv_append.wgsl`) and read by the subgroup decode design
//! (`shaders/decode_kv_texels.wgsl`). llvmpipe gathers texel fetches where it walks
//! storage loads lane by lane: on Mesa 22.3's lavapipe the split pass ran 1.3-1.55x
//! faster from the mirror (docs/design.md, "KV cache").

use super::decode::DecodeDesign;
use super::kv_append;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::kernels::page_table::PageTable;
use crate::kernels::policy::Policy;
use crate::options::FusedTiling;
use crate::tensor::Tensor;

/// Bytes of one texel: one 16-byte word of a buffer.
const TEXEL_BYTES: u64 = 16;

/// Where word `w` of a buffer lies in its mirror: texel `(w % width, (w / width) %
/// rows)` of layer `w / (width * rows)`. The same for every mirror on a device, so one
/// pipeline of each kernel serves them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TexelGrid {
    /// log2 of the texels per row: rows of 4096 texels (a power of two, so the
    /// shaders divide by shifting), fewer only on a device whose 2D textures are
    /// narrower (WebGPU guarantees 8192).
    pub shift: u32,
    /// Rows per layer: at most 1024, so a layer is at most 64 MiB and a mirror outgrows
    /// its buffer by less than one layer; fewer where the device's 2D textures are
    /// smaller.
    pub rows: u32,
}

/// Rows per layer where the device allows them.
const LAYER_ROWS: u32 = 1024;

impl TexelGrid {
    pub fn for_context(ctx: &Gpu) -> TexelGrid {
        let side = ctx.capabilities().max_texture_dim.max(1);
        TexelGrid {
            shift: side.min(4096).ilog2(),
            rows: side.min(LAYER_ROWS),
        }
    }

    pub fn width(self) -> u32 {
        1 << self.shift
    }

    /// The override constants of a kernel that reads or writes mirrors, named as in
    /// its WGSL.
    pub fn constants(self, shift: &'static str, rows: &'static str) -> [(&'static str, u32); 2] {
        [(shift, self.shift), (rows, self.rows)]
    }
}

/// The K and V mirrors of one cache.
#[derive(Debug)]
pub struct KvTexels {
    k: wgpu::TextureView,
    v: wgpu::TextureView,
}

impl KvTexels {
    /// Mirrors for a new cache of `k` and `v`: where split-K decode takes its subgroup
    /// design and the textures fit. A mirror past the limits is only a lost speed-up,
    /// and a bad `WGPU_ATTENTION_TILING` is for attention calls to report, not caches.
    pub(crate) fn for_new_cache(ctx: &Gpu, policy: &Policy, k: &Tensor, v: &Tensor) -> Option<KvTexels> {
        let subgroup = matches!(
            DecodeDesign::for_context(ctx, policy, FusedTiling::Auto),
            Ok(DecodeDesign::Subgroup)
        );
        subgroup.then(|| KvTexels::new(ctx, k, v).ok()).flatten()
    }

    /// Mirrors a caller asked for: `Unsupported` where decode would never read them
    /// (other adapters, or another design asked for by `WGPU_ATTENTION_TILING`) or past
    /// the device's texture limits.
    pub(crate) fn asked_for(ctx: &Gpu, policy: &Policy, k: &Tensor, v: &Tensor) -> Result<KvTexels> {
        let design = DecodeDesign::for_context(ctx, policy, FusedTiling::Auto)?;
        if design != DecodeDesign::Subgroup {
            return Err(Error::unsupported(
                "a KV cache's texel mirror",
                format!(
                    "split-K decode's {design:?} design on adapter {}",
                    ctx.adapter_info().name
                ),
                "the subgroup design (CPU adapters with 8-lane subgroups), the only one that reads a mirror",
            ));
        }
        KvTexels::new(ctx, k, v)
    }

    /// Zeroed mirrors sized for `k`'s and `v`'s buffers (new textures are zeroed, as a
    /// new cache's buffers are), or `Unsupported` past the device's texture limits.
    fn new(ctx: &Gpu, k: &Tensor, v: &Tensor) -> Result<KvTexels> {
        Ok(KvTexels {
            k: mirror(ctx, k.buffer().size(), "KV cache keys as texels", CACHE_USAGE)?,
            v: mirror(ctx, v.buffer().size(), "KV cache values as texels", CACHE_USAGE)?,
        })
    }

    /// Records the copy of rows `starts[b] .. starts[b] + counts[b]` of `k` and `v`
    /// (batch element b's, through `pages` in a paged pool) into these mirrors, after
    /// the rows were written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_copy(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        k: &Tensor,
        v: &Tensor,
        starts: &[u32],
        counts: &[u32],
        pages: Option<&PageTable>,
    ) -> Result<()> {
        kv_append::encode_texels(ctx, encoder, k, &self.k, starts, counts, pages)?;
        kv_append::encode_texels(ctx, encoder, v, &self.v, starts, counts, pages)
    }

    /// Records the copy of whole `pages` of the pools `k` and `v` (`[P, H, page_size,
    /// dim]`) into these mirrors.
    pub(crate) fn record_pages(
        &self,
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        k: &Tensor,
        v: &Tensor,
        pages: &[u32],
    ) -> Result<()> {
        if pages.is_empty() {
            return Ok(());
        }
        // Each page as a sequence of one page, all its rows.
        let one_each = PageTable::new(pages.len(), 1, pages.to_vec())?;
        let starts = vec![0; pages.len()];
        let counts = vec![k.shape()[2] as u32; pages.len()];
        self.record_copy(ctx, encoder, k, v, &starts, &counts, Some(&one_each))
    }

    /// Mirrors of two plain buffers for one attention call (K and V for the fused texel
    /// kernel, `kernels::flash_texel`), filled by buffer-to-texture copies recorded on
    /// `encoder`: a driver copy, no shader. `None` where the buffers outgrow the
    /// device's textures or cannot be copied from (a caller's buffer wrapped by
    /// `Tensor::from_buffer` without `COPY_SRC`): the buffer kernels serve those.
    pub(crate) fn copy_of(
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
    ) -> Result<Option<KvTexels>> {
        if !can_copy(ctx, k) || !can_copy(ctx, v) {
            return Ok(None);
        }
        let texels = KvTexels {
            k: mirror(ctx, k.size(), "keys as texels", COPY_USAGE)?,
            v: mirror(ctx, v.size(), "values as texels", COPY_USAGE)?,
        };
        copy_words(ctx, encoder, k, texels.k.texture());
        copy_words(ctx, encoder, v, texels.v.texture());
        Ok(Some(texels))
    }

    pub(crate) fn keys(&self) -> &wgpu::TextureView {
        &self.k
    }

    pub(crate) fn values(&self) -> &wgpu::TextureView {
        &self.v
    }
}

/// Whether a buffer can be mirrored for one call: it fits the device's textures and
/// can be copied from.
fn can_copy(ctx: &Gpu, buffer: &wgpu::Buffer) -> bool {
    extent(ctx, buffer.size()).is_some() && buffer.usage().contains(wgpu::BufferUsages::COPY_SRC)
}

/// Keeps (`on`) or drops the mirror in `slot` of a cache's buffers `k` and `v`, as the
/// caches' `set_texel_mirror` do: a new one (refused as [`KvTexels::asked_for`] says)
/// is filled by `fill` with the rows the cache holds, in one submission.
pub(crate) fn set_mirror(
    slot: &mut Option<KvTexels>,
    ctx: &Gpu,
    policy: &Policy,
    (k, v): (&Tensor, &Tensor),
    on: bool,
    fill: impl FnOnce(&mut wgpu::CommandEncoder, &KvTexels) -> Result<()>,
) -> Result<()> {
    k.check_context(ctx, "KV cache")?;
    if !on {
        *slot = None;
        return Ok(());
    }
    if slot.is_some() {
        return Ok(());
    }
    let texels = KvTexels::asked_for(ctx, policy, k, v)?;
    ctx.record_and_submit("submitting a KV cache texel mirror", |encoder| fill(encoder, &texels))?;
    *slot = Some(texels);
    Ok(())
}

/// Records the copy of all of `buffer`'s words into its mirror `texture`: whole layers,
/// then the last layer's whole rows, then its last partial row.
fn copy_words(ctx: &Gpu, encoder: &mut wgpu::CommandEncoder, buffer: &wgpu::Buffer, texture: &wgpu::Texture) {
    let grid = TexelGrid::for_context(ctx);
    let (width, per_layer) = (u64::from(grid.width()), u64::from(grid.rows));
    let words = buffer.size() / TEXEL_BYTES;
    let (rows, rest) = (words / width, words % width);
    let (layers, rows_left) = (rows / per_layer, rows % per_layer);
    let row_bytes = width * TEXEL_BYTES;
    let mut copy = |offset: u64, origin: (u64, u64, u64), size: (u64, u64, u64), rows_per_image: u64| {
        if size.0 * size.1 * size.2 == 0 {
            return;
        }
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset,
                    bytes_per_row: Some(row_bytes as u32),
                    rows_per_image: Some(rows_per_image as u32),
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: origin.0 as u32,
                    y: origin.1 as u32,
                    z: origin.2 as u32,
                },
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d {
                width: size.0 as u32,
                height: size.1 as u32,
                depth_or_array_layers: size.2 as u32,
            },
        );
    };
    copy(0, (0, 0, 0), (width, per_layer, layers), per_layer);
    copy(
        layers * per_layer * row_bytes,
        (0, 0, layers),
        (width, rows_left, 1),
        rows_left.max(1),
    );
    copy(rows * row_bytes, (0, rows_left, layers), (rest, 1, 1), 1);
}

/// The texture extent that holds `bytes` of a buffer, one 16-byte word a texel.
fn extent(ctx: &Gpu, bytes: u64) -> Option<wgpu::Extent3d> {
    let grid = TexelGrid::for_context(ctx);
    let rows = bytes.div_ceil(TEXEL_BYTES).div_ceil(u64::from(grid.width())).max(1);
    let per_layer = u64::from(grid.rows);
    let layers = rows.div_ceil(per_layer);
    (layers <= u64::from(ctx.capabilities().max_texture_layers)).then(|| wgpu::Extent3d {
        width: grid.width(),
        height: rows.min(per_layer) as u32,
        depth_or_array_layers: layers as u32,
    })
}

/// A cache's mirror is written by `kv_append.wgsl`.
const CACHE_USAGE: wgpu::TextureUsages =
    wgpu::TextureUsages::STORAGE_BINDING.union(wgpu::TextureUsages::TEXTURE_BINDING);
/// A mirror made for one call only receives copies.
const COPY_USAGE: wgpu::TextureUsages = wgpu::TextureUsages::TEXTURE_BINDING.union(wgpu::TextureUsages::COPY_DST);

fn mirror(ctx: &Gpu, bytes: u64, label: &str, usage: wgpu::TextureUsages) -> Result<wgpu::TextureView> {
    let caps = ctx.capabilities();
    let size = extent(ctx, bytes).ok_or_else(|| {
        Error::unsupported(
            "a KV cache's texel mirror",
            format!("{bytes} bytes"),
            format!(
                "at most {} layers of {} x {} 16-byte texels",
                caps.max_texture_layers,
                TexelGrid::for_context(ctx).width(),
                TexelGrid::for_context(ctx).rows
            ),
        )
    })?;
    let texture = ctx.create_texture(
        &wgpu::TextureDescriptor {
            label: Some(label),
            size,
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage,
            view_formats: &[],
        },
        u64::from(size.width) * u64::from(size.height) * u64::from(size.depth_or_array_layers) * TEXEL_BYTES,
    )?;
    Ok(texture.create_view(&wgpu::TextureViewDescriptor {
        dimension: Some(wgpu::TextureViewDimension::D2Array),
        ..Default::default()
    }))
}
