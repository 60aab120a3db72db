//! `WGPU_ATTENTION_TILING` is read once, when a context is made (issue 17 §2): a typo
//! is one clear error from `Context::new`, not a failure at whichever later call first
//! picks a tiling, and changing the variable later does not change a live context.
//! One test in its own binary, as it sets a process-wide variable.

mod common;
use wgpu_attention::{Context, Error, FusedTiling};

#[test]
fn the_tiling_variable_is_parsed_when_the_context_is_made() {
    if common::ctx().is_none() {
        return;
    }
    std::env::set_var("WGPU_ATTENTION_TILING", "registrs");
    let err = Context::new().expect_err("a misspelt tiling");
    assert!(
        matches!(&err, Error::Invalid { what, reason } if what == "WGPU_ATTENTION_TILING" && reason.contains("registers")),
        "{err}"
    );
    std::env::set_var("WGPU_ATTENTION_TILING", "registers");
    let ctx = Context::new().expect("a known tiling");
    std::env::set_var("WGPU_ATTENTION_TILING", "nonsense");
    assert_eq!(
        ctx.default_fused_tiling(false).expect("read at creation"),
        FusedTiling::Registers
    );
    // Set but empty is refused as every variable refuses it (issue 64 item 8: it meant
    // auto), not taken for unset.
    std::env::set_var("WGPU_ATTENTION_TILING", "");
    let err = Context::new().expect_err("an empty tiling");
    assert!(
        matches!(&err, Error::Invalid { what, reason } if what == "WGPU_ATTENTION_TILING" && reason.contains("empty")),
        "{err}"
    );
    std::env::remove_var("WGPU_ATTENTION_TILING");
}
