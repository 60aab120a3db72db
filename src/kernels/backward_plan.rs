//! The fused backward's plan (docs/design.md, "Backward"): which tiling runs a
//! problem ([`BackwardTiling`], from the forward's tiling, the dtype and precision, the
//! adapter's capabilities and the context's policy) and, for that tiling, every other
//! choice a call makes before it records anything ([`FusedBackwardPlan`]: its two
//! kernels and their constants, the coop passes' word staging, the walk each dispatch
//! may take under llvmpipe's loop cap). `crate::backward` checks the call's tensors and
//! records the plan.

use super::backward_blocked::{self, BlockedVariant};
use super::backward_coop::{self, CoopBackwardVariant};
use super::backward_passes::{rows_for, PassKernels, DKDV_SLOTS, DQ, DQ_SLOTS, SUBGROUP_128, SUBGROUP_64};
use super::policy::Policy;
use super::{loop_budget, AttentionParams};
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Gpu};
use crate::options::{FusedTiling, Precision};
use crate::problem::AttentionShape;
use crate::tensor::{DType, Tensor};

/// How the dQ and dK/dV passes are tiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackwardTiling {
    /// One row or key per invocation, operands from storage (`flash_backward.wgsl`):
    /// every adapter, every head dim.
    Rows,
    /// Where the forward runs its `subgroup` tiling (CPU adapters) and both head dims
    /// are at most 128: 4 rows or keys per invocation sharing loads through 8-lane
    /// subgroups (`flash_backward_subgroup.wgsl`).
    Subgroup,
    /// Where the forward runs a GPU tiling (`shared`, `blocked`, `coop`) and a variant
    /// of `flash_backward_blocked.wgsl` holds the head dims (up to 128 in f32, 256 in
    /// f16) in the adapter's workgroup memory: tiles of rows and keys with both
    /// operands of every product in workgroup memory (`kernels::backward_blocked`; in
    /// 48 KiB, 32 rows and keys per tile at D 64, and at D 128 16 in f32 and 32 in
    /// f16).
    Blocked(BlockedVariant),
    /// Where the forward runs its tensor-core tiling (`coop`: f16 inputs, or f32 below
    /// [`Precision::Highest`]) and a variant holds the head dims (up to 128): every
    /// product a 16 x 16 x 16 f16 cooperative-matrix multiply-add with f32
    /// accumulation (`kernels::backward_coop`), on subgroups of the given lanes.
    Coop(CoopBackwardVariant, u32),
}

impl BackwardTiling {
    /// The tiling for a problem of `dtype` at `precision` whose forward runs the fused
    /// tiling `forward` on `gpu` under `policy`. Below [`Precision::Highest`], f32
    /// inputs take the blocked tiling's f16 tiles where the adapter has f16, and follow
    /// a tensor-core forward onto tensor cores as f16 inputs do.
    pub(crate) fn for_forward(
        gpu: &Gpu,
        policy: &Policy,
        forward: FusedTiling,
        dtype: DType,
        precision: Precision,
        shape: &AttentionShape,
    ) -> Self {
        let dims = shape.head_dim.max(shape.head_dim_v);
        let caps = gpu.capabilities();
        let half_tiles = precision != Precision::Highest && caps.f16;
        if forward == FusedTiling::Coop && (dtype == DType::F16 || precision != Precision::Highest) {
            let coop = caps.coop_subgroup_size().and_then(|sg| {
                let dims = u32::try_from(dims).ok()?;
                let (bytes, invocations) = (caps.max_workgroup_storage, caps.max_invocations);
                let pinned = policy
                    .coop_backward_pinned
                    .filter(|v| v.fits(dims, sg, bytes, invocations));
                pinned
                    .or_else(|| {
                        backward_coop::variant_for(dims, sg, bytes, invocations)
                            .map(|v| v.with_named(policy.coop_backward_named))
                    })
                    .map(|v| (v, sg))
            });
            // Its dK/dV pass binds 14 storage buffers (the others' 10, and 4 as words).
            let storage = gpu.device().limits().max_storage_buffers_per_shader_stage as usize;
            if let Some((v, sg)) = coop.filter(|_| storage >= backward_coop::DKDV_SLOTS.len() - 1) {
                return BackwardTiling::Coop(v, sg);
            }
        }
        match forward {
            FusedTiling::Subgroup if dims <= 128 => BackwardTiling::Subgroup,
            FusedTiling::Shared | FusedTiling::Blocked | FusedTiling::Coop => {
                let fits = u32::try_from(dims).ok().and_then(|d| {
                    let (storage, invocations) = (caps.max_workgroup_storage, caps.max_invocations);
                    backward_blocked::variant_for(d, dtype, half_tiles, storage, invocations)
                });
                fits.map_or(BackwardTiling::Rows, |v| BackwardTiling::Blocked(*v))
            }
            _ => BackwardTiling::Rows,
        }
    }

