//! The int8 KV cache's dequantization (`kv_dequantize.wgsl`; `crate::quantized_kv`
//! encodes it).

use crate::kernels::Kernel;

/// `kv_dequantize.wgsl`: codes and scales to values of the attention's dtype.
pub const DEQUANTIZE: Kernel = Kernel {
    file: "kv_dequantize.wgsl",
    source: include_str!("../../shaders/kv_dequantize.wgsl"),
    entry: "kv_dequantize",
    slots: &[],
    preludes: &[],
    variant: "",
};

/// The dequantization kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![DEQUANTIZE]
}
