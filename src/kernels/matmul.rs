//! `shaders/matmul.wgsl` (+ `matmul_tiled.wgsl` or `matmul_texture.wgsl`): the linear
//! layer `Y = X · Wᵀ + b` as a GEMM, with a split epilogue that writes column ranges to
//! separate buffers (the fused Q/K/V projection). Also the benchmark's roofline probe.

use super::pack_rows::{PackedRows, RowSource, TextureShape, ROWS_PER_GROUP};
use super::{dispatch_entries, groups_for, loop_budget, pipeline, Kernel};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::gpu::Text;
use crate::kernels::policy::Policy;
use crate::tensor::{tensor_usage, DType};
use bytemuck::{Pod, Zeroable};

const SOURCE: &str = include_str!("../../shaders/matmul.wgsl");

/// Portable tiling: 64 x 64 blocks staged in workgroup memory, operands in storage
/// buffers (CPU adapters without subgroups).
pub const TILED: Kernel = Kernel {
    file: "matmul_tiled.wgsl",
    source: Text::Static(include_str!("../../shaders/matmul_tiled.wgsl")),
    entry: "linear_tiled",
    slots: &[],
    preludes: &[SOURCE],
    variant: Text::Static(""),
};

/// GPUs: 128 x 128 blocks, 8 x 8 outputs per invocation from K-major slabs of 16,
/// double-buffered in 32 KiB of workgroup memory ([`BLOCKED_WORKGROUP_BYTES`]), the
/// next slab loaded into registers (16 bytes at a time where [`gemm_words`] allows)
/// while this one is computed; one barrier per slab.
pub const BLOCKED: Kernel = Kernel {
    file: "matmul_blocked.wgsl",
    source: Text::Static(include_str!("../../shaders/matmul_blocked.wgsl")),
    entry: "linear_blocked",
    slots: &[],
    preludes: &[SOURCE],
    variant: Text::Static(""),
};

/// Tensor cores through cooperative matrices (16 x 16 f16 tiles, f32 accumulation):
/// 128 x 128 blocks, one 64 x 64 quadrant (4 x 4 tiles) per subgroup, 4 subgroups of
/// the adapter's fixed size (`SG`); X and W staged 32 deep with 16-byte loads into
/// padded rows. For f16 inputs, or f32 at `Precision::Medium`.
pub const COOP: Kernel = Kernel {
    file: "matmul_coop.wgsl",
    source: Text::Static(include_str!("../../shaders/matmul_coop.wgsl")),
    entry: "linear_coop",
    slots: &[],
    preludes: &[SOURCE],
    variant: Text::Static(""),
};

/// Tensor cores with no operand staging: the coop GEMM's `direct` design (every
/// fragment a cooperative load straight from X's and W's rows, the reference GEMM's
/// 75-80 TFLOP/s design on an H100), same blocks and epilogue. f16 storage only, where
/// [`direct_serves`]; pinned by [`crate::Context::use_direct_coop_gemm`] until a GPU has timed
/// it against [`COOP`].
pub const COOP_DIRECT: Kernel = Kernel {
    file: "matmul_coop_direct.wgsl",
    source: Text::Static(include_str!("../../shaders/matmul_coop_direct.wgsl")),
    entry: "linear_coop_direct",
    slots: &[],
    preludes: &[SOURCE],
    variant: Text::Static(""),
};

/// CPU adapters with >= 8-lane subgroups: operands packed into textures (texel fetches
/// are gathers there; storage loads go one lane at a time), X shared by broadcast.
pub const TEXTURE: Kernel = Kernel {
    file: "matmul_texture.wgsl",
    source: Text::Static(include_str!("../../shaders/matmul_texture.wgsl")),
    entry: "linear_texture",
    slots: &[],
    preludes: &[SOURCE],
    variant: Text::Static(""),
};

/// Which GEMM tiling to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearTiling {
    Tiled,
    Blocked,
    Texture,
    Coop,
}