    /// The name reports give it.
    pub fn name(self) -> &'static str {
        match self {
            BackwardTiling::Rows => "rows",
            BackwardTiling::Subgroup => "subgroup",
            BackwardTiling::Blocked(_) => "blocked",
            BackwardTiling::Coop(..) => "coop",
        }
    }

    pub(crate) fn kernels(self, shape: &AttentionShape, caps: &Capabilities) -> PassKernels {
        let dims = shape.head_dim.max(shape.head_dim_v) as u32;
        match self {
            BackwardTiling::Rows => rows_for(dims as usize, caps).0,
            BackwardTiling::Subgroup if dims <= 64 => SUBGROUP_64,
            BackwardTiling::Subgroup => SUBGROUP_128,
            BackwardTiling::Blocked(v) => PassKernels {
                dq: v.dq(DQ_SLOTS),
                dkdv: v.dkdv(DKDV_SLOTS),
            },
            BackwardTiling::Coop(v, sg) => PassKernels {
                dq: v.dq(sg),
                dkdv: v.dkdv(sg),
            },
        }
    }

    /// Override constants of its buffer kernels (the workgroup size of `rows` and
    /// `subgroup`'s, `ROWS` rows or keys of `rows`' lanes each; the blocked variants fix
    /// theirs in the prelude).
    fn constants(self, shape: &AttentionShape, caps: &Capabilities) -> Vec<(&'static str, u32)> {
        match self {
            BackwardTiling::Blocked(_) | BackwardTiling::Coop(..) => Vec::new(),
            BackwardTiling::Rows => vec![("ROWS", ROWS * rows_for(dims_of(shape), caps).1)],
            BackwardTiling::Subgroup => vec![("ROWS", ROWS)],
        }
    }

    /// Rows (or keys) per workgroup of its buffer kernels.
    fn rows_per_workgroup(self) -> u32 {
        match self {
            BackwardTiling::Blocked(v) => v.tile,
            BackwardTiling::Coop(v, _) => v.br,
            _ => ROWS,
        }
    }

    /// Loop iterations of one invocation of the dQ pass over `keys` keys, and of the
    /// dK/dV pass over `rows` query rows (llvmpipe's loop cap).
    fn dq_iterations(self, s: &AttentionShape, caps: &Capabilities, keys: usize) -> u64 {
        match self {
            BackwardTiling::Rows => {
                let lanes = rows_for(dims_of(s), caps).1;
                loop_budget::backward_dq_iterations(rows_vec4s(s, caps), lanes, keys)
            }
            BackwardTiling::Subgroup => loop_budget::backward_subgroup_dq_iterations(s, keys),
            BackwardTiling::Blocked(v) => backward_blocked::dq_iterations(&v, vec4s(s), keys),
            BackwardTiling::Coop(v, sg) => backward_coop::dq_iterations(&v, sg, keys),
        }
    }

    fn dkdv_iterations(self, s: &AttentionShape, caps: &Capabilities, rows: usize) -> u64 {
        match self {
            BackwardTiling::Rows => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                let lanes = rows_for(dims_of(s), caps).1;
                loop_budget::backward_dkdv_iterations(rows_vec4s(s, caps), lanes, rows, group)
            }
            BackwardTiling::Subgroup => loop_budget::backward_subgroup_dkdv_iterations(s, rows),
            BackwardTiling::Blocked(v) => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                backward_blocked::dkdv_iterations(&v, vec4s(s), rows, group)
            }
            BackwardTiling::Coop(v, sg) => {
                let group = (s.heads_q / s.heads_kv.max(1)) as u64;
                backward_coop::dkdv_iterations(&v, sg, rows, group)
            }
        }
    }
}

/// The head dims in vec4s (D, Dv).
fn vec4s(s: &AttentionShape) -> (u64, u64) {
    ((s.head_dim as u64).div_ceil(4), (s.head_dim_v as u64).div_ceil(4))
}

fn dims_of(s: &AttentionShape) -> usize {
    s.head_dim.max(s.head_dim_v)
}

