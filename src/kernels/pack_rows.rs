//! `shaders/pack_rows.wgsl`: rows of a matrix in a buffer, copied into an rgba32float
//! 2D-array texture four columns per texel: the operand format of the texture GEMM
//! (`shaders/matmul_texture.wgsl`).

use super::{dispatch_entries, groups_for, pipeline, Kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};

pub const KERNEL: Kernel = Kernel {
    file: "pack_rows.wgsl",
    source: Text::Static(include_str!("../../shaders/pack_rows.wgsl")),
    entry: "pack_rows",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Rows one workgroup covers in the packing kernel (8 x 8 texels), and one row group of
/// the texture GEMM (8 x 32 outputs; it takes two where the layer has more rows).
pub const ROWS_PER_GROUP: usize = 8;

/// Bytes of one texel (four f32).
const TEXEL_BYTES: u64 = 16;

/// Mirror of WGSL `PackParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct PackParams {
    pub rows: u32,
    pub cols: u32,
    pub stride: u32,
    pub row0: u32,
    pub layer_rows: u32,
    pub pad: [u32; 3],
}

/// Rows `row0 .. row0 + rows` of a row-major matrix of `dtype` elements in `buffer`,
/// `stride` elements apart, `cols` columns of each.
#[derive(Clone, Copy, Debug)]
pub struct RowSource<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl<'a> RowSource<'a> {
    /// All of a dense row-major `[rows, cols]` matrix.
    pub fn dense(buffer: &'a wgpu::Buffer, rows: usize, cols: usize) -> Self {
        RowSource {
            buffer,
            row0: 0,
            rows,
            cols,
            stride: cols,
        }
    }
}

/// How a `rows x cols` matrix lies in a texture: `texels` per row, `layer_rows` rows
/// per layer, `layers` layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextureShape {
    pub texels: usize,
    pub layer_rows: usize,
    pub layers: usize,
}

impl TextureShape {
    /// The shape on this device, or `None` when the matrix is too wide or too tall for
    /// its texture limits, or for the packing kernel's dispatch (8 texels of
    /// [`ROWS_PER_GROUP`] rows per workgroup: the binding limit, since the texture GEMM
    /// covers 8 or 16 rows per workgroup).
    pub fn for_matrix(ctx: &Gpu, rows: usize, cols: usize) -> Option<TextureShape> {
        let caps = ctx.capabilities();
        let max_dim = caps.max_texture_dim as usize;
        let texels = cols.div_ceil(4);
        let layer_rows = rows.min(max_dim);
        let layers = rows.div_ceil(layer_rows.max(1));
        let max_groups = caps.max_workgroups_per_dim;
        let dispatchable = groups_for(rows, ROWS_PER_GROUP) <= max_groups && groups_for(texels, 8) <= max_groups;
        let fits =
            rows >= 1 && texels >= 1 && texels <= max_dim && layers <= caps.max_texture_layers as usize && dispatchable;
        fits.then_some(TextureShape {
            texels,
            layer_rows,
            layers,
        })
    }
}

/// Whether `source` can be copied into its texture as it is: f32 rows whose texels are
/// whole (`cols % 4 == 0`) and whose stride meets the copy alignment.
fn copies_directly(dtype: DType, source: &RowSource) -> bool {
    let row_bytes = (source.stride * dtype.size()) as u32;
    dtype == DType::F32 && source.cols.is_multiple_of(4) && row_bytes.is_multiple_of(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT)
}

/// Records the buffer-to-texture copies of `source`: whole layers, then the last,
/// partial one.
fn copy_rows(encoder: &mut wgpu::CommandEncoder, source: &RowSource, texture: &wgpu::Texture, shape: TextureShape) {
    let row_bytes = (source.stride * DType::F32.size()) as u64;
    let full_layers = source.rows / shape.layer_rows;
    let last_rows = source.rows % shape.layer_rows;
    let pieces = [(0, full_layers, shape.layer_rows), (full_layers, 1, last_rows)];
    for (first_layer, layers, rows) in pieces {
        if layers == 0 || rows == 0 {
            continue;
        }
        let first_row = source.row0 + first_layer * shape.layer_rows;
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: source.buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: first_row as u64 * row_bytes,
                    bytes_per_row: Some(row_bytes as u32),
                    rows_per_image: Some(shape.layer_rows as u32),
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: 0,
                    y: 0,
                    z: first_layer as u32,
                },
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d {
                width: shape.texels as u32,
                height: rows as u32,
                depth_or_array_layers: layers as u32,
            },
        );
    }
}

