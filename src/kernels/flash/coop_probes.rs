//! Diagnostic edits of the tensor-core attention kernel, for whoever debugs it on a
//! GPU: on an NVIDIA H200 it gives wrong results that no smaller pattern reproduces
//! (docs/design.md, "Tensor cores"), and GPU time is scarce, so one binary carries
//! every question the next run should ask. `WGPU_ATTENTION_COOP_PROBES=a,b` (read when
//! a context is made; [`Context::use_coop_probes`](crate::Context::use_coop_probes)
//! for tests) builds every `flash_coop` pipeline of that context from
//! `flash_coop.wgsl` with these edits, each a textual change that fails loudly if the
//! kernel no longer has the line it edits:
//!
//! - `zero-init`: wgpu zero-initialises workgroup memory (the crate turns that off);
//! - `const-overrides`: the override constants become `const` declarations;
//! - `tid-from-lanes`: the invocation index is `subgroup_id * SG + lane` instead of
//!   `local_invocation_index`;
//! - `always-rescale`: the rescale decision is `true` instead of a
//!   `workgroupUniformLoad` of the workgroup atomic;
//! - `scores-marker`: `ss` is filled with 3.0 before the key loop, so scores that never
//!   land show up as 3.0 (lse = 3·scale + ln 1 for one key) instead of as zeros;
//! - `store-marker`: the kernel stores column + 1 as every output element and 7.0 as
//!   every lse, so a kernel that never reaches its end (or never runs) leaves its
//!   outputs as they were.
//!
//! `wgpu-attention tune --shape 1,1,1,1,1,64 --dtype f16 --reps 1` then shows each
//! probe's errors (docs/gpu/coop_probes.sh runs them all).

use crate::error::{Error, Result};

/// The environment variable naming the probes.
pub const COOP_PROBES_VAR: &str = "WGPU_ATTENTION_COOP_PROBES";

/// One diagnostic edit (the module's documentation says what each does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoopProbe {
    ZeroInit,
    ConstOverrides,
    TidFromLanes,
    AlwaysRescale,
    ScoresMarker,
    StoreMarker,
}

impl CoopProbe {
    /// Every probe, in the order `coop_probes.sh` runs them.
    pub const ALL: [CoopProbe; 6] = [
        CoopProbe::ZeroInit,
        CoopProbe::ConstOverrides,
        CoopProbe::TidFromLanes,
        CoopProbe::AlwaysRescale,
        CoopProbe::ScoresMarker,
        CoopProbe::StoreMarker,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CoopProbe::ZeroInit => "zero-init",
            CoopProbe::ConstOverrides => "const-overrides",
            CoopProbe::TidFromLanes => "tid-from-lanes",
            CoopProbe::AlwaysRescale => "always-rescale",
            CoopProbe::ScoresMarker => "scores-marker",
            CoopProbe::StoreMarker => "store-marker",
        }
    }
}

/// The probes a context applies (none by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoopProbes(Vec<CoopProbe>);

