//! The merge of partial attentions by their log-sum-exp (`merge_attentions.wgsl`;
//! `crate::merge` encodes it): one fold per partial into an f32 running state, then one
//! store in the output's dtype and layout.

use crate::gpu::Text;
use crate::kernels::Kernel;

const SOURCE: &str = include_str!("../../shaders/merge_attentions.wgsl");

/// Folds one partial into the f32 running state.
pub const FOLD: Kernel = Kernel {
    file: "merge_attentions.wgsl",
    source: Text::Static(SOURCE),
    entry: "merge_fold",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Stores the state in the output's dtype and layout.
pub const STORE: Kernel = Kernel {
    entry: "merge_store",
    ..FOLD
};

/// The merge's kernels (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![FOLD, STORE]
}
