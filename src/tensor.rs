//! GPU tensors: a storage buffer plus a logical `[B, H, S, D]` shape, a memory layout
//! (BHSD or BSHD, as strides) and an element type. Host data is always in the layout's
//! own memory order.

use crate::error::{checked_product, Error, Result};
pub use crate::gpu::DType;
use crate::gpu::Gpu;
use half::f16;

/// How the four logical axes `[batch, heads, seq, dim]` are laid out in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[batch, heads, seq, dim]`, C order.
    #[default]
    Bhsd,
    /// `[batch, seq, heads, dim]`, C order: heads concatenated per token, which is what
    /// a projection writes and reads.
    Bshd,
}

impl Layout {
    /// Element strides of the logical axes `(b, h, s, d)` for a logical shape.
    pub fn strides(self, [_, h, s, d]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Bhsd => [h * s * d, s * d, d, 1],
            Layout::Bshd => [s * h * d, d, h * d, 1],
        }
    }

    /// The memory-order shape (what a `.npy` file of this tensor has).
    pub fn memory_shape(self, [b, h, s, d]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Bhsd => [b, h, s, d],
            Layout::Bshd => [b, s, h, d],
        }
    }

    /// The logical shape from a memory-order shape.
    pub fn logical_shape(self, [a, b, c, d]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Bhsd => [a, b, c, d],
            Layout::Bshd => [a, c, b, d],
        }
    }
}

/// A 4-D tensor on the GPU.
#[derive(Debug)]
pub struct Tensor {
    buffer: wgpu::Buffer,
    /// The context that made it ([`Gpu::id`]): a tensor works only with that one.
    context: u64,
    shape: [usize; 4],
    layout: Layout,
    dtype: DType,
}

impl Tensor {
    /// Uploads f32 data given in `layout`'s memory order.
    pub fn from_f32(ctx: &Gpu, shape: [usize; 4], layout: Layout, data: &[f32]) -> Result<Self> {
        check_len(shape, data.len())?;
        Self::from_bytes(ctx, shape, layout, DType::F32, bytemuck::cast_slice(data))
    }

    /// [`Tensor::from_f32`] with its GPU errors awaited: on the web, where a step
    /// cannot pop its own error scopes, the form that reports them.
    pub async fn from_f32_async(ctx: &Gpu, shape: [usize; 4], layout: Layout, data: &[f32]) -> Result<Self> {
        ctx.scoped_async("uploading a tensor", || Self::from_f32(ctx, shape, layout, data))
            .await
    }

    /// Uploads f16 data given in `layout`'s memory order. Needs `SHADER_F16`.
    pub fn from_f16(ctx: &Gpu, shape: [usize; 4], layout: Layout, data: &[f16]) -> Result<Self> {
        check_len(shape, data.len())?;
        ctx.require_f16("f16 tensors")?;
        Self::from_bytes(ctx, shape, layout, DType::F16, bytemuck::cast_slice(data))
    }

    /// [`Tensor::from_f16`] with its GPU errors awaited (see [`Tensor::from_f32_async`]).
    pub async fn from_f16_async(ctx: &Gpu, shape: [usize; 4], layout: Layout, data: &[f16]) -> Result<Self> {
        ctx.scoped_async("uploading a tensor", || Self::from_f16(ctx, shape, layout, data))
            .await
    }

    /// Uploads f32 data, converting to `dtype` on the host.
    pub fn from_f32_as(ctx: &Gpu, shape: [usize; 4], layout: Layout, dtype: DType, data: &[f32]) -> Result<Self> {
        match dtype {
            DType::F32 => Self::from_f32(ctx, shape, layout, data),
            DType::F16 => {
                let halves: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
                Self::from_f16(ctx, shape, layout, &halves)
            }
        }
    }

    /// [`Tensor::from_f32_as`] with its GPU errors awaited (see [`Tensor::from_f32_async`]).
    pub async fn from_f32_as_async(
        ctx: &Gpu,
        shape: [usize; 4],
        layout: Layout,
        dtype: DType,
        data: &[f32],
    ) -> Result<Self> {
        ctx.scoped_async("uploading a tensor", || {
            Self::from_f32_as(ctx, shape, layout, dtype, data)
        })
        .await
    }