impl LinearTiling {
    pub fn name(self) -> &'static str {
        match self {
            LinearTiling::Tiled => "tiled",
            LinearTiling::Blocked => "blocked",
            LinearTiling::Texture => "texture",
            LinearTiling::Coop => "coop",
        }
    }

    fn kernel(self) -> Kernel {
        match self {
            LinearTiling::Tiled => TILED,
            LinearTiling::Blocked => BLOCKED,
            LinearTiling::Texture => TEXTURE,
            LinearTiling::Coop => COOP,
        }
    }

    /// Rows and columns of Y one workgroup covers in a layer of `m` rows.
    fn block(self, ctx: &Gpu, m: usize) -> (usize, usize) {
        match self {
            LinearTiling::Tiled => (64, 64),
            LinearTiling::Blocked => (128, 128),
            LinearTiling::Texture => (texture_row_groups(m) as usize * ROWS_PER_GROUP, 32),
            LinearTiling::Coop => {
                let block = coop_block(coop_tiles(ctx));
                (block, block)
            }
        }
    }
}

/// Workgroup memory the blocked GEMM declares: two buffers of an X and a W slab (128 x 16
/// f32 each).
pub const BLOCKED_WORKGROUP_BYTES: u32 = 2 * 2 * 128 * 16 * 4;

/// The blocked GEMM's `GEMM_WORDS`: bit 0 where X's rows may be read 16 bytes at a time,
/// bit 1 where W's may: every 4 consecutive K values from a multiple of 4 lie inside one
/// 16-byte word (K and X's row stride multiples of 4 elements; an f16 quad is half a
/// word), of a buffer of whole words (ours always are; a caller's may not be).
pub fn gemm_words(linear: &Linear) -> u32 {
    let whole = |buffer: &wgpu::Buffer| buffer.size() >= 16 && buffer.size().is_multiple_of(16);
    let k = linear.k.is_multiple_of(4);
    let x = k && linear.x_stride.is_multiple_of(4) && whole(linear.x);
    let w = k && whole(linear.w);
    u32::from(x) | (u32::from(w) << 1)
}

/// Groups of 8 rows a workgroup of the texture kernel owns (its `ROW_GROUPS`): two,
/// which share each W fetch (1.2-1.3x faster on lavapipe), except for layers of at most
/// 8 rows (a decode step's projections), where a second group would only compute
/// clamped rows.
pub fn texture_row_groups(m: usize) -> u32 {
    if m > ROWS_PER_GROUP {
        2
    } else {
        1
    }
}

/// Accumulator tiles per subgroup each way (`TILES` in `matmul_coop.wgsl`): 4 (the
/// measured design, 128 x 128 blocks) on tensor cores; 2 under the coop emulation, whose
/// 16 emulated accumulators and 8 fragments per subgroup take llvmpipe minutes to compile.
pub fn coop_tiles(ctx: &Gpu) -> u32 {
    if ctx.capabilities().coop_emulated {
        2
    } else {
        4
    }
}

/// Rows and columns of Y a workgroup of the coop GEMM owns (its `BLOCK`).
pub fn coop_block(tiles: u32) -> usize {
    32 * tiles as usize
}

/// Workgroup memory the coop GEMM declares: X and W staging (`BLOCK` rows of 32 + 8
/// halves each: 20 KiB at 4 tiles) and two 16 x 16 f32 output slots per subgroup (8 KiB).
pub fn coop_workgroup_bytes(tiles: u32) -> u32 {
    2 * 2 * coop_block(tiles) as u32 * 40 + 4 * 2 * 256 * 4
}

/// `matmul_coop.wgsl` for `tiles` accumulator tiles per subgroup each way (at most 4,
/// the file's own): `TILES` set, and every line dropped that names an accumulator
/// (`accIJ`) or fragment (`aI`, `bJ`, their indices `iaI`, `ibJ`) past `tiles - 1`.
pub fn coop_source(tiles: u32) -> String {
    tiles_source(&COOP.source, tiles)
}

