//! The `subgroup` tiling's texel kernel (`shaders/flash_texel.wgsl`, whose opening
//! comment explains the tiling): K and V read as texel fetches from a texel mirror
//! (`kernels::kv_texels`), query rows as workgroup-uniform quads, keys across the 8
//! lanes. Its entry point is written out here, per variant, with every loop over rows,
//! head-dim words and keys of a block unrolled: llvmpipe turns a dynamically indexed
//! private array into a ladder of branches, so each row's Q slice, scores and
//! accumulator is a named value. On lavapipe it ran (1,8,2048,64) f32 1.3-1.7x faster
//! than the buffer kernel (docs/design.md, "Kernel paths and tilings").
//!
//! It serves problems whose K and V rows are whole 16-byte words (head dims and
//! strides multiples of 4 f32 or 8 f16 elements) and whose head dims fit a variant;
//! [`variant_for`] says which, and the buffer kernel takes the rest.

use super::{Kernel, Slot, COMMON, TEXEL_WORDS};
use crate::gpu::Capabilities;
use crate::gpu::Text;
use crate::tensor::DType;
use std::fmt::Write;
use std::sync::OnceLock;

const HELPERS: &str = include_str!("../../shaders/flash_texel.wgsl");

/// The bindings the entry point uses.
pub const SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::Q,
    Slot::Output,
    Slot::Mask,
    Slot::SideWords,
    Slot::Lse,
    Slot::KTexels,
    Slot::VTexels,
];

/// Lanes of the subgroup (the workgroup) that share a block of keys.
const LANES: u32 = 8;

/// One generated kernel: `rows` query rows per workgroup, Q·Kᵀ over `groups` groups of
/// 8 words (the head dims it holds: `groups` x 8 x 4 f32, or x 8 f16), keys in blocks
/// of 8 x `keys_per_lane`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TexelVariant {
    pub name: &'static str,
    pub rows: u32,
    pub groups: u32,
    pub keys_per_lane: u32,
    pub dtype: DType,
}

/// Every variant, with the source cache slot of each at the same index.
///
/// Rows per workgroup trade K/V fetches (fewer per multiply-add with more rows)
/// against live values (each row's Q slice and accumulator); the picks were measured
/// on lavapipe (docs/design.md): Mesa 22.3 runs 32 rows fastest at D 64 and 16 at D
/// 128; Mesa 25 compiles the 32-row kernel for 15 s cold and gets 16 rows (4 keys a
/// lane ran 1.1x faster there but compiled for 12-15 s). At D 128 on Mesa 25 the
/// 16-row kernel ran 1.15x faster than the buffer kernel but compiled for 15.6 s cold;
/// the buffer kernel compiles in 3 s.
pub const VARIANTS: [TexelVariant; 6] = [
    TexelVariant {
        name: "[32 rows, D 64]",
        rows: 32,
        groups: 2,
        keys_per_lane: 2,
        dtype: DType::F32,
    },
    TexelVariant {
        name: "[16 rows, D 64]",
        rows: 16,
        groups: 2,
        keys_per_lane: 2,
        dtype: DType::F32,
    },
    TexelVariant {
        name: "[16 rows, D 128]",
        rows: 16,
        groups: 4,
        keys_per_lane: 2,
        dtype: DType::F32,
    },
    TexelVariant {
        name: "[32 rows, D 64]",
        rows: 32,
        groups: 1,
        keys_per_lane: 2,
        dtype: DType::F16,
    },
    TexelVariant {
        name: "[16 rows, D 64]",
        rows: 16,
        groups: 1,
        keys_per_lane: 2,
        dtype: DType::F16,
    },
    TexelVariant {
        name: "[16 rows, D 128]",
        rows: 16,
        groups: 2,
        keys_per_lane: 2,
        dtype: DType::F16,
    },
];

static SOURCES: [OnceLock<Text>; 6] = [const { OnceLock::new() }; 6];