/// A matrix packed four columns per texel (zero past the last column), f32 texels.
#[derive(Debug)]
pub struct PackedRows {
    view: wgpu::TextureView,
    /// The buffer and first row it was packed from (so a user can be checked).
    source: wgpu::Buffer,
    row0: usize,
    rows: usize,
    cols: usize,
    shape: TextureShape,
}

impl PackedRows {
    /// Records the packing of `source` (elements of `dtype`) into a new texture.
    pub fn encode(
        ctx: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        dtype: DType,
        source: &RowSource,
    ) -> Result<PackedRows> {
        let RowSource {
            rows,
            cols,
            stride,
            row0,
            ..
        } = *source;
        let what = || format!("packing a {rows} x {cols} matrix into a texture");
        let needed = if rows == 0 {
            0
        } else {
            (row0 + rows - 1) * stride + cols
        };
        let elements = source.buffer.size() as usize / dtype.size();
        if cols == 0 || stride < cols || elements < needed {
            return Err(Error::invalid(
                "texture packing",
                format!(
                    "{}: stride {stride}, buffer of {elements} elements, {needed} needed",
                    what()
                ),
            ));
        }
        let Some(shape) = TextureShape::for_matrix(ctx, rows, cols) else {
            return Err(Error::unsupported(
                "texture packing",
                what(),
                format!(
                    "at most {} texels per row, {} layers of as many rows, and {} workgroups of {} rows",
                    ctx.capabilities().max_texture_dim,
                    ctx.capabilities().max_texture_layers,
                    ctx.capabilities().max_workgroups_per_dim,
                    ROWS_PER_GROUP
                ),
            ));
        };
        let size = wgpu::Extent3d {
            width: shape.texels as u32,
            height: shape.layer_rows as u32,
            depth_or_array_layers: shape.layers as u32,
        };
        let texture = ctx.create_texture(
            &wgpu::TextureDescriptor {
                label: Some("packed rows"),
                size,
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: wgpu::TextureFormat::Rgba32Float,
                usage: wgpu::TextureUsages::STORAGE_BINDING
                    | wgpu::TextureUsages::TEXTURE_BINDING
                    | wgpu::TextureUsages::COPY_DST,
                view_formats: &[],
            },
            (shape.texels * shape.layer_rows * shape.layers) as u64 * TEXEL_BYTES,
        )?;
        let view = texture.create_view(&wgpu::TextureViewDescriptor {
            dimension: Some(wgpu::TextureViewDimension::D2Array),
            ..Default::default()
        });
        let packed = PackedRows {
            view,
            source: source.buffer.clone(),
            row0,
            rows,
            cols,
            shape,
        };
        if copies_directly(dtype, source) {
            copy_rows(encoder, source, &texture, shape);
            return Ok(packed);
        }
        // Within the dispatch limit: `TextureShape::for_matrix` checked it.
        let groups = [groups_for(shape.texels, 8), groups_for(rows, ROWS_PER_GROUP), 1];
        let params = PackParams {
            rows: rows as u32,
            cols: cols as u32,
            stride: stride as u32,
            row0: row0 as u32,
            layer_rows: shape.layer_rows as u32,
            pad: [0; 3],
        };
        let params = ctx.create_buffer_init("pack params", bytemuck::bytes_of(&params), wgpu::BufferUsages::UNIFORM)?;
        let pipeline = pipeline(ctx, &KERNEL, dtype, &[])?;
        ctx.scoped("recording a texture packing", || {
            let entries = [
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: source.buffer.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::TextureView(&packed.view),
                },
            ];
            dispatch_entries(ctx, encoder, &pipeline, &entries, groups)
        })?;
        Ok(packed)
    }

    /// Packs `source` and submits the work (for weights packed once, ahead of use).
    pub fn upload(ctx: &Gpu, dtype: DType, source: &RowSource) -> Result<PackedRows> {
        ctx.record_and_submit("submitting a texture packing", |encoder| {
            Self::encode(ctx, encoder, dtype, source)
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether this holds rows `0..` of `buffer`, i.e. a whole weight matrix.
    pub fn is_whole(&self, buffer: &wgpu::Buffer) -> bool {
        self.row0 == 0 && self.source == *buffer
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn shape(&self) -> TextureShape {
        self.shape
    }

    pub(crate) fn view(&self) -> &wgpu::TextureView {
        &self.view
    }
}

/// The row-packing kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