impl CoopProbes {
    /// Parses a comma-separated list of probe names (empty: none).
    pub fn parse(list: &str) -> Result<Self> {
        let mut probes = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let probe = CoopProbe::ALL.iter().find(|p| p.name() == name).ok_or_else(|| {
                let known: Vec<&str> = CoopProbe::ALL.iter().map(|p| p.name()).collect();
                Error::invalid(
                    COOP_PROBES_VAR,
                    format!("unknown probe {name:?}; known: {}", known.join(", ")),
                )
            })?;
            if !probes.contains(probe) {
                probes.push(*probe);
            }
        }
        Ok(CoopProbes(probes))
    }

    /// The probes `WGPU_ATTENTION_COOP_PROBES` names.
    pub fn from_env() -> Result<Self> {
        match std::env::var(COOP_PROBES_VAR) {
            Ok(list) => Self::parse(&list),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid(COOP_PROBES_VAR, "not valid UTF-8")),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn has(&self, probe: CoopProbe) -> bool {
        self.0.contains(&probe)
    }

    /// `+zero-init+store-marker`: what pipeline labels add.
    pub fn label(&self) -> String {
        self.0.iter().map(|p| format!("+{}", p.name())).collect()
    }

    /// The kernel's full source with the probes' edits, and the override constants the
    /// pipeline still takes (none once `const-overrides` wrote them into the source).
    pub fn edit(&self, source: &str, constants: &[(&'static str, u32)]) -> Result<(String, Vec<(&'static str, u32)>)> {
        let mut s = source.to_string();
        let mut constants = constants.to_vec();
        if self.has(CoopProbe::ConstOverrides) {
            s = overrides_as_consts(&s, &constants)?;
            constants.clear();
        }
        if self.has(CoopProbe::TidFromLanes) {
            s = replace_once(&s, "    @builtin(local_invocation_index) tid: u32,\n", "")?;
            s = replace_once(
                &s,
                "    @builtin(subgroup_invocation_id) lane: u32,\n) {\n",
                "    @builtin(subgroup_invocation_id) lane: u32,\n) {\n    let tid = sg * SG + lane;\n",
            )?;
        }
        if self.has(CoopProbe::AlwaysRescale) {
            s = replace_once(
                &s,
                "let rescale = workgroupUniformLoad(&moved) != 0u;",
                "_ = workgroupUniformLoad(&moved);\n        let rescale = true;",
            )?;
        }
        if self.has(CoopProbe::ScoresMarker) {
            s = replace_once(
                &s,
                "    // Software-pipelined by half a tile",
                "    for (var x = tid; x < BR * LDS; x += NT) {\n        ss[x] = 3.0;\n    }\n    workgroupBarrier();\n    // Software-pipelined by half a tile",
            )?;
        }
        if self.has(CoopProbe::StoreMarker) {
            // The markers still depend on what the kernel computed (so nothing before
            // the stores can be dropped as dead), but only where it is +inf, never
            // through a NaN or an lse of -inf: select(marker, marker + 1000, value > 1e30).
            s = replace_once(
                &s,
                "= elem(ss[(band + r) * LDS + j + e] * inv);",
                "= elem(select(f32(col) + 1.0, f32(col) + 1001.0, ss[(band + r) * LDS + j + e] * inv > 1e30));",
            )?;
            s = replace_once(
                &s,
                "= row_lse(row_max[rr], row_sum[rr]);",
                "= select(7.0, 1007.0, row_lse(row_max[rr], row_sum[rr]) > 1e30);",
            )?;
        }
        Ok((s, constants))
    }
}

fn replace_once(source: &str, from: &str, to: &str) -> Result<String> {
    match source.matches(from).count() {
        1 => Ok(source.replacen(from, to, 1)),
        n => Err(Error::invalid(
            COOP_PROBES_VAR,
            format!("flash_coop.wgsl has {n} copies of the line a probe edits ({from:?}), not one: update kernels::flash::coop_probes"),
        )),
    }
}

/// Every `override NAME: TYPE = DEFAULT;` as `const NAME: TYPE = VALUE;`, VALUE the
/// pipeline's constant where it sets one.
fn overrides_as_consts(source: &str, constants: &[(&'static str, u32)]) -> Result<String> {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let Some(rest) = line.trim_start().strip_prefix("override ") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let parsed = rest.split_once(':').and_then(|(name, tail)| {
            let (ty, default) = tail.split_once('=')?;
            let default = default.split(';').next()?;
            Some((name.trim(), ty.trim(), default.trim()))
        });
        let Some((name, ty, default)) = parsed else {
            return Err(Error::invalid(
                COOP_PROBES_VAR,
                format!("cannot read the override {line:?}"),
            ));
        };
        let value = match constants.iter().find(|(n, _)| *n == name) {
            None => default.to_string(),
            Some((_, v)) if ty == "bool" => (*v != 0).to_string(),
            Some((_, v)) => format!("{v}u"),
        };
        out.push_str(&format!("const {name}: {ty} = {value};\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::flash::CoopVariant;
    use crate::kernels::shader_source;
    use crate::tensor::DType;

    #[test]
    fn names_parse_and_unknown_ones_are_refused() {
        let p = CoopProbes::parse("zero-init, store-marker,zero-init").expect("parses");
        assert!(p.has(CoopProbe::ZeroInit) && p.has(CoopProbe::StoreMarker));
        assert_eq!(p.label(), "+zero-init+store-marker");
        assert!(CoopProbes::parse("").expect("empty").is_empty());
        let e = CoopProbes::parse("zero-init,nonsense").expect_err("unknown");
        assert!(
            e.to_string().contains("nonsense") && e.to_string().contains("tid-from-lanes"),
            "{e}"
        );
    }

    #[test]
    fn every_probe_edits_the_kernel_into_valid_wgsl() {
        let kernel = CoopVariant::new(64, 32, 32).kernel(32);
        let source = shader_source(&kernel, DType::F16);
        for probe in CoopProbe::ALL {
            let probes = CoopProbes(vec![probe]);
            let (edited, constants) = probes
                .edit(&source, &[("WORDS", 1)])
                .unwrap_or_else(|e| panic!("{}: {e}", probe.name()));
            // zero-init changes the pipeline's options, not its source.
            assert_eq!(edited == source, probe == CoopProbe::ZeroInit, "{}", probe.name());
            assert_eq!(
                constants.is_empty(),
                probe == CoopProbe::ConstOverrides,
                "{}",
                probe.name()
            );
            let module = naga::front::wgsl::parse_str(&edited).unwrap_or_else(|e| panic!("{}: {e}", probe.name()));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", probe.name()));
        }
        let all = CoopProbes(CoopProbe::ALL.to_vec());
        let (edited, _) = all.edit(&source, &[("WORDS", 0)]).expect("all at once");
        assert!(edited.contains("const WORDS: bool = false;") && !edited.contains("override "));
    }
}
