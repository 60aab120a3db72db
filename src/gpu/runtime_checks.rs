//! The checks wgpu writes into every shader unless a module is created "trusted"
//! (`create_shader_module_trusted`): a 64-bit counter in every loop and bounds checks on
//! every index and buffer access. On by default; a context may drop them so that a GPU
//! run can time both (docs/design.md, "Runtime checks"; `isa` shows what each costs).

use crate::error::{Error, Result};

/// The environment variable that picks a context's runtime checks:
/// `checked` (the default), `no-loop-bound`, `no-bounds-checks` or `unchecked`.
pub const RUNTIME_CHECKS_VAR: &str = "WGPU_ATTENTION_RUNTIME_CHECKS";

/// Which of wgpu's runtime checks the kernels are compiled with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeChecks {
    /// A counter in every loop that ends it after 2^64 iterations (`force_loop_bounding`).
    pub loop_bounding: bool,
    /// Every dynamic index clamped into its array, and buffer and image accesses into
    /// their bindings where the device lacks robust access (`bounds_checks`).
    pub bounds_checks: bool,
}

impl RuntimeChecks {
    /// What wgpu does for a module from `create_shader_module`.
    pub const WGPU_DEFAULT: Self = RuntimeChecks {
        loop_bounding: true,
        bounds_checks: true,
    };

    const NAMED: [(&'static str, bool, bool); 4] = [
        ("checked", true, true),
        ("no-loop-bound", false, true),
        ("no-bounds-checks", true, false),
        ("unchecked", false, false),
    ];

    /// The name tables, `isa --checks` and [`RUNTIME_CHECKS_VAR`] use.
    pub fn label(&self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(_, l, b)| *l == self.loop_bounding && *b == self.bounds_checks)
            .map_or("checked", |(name, ..)| name)
    }

    /// Parses [`RuntimeChecks::label`]'s names (exactly; `what` names the source in
    /// the error).
    pub fn parse(what: &str, name: &str) -> Result<Self> {
        Self::NAMED
            .iter()
            .find(|(n, ..)| *n == name)
            .map(|&(_, loop_bounding, bounds_checks)| RuntimeChecks {
                loop_bounding,
                bounds_checks,
            })
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMED.iter().map(|(n, ..)| *n).collect();
                Error::invalid(what, format!("'{name}' is not one of {}", names.join(", ")))
            })
    }

    /// wgpu's form: every other check (ray queries, mesh shaders, integer division) kept.
    pub fn to_wgpu(self) -> wgpu::ShaderRuntimeChecks {
        wgpu::ShaderRuntimeChecks {
            bounds_checks: self.bounds_checks,
            force_loop_bounding: self.loop_bounding,
            ..wgpu::ShaderRuntimeChecks::checked()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_or_empty_names_are_refused() {
        for (name, ..) in RuntimeChecks::NAMED {
            assert_eq!(RuntimeChecks::parse("x", name).expect("a name").label(), name);
        }
        for bad in ["", " checked", "Checked", "none"] {
            assert!(RuntimeChecks::parse("x", bad).is_err(), "{bad:?}");
        }
        let default = RuntimeChecks::WGPU_DEFAULT.to_wgpu();
        assert!(default.bounds_checks && default.force_loop_bounding && default.int_div_checks);
        let off = RuntimeChecks::parse("x", "unchecked").expect("a name").to_wgpu();
        assert!(!off.bounds_checks && !off.force_loop_bounding && off.int_div_checks);
    }
}