/// The same for `matmul_coop_direct.wgsl`, written to the same rule.
pub fn coop_direct_source(tiles: u32) -> String {
    tiles_source(&COOP_DIRECT.source, tiles)
}

/// A coop GEMM source at `tiles` tiles each way (see [`coop_source`]).
fn tiles_source(source: &str, tiles: u32) -> String {
    let own = "const TILES: u32 = 4u;";
    assert!(source.contains(own) && (1..=4).contains(&tiles), "coop GEMM: TILES");
    let beyond = |token: &str| -> bool {
        let digits = |d: &str| d.len() <= 2 && d.chars().all(|c| c.is_ascii_digit());
        let index = match token {
            t if t.len() == 5 && t.starts_with("acc") && digits(&t[3..]) => &t[3..],
            t if t.len() == 3 && (t.starts_with("ia") || t.starts_with("ib")) && digits(&t[2..]) => &t[2..],
            t if t.len() == 2 && (t.starts_with('a') || t.starts_with('b')) && digits(&t[1..]) => &t[1..],
            _ => return false,
        };
        index.chars().any(|c| c.to_digit(10).is_some_and(|i| i >= tiles))
    };
    source
        .lines()
        .filter(|line| {
            let code = line.split("//").next().unwrap_or("");
            !code
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(beyond)
        })
        .map(|line| {
            if line.starts_with(own) {
                line.replace(own, &format!("const TILES: u32 = {tiles}u;"))
            } else {
                line.to_string()
            }
        })
        .map(|line| line + "\n")
        .collect()
}

/// The coop GEMM kernel (staged, or `direct`) for `tiles` (see [`coop_source`]); the
/// file's own at 4.
fn coop_kernel(direct: bool, tiles: u32) -> Kernel {
    use std::sync::OnceLock;
    type Smaller = [OnceLock<Text>; 3];
    static STAGED: Smaller = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    static DIRECT: Smaller = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    const NAMES: [&str; 3] = ["tiles1", "tiles2", "tiles3"];
    let (full, smaller) = if direct {
        (COOP_DIRECT, &DIRECT)
    } else {
        (COOP, &STAGED)
    };
    match tiles {
        1..=3 => {
            let i = tiles as usize - 1;
            Kernel {
                source: smaller[i]
                    .get_or_init(|| Text::from(tiles_source(&full.source, tiles)))
                    .clone(),
                variant: Text::Static(NAMES[i]),
                ..full
            }
        }
        _ => full,
    }
}

/// Whether the coop GEMM's `direct` design serves a layer (its fragments, clamped at
/// the edges, must lie inside X and W and start 16-byte aligned): f16 storage, M and N
/// at least one 16 x 16 tile, K a multiple of 16, X's row stride a multiple of 8.
pub fn direct_serves(dtype: DType, linear: &Linear) -> bool {
    dtype == DType::F16
        && linear.m >= 16
        && linear.n() >= 16
        && linear.k.is_multiple_of(16)
        && linear.x_stride.is_multiple_of(8)
}

/// Mirror of WGSL `LinearParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LinearParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub has_bias: u32,
    pub seg1: u32,
    pub seg2: u32,
    pub w_row0: u32,
    pub x_stride: u32,
    pub x_layer_rows: u32,
    pub w_layer_rows: u32,
    pub w_texture_row0: u32,
    pub pad0: u32,
}

/// One linear layer application: `out = x · wᵀ + bias`, all buffers row-major of `dtype`.
pub struct Linear<'a> {
    /// `[m, k]` with row stride `x_stride` elements.
    pub x: &'a wgpu::Buffer,
    pub x_stride: usize,
    /// `[n, k]`, as PyTorch stores `nn.Linear.weight`, from row `w_row0` on.
    pub w: &'a wgpu::Buffer,
    /// `w` already packed for the texture tiling (all of its rows, from row 0), as a
    /// layer packs its weights once; without it the texture tiling packs the rows it
    /// uses on every call.
    pub w_packed: Option<&'a PackedRows>,
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