impl TexelVariant {
    /// Elements of one 16-byte word.
    pub fn word_elems(self) -> u32 {
        match self.dtype {
            DType::F32 => 4,
            DType::F16 => 8,
        }
    }

    /// The largest head dim (D and Dv) it holds.
    pub fn max_dim(self) -> u32 {
        self.groups * LANES * self.word_elems()
    }

    /// Keys per block.
    pub fn block_keys(self) -> u32 {
        LANES * self.keys_per_lane
    }

    pub fn kernel(self) -> Kernel {
        let index = VARIANTS.iter().position(|v| *v == self).expect("a listed variant");
        Kernel {
            file: "flash_texel.wgsl",
            source: SOURCES[index].get_or_init(|| Text::from(entry_point(self))).clone(),
            entry: "flash_texel",
            slots: SLOTS,
            preludes: &[COMMON, TEXEL_WORDS, HELPERS],
            variant: Text::Static(self.name),
        }
    }
}

/// The variant for a problem, or `None` where the buffer kernel serves it. `strides`
/// are K's and V's (in elements) that must be whole words for every row to start on
/// one: batch, head, row and page strides. `None` for head dims
/// and strides not whole words, head dims past 128, and off Mesa 22 head dims past 64
/// or problems with the rules beyond key ranges (`full_rules`: explicit masks,
/// soft-capping, ALiBi), whose pipelines Mesa 25 compiles cold for over 10 s.
pub fn variant_for(
    dtype: DType,
    (d, dv): (u32, u32),
    strides: &[u32],
    full_rules: bool,
    caps: &Capabilities,
) -> Option<TexelVariant> {
    if !whole_words(dtype, (d, dv), strides) {
        return None;
    }
    let mesa_22 = matches!(caps.mesa_version, Some((major, _)) if major <= 22);
    let need = d.max(dv);
    let pick = |rows: u32, keys: u32, max_dim: u32| {
        VARIANTS
            .iter()
            .copied()
            .find(|v| v.dtype == dtype && v.rows == rows && v.keys_per_lane == keys && v.max_dim() == max_dim)
    };
    match (need, mesa_22) {
        (0..=64, true) => pick(32, 2, 64),
        (0..=64, false) if !full_rules => pick(16, 2, 64),
        (65..=128, true) => pick(16, 2, 128),
        _ => None,
    }
}

/// Whether head dims and strides (in elements) of `dtype` are whole 16-byte words, so
/// that every row a texel kernel reads starts on a word of its mirror.
pub(crate) fn whole_words(dtype: DType, (d, dv): (u32, u32), strides: &[u32]) -> bool {
    let word = 16 / dtype.size() as u32;
    d.is_multiple_of(word) && dv.is_multiple_of(word) && strides.iter().all(|s| s.is_multiple_of(word))
}

/// Whether some dtype and driver could give head dims (D, Dv) the texel kernel (whole
/// f32 words and at most 128), for the loop model, which knows neither.
pub fn may_serve(d: u32, dv: u32) -> bool {
    d.is_multiple_of(4) && dv.is_multiple_of(4) && d.max(dv) <= 128
}

/// Worst-case loop iterations of one invocation over all variants: per block of 16 or
/// more keys the block loop's trip and the masking loop over quads x keys per lane
/// (at most 16 + 1), plus the block loop's exit. Nothing else loops.
pub fn iterations(len_k: u64) -> u64 {
    1 + len_k.div_ceil(16) * 18
}

