//! `shaders/gemm_strided.wgsl`: `C = A · B (+ C)` with each operand read through its
//! own row and column strides, for the backward pass of the linear layers, whose
//! products take an operand transposed (`dX = dY · W`, `dW = dYᵀ · X`) or broadcast
//! (`db = 1ᵀ · dY`). The forward GEMM (`matmul.rs`) reads `Y = X · Wᵀ` only.

use super::{dispatch, groups_for, loop_budget, pipeline, Kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::tensor::DType;
use bytemuck::{Pod, Zeroable};

const SOURCE: &str = include_str!("../../shaders/gemm_strided.wgsl");

/// The GEMM writing f32 (gradients, whatever the operands' dtype).
pub const F32_OUT: Kernel = Kernel {
    file: "gemm_strided.wgsl",
    source: Text::Static(SOURCE),
    entry: "gemm_strided",
    slots: &[],
    preludes: &["alias out_t = f32;\n"],
    variant: Text::Static("f32_out"),
};

/// The GEMM writing the operands' dtype (an intermediate that feeds a kernel of it).
pub const ELEM_OUT: Kernel = Kernel {
    preludes: &["alias out_t = elem;\n"],
    variant: Text::Static("elem_out"),
    ..F32_OUT
};

/// Rows and columns of C one workgroup covers.
const BLOCK: usize = 64;
/// Contraction steps per stage.
const STEP: usize = 16;

/// Mirror of WGSL `GemmParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct GemmParams {
    pub m: u32,
    pub n: u32,
    pub t_begin: u32,
    pub t_end: u32,
    pub a_offset: u32,
    pub a_row: u32,
    pub a_col: u32,
    pub accumulate: u32,
    pub b_offset: u32,
    pub b_row: u32,
    pub b_col: u32,
    pub pad0: u32,
}

/// One operand of the operands' dtype: element `(i, t)` at `offset + i·row + t·col`
/// (for B, `(t, j)` at `offset + t·row + j·col`).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// Elements of the operands' dtype.
    pub buffer: &'a wgpu::Buffer,
    /// Index of element `(0, 0)`.
    pub offset: usize,
    /// Elements between consecutive rows (0: every row the same).
    pub row: usize,
    /// Elements between consecutive columns (0: every column the same).
    pub col: usize,
}

impl<'a> Operand<'a> {
    /// A dense row-major matrix with rows `stride` elements apart, from `offset` on.
    pub fn rows(buffer: &'a wgpu::Buffer, offset: usize, stride: usize) -> Self {
        Operand {
            buffer,
            offset,
            row: stride,
            col: 1,
        }
    }

    /// The transpose of a dense row-major matrix with rows `stride` elements apart.
    pub fn transposed(buffer: &'a wgpu::Buffer, stride: usize) -> Self {
        Operand {
            buffer,
            offset: 0,
            row: 1,
            col: stride,
        }
    }

    /// One element standing for every position (a row of ones, say).
    pub fn broadcast(buffer: &'a wgpu::Buffer) -> Self {
        Operand {
            buffer,
            offset: 0,
            row: 0,
            col: 0,
        }
    }

    /// The largest element index read over `rows` x `cols` positions, if it fits u64.
    fn last_index(&self, rows: usize, cols: usize) -> Option<u64> {
        let term = |n: usize, stride: usize| (n as u64 - 1).checked_mul(stride as u64);
        (self.offset as u64)
            .checked_add(term(rows, self.row)?)?
            .checked_add(term(cols, self.col)?)
    }
}

/// `c = a · b (+ c)`: `a` is `[m, depth]`, `b` `[depth, n]`, `c` dense row-major
/// `[m, n]`, of f32 when `f32_out`, else of the operands' dtype.
pub struct Gemm<'a> {
    /// `[m, depth]`.
    pub a: Operand<'a>,
    /// `[depth, n]`.
    pub b: Operand<'a>,
    /// Dense row-major `[m, n]`.
    pub c: &'a wgpu::Buffer,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The contraction's length.
    pub depth: usize,
    /// Add to `c`'s previous contents rather than overwrite them.
    pub accumulate: bool,
    /// C is f32 (else of the operands' dtype).
    pub f32_out: bool,
}