impl Gpu {
    /// The GEMM tiling for f32 inputs at the default precision: on GPUs `blocked` (with
    /// the 32 KiB of workgroup memory it takes; else `tiled`); on CPU adapters `texture`
    /// with >= 8-lane subgroups (lavapipe), else `tiled` (barriers are cheap enough
    /// there for its 64 x 64 blocks, and its 4 x 4 micro-tiles suit 8-wide SIMD).
    pub fn linear_tiling(&self) -> LinearTiling {
        if !self.is_cpu_adapter() && fits_blocked(self) {
            LinearTiling::Blocked
        } else if has_8_lane_subgroups(self) {
            LinearTiling::Texture
        } else {
            LinearTiling::Tiled
        }
    }

    /// The GEMM tiling for inputs of `dtype` at `precision`: `coop` (tensor cores)
    /// where f16 products are allowed and the adapter can run it, else as
    /// [`Gpu::linear_tiling`].
    pub fn linear_tiling_for(&self, dtype: DType, precision: crate::options::Precision) -> LinearTiling {
        if precision.allows_f16_products(dtype) && coop_subgroup_size(self).is_some() {
            LinearTiling::Coop
        } else {
            self.linear_tiling()
        }
    }
}

/// The subgroup size the coop GEMM runs with, if this device can run it. Its loops
/// divide a slab's f16 words (32 per 16 x 16 tile) evenly among the 4 subgroups, so
/// the size must divide 32 x `TILES` (128 on tensor cores).
fn coop_subgroup_size(ctx: &Gpu) -> Option<u32> {
    let caps = ctx.capabilities();
    caps.coop_subgroup_size().filter(|&sg| {
        (32 * coop_tiles(ctx)).is_multiple_of(sg)
            && 4 * sg <= caps.max_invocations
            && coop_workgroup_bytes(coop_tiles(ctx)) <= caps.max_workgroup_storage
    })
}

/// Whether the adapter grants the blocked GEMM's workgroup memory.
fn fits_blocked(ctx: &Gpu) -> bool {
    ctx.capabilities().max_workgroup_storage >= BLOCKED_WORKGROUP_BYTES
}

/// The texture kernel shares X across 8 lanes of one subgroup.
fn has_8_lane_subgroups(ctx: &Gpu) -> bool {
    ctx.capabilities().subgroups.is_some_and(|(min, _)| min >= 8)
}