/// The `flash_texel` entry point of a variant.
fn entry_point(v: TexelVariant) -> String {
    let quads = v.rows / 4;
    let keys = v.keys_per_lane;
    let words = v.groups * LANES; // words of a K row the kernel reads
    let elems = v.word_elems(); // Q elements per word and lane
    let halves = elems / 4; // vec4s per word
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "// Generated by src/kernels/flash_texel.rs: {} rows, {} words of Q·Kᵀ, {} keys a lane.",
        v.rows, words, keys
    );
    let _ = writeln!(
        w,
        "var<workgroup> mask_scratch: array<vec4<f32>, {}>;",
        quads * keys * LANES
    );
    let _ = writeln!(w, "@compute @workgroup_size({LANES}, 1, 1)");
    let _ = writeln!(
        w,
        "fn flash_texel(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {{"
    );
    write_query_head(w, v.rows);
    let _ = writeln!(w, "    // Words of a K row (the host guarantees whole words).");
    let _ = writeln!(w, "    let k_words = p.head_dim / (4u * ELEMS_PER_WORD);");
    // Per quad: its rows (clamped), visible key ranges, Q slices and running state.
    for c in 0..quads {
        write_quad_rows(w, c);
        for g in 0..v.groups {
            for i in 0..elems {
                let _ = writeln!(
                    w,
                    "    let q_{c}_{g}_{i} = q_quad(q_rows_{c}, {});",
                    lane_element(g, elems, i)
                );
            }
        }
        let _ = writeln!(w, "    var m_{c} = resumed_quad_max(hd, rows_{c});");
        let _ = writeln!(w, "    var l_{c} = resumed_quad_sum(m_{c}, lane);");
        for r in 0..4 {
            let _ = writeln!(w, "    let out_{c}_{r} = o_head + rows_{c}[{r}] * p.o_stride_s;");
            for ch in 0..v.groups {
                for h in 0..halves {
                    let _ = writeln!(
                        w,
                        "    var o_{ch}_{c}_{r}_{h} = resumed_out(out_{c}_{r}, !is_neg_inf(m_{c}[{r}]), {});",
                        lane_element(ch, elems, 4 * h)
                    );
                }
            }
        }
    }
    let _ = writeln!(
        w,
        "    // Uniform across the workgroup: from its first row's first key to the last key its"
    );
    let _ = writeln!(w, "    // last row sees.");
    let _ = writeln!(w, "    let block_begin = block_key_begin(hd.b, min(row0, last_q));");
    let _ = writeln!(
        w,
        "    let block_end = min(key_end(hd.b, min(row0 + {}u, last_q)), p.key_stop);",
        v.rows - 1
    );
    let _ = writeln!(
        w,
        "    for (var j0 = block_begin; j0 < block_end; j0 += {}u) {{",
        v.block_keys()
    );
    for k in 0..keys {
        let _ = writeln!(
            w,
            "        let k_row_{k} = row_word(true, hd.b, k_base, j0 + {}u + lane);",
            k * LANES
        );
        let _ = writeln!(
            w,
            "        let v_row_{k} = row_word(false, hd.b, v_base, j0 + {}u + lane);",
            k * LANES
        );
        for c in 0..quads {
            let _ = writeln!(w, "        var s_{c}_{k} = vec4<f32>(0.0);");
        }
    }
    // Q·Kᵀ, word by word: word t of every lane's keys against the quad's Q elements of
    // word t, held by lane t % 8 of group t / 8.
    for t in 0..words {
        let (g, from) = (t / LANES, t % LANES);
        let _ = writeln!(w, "        {{");
        let _ = writeln!(w, "            let keep = {t}u < k_words;");
        for k in 0..keys {
            let _ = writeln!(w, "            let kw_{k} = k_word(k_row_{k} + {t}u);");
            let _ = write_word_halves(w, &format!("kx_{k}"), &format!("kw_{k}"), "keep", halves);
        }
        for c in 0..quads {
            for i in 0..elems {
                let _ = writeln!(
                    w,
                    "            let b_{c}_{i} = subgroupBroadcast(q_{c}_{g}_{i}, {from}u);"
                );
                for k in 0..keys {
                    let _ = writeln!(
                        w,
                        "            s_{c}_{k} = fma(b_{c}_{i}, vec4<f32>(kx_{k}_{}[{}]), s_{c}_{k});",
                        i / 4,
                        i % 4
                    );
                }
            }
        }
        let _ = writeln!(w, "        }}");
    }
    // Masks. Visible key ranges (causal, window, key lengths) without a branch; the
    // other rules (explicit masks, soft-capping, ALiBi) only in pipelines made for them
    // (FULL_RULES), in a loop over (quad, key) pairs, so that they are compiled once.
    // The scores go through workgroup memory for that loop, each lane its own slots:
    // a private array indexed by the loop would be a ladder of branches. Any rarely
    // taken branch here slowed the whole kernel on Mesa 22.3 (1.2-1.3x), hence the
    // override.
    for k in 0..keys {
        let _ = writeln!(w, "        let keys_{k} = vec4<u32>(j0 + {}u + lane);", k * LANES);
        for c in 0..quads {
            let _ = writeln!(w, "        s_{c}_{k} = select(vec4<f32>(neg_inf()), s_{c}_{k}, in_key_range(keys_{k}, starts_{c}, ends_{c}));");
        }
    }
    let _ = writeln!(w, "        if FULL_RULES != 0u {{");
    let pairs = quads * keys;
    // Pair (quad c, key k) sits in slot (k * quads + c) * 8 + lane, as the loop reads it.
    let slots = |w: &mut String, line: &dyn Fn(u32, u32, u32) -> String| {
        for k in 0..keys {
            for c in 0..quads {
                let _ = writeln!(w, "            {}", line((k * quads + c) * LANES, c, k));
            }
        }
    };
    slots(w, &|slot, c, k| format!("mask_scratch[{slot}u + lane] = s_{c}_{k};"));
    let _ = writeln!(w, "            for (var x = 0u; x < {pairs}u; x++) {{");
    let _ = writeln!(w, "                mask_scratch[x * {LANES}u + lane] = mask_pair(hd, row0 + x % {quads}u * 4u, j0 + x / {quads}u * {LANES}u + lane, mask_scratch[x * {LANES}u + lane]);");
    let _ = writeln!(w, "            }}");
    slots(w, &|slot, c, k| format!("s_{c}_{k} = mask_scratch[{slot}u + lane];"));
    let _ = writeln!(w, "        }}");
    // One online-softmax step per quad.
    for c in 0..quads {
        let block_max = (1..keys).fold(format!("s_{c}_0"), |acc, k| format!("max({acc}, s_{c}_{k})"));
        let _ = writeln!(w, "        let m_new_{c} = max(m_{c}, subgroupMax({block_max}));");
        let _ = writeln!(w, "        let alpha_{c} = softmax_rescale(m_{c}, m_new_{c});");
        let _ = writeln!(w, "        m_{c} = m_new_{c};");
        for k in 0..keys {
            let _ = writeln!(w, "        let p_{c}_{k} = softmax_probs(s_{c}_{k}, m_new_{c});");
        }
        let sum = (0..keys).map(|k| format!("p_{c}_{k}")).collect::<Vec<_>>().join(" + ");
        let _ = writeln!(w, "        l_{c} = l_{c} * alpha_{c} + ({sum});");
    }
    // P·V: every key of the block, its V row offset from the lane that scored it.
    for k in 0..keys {
        for x in 0..LANES {
            let _ = writeln!(w, "        let vr_{k}_{x} = subgroupBroadcast(v_row_{k}, {x}u);");
        }
    }
    for ch in 0..v.groups {
        let _ = writeln!(w, "        {{");
        for k in 0..keys {
            for x in 0..LANES {
                let _ = writeln!(
                    w,
                    "            let vw_{k}_{x} = v_word(vr_{k}_{x} + {}u + lane);",
                    ch * LANES
                );
                let _ = write_word_halves(w, &format!("vx_{k}_{x}"), &format!("vw_{k}_{x}"), "true", halves);
            }
        }
        for c in 0..quads {
            for r in 0..4 {
                for h in 0..halves {
                    let _ = writeln!(w, "            o_{ch}_{c}_{r}_{h} *= alpha_{c}[{r}];");
                }
            }
            for k in 0..keys {
                for x in 0..LANES {
                    let _ = writeln!(
                        w,
                        "            let pb_{c}_{k}_{x} = subgroupBroadcast(p_{c}_{k}, {x}u);"
                    );
                    for r in 0..4 {
                        for h in 0..halves {
                            let _ = writeln!(
                                w,
                                "            o_{ch}_{c}_{r}_{h} = fma(vec4<f32>(pb_{c}_{k}_{x}[{r}]), vx_{k}_{x}_{h}, o_{ch}_{c}_{r}_{h});"
                            );
                        }
                    }
                }
            }
        }
        let _ = writeln!(w, "        }}");
    }
    let _ = writeln!(w, "    }}");
    // Normalise and store; rows that saw no key get zeros and lse = -inf.
    for c in 0..quads {
        let _ = writeln!(w, "    let sum_{c} = subgroupAdd(l_{c});");
        let _ = writeln!(w, "    let inv_{c} = vec4<f32>(row_inv_sum(sum_{c}.x), row_inv_sum(sum_{c}.y), row_inv_sum(sum_{c}.z), row_inv_sum(sum_{c}.w));");
        for r in 0..4 {
            let _ = writeln!(w, "    if row0 + {}u < p.len_q {{", 4 * c + r);
            for ch in 0..v.groups {
                for h in 0..halves {
                    let _ = writeln!(
                        w,
                        "        store_out(out_{c}_{r}, {}, o_{ch}_{c}_{r}_{h} * inv_{c}[{r}]);",
                        lane_element(ch, elems, 4 * h)
                    );
                }
            }
            let _ = writeln!(w, "        if lane == 0u {{");
            let _ = writeln!(
                w,
                "            lse[(hd.b * p.heads_q + hd.h) * p.len_q + row0 + {}u] = row_lse(m_{c}[{r}], sum_{c}[{r}]);",
                4 * c + r
            );
            let _ = writeln!(w, "        }}");
            let _ = writeln!(w, "    }}");
        }
    }
    let _ = writeln!(w, "}}");
    s
}

