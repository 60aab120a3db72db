//! The int8 KV cache's dequantization (`kv_dequantize.wgsl`; `crate::quantized_kv`
//! encodes it).

use crate::gpu::Text;
use crate::kernels::Kernel;

/// `kv_dequantize.wgsl`: codes and scales to values of the attention's dtype.
pub const DEQUANTIZE: Kernel = Kernel {
    file: "kv_dequantize.wgsl",
    source: Text::Static(include_str!("../../shaders/kv_dequantize.wgsl")),
    entry: "kv_dequantize",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// The dequantization kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![DEQUANTIZE]
}
