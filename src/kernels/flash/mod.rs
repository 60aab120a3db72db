//! The fused one-pass kernels and the registry of their tilings.
//!
//! Each tiling is declared once, in [`FUSED_TILINGS`]: its name, what it needs from the
//! adapter, the class of adapter it is picked for, its kernel variants and its
//! loop-iteration model. The picker ([`crate::Context::default_fused_tiling`]),
//! `info`, `bench`, `check`, the CLI's `--tiling`, `WGPU_ATTENTION_TILING` and the
//! tests all read this table (docs/design.md, "Kernel paths and tilings").
//!
//! Four rooms: `variants` (the WGSL kernels and their memory needs), `coop` (the
//! tensor-core variants, as data), `tilings` (the registry and picking) and `encode`
//! (recording a dispatch).

mod coop;
mod encode;
mod tilings;
mod variants;

pub use coop::*;
pub(crate) use encode::{encode, texel_mirror};
pub use tilings::*;
pub use variants::*;

/// The fused tilings' kernels (for [`super::every_kernel`]): `registers`, `shared` (run-time
/// and head-dim classes), `subgroup`, `blocked`, the tensor-core variants in every form
/// a table can pin (arrayed and named, one band and two, for 32-lane subgroups; two bands
/// of named fragments are retired, [`CoopVariant::valid_for`]) and `micro`'s variants.
pub fn kernels() -> Vec<super::Kernel> {
    let tilings = [
        REGISTERS,
        SHARED,
        SHARED_64,
        SHARED_128,
        SHARED_256,
        SHARED_128_WG,
        SHARED_256_WG,
        SUBGROUP_64,
        SUBGROUP_128,
        SUBGROUP_256,
        SUBGROUP_WIDE_64,
        SUBGROUP_WIDE_128,
        SUBGROUP_WIDE_256,
    ];
    let coop_forms = COOP_VARIANTS
        .iter()
        .flat_map(|v| [(v, 1, false), (v, 1, true), (v, 2, false)])
        .map(|(v, bands, named)| v.with_bands(bands).with_named(named).kernel(32));
    tilings
        .into_iter()
        .chain(BLOCKED.iter().flat_map(|b| [b.variant.kernel.clone(), b.words.clone()]))
        .chain(coop_forms)
        .chain(MICRO.iter().flat_map(|v| [v.kernel.clone(), v.words.clone()]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::gpu::Capabilities;
    use crate::kernels::policy::Policy;
    use crate::kernels::{flash_texel, loop_budget};
    use crate::options::FusedTiling;
    use crate::problem::AttentionShape;

    fn caps(subgroups: Option<(u32, u32)>, workgroup_bytes: u32) -> Capabilities {
        Capabilities::for_tests(subgroups, workgroup_bytes, None)
    }

    #[test]
    fn subgroup_key_blocks_follow_the_mesa_release() {
        let mut c = caps(Some((8, 8)), 32768);
        assert_eq!(crate::gpu::mesa_version("Mesa 22.3.6 (LLVM 15.0.6)"), Some((22, 3)));
        assert_eq!(
            crate::gpu::mesa_version("4.5 (Core Profile) Mesa 25.0.7-2~bpo12+1"),
            Some((25, 0))
        );
        assert_eq!(crate::gpu::mesa_version("NVIDIA 550.54"), None);
        assert_eq!(crate::gpu::mesa_version("Mesa x"), None);
        assert_eq!(subgroup_keys_per_block(&c), 16);
        c.mesa_version = Some((22, 3));
        assert_eq!(subgroup_keys_per_block(&c), 32);
        let launch = (spec(FusedTiling::Subgroup).expect("registered").launch)(64, 64, &c, &Policy::default());
        assert_eq!(launch.kernel, SUBGROUP_WIDE_64);
        c.mesa_version = Some((25, 0));
        assert_eq!(subgroup_keys_per_block(&c), 16);
        let launch = (spec(FusedTiling::Subgroup).expect("registered").launch)(200, 64, &c, &Policy::default());
        assert_eq!(launch.kernel, SUBGROUP_256);
    }

    #[test]
    fn blocks_of_16_keys_bound_the_subgroup_model_past_the_shortest_ranges() {
        // The model takes the larger count of the two block sizes; past 32 keys it is
        // the 16-key one, so picking 32 on Mesa 22 never shortens its dispatches.
        for d in [8, 64, 128, 256] {
            for lk in (32..2000).step_by(7) {
                let s = AttentionShape::new(1, 1, 1, 1, lk, d, d);
                let (k16, k32) = (
                    loop_budget::subgroup_iterations_per(&s, 16),
                    loop_budget::subgroup_iterations_per(&s, 32),
                );
                assert!(k16 >= k32, "D {d}, {lk} keys: {k16} < {k32}");
                let texel = flash_texel::iterations(lk as u64);
                let both = if d <= 128 { k16.max(texel) } else { k16 };
                assert_eq!(loop_budget::subgroup_iterations(&s), both);
                // Head dims the texel kernel never serves keep the buffer kernel's model.
                let odd = AttentionShape::new(1, 1, 1, 1, lk, d + 2, d + 2);
                assert_eq!(
                    loop_budget::subgroup_iterations(&odd),
                    loop_budget::subgroup_iterations_per(&odd, 16)
                );
            }
        }
    }

    /// Tensor cores: the 16x16x16 f16 -> f32 configuration the coop kernels need.
    fn with_tensor_cores(mut caps: Capabilities) -> Capabilities {
        caps.cooperative_matrix = vec![crate::gpu::CoopConfig {
            m: 16,
            n: 16,
            k: 16,
            ab: "f16",
            c: "f32",
        }];
        caps
    }

    #[test]
    fn picker_chooses_gpu_tilings_for_gpus_and_cpu_tilings_for_cpu_adapters() {
        // An NVIDIA H100 through Vulkan without tensor cores enabled: 48 KiB, subgroups of 32.
        let h100 = caps(Some((32, 32)), 48 * 1024);
        assert_eq!(default_tiling(AdapterClass::Gpu, &h100, true), FusedTiling::Shared);
        // With them: tensor cores where f16 products are allowed, else exact f32.
        let h100_coop = with_tensor_cores(h100);
        assert_eq!(default_tiling(AdapterClass::Gpu, &h100_coop, true), FusedTiling::Coop);
        assert_eq!(
            default_tiling(AdapterClass::Gpu, &h100_coop, false),
            FusedTiling::Shared
        );
        // Tensor cores but no fixed subgroup size (the kernel's SG): not coop.
        let varying = with_tensor_cores(caps(Some((32, 64)), 64 * 1024));
        assert_eq!(default_tiling(AdapterClass::Gpu, &varying, true), FusedTiling::Shared);
        // A GPU at WebGPU's default 16 KiB: shared too.
        let webgpu = caps(Some((4, 128)), 16 * 1024);
        assert_eq!(default_tiling(AdapterClass::Gpu, &webgpu, true), FusedTiling::Shared);
        // Less than that: registers, which runs anywhere.
        assert_eq!(
            default_tiling(AdapterClass::Gpu, &caps(None, 8192), true),
            FusedTiling::Registers
        );
        // lavapipe: 32 KiB, subgroups of 8.
        let lavapipe = caps(Some((8, 8)), 32 * 1024);
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &lavapipe, true),
            FusedTiling::Subgroup
        );
        // llvmpipe GL and SwiftShader: no subgroups, 32 KiB.
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &caps(None, 32 * 1024), true),
            FusedTiling::Blocked
        );
        // SwiftShader in a browser: shared.
        assert_eq!(
            default_tiling(AdapterClass::BrowserCpu, &caps(None, 32 * 1024), true),
            FusedTiling::Shared
        );
        // A CPU adapter with less workgroup memory than blocked needs: registers.
        assert_eq!(
            default_tiling(AdapterClass::Cpu, &caps(None, 16 * 1024), true),
            FusedTiling::Registers
        );
    }

    #[test]
    fn coop_says_which_need_is_missing() {
        let spec = spec(FusedTiling::Coop).expect("registered");
        let plain = caps(Some((32, 32)), 48 * 1024);
        assert!(matches!(spec.unmet("gpu", &plain), Some(Error::MissingFeature { .. })));
        let small = with_tensor_cores(caps(Some((32, 32)), 16 * 1024));
        assert!(matches!(spec.unmet("gpu", &small), Some(Error::LimitExceeded { .. })));
        let wide = with_tensor_cores(caps(Some((128, 128)), 48 * 1024));
        assert!(matches!(spec.unmet("gpu", &wide), Some(Error::LimitExceeded { .. })));
        assert!(spec.unmet("gpu", &with_tensor_cores(plain)).is_none());
    }

    /// The largest of the smallest variant of each head-dim class.
    fn min_bytes(variants: &[BlockVariant]) -> u32 {
        let mut classes: Vec<u32> = variants.iter().map(|v| v.dmax).collect();
        classes.dedup();
        classes
            .iter()
            .map(|&d| {
                variants
                    .iter()
                    .filter(|v| v.dmax == d)
                    .map(|v| v.workgroup_bytes)
                    .min()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether the workgroup-memory accesses of one instruction are free of bank
    /// conflicts, on the usual model (32 banks of 4 bytes; 4-byte accesses served a
    /// warp of 32 invocations at a time, 16-byte ones 8 at a time): within each such
    /// group, distinct addresses use distinct banks (equal ones are a broadcast).
    /// `address` gives an invocation's byte offset, `None` where it makes no access.
    fn conflict_free(bytes: u32, address: impl Fn(u32) -> Option<u32>) -> bool {
        let group = if bytes == 16 { 8 } else { 32 };
        (0..128).step_by(group).all(|first| {
            let mut seen: Vec<u32> = (first..first + group as u32).filter_map(&address).collect();
            seen.sort_unstable();
            seen.dedup();
            let mut banks: Vec<u32> = seen
                .iter()
                .flat_map(|a| (0..bytes / 4).map(move |w| (a / 4 + w) % 32))
                .collect();
            let all = banks.len();
            banks.sort_unstable();
            banks.dedup();
            banks.len() == all
        })
    }

    #[test]
    fn blocked_workgroup_accesses_are_free_of_bank_conflicts() {
        for v in BLOCKED {
            let (dmax, br, bc) = (v.variant.dmax, v.variant.br, v.variant.bc);
            let d4 = dmax / 4;
            let (qs, ks) = (d4 + 1, d4 + 1);
            let vs = if v.split { d4 } else { ks };
            let tcs = bc / 4;
            let (mrs, mro, oc) = (v.mrs, v.mro, d4 / 8);
            let ns = br / mrs * tcs;
            let no = br / mro * 8;
            let name = v.variant.kernel.variant;
            let check = |what: &str, bytes: u32, address: &dyn Fn(u32) -> Option<u32>| {
                assert!(conflict_free(bytes, address), "{name}: {what}");
            };
            let scorer = |tid: u32| (tid < ns).then_some((tid / tcs, tid % tcs));
            for r in 0..mrs {
                let row = |trs: u32| trs * mrs + r;
                for t in 0..d4 {
                    check("Q read", 16, &|tid| scorer(tid).map(|(a, _)| 16 * (row(a) * qs + t)));
                    for c in 0..4 {
                        check("K read", 16, &|tid| {
                            scorer(tid).map(|(_, b)| 16 * ((c * tcs + b) * ks + t))
                        });
                    }
                }
                check("pmax write", 4, &|tid| {
                    scorer(tid).map(|(a, b)| 4 * (row(a) * v.pms + b))
                });
                for i in 0..tcs {
                    check("pmax read", 4, &|tid| {
                        scorer(tid).map(|(a, _)| 4 * (row(a) * v.pms + i))
                    });
                }
                check("probs write", 16, &|tid| {
                    scorer(tid).map(|(a, b)| 16 * (row(a) * v.ps + b))
                });
                check("alpha write", 4, &|tid| {
                    scorer(tid).and_then(|(a, b)| (b == 0).then_some(4 * row(a)))
                });
            }
            let row = |tid: u32, r: u32| (tid < no).then_some((tid / 8) * mro + r);
            for r in 0..mro {
                check("alpha read", 4, &|tid| row(tid, r).map(|row| 4 * row));
                for i in 0..tcs {
                    check("probs read", 16, &|tid| row(tid, r).map(|row| 16 * (row * v.ps + i)));
                    check("sum read", 4, &|tid| row(tid, r).map(|row| 4 * (row * v.pms + i)));
                }
            }
            for j in 0..bc {
                for u in 0..oc {
                    check("V read", 16, &|tid| {
                        (tid < no).then_some(16 * (j * vs + tid % 8 + 8 * u))
                    });
                }
            }
            for i in 0..(br * d4).div_ceil(128) {
                check("Q store", 16, &|tid| {
                    let x = tid + 128 * i;
                    (x < br * d4).then_some(16 * (x / d4 * qs + x % d4))
                });
            }
            for i in 0..bc * d4 / 128 {
                let x = |tid: u32| tid + 128 * i;
                check("K store", 16, &|tid| {
                    let j = x(tid) / d4;
                    Some(16 * (((j % 4) * tcs + j / 4) * ks + x(tid) % d4))
                });
                check("V store", 16, &|tid| Some(16 * (x(tid) / d4 * vs + x(tid) % d4)));
            }
        }
    }

    #[test]
    fn blocked_variants_tile_their_work_evenly() {
        // At most 128 invocations score (whole rows of 4-key quads) and at most 128
        // accumulate (8 per row, whole value vec4 columns); staging shares are whole.
        for v in BLOCKED {
            let (dmax, br, bc) = (v.variant.dmax, v.variant.br, v.variant.bc);
            assert!(bc % 4 == 0 && br % v.mrs == 0 && br / v.mrs * bc / 4 <= 128, "{v:?}");
            assert!(br % v.mro == 0 && br / v.mro * 8 <= 128, "{v:?}");
            assert!(
                (dmax / 4) % 8 == 0 && (bc * dmax / 4) % 128 == 0 && v.ps >= bc / 4,
                "{v:?}"
            );
            assert_eq!(v.variant.kernel.variant, v.words.variant.replace(" words", "").as_str());
            assert_eq!(blocked_words(&v.variant.kernel), Some(v.words));
        }
        assert_eq!(blocked_words(&REGISTERS), None);
    }

    #[test]
    fn block_tilings_need_exactly_what_their_widest_class_takes() {
        assert_eq!(BLOCKED_MIN_BYTES, min_bytes(&*BLOCKED_VARIANTS));
        // Every head dim up to 256 finds a variant at that budget; the wide D <= 64 one
        // only with 48 KiB.
        for d in [1, 8, 63, 64, 65, 128, 129, 256] {
            let v = blocked_for(d, d, BLOCKED_MIN_BYTES).map(|v| v.dmax);
            assert!(v.is_some_and(|dmax| dmax >= d), "D = {d}: {v:?}");
        }
        assert_eq!(blocked_for(64, 64, 48 * 1024).map(|v| v.bc), Some(32));
        assert_eq!(blocked_for(64, 64, 32 * 1024).map(|v| v.bc), Some(16));
        assert_eq!(blocked_for(32, 32, 32 * 1024).map(|v| v.br), Some(64));
        assert!(blocked_for(257, 1, u32::MAX).is_none());
    }

    #[test]
    fn coop_variants_fit_their_budgets_and_hold_together() {
        let smallest = |dmax: u32| {
            COOP_VARIANTS
                .iter()
                .filter(|v| v.dmax == dmax)
                .map(|v| v.workgroup_bytes())
                .min()
                .unwrap_or(0)
        };
        assert_eq!(
            COOP_MIN_BYTES,
            [64, 128, 256].map(smallest).into_iter().max().unwrap_or(0)
        );
        for d in [1, 8, 63, 64, 65, 128, 129, 256] {
            let v = coop_for(d, d, COOP_MIN_BYTES).map(|v| v.dmax);
            assert!(v.is_some_and(|dmax| dmax >= d), "coop, D = {d}: {v:?}");
            // The 48 KiB pick of every class is one NVIDIA's limit holds.
            let wide = coop_for(d, d, 48 * 1024).expect("a variant");
            assert!(
                wide.workgroup_bytes() <= 48 * 1024 && wide.workgroup_bytes() > 32 * 1024,
                "{wide:?}"
            );
        }
        assert!(coop_for(1, 257, u32::MAX).is_none());
        // One 16-row band per subgroup, at most 4 subgroups; whole 16-key chunks; Q
        // staged through the K/V tile; valid for 8- (lavapipe), 16-, 32- and 64-lane
        // subgroups.
        for v in COOP_VARIANTS {
            assert!(v.br / 16 <= 4, "{v:?}");
            for sg in [8, 16, 32, 64] {
                assert!(v.valid_for(sg), "{v:?} at {sg} lanes");
            }
            assert_eq!(CoopVariant::parse(&v.label()), Some(v));
            let named = v.with_named(true);
            assert_eq!(CoopVariant::parse(&named.label()), Some(named));
            let small = v.shrunk_to(32 * 1024).expect("an emulatable form");
            assert!(
                small.workgroup_bytes() <= 32 * 1024 && small.bc == v.bc && small.valid_for(8),
                "{small:?}"
            );
        }
        assert!(!CoopVariant::new(128, 96, 32).valid_for(32), "BR > 2 BC");
        assert!(!CoopVariant::new(128, 64, 40).valid_for(32), "BC not whole chunks");
        assert_eq!(CoopVariant::parse("128x64"), None);
        assert_eq!(CoopVariant::parse("128x64x32x1"), None);
        // Kernels are built once per variant and subgroup size, their generated
        // constants first in the source.
        let a = COOP_VARIANTS[0].kernel(32);
        assert_eq!(a, COOP_VARIANTS[0].kernel(32));
        assert_ne!(a.variant, COOP_VARIANTS[0].kernel(8).variant);
        assert_ne!(a.variant, COOP_VARIANTS[0].with_named(true).kernel(32).variant);
        assert!(a
            .source
            .to_string()
            .contains("const SG: u32 = 32u;\nconst LPR: u32 = 2u;\nconst RPL: u32 = 1u;"));
        assert!(COOP_VARIANTS[0]
            .kernel(8)
            .source
            .to_string()
            .contains("const LPR: u32 = 1u;\nconst RPL: u32 = 2u;"));
    }

    #[test]
    fn head_dim_256_variants_split_their_bands_or_keep_q_in_workgroup_memory() {
        // 256x64x32: two subgroups per band, 256 invocations, 4 lanes per row at 32.
        let split = CoopVariant::new(256, 64, 32);
        assert_eq!((split.split, split.qr, split.label()), (2, 0, "256x64x32".to_string()));
        assert_eq!(split.invocations(32), 256);
        assert_eq!(split.workgroup_bytes(), 48_144);
        assert!(split.valid_for(32) && split.valid_for(8));
        let prelude = split.kernel(32).source.to_string();
        assert!(prelude
            .contains("const LPR: u32 = 4u;\nconst RPL: u32 = 1u;\nconst BANDS: u32 = 1u;\nconst SPLIT: u32 = 2u;\n"));
        assert!(split
            .kernel(8)
            .source
            .to_string()
            .contains("const LPR: u32 = 1u;\nconst RPL: u32 = 1u;"));
        // Its form on lavapipe's 32 KiB keeps the split (and so names it).
        let small = split.shrunk_to(32 * 1024).expect("fits");
        assert_eq!(
            (small.dmax, small.split, small.label()),
            (128, 2, "128x64x32s2".to_string())
        );
        assert_eq!(CoopVariant::parse("128x64x32s2"), Some(small));
        assert_eq!(CoopVariant::parse("256x64x32s1"), Some(split.with_split(1)));
        // A split needs an even number of key chunks that divides the head dims' chunks.
        assert!(!CoopVariant::new(128, 64, 48).with_split(2).valid_for(32));
        assert!(!CoopVariant::new(256, 64, 32).with_split(3).valid_for(32));
        // 256x32x16: 8 of Q's 16 chunks in `qs`, passes through `ss` rotating.
        let qr = CoopVariant::new(256, 32, 16);
        assert_eq!((qr.split, qr.qr, qr.label()), (1, 8, "256x32x16".to_string()));
        assert_eq!(qr.workgroup_bytes(), 21_008 + 2 * 32 * (8 * 16 + 8));
        assert!(qr.workgroup_bytes() <= COOP_MIN_BYTES);
        assert_eq!(CoopVariant::parse("256x32x16q6").map(|v| v.qr), Some(6));
        assert_eq!(
            CoopVariant::parse("256x32x16q0").map(|v| v.label()),
            Some("256x32x16q0".to_string())
        );
        let source = qr.kernel(32).source;
        assert!(source.contains("var<workgroup> qs: array<f16, BR * LDH>;"));
        assert!(source.contains("var qf: array<coop_mat16x16<f16, A>, QK*BANDS>;"));
        // Rotating: `o` indexed by constants only, also in the arrayed form.
        assert!(source.contains("o[0u * OH + 14u] = o[0u * OH + 14u + KH];"));
        assert!(!source.contains("o[0u * OH + g * KH + u]"));
        assert!(!CoopVariant::new(128, 64, 32)
            .kernel(32)
            .source
            .contains("var<workgroup> qs"));
    }

    #[test]
    fn named_coop_variants_name_every_fragment_and_unroll_every_loop_over_them() {
        // 128x64x48: 8 Q fragments and 8 output tiles, which go through `ss` in groups of
        // 3 (the last of 2).
        let v = CoopVariant::new(128, 64, 48);
        let arrayed = v.kernel(32).source;
        let named = v.with_named(true).kernel(32).source;
        assert!(arrayed.contains("var qf: array<coop_mat16x16<f16, A>, QK*BANDS>;"));
        // One band: its per-band fragments are single values, as before the band axis.
        assert!(arrayed.contains("o[0u * OH + g * KH + u]"));
        assert!(arrayed.contains("var pf_0: coop_mat16x16<f16, A>;") && arrayed.contains("var s_0:"));
        let two_arrayed = v.with_bands(2).kernel(32).source;
        assert!(two_arrayed.contains("var pf: array<coop_mat16x16<f16, A>, BANDS>;"));
        assert!(two_arrayed.contains("o[bb * OH + g * KH + u]"));
        for k in 0..8 {
            assert!(named.contains(&format!("var qf_{k}: coop_mat16x16<f16, A>;")), "qf_{k}");
            assert!(named.contains(&format!("var o_{k}: coop_mat16x16<f32, C>;")), "o_{k}");
        }
        assert!(!named.contains("qf_8") && !named.contains("o_8"));
        assert!(!named.contains("qf[") && !named.contains("o[") && !named.contains("@{"));
        assert!(!named.contains("//@") && !arrayed.contains("//@"));
        // Every output tile is stored in the normalisation, each once.
        for k in 0..8 {
            assert_eq!(
                named.matches(&format!("coopStoreT(o_{k},")).count(),
                2,
                "o_{k}: rescale and store"
            );
        }
        // Two bands of named fragments are retired (CoopVariant::valid_for): the label
        // still parses, but no pin or table takes it.
        let two = v.with_bands(2).with_named(true);
        assert_eq!(two.label(), "128x64x48r32n");
        assert_eq!(CoopVariant::parse("128x64x48r32n"), Some(two));
        assert_eq!(CoopVariant::parse_valid("128x64x48r32n"), None);
        assert!(CoopVariant::parse_valid("128x64x48r32").is_some());
        assert_eq!(CoopVariant::parse("128x64x48r20"), None);
        assert_eq!(v.with_bands(2).invocations(32), 64);
    }
}
