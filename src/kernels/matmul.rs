//! `shaders/matmul.wgsl` (+ `matmul_subgroup.wgsl`): the linear layer `Y = X · Wᵀ + b`
//! as a GEMM, with a split epilogue that writes column ranges to separate buffers (the
//! fused Q/K/V projection). Also the benchmark's roofline probe.

use super::{dispatch, groups_for, pipeline, Kernel};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::{tensor_usage, DType};
use bytemuck::{Pod, Zeroable};

const SOURCE: &str = include_str!("../../shaders/matmul.wgsl");

/// Portable tiling: 64 x 64 blocks staged in workgroup memory (GPUs; CPU adapters
/// without subgroups).
pub const TILED: Kernel = Kernel {
    file: "matmul.wgsl",
    source: SOURCE,
    entry: "linear_tiled",
    slots: &[],
    preludes: &[],
    variant: "",
};

/// CPU adapters with >= 8-lane subgroups: X elements loaded once and broadcast.
pub const SUBGROUP: Kernel = Kernel {
    file: "matmul_subgroup.wgsl",
    source: include_str!("../../shaders/matmul_subgroup.wgsl"),
    entry: "linear_subgroup",
    slots: &[],
    preludes: &[SOURCE],
    variant: "",
};

/// Which GEMM tiling to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearTiling {
    Tiled,
    Subgroup,
}

impl LinearTiling {
    pub fn name(self) -> &'static str {
        match self {
            LinearTiling::Tiled => "tiled",
            LinearTiling::Subgroup => "subgroup",
        }
    }

    fn kernel(self) -> Kernel {
        match self {
            LinearTiling::Tiled => TILED,
            LinearTiling::Subgroup => SUBGROUP,
        }
    }

    /// Rows and columns of Y one workgroup covers.
    fn block(self) -> (usize, usize) {
        match self {
            LinearTiling::Tiled => (64, 64),
            LinearTiling::Subgroup => (8, 16),
        }
    }
}

/// Mirror of WGSL `LinearParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub x_stride: u32,
    pub has_bias: u32,
    pub seg1: u32,
    pub seg2: u32,
    pub w_row0: u32,
}

/// One linear layer application: `out = x · wᵀ + bias`, all buffers row-major of `dtype`.
pub struct Linear<'a> {
    /// `[m, k]` with row stride `x_stride` elements.
    pub x: &'a wgpu::Buffer,
    pub x_stride: usize,
    /// `[n, k]`, as PyTorch stores `nn.Linear.weight`, from row `w_row0` on.
    pub w: &'a wgpu::Buffer,
    /// `[n]`, from element `w_row0` on.
    pub bias: Option<&'a wgpu::Buffer>,
    /// First row of `w` (and element of `bias`) used: lets one packed `[3E, E]`
    /// projection weight serve separate Q, K and V projections.
    pub w_row0: usize,
    /// One to three outputs, each `(buffer, width)`: consecutive column ranges of Y,
    /// stored as dense `[m, width]` matrices. The widths add up to `n`.
    pub outputs: &'a [(&'a wgpu::Buffer, usize)],
    pub m: usize,
    pub k: usize,
}

impl Context {
    /// The GEMM tiling used for this adapter: `subgroup` on CPU adapters with >= 8-lane
    /// subgroups (shared loads are what costs there), else `tiled`.
    pub fn linear_tiling(&self) -> LinearTiling {
        let lanes = self.capabilities().subgroups.is_some_and(|(min, _)| min >= 8);
        if self.is_cpu_adapter() && lanes {
            LinearTiling::Subgroup
        } else {
            LinearTiling::Tiled
        }
    }
}

fn elements(buffer: &wgpu::Buffer, dtype: DType) -> usize {
    buffer.size() as usize / dtype.size()
}

impl Linear<'_> {
    /// Output columns.
    pub fn n(&self) -> usize {
        self.outputs.iter().map(|&(_, width)| width).sum()
    }

    fn validate(&self, dtype: DType) -> Result<()> {
        let (m, n, k) = (self.m, self.n(), self.k);
        if m == 0 || k == 0 || self.outputs.is_empty() || self.outputs.len() > 3 {
            return Err(Error::unsupported(
                "linear layer",
                format!("m={m} k={k} with {} outputs", self.outputs.len()),
                "m, k >= 1 and 1 to 3 outputs",
            ));
        }
        if self.outputs.iter().any(|&(_, width)| width == 0) || self.x_stride < k {
            return Err(Error::invalid(
                "linear layer",
                format!(
                    "output widths must be >= 1 and the X row stride ({}) >= k ({k})",
                    self.x_stride
                ),
            ));
        }
        let too_small = |what: &str, buffer: &wgpu::Buffer, need: usize| -> Result<()> {
            if elements(buffer, dtype) < need {
                return Err(Error::invalid(
                    "linear layer",
                    format!("{what} holds {} elements, needs {need}", elements(buffer, dtype)),
                ));
            }
            Ok(())
        };
        too_small("X", self.x, (m - 1) * self.x_stride + k)?;
        too_small("W", self.w, (self.w_row0 + n) * k)?;
        if let Some(bias) = self.bias {
            too_small("bias", bias, self.w_row0 + n)?;
        }
        for (i, &(buffer, width)) in self.outputs.iter().enumerate() {
            too_small(&format!("output {i}"), buffer, m * width)?;
        }
        Ok(())
    }
}

/// Records one linear layer application.
pub fn encode_linear(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    tiling: LinearTiling,
    linear: &Linear,
) -> Result<()> {
    linear.validate(dtype)?;
    let (m, n) = (linear.m, linear.n());
    let (block_m, block_n) = tiling.block();
    let groups = [groups_for(n, block_n), groups_for(m, block_m), 1];
    let max = ctx.capabilities().max_workgroups_per_dim;
    if groups[0] > max || groups[1] > max {
        return Err(Error::LimitExceeded {
            what: format!("a {m} x {n} linear layer"),
            limit: "max_compute_workgroups_per_dimension",
            unit: "workgroups",
            requested: groups[0].max(groups[1]).into(),
            max: max.into(),
        });
    }
    let pipeline = pipeline(ctx, &tiling.kernel(), dtype, &[])?;
    let widths: Vec<usize> = linear.outputs.iter().map(|&(_, width)| width).collect();
    let seg1 = widths[0];
    let seg2 = seg1 + widths.get(1).copied().unwrap_or(0);
    let params = LinearParams {
        m: m as u32,
        n: n as u32,
        k: linear.k as u32,
        x_stride: linear.x_stride as u32,
        has_bias: linear.bias.is_some().into(),
        seg1: seg1 as u32,
        seg2: if widths.len() == 1 { n as u32 } else { seg2 as u32 },
        w_row0: linear.w_row0 as u32,
    };
    let params = ctx.create_buffer_init(
        "linear params",
        bytemuck::bytes_of(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    // Unused bindings still need a buffer each (a writable one may not be bound twice).
    let placeholders = (0..3)
        .map(|_| ctx.create_buffer("linear placeholder", 16, tensor_usage()))
        .collect::<Result<Vec<_>>>()?;
    let output = |i: usize| linear.outputs.get(i).map_or(&placeholders[i], |&(buffer, _)| buffer);
    let bindings = [
        (0, &params),
        (1, linear.x),
        (2, linear.w),
        (3, linear.bias.unwrap_or(&placeholders[0])),
        (4, output(0)),
        (5, output(1)),
        (6, output(2)),
    ];
    ctx.scoped("recording a linear layer", || {
        dispatch(ctx, encoder, &pipeline, &bindings, groups);
        Ok(())
    })
}
