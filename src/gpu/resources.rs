//! What a context makes and keeps: buffers and textures (counted in
//! `allocated_bytes`), and the pipeline cache.

use super::DType;
use super::Gpu;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Identifies one compiled pipeline: which shader, which element type, which override
/// constants. Pipelines are compiled once per context (lavapipe compiles through LLVM).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    /// Shader file, entry point and variant.
    pub shader: (&'static str, &'static str, super::Text),
    pub dtype: DType,
    pub constants: Vec<(&'static str, u32)>,
    pub checks: super::RuntimeChecks,
}

/// A compiled pipeline and its (automatic) bind group layout, fetched once: every
/// dispatch makes a bind group against it (issue 17 §5: not one
/// `get_bind_group_layout` per dispatch).
#[derive(Clone, Debug)]
pub(crate) struct CompiledPipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

impl Gpu {
    /// Creates a buffer after checking the device's size limit.
    pub(crate) fn create_buffer(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        let size = self.check_buffer_size(label, bytes)?;
        self.scoped(label, || {
            Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            }))
        })
    }

    /// Creates a buffer holding `contents` after checking the device's size limit.
    /// (Mapped at creation, as wgpu's `create_buffer_init`, but a failed mapping is an
    /// error rather than wgpu's panic.)
    pub(crate) fn create_buffer_init(
        &self,
        label: &str,
        contents: &[u8],
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let size = self.check_buffer_size(label, contents.len() as u64)?;
        self.scoped(label, || {
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: true,
            });
            let mut view = buffer.get_mapped_range_mut(..).map_err(|e| Error::Gpu {
                during: label.into(),
                message: e.to_string(),
            })?;
            // The padding past `contents` stays zero: wgpu zeroes new buffers.
            view.slice(..contents.len()).copy_from_slice(contents);
            drop(view);
            buffer.unmap();
            Ok(buffer)
        })
    }

    /// Creates a texture; its bytes count in [`Gpu::allocated_bytes`].
    pub(crate) fn create_texture(&self, descriptor: &wgpu::TextureDescriptor, bytes: u64) -> Result<wgpu::Texture> {
        let label = descriptor.label.unwrap_or("texture");
        let texture = self.scoped(label, || Ok(self.device.create_texture(descriptor)))?;
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
        Ok(texture)
    }

    /// The rounded size of a new buffer, counted in [`Gpu::allocated_bytes`]: whole
    /// 16-byte units, so any buffer can be bound as an array of vec4s that reaches its
    /// last element (the subgroup decode design reads K and V only so).
    fn check_buffer_size(&self, label: &str, bytes: u64) -> Result<u64> {
        // Checked: within 16 bytes of 2^64, rounding up would wrap to a 0-byte buffer.
        let size = bytes.max(16).checked_next_multiple_of(16);
        let Some(size) = size.filter(|&size| size <= self.caps.max_buffer) else {
            return Err(Error::LimitExceeded {
                what: label.into(),
                limit: "max_buffer_size",
                unit: "bytes",
                requested: size.unwrap_or(bytes),
                max: self.caps.max_buffer,
            });
        };
        self.allocated.fetch_add(size, Ordering::Relaxed);
        Ok(size)
    }

    /// Bytes of GPU buffers and textures this context has created so far (cumulative: freed buffers
    /// are not subtracted). The difference around a call is what that call allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Returns the cached pipeline for `key`, compiling it with `build` on first use.
    pub(crate) fn pipeline(
        &self,
        key: PipelineKey,
        build: impl FnOnce(&PipelineKey) -> Result<wgpu::ComputePipeline>,
    ) -> Result<CompiledPipeline> {
        if let Some(p) = self.lock_pipelines().get(&key) {
            return Ok(p.clone());
        }
        // Compile outside the lock: two threads may race to compile the same pipeline,
        // which is wasteful but correct, and nobody waits behind a slow LLVM compile.
        let pipeline = build(&key)?;
        let compiled = CompiledPipeline {
            layout: pipeline.get_bind_group_layout(0),
            pipeline,
        };
        self.lock_pipelines().insert(key, compiled.clone());
        Ok(compiled)
    }

    fn lock_pipelines(&self) -> std::sync::MutexGuard<'_, HashMap<PipelineKey, CompiledPipeline>> {
        // A panic while holding the lock cannot leave the map inconsistent (inserts are
        // atomic), so a poisoned lock is still usable.
        self.pipelines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of pipelines compiled so far (for tests and the bench report).
    pub fn compiled_pipelines(&self) -> usize {
        self.lock_pipelines().len()
    }
}
