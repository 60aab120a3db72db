//! The element types kernels are compiled for and buffers hold.

/// Element type in GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision, 4 bytes.
    F32,
    /// IEEE half precision: f32 data converted to it rounds, and values beyond ±65504
    /// become ±inf (the conversion does not check; the CLI refuses such files).
    F16,
}

impl DType {
    /// Bytes per element: 4 or 2.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    /// The lower-case name used in messages and labels: `"f32"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
        }
    }
}