/// Whether a buffer holds at least one 16-byte word (can be bound as `array<vec4<u32>>`).
fn buffer_words(buffer: &wgpu::Buffer) -> bool {
    buffer.size() >= 16
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
        if let Some(packed) = self.w_packed {
            if !packed.is_whole(self.w) || packed.cols() != k || packed.rows() < self.w_row0 + n {
                return Err(Error::invalid(
                    "linear layer",
                    format!(
                        "the packed W must hold rows 0.. of W; it is {} x {}, needs {k} columns and {} rows",
                        packed.rows(),
                        packed.cols(),
                        self.w_row0 + n
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether both operands can be packed into textures (and so run through the texture
    /// GEMM, which covers 8 or 16 rows per workgroup: wherever the packing's 8-row
    /// dispatch fits, so does the GEMM's).
    fn fits_textures(&self, ctx: &Gpu) -> bool {
        let w_rows = self.w_packed.map_or(self.n(), PackedRows::rows);
        TextureShape::for_matrix(ctx, self.m, self.k).is_some()
            && TextureShape::for_matrix(ctx, w_rows, self.k).is_some()
    }
}

/// A linear layer's dispatch, decided whole before anything is recorded (as the fused
/// forward's `FusedPlan`): the tiling that runs (the one asked for, or the one that
/// stands in where the adapter or the operands rule it out), its kernel (the coop
/// GEMM's direct or staged form) and constants, and the grid.
#[derive(Clone, Debug)]
pub(crate) struct LinearPlan {
    pub tiling: LinearTiling,
    pub kernel: Kernel,
    pub constants: Vec<(&'static str, u32)>,
    pub groups: [u32; 3],
    /// The coop GEMM loads its fragments straight from X and W (no word bindings).
    pub direct: bool,
}

/// The plan of one linear layer application asked for in `tiling`; an error where its
/// loop outgrows the driver's cap or its grid the device's workgroups per dimension.
pub(crate) fn plan(
    ctx: &Gpu,
    policy: &Policy,
    dtype: DType,
    tiling: LinearTiling,
    linear: &Linear,
) -> Result<LinearPlan> {
    let tiling = match tiling {
        LinearTiling::Texture if !has_8_lane_subgroups(ctx) || !linear.fits_textures(ctx) => LinearTiling::Tiled,
        LinearTiling::Coop if coop_subgroup_size(ctx).is_none() => LinearTiling::Blocked,
        other => other,
    };
    // The blocked GEMM's double buffers want 32 KiB; the tiled one runs anywhere.
    let tiling = match tiling {
        LinearTiling::Blocked if !fits_blocked(ctx) => LinearTiling::Tiled,
        other => other,
    };
    let (m, n) = (linear.m, linear.n());
    loop_budget::check(
        ctx,
        || {
            format!(
                "a {m} x {n} linear layer over {} inputs ({} tiling)",
                linear.k,
                tiling.name()
            )
        },
        loop_budget::linear_iterations(tiling, linear.k),
    )?;
    let (block_m, block_n) = tiling.block(ctx, m);
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
    let direct = tiling == LinearTiling::Coop && policy.coop_gemm_direct && direct_serves(dtype, linear);
    let constants = match (tiling, coop_subgroup_size(ctx)) {
        (LinearTiling::Coop, Some(sg)) => vec![("SG", sg)],
        (LinearTiling::Texture, _) => vec![("ROW_GROUPS", texture_row_groups(m))],
        (LinearTiling::Blocked, _) => vec![("GEMM_WORDS", gemm_words(linear))],
        _ => Vec::new(),
    };
    let kernel = match tiling {
        LinearTiling::Coop => coop_kernel(direct, coop_tiles(ctx)),
        other => other.kernel(),
    };
    Ok(LinearPlan {
        tiling,
        kernel,
        constants,
        groups,
        direct,
    })
}

/// Records one linear layer application: its `plan`, compiled and bound. The texture
/// tiling packs X (and W, unless `w_packed` is given) into textures first, in the same
/// encoder; on an adapter without 8-lane subgroups, or for operands past the texture or
/// dispatch limits, the tiled kernel runs instead.
pub fn encode_linear(
    ctx: &Gpu,
    policy: &Policy,
    encoder: &mut wgpu::CommandEncoder,
    dtype: DType,
    tiling: LinearTiling,
    linear: &Linear,
) -> Result<()> {
    linear.validate(dtype)?;
    let LinearPlan {
        tiling,
        kernel,
        constants,
        groups,
        direct,
    } = plan(ctx, policy, dtype, tiling, linear)?;
    let (m, n) = (linear.m, linear.n());
    let pipeline = pipeline(ctx, &kernel, dtype, &constants)?;
    let widths: Vec<usize> = linear.outputs.iter().map(|&(_, width)| width).collect();
    let seg1 = widths[0];
    let seg2 = seg1 + widths.get(1).copied().unwrap_or(0);
    let mut params = LinearParams {
        m: m as u32,
        n: n as u32,
        k: linear.k as u32,
        has_bias: linear.bias.is_some().into(),
        seg1: seg1 as u32,
        seg2: if widths.len() == 1 { n as u32 } else { seg2 as u32 },
        w_row0: linear.w_row0 as u32,
        x_stride: linear.x_stride as u32,
        ..Default::default()
    };
    // Operands: buffers for the tiled kernel, textures for the texture kernel.
    let (x_packed, w_packed_here);
    let (x, w) = match tiling {
        LinearTiling::Tiled | LinearTiling::Blocked | LinearTiling::Coop => {
            (linear.x.as_entire_binding(), linear.w.as_entire_binding())
        }
        LinearTiling::Texture => {
            let x = RowSource {
                buffer: linear.x,
                row0: 0,
                rows: m,
                cols: linear.k,
                stride: linear.x_stride,
            };
            x_packed = PackedRows::encode(ctx, encoder, dtype, &x)?;
            let (w, w_texture_row0) = match linear.w_packed {
                Some(w) => (w, linear.w_row0),
                None => {
                    let w = RowSource {
                        buffer: linear.w,
                        row0: linear.w_row0,
                        rows: n,
                        cols: linear.k,
                        stride: linear.k,
                    };
                    w_packed_here = PackedRows::encode(ctx, encoder, dtype, &w)?;
                    (&w_packed_here, 0)
                }
            };
            params.x_layer_rows = x_packed.shape().layer_rows as u32;
            params.w_layer_rows = w.shape().layer_rows as u32;
            params.w_texture_row0 = w_texture_row0 as u32;
            (
                wgpu::BindingResource::TextureView(x_packed.view()),
                wgpu::BindingResource::TextureView(w.view()),
            )
        }
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
    let buffers = [
        (3, linear.bias.unwrap_or(&placeholders[0])),
        (4, output(0)),
        (5, output(1)),
        (6, output(2)),
    ];
    let mut entries = vec![
        wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        },
        wgpu::BindGroupEntry {
            binding: 1,
            resource: x,
        },
        wgpu::BindGroupEntry {
            binding: 2,
            resource: w,
        },
    ];
    entries.extend(buffers.iter().map(|&(binding, buffer)| wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }));
    if matches!(tiling, LinearTiling::Coop | LinearTiling::Blocked) && !direct {
        // X and W again as 16-byte words. A buffer shorter than one word cannot be bound
        // so; the kernels read words only where K and X's row stride are multiples of a
        // word's elements (coop) or of 4 elements in buffers of whole words (blocked),
        // which makes both buffers hold at least one. (Placeholder 0 is only ever bound
        // read-only: outputs always have a buffer of their own there.)
        let word = |buffer| if buffer_words(buffer) { buffer } else { &placeholders[0] };
        entries.extend(
            [(7, word(linear.x)), (8, word(linear.w))].map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            }),
        );
    }
    ctx.scoped("recording a linear layer", || {
        dispatch_entries(ctx, encoder, &pipeline, &entries, groups)
    })
}

/// The linear layer's kernels (the direct coop GEMM is `isa`'s and its own tests') (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![TILED, BLOCKED, COOP, TEXTURE]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coop_generator_keeps_the_tiles_asked_for() {
        assert_eq!(COOP.source, coop_source(4).as_str());
        let two = coop_source(2);
        assert!(two.contains("const TILES: u32 = 2u;"), "{two}");
        let code: String = two.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
        for gone in ["acc02", "acc20", "acc33", "let a2 ", "let ib3 ", "acc13"] {
            assert!(!code.contains(gone), "{gone} in\n{two}");
        }
        // 4 accumulators declared, 4 fragment loads and 4 multiply-adds in each of the
        // slab's two steps (written out), 4 stores.
        assert_eq!(two.matches("= coop_mat16x16<f32, C>();").count(), 4);
        assert_eq!(two.matches("= coopLoad").count(), 8);
        assert_eq!(two.matches("coopMultiplyAdd(").count(), 8);
        assert_eq!(two.matches("coopStoreT(").count(), 4);
        assert_eq!(coop_block(2), 64);
        assert_eq!(coop_workgroup_bytes(4), 28 * 1024);
    }
}