/// The opening lines of an entry point that owns `rows` query rows of one (batch,
/// head) from row0: the head, the lane, the first row, and the offsets of the head in
/// Q and the output and of its kv head in K and V.
fn write_query_head(w: &mut String, rows: u32) {
    let _ = writeln!(w, "    let hd = head_of(p.bh_start + wid.y);");
    let _ = writeln!(w, "    let lane = sg_lane % {LANES}u;");
    let _ = writeln!(w, "    let row0 = wid.x * {rows}u;");
    let _ = writeln!(w, "    let last_q = p.len_q - 1u;");
    let _ = writeln!(w, "    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;");
    let _ = writeln!(w, "    let o_head = hd.b * p.o_stride_b + hd.h * p.o_stride_h;");
    let _ = writeln!(w, "    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;");
    let _ = writeln!(w, "    let v_base = hd.b * p.v_stride_b + hd.hk * p.v_stride_h;");
}

/// Quad c's rows (clamped to the last), their visible key ranges within this
/// dispatch's keys and their offsets in Q.
fn write_quad_rows(w: &mut String, c: u32) {
    let _ = writeln!(
        w,
        "    let rows_{c} = min(vec4<u32>(row0 + {}u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_q));",
        4 * c
    );
    let _ = writeln!(w, "    let starts_{c} = key_starts(hd.b, rows_{c});");
    let _ = writeln!(
        w,
        "    let ends_{c} = min(key_ends(hd.b, rows_{c}), vec4<u32>(p.key_stop));"
    );
    let _ = writeln!(w, "    let q_rows_{c} = vec4<u32>(q_head) + rows_{c} * p.q_stride_s;");
}