/// The vec4s each lane of `rows`' passes walks per row (D, Dv): the head dims' on CPU
/// adapters, a head-dim class's constant 8 on GPUs (`rows_for`).
fn rows_vec4s(s: &AttentionShape, caps: &Capabilities) -> (u64, u64) {
    if rows_for(dims_of(s), caps).0.dq == DQ {
        vec4s(s)
    } else {
        (8, 8)
    }
}

/// Rows (or keys) per workgroup of the dQ and dK/dV passes' buffer kernels, in both
/// tilings.
const ROWS: u32 = 32;

/// The fused backward of one call, decided whole before anything is recorded, as the
/// fused forward's `FusedPlan` is: the tiling, its dQ and dK/dV kernels and their
/// override constants (the coop passes' 16-byte-word staging included), the rows or
/// keys a workgroup owns, whether a placeholder stands in at the word slots, and how
/// many keys (dQ) or query rows (dK/dV) one dispatch may walk under the loop cap.
#[derive(Clone, Debug)]
pub(crate) struct FusedBackwardPlan {
    pub(crate) kernels: PassKernels,
    pub(crate) constants: Vec<(&'static str, u32)>,
    pub(crate) rows_per_workgroup: u32,
    /// Q, K, V or dO is shorter than one 16-byte word: a placeholder is bound at the
    /// coop passes' word slots, and they read elements.
    pub(crate) word_placeholder: bool,
    pub(crate) keys_per_dq_dispatch: usize,
    pub(crate) rows_per_dkdv_dispatch: usize,
}

impl FusedBackwardPlan {
    /// The plan of `tiling` for a problem `s` of `dtype` with parameters `params` over
    /// the operands Q, K, V and dO; an error where the loop cap cannot fit even 4 keys
    /// or rows of its walks.
    pub(crate) fn new(
        gpu: &Gpu,
        tiling: BackwardTiling,
        s: &AttentionShape,
        dtype: DType,
        params: &AttentionParams,
        operands: [&Tensor; 4],
    ) -> Result<FusedBackwardPlan> {
        let caps = gpu.capabilities();
        let coop = matches!(tiling, BackwardTiling::Coop(..));
        let word_placeholder = coop && operands.iter().any(|t| t.buffer().size() < 16);
        let mut constants = tiling.constants(s, caps);
        if coop {
            // The coop passes read Q, dO, K and V as 16-byte words where every one's
            // rows are whole words (their WORDS override).
            let words = !word_placeholder && coop_words(dtype, params);
            constants.push(("WORDS", u32::from(words)));
        }
        Ok(FusedBackwardPlan {
            kernels: tiling.kernels(s, caps),
            constants,
            rows_per_workgroup: tiling.rows_per_workgroup(),
            word_placeholder,
            keys_per_dq_dispatch: range_per_dispatch(gpu, s.len_k, |keys| tiling.dq_iterations(s, caps, keys))?,
            rows_per_dkdv_dispatch: range_per_dispatch(gpu, s.len_q, |rows| tiling.dkdv_iterations(s, caps, rows))?,
        })
    }
}

/// Whether the coop passes stage in 16-byte words for a problem: head dims and every
/// stride of Q, dO (the output's), K and V (a paged cache's page strides too) whole
/// words.
fn coop_words(dtype: DType, p: &AttentionParams) -> bool {
    let per_word = 16 / dtype.size() as u32;
    let rows = [
        p.q_stride_b,
        p.q_stride_h,
        p.q_stride_s,
        p.o_stride_b,
        p.o_stride_h,
        p.o_stride_s,
    ];
    let strides: Vec<u32> = p.kv_strides().into_iter().chain(rows).collect();
    crate::kernels::flash::words_fit(per_word, (p.head_dim, p.head_dim_v), &strides)
}

/// How many of `total` keys (or rows) one dispatch may walk under the context's loop
/// cap (all of them without one): the most, a multiple of 4, whose iteration count
/// `iterations` keeps within the cap.
fn range_per_dispatch(gpu: &Gpu, total: usize, iterations: impl Fn(usize) -> u64) -> Result<usize> {
    let Some(cap) = gpu.loop_cap() else {
        return Ok(total.max(1));
    };
    let (mut lo, mut hi) = (0usize, total.div_ceil(4));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if iterations(4 * mid) <= cap {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        return Err(Error::unsupported(
            "attention backward on this driver",
            format!("a loop cap of {cap} iterations per invocation"),
            "a cap that fits at least 4 keys or rows of its head dims",
        ));
    }
    Ok(4 * lo)
}