impl Gemm<'_> {
    fn validate(&self, ctx: &Gpu, dtype: DType) -> Result<()> {
        let (m, n, depth) = (self.m, self.n, self.depth);
        if m == 0 || n == 0 || depth == 0 {
            return Err(Error::unsupported(
                "strided GEMM",
                format!("m={m} n={n} depth={depth}"),
                "every size at least 1",
            ));
        }
        let elements = |buffer: &wgpu::Buffer, size: usize| buffer.size() / size as u64;
        let out_size = if self.f32_out { 4 } else { dtype.size() };
        let c_needs = (m as u64).checked_mul(n as u64);
        let fits = |last: Option<u64>, buffer: &wgpu::Buffer, size: usize| {
            last.is_some_and(|last| last < elements(buffer, size) && last < u64::from(u32::MAX))
        };
        let checks = [
            ("A", fits(self.a.last_index(m, depth), self.a.buffer, dtype.size())),
            ("B", fits(self.b.last_index(depth, n), self.b.buffer, dtype.size())),
            ("C", fits(c_needs.map(|x| x - 1), self.c, out_size)),
        ];
        if let Some((what, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(Error::invalid(
                "strided GEMM",
                format!("operand {what} of a {m} x {n} product over {depth} reads past its buffer"),
            ));
        }
        let groups = [groups_for(n, BLOCK), groups_for(m, BLOCK)];
        let max = ctx.capabilities().max_workgroups_per_dim;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::LimitExceeded {
                what: format!("a {m} x {n} GEMM"),
                limit: "max_compute_workgroups_per_dimension",
                unit: "workgroups",
                requested: groups[0].max(groups[1]).into(),
                max: max.into(),
            });
        }
        Ok(())
    }
}

/// The contraction steps one dispatch may take under the context's loop cap (all
/// of them without one), a multiple of [`STEP`].
fn depth_per_dispatch(ctx: &Gpu, gemm: &Gemm) -> Result<usize> {
    let Some(cap) = ctx.loop_cap() else {
        return Ok(gemm.depth);
    };
    let steps = (1..=gemm.depth.div_ceil(STEP))
        .rev()
        .find(|&s| loop_budget::gemm_iterations(s * STEP) <= cap);
    steps.map(|s| s * STEP).ok_or_else(|| {
        loop_budget::over_cap(
            format!("a {} x {} GEMM", gemm.m, gemm.n),
            loop_budget::gemm_iterations(STEP),
            cap,
        )
    })
}

/// Records `c = a · b (+ c)`, split along the contraction into dispatches that each
/// fit the loop cap (the later ones accumulating, in a fixed order).
pub fn encode_gemm(ctx: &Gpu, encoder: &mut wgpu::CommandEncoder, dtype: DType, gemm: &Gemm) -> Result<()> {
    gemm.validate(ctx, dtype)?;
    let kernel = if gemm.f32_out { F32_OUT } else { ELEM_OUT };
    let pipeline = pipeline(ctx, &kernel, dtype, &[])?;
    let per = depth_per_dispatch(ctx, gemm)?;
    for begin in (0..gemm.depth).step_by(per) {
        let params = GemmParams {
            m: gemm.m as u32,
            n: gemm.n as u32,
            t_begin: begin as u32,
            t_end: (begin + per).min(gemm.depth) as u32,
            a_offset: gemm.a.offset as u32,
            a_row: gemm.a.row as u32,
            a_col: gemm.a.col as u32,
            accumulate: u32::from(gemm.accumulate || begin > 0),
            b_offset: gemm.b.offset as u32,
            b_row: gemm.b.row as u32,
            b_col: gemm.b.col as u32,
            pad0: 0,
        };
        let params = ctx.create_buffer_init("gemm params", bytemuck::bytes_of(&params), wgpu::BufferUsages::UNIFORM)?;
        let bindings = [(0, &params), (1, gemm.a.buffer), (2, gemm.b.buffer), (3, gemm.c)];
        let groups = [groups_for(gemm.n, BLOCK), groups_for(gemm.m, BLOCK), 1];
        ctx.scoped("recording a strided GEMM", || {
            dispatch(ctx, encoder, &pipeline, &bindings, groups)
        })?;
    }
    Ok(())
}

/// The strided GEMM's kernels (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![F32_OUT, ELEM_OUT]
}