/// The WGSL index, within a row, of element `e` of the word this lane holds in group
/// `group` of 8 words (Q slices, output words): word 8 * group + lane.
fn lane_element(group: u32, elems: u32, e: u32) -> String {
    format!("({}u + lane) * {elems}u + {e}u", group * LANES)
}

/// `let {name}_{h} = ...;` for each vec4 of a word's elements as f32.
fn write_word_halves(w: &mut String, name: &str, word: &str, keep: &str, halves: u32) -> std::fmt::Result {
    if halves == 1 {
        return writeln!(w, "            let {name}_0 = word_f32({word}, {keep});");
    }
    writeln!(w, "            let {name}_0 = word_lo({word}, {keep});")?;
    writeln!(w, "            let {name}_1 = word_hi({word}, {keep});")
}

/// The texel forward's generated variants (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    VARIANTS.iter().map(|v| v.kernel()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(mesa: Option<(u32, u32)>) -> Capabilities {
        Capabilities::for_tests(Some((8, 8)), 32768, mesa)
    }

    const DENSE: &[u32] = &[64 * 8 * 128, 64 * 128, 64, 0];

    #[test]
    fn variants_follow_the_driver_and_the_head_dims() {
        let (m22, m25) = (caps(Some((22, 3))), caps(Some((25, 0))));
        for dtype in [DType::F32, DType::F16] {
            for rules in [false, true] {
                let v = variant_for(dtype, (64, 64), DENSE, rules, &m22).expect("D 64 on Mesa 22");
                assert_eq!((v.rows, v.keys_per_lane, v.max_dim(), v.dtype), (32, 2, 64, dtype));
                let v = variant_for(dtype, (128, 64), DENSE, rules, &m22).expect("D 128 on Mesa 22");
                assert_eq!((v.rows, v.max_dim()), (16, 128));
            }
            let v = variant_for(dtype, (64, 64), DENSE, false, &m25).expect("D 64 on Mesa 25");
            assert_eq!((v.rows, v.keys_per_lane, v.max_dim()), (16, 2, 64));
            assert_eq!(variant_for(dtype, (64, 64), DENSE, true, &m25), None);
            assert_eq!(variant_for(dtype, (128, 128), DENSE, false, &m25), None);
            assert_eq!(variant_for(dtype, (64, 136), DENSE, false, &m22), None);
            assert_eq!(variant_for(dtype, (256, 256), DENSE, false, &m22), None);
        }
        // Rows must start on whole words.
        let rows_of_36: &[u32] = &[36, 36, 36];
        assert!(variant_for(DType::F32, (36, 36), rows_of_36, false, &m22).is_some());
        assert_eq!(variant_for(DType::F16, (36, 36), &[36, 36, 36], false, &m22), None);
        assert_eq!(variant_for(DType::F32, (64, 64), &[64, 64, 66], false, &m22), None);
        assert_eq!(variant_for(DType::F32, (64, 62), DENSE, false, &m22), None);
    }

    #[test]
    fn generated_entry_points_index_nothing_by_a_loop_variable_but_workgroup_memory() {
        for v in VARIANTS {
            let source = entry_point(v);
            assert!(source.contains("fn flash_texel("), "{}", v.name);
            // The only loop is over key blocks and the rules' (quad, key) pairs.
            assert_eq!(source.matches("for (").count(), 2, "{}", v.name);
            for line in source.lines().filter(|l| l.contains("[x")) {
                assert!(line.contains("mask_scratch["), "{}: {line}", v.name);
            }
            // Every Q element of a word is broadcast once per quad and word.
            let broadcasts = source.matches("subgroupBroadcast(q_").count() as u32;
            assert_eq!(broadcasts, v.rows / 4 * v.groups * LANES * v.word_elems(), "{}", v.name);
        }
    }

    #[test]
    fn the_loop_model_counts_every_variants_trips() {
        for v in VARIANTS {
            let pairs = u64::from(v.rows / 4 * v.keys_per_lane);
            for len_k in [1u64, 15, 16, 17, 1000, 65_535] {
                let blocks = len_k.div_ceil(u64::from(v.block_keys()));
                assert!(blocks * (2 + pairs) < iterations(len_k), "{} at {len_k} keys", v.name);
            }
        }
    }
}
