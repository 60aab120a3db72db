//! What the user, the environment or a tuning table chose, apart from what the adapter
//! reports ([`crate::gpu::Capabilities`]): pins of kernel designs, key splits, the tuned
//! tensor-core variants. Every environment variable a context obeys
//! is read here, once, when the context is made ([`Policy::from_env`]); a context made
//! from the caller's device reads only the two whose errors wait for the call that
//! needs them (`Policy::deferred`). Pickers take the capabilities and the policy side
//! by side (docs/design.md, "Host side").

use crate::error::{Error, Result};
use crate::gpu::{env_value, RuntimeChecks, RUNTIME_CHECKS_VAR};
use crate::kernels::backward_coop::CoopBackwardVariant;
use crate::kernels::decode::DecodeDesign;
use crate::kernels::flash::CoopVariant;
use crate::options::FusedTiling;

/// The choices a context's kernels are picked and compiled under, beside what the
/// adapter can do.
#[derive(Clone, Debug)]
pub struct Policy {
    /// `WGPU_ATTENTION_TILING` as read when the context was made (`Auto` when unset),
    /// or why it could not be parsed (the error waits for a call that needs it).
    pub(crate) tiling: std::result::Result<FusedTiling, String>,
    /// The split-K decode design `WGPU_ATTENTION_DECODE` or
    /// [`crate::Context::use_decode_design`] pins (`None`: the adapter's), or why the
    /// variable could not be parsed.
    pub(crate) decode_design: std::result::Result<Option<DecodeDesign>, String>,
    /// Tensor-core variants a tuning table measured fastest on this adapter, one per
    /// head-dim class ([`crate::kernels::tune`]); empty where no table names the adapter.
    pub coop_tuned: Vec<CoopVariant>,
    /// Lanes the micro-tile tiling reduces a row over with subgroup shuffles, where
    /// pinned ([`crate::Context::use_micro_lanes`]; `tune` times each); else the most the
    /// adapter's subgroups hold ([`crate::kernels::flash::micro_lanes`]).
    pub micro_lanes: Option<u32>,
    /// Disjoint key ranges a fused attention is split into, each in its own dispatches
    /// with outputs of its own, merged by log-sum-exp ([`crate::merge`]): more
    /// workgroups where B·H·(Lq/rows) leaves a GPU's cores idle (issue 52). 1 (no split)
    /// unless pinned ([`crate::Context::use_key_splits`], `WGPU_ATTENTION_KEY_SPLITS`).
    pub key_splits: u32,
    /// The tensor-core backward's fragments and gradient tiles as named values, its
    /// loops over them unrolled (the forward's `named` axis, issue 52), where pinned
    /// ([`crate::Context::use_named_coop_backward`], `WGPU_ATTENTION_COOP_BACKWARD`);
    /// arrays by default.
    pub coop_backward_named: bool,
    /// The tensor-core backward's variant, where pinned and it fits a problem
    /// ([`crate::Context::use_coop_backward_variant`]; `tune --backward` times each);
    /// else the picker's (`kernels::backward_coop::variant_for`).
    pub coop_backward_pinned: Option<CoopBackwardVariant>,
    /// The coop GEMM in its `direct` design (fragments loaded straight from X and W,
    /// nothing staged) where it serves a layer, where pinned
    /// ([`crate::Context::use_direct_coop_gemm`], `WGPU_ATTENTION_COOP_GEMM`); staged by
    /// default.
    pub coop_gemm_direct: bool,
    /// Whether a device this crate makes asks for subgroups where the adapter has them
    /// (`WGPU_ATTENTION_SUBGROUPS=off`: no, so every kernel takes the variant a GPU
    /// without subgroups gets, as a browser without `subgroups` or wgpu's GL backend
    /// would; for timing those variants on a GPU that has subgroups).
    pub subgroups: bool,
}

impl Default for Policy {
    /// Nothing pinned, nothing tuned, wgpu's runtime checks.
    fn default() -> Self {
        Policy {
            tiling: Ok(FusedTiling::Auto),
            decode_design: Ok(None),
            coop_tuned: Vec::new(),
            micro_lanes: None,
            key_splits: 1,
            coop_backward_named: false,
            coop_backward_pinned: None,
            coop_gemm_direct: false,
            subgroups: true,
        }
    }
}

impl Policy {
    /// What every context reads, including one made from the caller's device
    /// ([`crate::Context::from_wgpu`]): `WGPU_ATTENTION_TILING` and
    /// `WGPU_ATTENTION_DECODE`, whose errors wait for the call that needs them.
    pub(crate) fn deferred() -> Self {
        Policy {
            tiling: tiling_from_env(),
            decode_design: decode_design_from_env(),
            ..Policy::default()
        }
    }

    /// Every variable [`crate::Context::new`] obeys, and the tuning table's variants for
    /// the adapter `info` names; a variable set to something unreadable is an error
    /// naming it.
    pub fn from_env(info: &wgpu::AdapterInfo) -> Result<Self> {
        let deferred = Policy::deferred();
        deferred.tiling()?;
        deferred.decode_design()?;
        Ok(Policy {
            key_splits: key_splits_from_env()?,
            coop_backward_named: form_from_env(COOP_BACKWARD_VAR, "arrayed", "named")?,
            coop_gemm_direct: form_from_env(COOP_GEMM_VAR, "staged", "direct")?,
            coop_tuned: crate::kernels::tune::TuneTable::load()?.coop_variants_for(info),
            subgroups: !form_from_env(SUBGROUPS_VAR, "on", "off")?,
            ..deferred
        })
    }

