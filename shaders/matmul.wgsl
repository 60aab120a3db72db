// Linear layer as a GEMM: Y = X · Wᵀ (+ bias), the layout of PyTorch's nn.Linear.
// X is [M, K], W is [N, K] from row w_row0 on, bias [N] from element w_row0 on, all
// `elem` (f32 or f16) and accumulated in f32. Used for the attention projections and as
// the benchmark's roofline probe.
//
// This file is the part both tilings share: the parameters, bias and outputs, and the
// split epilogue. Output columns [0, seg1) go to out0, [seg1, seg2) to out1 and
// [seg2, N) to out2, each a dense row-major [M, width] matrix. A fused Q/K/V projection
// thus writes Q, K and V straight into three head-split BSHD tensors ([B, S, H, D] is
// [B*S, H*D] row-major). With seg1 = seg2 = N everything goes to out0.
//
// The tilings, chosen by the host (src/kernels/matmul.rs), are appended to this file:
// matmul_tiled.wgsl reads X and W from storage buffers (GPUs, and CPU adapters without
// subgroups); matmul_texture.wgsl reads them from textures, filled by a buffer-to-
// texture copy or by pack_rows.wgsl (CPU adapters with subgroups, where texel fetches
// are gathers and storage loads go one lane at a time).

struct LinearParams {
    m: u32,
    n: u32,
    k: u32,
    has_bias: u32,
    seg1: u32,
    seg2: u32,
    w_row0: u32,
    // Tiled: X's row stride in elements.
    x_stride: u32,
    // Texture: rows per layer of the X and W textures, and the texture row holding
    // W row w_row0.
    x_layer_rows: u32,
    w_layer_rows: u32,
    w_texture_row0: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> lp: LinearParams;
@group(0) @binding(3) var<storage, read> bias: array<elem>;
@group(0) @binding(4) var<storage, read_write> out0: array<elem>;
@group(0) @binding(5) var<storage, read_write> out1: array<elem>;
@group(0) @binding(6) var<storage, read_write> out2: array<elem>;

// Adds the bias and stores Y[row][col] into its output segment; ignores positions past M or N.
fn store(row: u32, col: u32, value: f32) {
    if row >= lp.m || col >= lp.n {
        return;
    }
    var y = value;
    if lp.has_bias != 0u {
        y += f32(bias[lp.w_row0 + col]);
    }
    if col < lp.seg1 {
        out0[row * lp.seg1 + col] = elem(y);
    } else if col < lp.seg2 {
        out1[row * (lp.seg2 - lp.seg1) + col - lp.seg1] = elem(y);
    } else {
        out2[row * (lp.n - lp.seg2) + col - lp.seg2] = elem(y);
    }
}