    /// A batch-first sequence `[B, S, width]` (the inputs and outputs of
    /// [`crate::mha::MultiHeadAttention`]), stored as shape `[B, 1, S, width]`.
    pub fn sequence(ctx: &Gpu, [batch, seq, width]: [usize; 3], dtype: DType, data: &[f32]) -> Result<Self> {
        Self::from_f32_as(ctx, [batch, 1, seq, width], Layout::Bhsd, dtype, data)
    }

    fn from_bytes(ctx: &Gpu, shape: [usize; 4], layout: Layout, dtype: DType, bytes: &[u8]) -> Result<Self> {
        let buffer = ctx.create_buffer_init("wgpu-attention tensor", &pad_to_4(bytes), tensor_usage())?;
        Ok(Tensor {
            buffer,
            context: ctx.id(),
            shape,
            layout,
            dtype,
        })
    }

    /// Wraps a caller's buffer as a tensor, without copying: its first
    /// `shape.product() · dtype.size()` bytes hold the data in `layout`'s memory order.
    /// The buffer must come from this context's device ([`Gpu::device`]; wgpu
    /// cannot tell, and a buffer of another device fails inside wgpu) and have
    /// `STORAGE` usage (`COPY_SRC` too, to read it back, `COPY_DST` to be appended to a
    /// cache from). Data starts at offset 0: to use a range of a larger buffer, copy it
    /// (`CommandEncoder::copy_buffer_to_buffer`), since the kernels bind whole buffers.
    pub fn from_buffer(
        ctx: &Gpu,
        buffer: wgpu::Buffer,
        shape: [usize; 4],
        layout: Layout,
        dtype: DType,
    ) -> Result<Self> {
        if dtype == DType::F16 {
            ctx.require_f16("f16 tensors")?;
        }
        let bytes = checked_product(
            "tensor shape (bytes)",
            &[shape[0], shape[1], shape[2], shape[3], dtype.size()],
        )? as u64;
        if bytes == 0 {
            return Err(Error::unsupported(
                "tensor shape",
                format!("{shape:?}"),
                "every axis at least 1",
            ));
        }
        // Copies (readback) move whole 4-byte words: an odd count of f16 needs the
        // buffer's next 2 bytes too.
        let needed = bytes.next_multiple_of(4);
        if buffer.size() < needed {
            return Err(Error::shape(
                format!("buffer for a {} tensor of shape {shape:?}", dtype.name()),
                format!("at least {needed} bytes"),
                format!("{} bytes", buffer.size()),
            ));
        }
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::invalid(
                "buffer for a tensor",
                format!(
                    "its usage {:?} lacks STORAGE, which the kernels bind it as",
                    buffer.usage()
                ),
            ));
        }
        Ok(Tensor {
            buffer,
            context: ctx.id(),
            shape,
            layout,
            dtype,
        })
    }

    /// An uninitialised tensor (used for outputs).
    pub fn empty(ctx: &Gpu, shape: [usize; 4], layout: Layout, dtype: DType) -> Result<Self> {
        let bytes = checked_product(
            "output tensor shape (bytes)",
            &[shape[0], shape[1], shape[2], shape[3], dtype.size()],
        )? as u64;
        let buffer = ctx.create_buffer("wgpu-attention output", bytes, tensor_usage())?;
        Ok(Tensor {
            buffer,
            context: ctx.id(),
            shape,
            layout,
            dtype,
        })
    }

    /// Reads the tensor back as f32 in its layout's memory order.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_f32_vec(&self, ctx: &Gpu) -> Result<Vec<f32>> {
        pollster::block_on(self.to_f32_vec_async(ctx))
    }

    /// [`Tensor::to_f32_vec`], awaited (the only form on the web).
    pub async fn to_f32_vec_async(&self, ctx: &Gpu) -> Result<Vec<f32>> {
        self.check_context(ctx, "tensor to read back")?;
        let bytes = ctx.read_buffer_async(&self.buffer, self.byte_len()).await?;
        Ok(self.values_of(&bytes))
    }

    /// Reads an f16 tensor back as f16, in its layout's memory order, without rounding
    /// through f32 ([`Tensor::to_f32_vec`] reads either dtype as f32).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_f16_vec(&self, ctx: &Gpu) -> Result<Vec<f16>> {
        pollster::block_on(self.to_f16_vec_async(ctx))
    }

    /// [`Tensor::to_f16_vec`], awaited (the only form on the web).
    pub async fn to_f16_vec_async(&self, ctx: &Gpu) -> Result<Vec<f16>> {
        self.check_context(ctx, "tensor to read back")?;
        if self.dtype != DType::F16 {
            return Err(Error::shape(
                "dtype of the tensor read back as f16",
                "f16",
                format!("{} (read it with to_f32_vec)", self.dtype.name()),
            ));
        }
        let bytes = ctx.read_buffer_async(&self.buffer, self.byte_len()).await?;
        Ok(bytemuck::pod_collect_to_vec::<u8, f16>(&bytes))
    }

    /// This tensor's elements as f32, from the bytes of its buffer.
    pub(crate) fn values_of(&self, bytes: &[u8]) -> Vec<f32> {
        match self.dtype {
            DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(bytes),
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(bytes)
                .into_iter()
                .map(f16::to_f32)
                .collect(),
        }
    }

    /// Refuses a tensor made by another context: wgpu does not catch the mix (each
    /// context has its own wgpu instance, whose resource ids overlap another's, so a
    /// foreign buffer resolves to one of this device's, or to none and a panic).
    pub(crate) fn check_context(&self, ctx: &Gpu, what: &str) -> Result<()> {
        if self.context != ctx.id() {
            return Err(Error::invalid(
                what,
                "belongs to another Context (another device); a tensor works only with the context that made it",
            ));
        }
        Ok(())
    }

    /// Logical shape `[B, H, S, D]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The memory layout of its buffer.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The element type in its buffer.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The storage buffer holding the data from offset 0; it may be longer than
    /// [`Tensor::byte_len`] (padding to 4 bytes, or a larger buffer given to
    /// [`Tensor::from_buffer`]).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// The `[B, S, width]` shape of a batch-first sequence ([`Tensor::sequence`]: the
    /// inputs and outputs of [`crate::MultiHeadAttention`], PyTorch's `batch_first`
    /// layout), which is stored as `[B, 1, S, width]`; `None` for a tensor of several
    /// heads.
    pub fn sequence_shape(&self) -> Option<[usize; 3]> {
        let [b, h, s, w] = self.shape;
        (h == 1).then_some([b, s, w])
    }

    /// Element strides of the logical axes.
    pub fn strides(&self) -> [usize; 4] {
        self.layout.strides(self.shape)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements (some axis is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of data (the buffer may be larger: this crate pads its own to a multiple
    /// of 16 bytes, at least 16).
    pub fn byte_len(&self) -> u64 {
        (self.len() * self.dtype.size()) as u64
    }
}

pub(crate) fn tensor_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
}

/// wgpu buffer sizes and copies must be multiples of 4 bytes.
pub(crate) fn pad_to_4(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
        std::borrow::Cow::Borrowed(bytes)
    } else {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
        std::borrow::Cow::Owned(v)
    }
}

fn check_len(shape: [usize; 4], len: usize) -> Result<()> {
    let expected = checked_product("tensor shape", &shape)?;
    if expected != len {
        return Err(Error::shape(
            format!("tensor data for shape {shape:?}"),
            format!("{expected} elements"),
            format!("{len} elements"),
        ));
    }
    Ok(())
}

/// Reorders host data from one layout's memory order to another's.
pub fn relayout<T: Copy + Default>(data: &[T], shape: [usize; 4], from: Layout, to: Layout) -> Vec<T> {
    if from == to {
        return data.to_vec();
    }
    let fs = from.strides(shape);
    let ts = to.strides(shape);
    let mut out = vec![T::default(); data.len()];
    let [nb, nh, ns, nd] = shape;
    for b in 0..nb {
        for h in 0..nh {
            for s in 0..ns {
                for d in 0..nd {
                    out[b * ts[0] + h * ts[1] + s * ts[2] + d] = data[b * fs[0] + h * fs[1] + s * fs[2] + d];
                }
            }
        }
    }
    out
}