    /// The tiling `WGPU_ATTENTION_TILING` named (`Auto` when unset), or its error.
    pub fn tiling(&self) -> Result<FusedTiling> {
        self.tiling.clone().map_err(|reason| Error::invalid(TILING_VAR, reason))
    }

    /// The pinned split-K decode design (`None`: the adapter's own pick), or the error
    /// `WGPU_ATTENTION_DECODE` gave.
    pub(crate) fn decode_design(&self) -> Result<Option<DecodeDesign>> {
        self.decode_design
            .clone()
            .map_err(|reason| Error::invalid(crate::kernels::decode::DECODE_VAR, reason))
    }

    /// The tuned tensor-core variant for head dims up to `need`: the smallest tuned one
    /// that holds them within their head-dim class (the smallest of 64, 128, 256 that
    /// holds them), if any; a class without one takes the picker's rule.
    pub fn tuned_coop(&self, need: u32) -> Option<CoopVariant> {
        let class_of = |d: u32| [64, 128, 256].into_iter().find(|&c| d <= c);
        let class = class_of(need)?;
        self.coop_tuned
            .iter()
            .filter(|v| v.dmax >= need && class_of(v.dmax) == Some(class))
            .min_by_key(|v| v.dmax)
            .copied()
    }
}

/// The environment variable that keeps subgroups off a device [`crate::Context::new`]
/// makes, `on` (the default) or `off` ([`Policy::subgroups`]).
pub const SUBGROUPS_VAR: &str = "WGPU_ATTENTION_SUBGROUPS";

/// The environment variable that names the fused tiling when none is asked for.
pub const TILING_VAR: &str = "WGPU_ATTENTION_TILING";

/// The environment variable that pins the key splits of fused attention
/// ([`crate::Context::use_key_splits`]).
pub const KEY_SPLITS_VAR: &str = "WGPU_ATTENTION_KEY_SPLITS";

/// The environment variable that picks the tensor-core backward's form, `arrayed`
/// (the default) or `named` ([`crate::Context::use_named_coop_backward`]).
pub const COOP_BACKWARD_VAR: &str = "WGPU_ATTENTION_COOP_BACKWARD";

/// The environment variable that picks the tensor-core GEMM's design, `staged` (the
/// default) or `direct` ([`crate::Context::use_direct_coop_gemm`]).
pub const COOP_GEMM_VAR: &str = "WGPU_ATTENTION_COOP_GEMM";

/// An environment variable that picks one of two forms, parsed: `Ok(false)` where unset
/// or `off`, `Ok(true)` for `on`.
fn form_from_env(var: &str, off: &str, on: &str) -> Result<bool> {
    match env_value(var)? {
        None => Ok(false),
        Some(text) => match text.trim() {
            t if t == off => Ok(false),
            t if t == on => Ok(true),
            other => Err(Error::invalid(var, format!("'{other}' is neither '{off}' nor '{on}'"))),
        },
    }
}

/// Most key splits one attention takes.
pub const MAX_KEY_SPLITS: u32 = 16;

/// [`KEY_SPLITS_VAR`], parsed (1 where unset).
fn key_splits_from_env() -> Result<u32> {
    match env_value(KEY_SPLITS_VAR)? {
        None => Ok(1),
        Some(text) => crate::kernels::tune::parse_key_splits(KEY_SPLITS_VAR, &text),
    }
}

/// [`TILING_VAR`], parsed: read once per context, so a typo is one clear error when
/// the context is made rather than a surprise at some later call.
fn tiling_from_env() -> std::result::Result<FusedTiling, String> {
    let reason = |e: Error| match e {
        Error::Invalid { reason, .. } => reason,
        e => e.to_string(),
    };
    match env_value(TILING_VAR).map_err(reason)? {
        None => Ok(FusedTiling::Auto),
        Some(name) => crate::kernels::flash::parse_tiling(TILING_VAR, &name).map_err(reason),
    }
}

/// `WGPU_ATTENTION_DECODE`, parsed (`None` where unset or `auto`), or why not.
fn decode_design_from_env() -> std::result::Result<Option<DecodeDesign>, String> {
    match env_value(crate::kernels::decode::DECODE_VAR) {
        Err(Error::Invalid { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
        Ok(_) => DecodeDesign::from_env(),
    }
}

/// `WGPU_ATTENTION_RUNTIME_CHECKS`, parsed (wgpu's default where unset): the device
/// layer compiles with them ([`crate::Gpu::use_runtime_checks`]), so the context that
/// reads the others here reads this one too and hands it down.
pub(crate) fn runtime_checks_from_env() -> Result<RuntimeChecks> {
    match env_value(RUNTIME_CHECKS_VAR)? {
        None => Ok(RuntimeChecks::WGPU_DEFAULT),
        Some(value) => RuntimeChecks::parse(RUNTIME_CHECKS_VAR, &value),
    }
}
