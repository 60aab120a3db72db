//! The `subgroup` backward tiling's texel kernels (`shaders/backward_texel.wgsl`,
//! whose opening comment explains the tiling): the dQ pass reads K and V, the dK/dV
//! pass Q and dO, as texel fetches from mirrors (`kernels::kv_texels`), the owned rows
//! as workgroup-uniform quads, the walked rows across the 8 lanes. Their entry points
//! are written out here, per variant, with every loop over owned rows, head-dim words
//! and walked rows of a block unrolled, as `flash_texel` writes the forward's.
//!
//! They serve problems whose rows are whole 16-byte words (head dims and every stride
//! of Q, K, V and dO multiples of 4 f32 or 8 f16 elements), whose head dims fit a
//! variant (up to 128) and whose only masks are visible key ranges (causal, window, key lengths);
//! [`variant_for`] says which, and the buffer kernels
//! (`flash_backward_subgroup.wgsl`) take the rest.

use super::flash_texel::{lane_element, whole_words, write_word_halves};
use super::{Kernel, Slot, BACKWARD_COMMON, COMMON, TEXEL_WORDS};
use crate::gpu::Capabilities;
use crate::gpu::Text;
use crate::tensor::DType;
use std::fmt::Write;
use std::sync::OnceLock;

const HELPERS: &str = include_str!("../../shaders/backward_texel.wgsl");
const PRELUDES: &[&str] = &[COMMON, BACKWARD_COMMON, TEXEL_WORDS, HELPERS];

/// The dQ pass's bindings: K as texels at KTexels, the band's dX at DxTexels.
pub const DQ_SLOTS: &[Slot] = &[Slot::Params, Slot::SideWords, Slot::DQ, Slot::KTexels, Slot::DxTexels];
/// The dK/dV pass's: Q's mirror at KTexels, dO's at VTexels, the band's dX written at
/// DxStore.
pub const DKDV_SLOTS: &[Slot] = &[
    Slot::Params,
    Slot::K,
    Slot::V,
    Slot::SideWords,
    Slot::Scores,
    Slot::Lse,
    Slot::DK,
    Slot::DV,
    Slot::KTexels,
    Slot::VTexels,
    Slot::DxStore,
];

/// Lanes of the subgroup (the workgroup) that share a block of walked rows.
const LANES: u32 = 8;
/// Walked rows per lane and block (a block is 16).
const PER_LANE: u32 = 2;
/// Walked rows per block.
pub const BLOCK: u32 = LANES * PER_LANE;

/// One pair of generated kernels: `rows` owned rows per workgroup, head dims up to
/// `groups` groups of 8 words (`groups` x 8 x 4 f32, or x 8 f16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardTexelVariant {
    pub name: &'static str,
    pub rows: u32,
    pub groups: u32,
    pub dtype: DType,
}

/// Every variant, with the source cache slots of each at the same index.
///
/// More owned rows per workgroup mean fewer fetches and broadcasts per multiply-add
/// but more live values and a longer cold compile. On Mesa 22.3's lavapipe at
/// (1,8,2048,64) f32, 32 rows in both passes ran the backward in 500-517 ms against
/// 597 ms with 16 rows, and compiled cold in 57 s against 11 s; 64 rows ran no faster
/// (483 ms) and compiled for 200 s. At D 128, 16 rows compile in 36 s (f32). Mesa 25
/// compiled the D 64 16-row pair for 101 s (and the 32-row pair for over 400 s), so it
/// keeps the buffer kernels (docs/design.md, "Backward"). [`variant_for`] takes the
/// first that fits, so D 64 and below get 32 rows.
pub const VARIANTS: [BackwardTexelVariant; 4] = [
    BackwardTexelVariant {
        name: "[texel 32 rows, D 64]",
        rows: 32,
        groups: 2,
        dtype: DType::F32,
    },
    BackwardTexelVariant {
        name: "[texel 32 rows, D 64]",
        rows: 32,
        groups: 1,
        dtype: DType::F16,
    },
    BackwardTexelVariant {
        name: "[texel 16 rows, D 128]",
        rows: 16,
        groups: 4,
        dtype: DType::F32,
    },
    BackwardTexelVariant {
        name: "[texel 16 rows, D 128]",
        rows: 16,
        groups: 2,
        dtype: DType::F16,
    },
];

static DQ_SOURCES: [OnceLock<Text>; 4] = [const { OnceLock::new() }; 4];
static DKDV_SOURCES: [OnceLock<Text>; 4] = [const { OnceLock::new() }; 4];

/// Which pass an entry point is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Owns query rows, walks keys: dQ.
    Dq,
    /// Owns keys, walks the query rows of each query head of its kv head: dK and dV.
    DkDv,
}

impl BackwardTexelVariant {
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

    fn index(self) -> usize {
        VARIANTS.iter().position(|v| *v == self).expect("a listed variant")
    }

    pub fn dq(self) -> Kernel {
        Kernel {
            file: "backward_texel.wgsl",
            source: DQ_SOURCES[self.index()]
                .get_or_init(|| Text::from(entry_point(self, Pass::Dq)))
                .clone(),
            entry: "bwd_dq_texel",
            slots: DQ_SLOTS,
            preludes: PRELUDES,
            variant: Text::Static(self.name),
        }
    }

    pub fn dkdv(self) -> Kernel {
        Kernel {
            file: "backward_texel.wgsl",
            source: DKDV_SOURCES[self.index()]
                .get_or_init(|| Text::from(entry_point(self, Pass::DkDv)))
                .clone(),
            entry: "bwd_dkdv_texel",
            slots: DKDV_SLOTS,
            preludes: PRELUDES,
            variant: Text::Static(self.name),
        }
    }
}

/// The variant for a problem, or `None` where the buffer kernels serve it: `strides`
/// are every stride of Q, K, V and dO (in elements), which must be whole words for
/// every row to start on one, as must both head dims; `full_rules` (explicit masks,
/// soft-capping, ALiBi), head dims past 128 and drivers other than Mesa 22 (whose cold
/// compile of these kernels takes minutes: [`VARIANTS`]) go to the buffer kernels.
pub fn variant_for(
    dtype: DType,
    (d, dv): (u32, u32),
    strides: &[u32],
    full_rules: bool,
    caps: &Capabilities,
) -> Option<BackwardTexelVariant> {
    if full_rules || !whole_words(dtype, (d, dv), strides) || caps.subgroups.is_none() {
        return None;
    }
    let mesa_22 = matches!(caps.mesa_version, Some((major, _)) if major <= 22);
    if !mesa_22 {
        return None;
    }
    VARIANTS
        .iter()
        .copied()
        .find(|v| v.dtype == dtype && d.max(dv) <= v.max_dim())
}

/// Worst-case loop iterations of one invocation of the dQ pass over `keys` keys: the
/// block loop's trips (one more where the first block starts before the range on a
/// multiple of 4) and its exit. Nothing else loops.
pub fn dq_iterations(keys: usize) -> u64 {
    2 + keys.div_ceil(BLOCK as usize) as u64 + 1
}

/// The same for the dK/dV pass over `rows` query rows of each of `group` query heads:
/// the two binary searches for the rows its keys are visible to, then per head the
/// block loop as above.
pub fn dkdv_iterations(rows: usize, group: usize) -> u64 {
    let searches = 2 * (u64::from(usize::BITS - rows.leading_zeros()) + 2);
    1 + searches + group as u64 * (1 + dq_iterations(rows))
}

/// What one pass's entry point is made of, named as the WGSL it writes.
struct Shape {
    v: BackwardTexelVariant,
    quads: u32,
    elems: u32,
    halves: u32,
}

impl Shape {
    /// `{acc}_{c}_{k} += owned · walked` over the words of one head dim: for word t,
    /// each lane fetches word t of its walked rows (`rows`_k, first words) and takes
    /// the owned quads' elements of word t (`owned`_c_g_i) from lane t % 8. Words at or
    /// past `dim_words` count zero (they belong to the next row).
    fn product(&self, w: &mut String, acc: &str, owned: &str, fetch: &str, rows: &str, dim_words: &str) {
        for t in 0..self.v.groups * LANES {
            let (g, from) = (t / LANES, t % LANES);
            let _ = writeln!(w, "        {{");
            let _ = writeln!(w, "            let keep = {t}u < {dim_words};");
            for k in 0..PER_LANE {
                let _ = writeln!(w, "            let ww_{k} = {fetch}({rows}_{k} + {t}u);");
                let _ = write_word_halves(w, &format!("wx_{k}"), &format!("ww_{k}"), "keep", self.halves);
            }
            for c in 0..self.quads {
                for i in 0..self.elems {
                    let _ = writeln!(
                        w,
                        "            let b_{c}_{i} = subgroupBroadcast({owned}_{c}_{g}_{i}, {from}u);"
                    );
                    for k in 0..PER_LANE {
                        let _ = writeln!(
                            w,
                            "            {acc}_{c}_{k} = fma(b_{c}_{i}, vec4<f32>(wx_{k}_{}[{}]), {acc}_{c}_{k});",
                            i / 4,
                            i % 4
                        );
                    }
                }
            }
            let _ = writeln!(w, "        }}");
        }
    }

    /// `{acc}_{ch}_{c}_{r}_{h} += coefficient × word 8ch + lane of walked row x`, for
    /// every walked row x of the block (lane x % 8's row k): the word fetched from
    /// `fetch` at the row's first word, broadcast from that lane. `keep` gives, per
    /// walked row (k, x), a WGSL condition for its word to count (else 0), beside the
    /// word lying within the head dim (`dim_words`). `products(w, ch, c)` writes the
    /// fmas of owned quad c into chunk ch, with the walked words as `ax_{k}_{x}_{h}`.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        w: &mut String,
        fetch: &str,
        rows: &str,
        dim_words: &str,
        keep: &dyn Fn(u32, u32) -> Option<String>,
        products: &dyn Fn(&mut String, u32, u32),
    ) {
        for k in 0..PER_LANE {
            for x in 0..LANES {
                let _ = writeln!(w, "        let {rows}_{k}_{x} = subgroupBroadcast({rows}_{k}, {x}u);");
            }
        }
        for ch in 0..self.v.groups {
            let _ = writeln!(w, "        {{");
            let _ = writeln!(w, "            let in_dim = {}u + lane < {dim_words};", ch * LANES);
            for k in 0..PER_LANE {
                for x in 0..LANES {
                    let cond = keep(k, x).map_or("in_dim".to_string(), |c| format!("in_dim && {c}"));
                    let _ = writeln!(
                        w,
                        "            let aw_{k}_{x} = {fetch}({rows}_{k}_{x} + {}u + lane);",
                        ch * LANES
                    );
                    let _ = write_word_halves(w, &format!("ax_{k}_{x}"), &format!("aw_{k}_{x}"), &cond, self.halves);
                }
            }
            for c in 0..self.quads {
                products(w, ch, c);
            }
            let _ = writeln!(w, "        }}");
        }
    }

    /// [`Shape::accumulate`]'s products where each lane computed the coefficients of
    /// its own walked rows (`{coef}_{c}_{k}`, a vec4 over quad c's owned rows): each
    /// broadcast from its lane, then `{acc}_.. += coefficient[r] × walked word`.
    fn broadcast_products(&self, w: &mut String, acc: &str, coef: &str, (ch, c): (u32, u32)) {
        for k in 0..PER_LANE {
            for x in 0..LANES {
                let _ = writeln!(
                    w,
                    "            let cb_{c}_{k}_{x} = subgroupBroadcast({coef}_{c}_{k}, {x}u);"
                );
                for r in 0..4 {
                    for h in 0..self.halves {
                        let _ = writeln!(
                            w,
                            "            {acc}_{ch}_{c}_{r}_{h} = fma(vec4<f32>(cb_{c}_{k}_{x}[{r}]), ax_{k}_{x}_{h}, {acc}_{ch}_{c}_{r}_{h});"
                        );
                    }
                }
            }
        }
    }

    /// The dQ pass's coefficients: dX comes from the scratch, in texels of 4 keys of
    /// one owned row (`f_{cc}_{r}`: lane `q + 4 half` holds key quad q of the block for
    /// row 4cc + r of its half of the owned rows); each is broadcast from that lane
    /// once a block, as `t_{c}_{r}_{q}`.
    fn scratch_coefficients(&self, w: &mut String) {
        let per_half = self.quads / 2;
        for c in 0..self.quads {
            for q in 0..BLOCK / 4 {
                for r in 0..4 {
                    let _ = writeln!(
                        w,
                        "        let t_{c}_{r}_{q} = subgroupBroadcast(f_{}_{r}, {}u);",
                        c % per_half,
                        q + 4 * (c / per_half)
                    );
                }
            }
        }
    }

    /// The dQ pass's products: the components of `t_{c}_{r}_{q}` multiply the walked
    /// words of the block's keys 4q .. 4q + 3.
    fn scratch_products(&self, w: &mut String, (ch, c): (u32, u32)) {
        for q in 0..BLOCK / 4 {
            for r in 0..4 {
                for e in 0..4 {
                    let walked = 4 * q + e;
                    let (k, x) = (walked / LANES, walked % LANES);
                    for h in 0..self.halves {
                        let _ = writeln!(
                            w,
                            "            acc_{ch}_{c}_{r}_{h} = fma(vec4<f32>(t_{c}_{r}_{q}[{e}]), ax_{k}_{x}_{h}, acc_{ch}_{c}_{r}_{h});"
                        );
                    }
                }
            }
        }
    }

    /// `let {name}_{c}_{g}_{i} = {load}({rows}_{c}, element)` for every owned quad and
    /// element of the words this lane holds.
    fn owned_slices(&self, w: &mut String, name: &str, load: &str, rows: &str, c: u32) {
        for g in 0..self.v.groups {
            for i in 0..self.elems {
                let _ = writeln!(
                    w,
                    "    let {name}_{c}_{g}_{i} = {load}({rows}_{c}, {});",
                    lane_element(g, self.elems, i)
                );
            }
        }
    }

    /// `var {name}_{ch}_{c}_{r}_{h} = vec4<f32>(0.0);` for every accumulator word.
    fn zeroed(&self, w: &mut String, name: &str, c: u32) {
        for r in 0..4 {
            for ch in 0..self.v.groups {
                for h in 0..self.halves {
                    let _ = writeln!(w, "    var {name}_{ch}_{c}_{r}_{h} = vec4<f32>(0.0);");
                }
            }
        }
    }

    /// `{store}({rows}_{c}[r], element, {name}_..{scale})` for every word of owned row
    /// r of quad c.
    /// `seen`: 0 where a `seen` the caller defines is false.
    #[allow(clippy::too_many_arguments)]
    fn store(&self, w: &mut String, store: &str, rows: &str, name: &str, (c, r): (u32, u32), scale: &str, seen: bool) {
        for ch in 0..self.v.groups {
            for h in 0..self.halves {
                let value = format!("{name}_{ch}_{c}_{r}_{h}{scale}");
                let value = if seen {
                    format!("select(vec4<f32>(0.0), {value}, seen)")
                } else {
                    value
                };
                let _ = writeln!(
                    w,
                    "        {store}({rows}_{c}[{r}], {}, {value});",
                    lane_element(ch, self.elems, 4 * h)
                );
            }
        }
    }
}

/// The entry point of one pass of a variant.
fn entry_point(v: BackwardTexelVariant, pass: Pass) -> String {
    let shape = Shape {
        v,
        quads: v.rows / 4,
        elems: v.word_elems(),
        halves: v.word_elems() / 4,
    };
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "// Generated by src/kernels/backward_texel.rs: {} owned rows, {} words per head dim, {} walked rows a block.",
        v.rows,
        v.groups * LANES,
        BLOCK
    );
    let _ = writeln!(w, "@compute @workgroup_size({LANES}, 1, 1)");
    match pass {
        Pass::Dq => dq_body(w, &shape),
        Pass::DkDv => dkdv_body(w, &shape),
    }
    s
}

/// `bwd_dq_texel`: owns query rows row0 .. row0 + ROWS of the band p.key_begin ..
/// p.key_stop of one (batch, head), walks the keys they see, reading dX from the
/// band's scratch (which the dK/dV pass wrote).
fn dq_body(w: &mut String, sh: &Shape) {
    let (v, quads) = (sh.v, sh.quads);
    let _ = writeln!(
        w,
        "fn bwd_dq_texel(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {{"
    );
    let _ = writeln!(w, "    let hd = head_of(p.bh_start + wid.y);");
    let _ = writeln!(w, "    let lane = sg_lane % {LANES}u;");
    let _ = writeln!(w, "    let row0 = p.key_begin + wid.x * {}u;", v.rows);
    let _ = writeln!(w, "    let last_row = p.key_stop - 1u;");
    let _ = writeln!(w, "    let q_head = hd.b * p.q_stride_b + hd.h * p.q_stride_h;");
    let _ = writeln!(w, "    let k_base = hd.b * p.k_stride_b + hd.hk * p.k_stride_h;");
    let _ = writeln!(w, "    let k_words = word_at(p.head_dim);");
    let _ = writeln!(w, "    let limit = key_limit(hd.b);");
    let _ = writeln!(w, "    let last_quad = (p.len_k + 3u) / 4u - 1u;");
    for c in 0..quads {
        let _ = writeln!(
            w,
            "    let rows_{c} = min(vec4<u32>(row0 + {}u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_row));",
            4 * c
        );
        let _ = writeln!(w, "    let q_rows_{c} = vec4<u32>(q_head) + rows_{c} * p.q_stride_s;");
        sh.zeroed(w, "acc", c);
    }
    let _ = writeln!(
        w,
        "    // This lane fetches key quad lane % 4 of each block for the rows of half lane / 4,"
    );
    let _ = writeln!(w, "    // each masked by its row's visible key range.");
    let _ = writeln!(w, "    let fq = lane % 4u;");
    let _ = writeln!(w, "    let frow0 = row0 + lane / 4u * {}u;", v.rows / 2);
    for cc in 0..quads / 2 {
        let _ = writeln!(
            w,
            "    let frows_{cc} = min(vec4<u32>(frow0 + {}u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last_row));",
            4 * cc
        );
        let _ = writeln!(w, "    let fstarts_{cc} = key_starts(hd.b, frows_{cc});");
        let _ = writeln!(w, "    let fends_{cc} = key_ends(hd.b, frows_{cc});");
        let _ = writeln!(
            w,
            "    let fw_{cc} = vec4<u32>(dx_row_word(frows_{cc}.x, wid.y, p.bh_count), dx_row_word(frows_{cc}.y, wid.y, p.bh_count), dx_row_word(frows_{cc}.z, wid.y, p.bh_count), dx_row_word(frows_{cc}.w, wid.y, p.bh_count));"
        );
    }
    let _ = writeln!(
        w,
        "    // Uniform across the workgroup: from its first row's first key to the last key"
    );
    let _ = writeln!(w, "    // its last row sees.");
    let _ = writeln!(w, "    let block_begin = key_start(hd.b, row0) / 4u * 4u;");
    let _ = writeln!(
        w,
        "    let block_end = key_end(hd.b, min(row0 + {}u, last_row));",
        v.rows - 1
    );
    let _ = writeln!(w, "    for (var j0 = block_begin; j0 < block_end; j0 += {BLOCK}u) {{");
    for k in 0..PER_LANE {
        let j = format!("min(j0 + {}u + lane, p.len_k - 1u)", k * LANES);
        let _ = writeln!(w, "        let kr_{k} = word_at(k_base + {j} * p.k_stride_s);");
    }
    let _ = writeln!(w, "        let kq = min(j0 / 4u + fq, last_quad);");
    let _ = writeln!(
        w,
        "        let fkeys = vec4<u32>(j0 + 4u * fq) + vec4<u32>(0u, 1u, 2u, 3u);"
    );
    for cc in 0..quads / 2 {
        for r in 0..4 {
            let _ = writeln!(
                w,
                "        let f_{cc}_{r} = dx_fetch(fw_{cc}[{r}] + kq, in_key_range(fkeys, vec4<u32>(fstarts_{cc}[{r}]), vec4<u32>(fends_{cc}[{r}])));"
            );
        }
    }
    sh.scratch_coefficients(w);
    let _ = writeln!(
        w,
        "        // dQ += dX·K, keys past the key length kept out (their rows may hold NaN)."
    );
    sh.accumulate(
        w,
        "k_word",
        "kr",
        "k_words",
        &|k, x| Some(format!("j0 + {}u < limit", k * LANES + x)),
        &|w, ch, c| sh.scratch_products(w, (ch, c)),
    );
    let _ = writeln!(w, "    }}");
    let _ = writeln!(w, "    // dQ = scale · Σ dX k.");
    for c in 0..quads {
        for r in 0..4 {
            let _ = writeln!(w, "    if row0 + {}u < p.key_stop {{", 4 * c + r);
            sh.store(w, "store_dq", "q_rows", "acc", (c, r), " * p.scale", false);
            let _ = writeln!(w, "    }}");
        }
    }
    let _ = writeln!(w, "}}");
}

/// `bwd_dkdv_texel`: owns keys key0 .. key0 + ROWS of one (batch, kv head), walks the
/// query rows of p.key_begin .. p.key_stop (this pass's row range) that see any of
/// them, for each query head of the group.
fn dkdv_body(w: &mut String, sh: &Shape) {
    let (v, quads) = (sh.v, sh.quads);
    let _ = writeln!(
        w,
        "fn bwd_dkdv_texel(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32) {{"
    );
    let _ = writeln!(
        w,
        "    // p.bh_start + wid.y counts (batch, kv head) pairs in this pass."
    );
    let _ = writeln!(w, "    let pair = p.bh_start + wid.y;");
    let _ = writeln!(w, "    let b = pair / p.heads_kv;");
    let _ = writeln!(w, "    let hk = pair % p.heads_kv;");
    let _ = writeln!(w, "    let lane = sg_lane % {LANES}u;");
    let _ = writeln!(w, "    let key0 = wid.x * {}u;", v.rows);
    let _ = writeln!(w, "    let last_q = p.len_q - 1u;");
    let _ = writeln!(w, "    let last_k = p.len_k - 1u;");
    let _ = writeln!(w, "    let k_words = word_at(p.head_dim);");
    let _ = writeln!(w, "    let v_words = word_at(p.head_dim_v);");
    for c in 0..quads {
        let _ = writeln!(
            w,
            "    let keys_{c} = vec4<u32>(key0 + {}u) + vec4<u32>(0u, 1u, 2u, 3u);",
            4 * c
        );
        let _ = writeln!(w, "    let kc_{c} = min(keys_{c}, vec4<u32>(last_k));");
        let _ = writeln!(
            w,
            "    let k_rows_{c} = vec4<u32>(b * p.k_stride_b + hk * p.k_stride_h) + kc_{c} * p.k_stride_s;"
        );
        let _ = writeln!(
            w,
            "    let v_rows_{c} = vec4<u32>(b * p.v_stride_b + hk * p.v_stride_h) + kc_{c} * p.v_stride_s;"
        );
        sh.owned_slices(w, "k", "k_quad", "k_rows", c);
        sh.owned_slices(w, "v", "v_quad", "v_rows", c);
        sh.zeroed(w, "dk", c);
        sh.zeroed(w, "dv", c);
    }
    let _ = writeln!(w, "    let group = p.heads_q / p.heads_kv;");
    let _ = writeln!(w, "    // The rows any key of this workgroup is visible to (uniform).");
    let _ = writeln!(
        w,
        "    let range = rows_seeing(b, key0, min(key0 + {}u, p.len_k) - 1u);",
        v.rows
    );
    let _ = writeln!(w, "    for (var gh = 0u; gh < group; gh++) {{");
    let _ = writeln!(w, "    let hd = Head(b, hk * group + gh, hk);");
    let _ = writeln!(w, "    let band_pair = wid.y * group + gh;");
    let _ = writeln!(w, "    let q_head = b * p.q_stride_b + hd.h * p.q_stride_h;");
    let _ = writeln!(w, "    let o_head = b * p.o_stride_b + hd.h * p.o_stride_h;");
    let _ = writeln!(w, "    for (var i0 = range.x; i0 < range.y; i0 += {BLOCK}u) {{");
    for k in 0..PER_LANE {
        let _ = writeln!(w, "        let i_{k} = i0 + {}u + lane;", k * LANES);
        let _ = writeln!(w, "        let ic_{k} = min(i_{k}, last_q);");
        let _ = writeln!(w, "        let qr_{k} = word_at(q_head + ic_{k} * p.q_stride_s);");
        let _ = writeln!(w, "        let or_{k} = word_at(o_head + ic_{k} * p.o_stride_s);");
        let _ = writeln!(w, "        let start_{k} = vec4<u32>(key_start(b, ic_{k}));");
        let _ = writeln!(w, "        let end_{k} = vec4<u32>(key_end(b, ic_{k}));");
        let _ = writeln!(w, "        let live_{k} = vec4<bool>(i_{k} < range.y);");
        let _ = writeln!(w, "        let lse_{k} = vec4<f32>(lse_at(hd, ic_{k}));");
        let _ = writeln!(w, "        let delta_{k} = vec4<f32>(delta_at(hd, ic_{k}));");
        for c in 0..quads {
            let _ = writeln!(w, "        var s_{c}_{k} = vec4<f32>(0.0);");
            let _ = writeln!(w, "        var dp_{c}_{k} = vec4<f32>(0.0);");
        }
    }
    let _ = writeln!(
        w,
        "        // Transposed scores (K carries the scale) and dP = V·dO (Q's and dO's mirrors"
    );
    let _ = writeln!(w, "        // are bound at k_texels and v_texels).");
    sh.product(w, "s", "k", "k_word", "qr", "k_words");
    sh.product(w, "dp", "v", "v_word", "or", "v_words");
    let _ = writeln!(w, "        // Visible key ranges, P and dX.");
    for k in 0..PER_LANE {
        for c in 0..quads {
            let _ = writeln!(w, "        let sm_{c}_{k} = select(vec4<f32>(neg_inf()), s_{c}_{k}, in_key_range(keys_{c}, start_{k}, end_{k}) & live_{k});");
            let _ = writeln!(w, "        let pr_{c}_{k} = probs_of(sm_{c}_{k}, lse_{k});");
            let _ = writeln!(
                w,
                "        let dx_{c}_{k} = dx_of(pr_{c}_{k}, dp_{c}_{k}, delta_{k}, vec4<f32>(1.0));"
            );
        }
    }
    let _ = writeln!(w, "        // dX to the band's scratch, for the dQ pass.");
    for k in 0..PER_LANE {
        let _ = writeln!(
            w,
            "        let xw_{k} = dx_row_word(ic_{k}, band_pair, p.bh_count * group) + key0 / 4u;"
        );
        for c in 0..quads {
            let _ = writeln!(
                w,
                "        if i_{k} < range.y && key0 + {}u < p.len_k {{ store_dx(xw_{k} + {c}u, dx_{c}_{k}); }}",
                4 * c
            );
        }
    }
    let _ = writeln!(w, "        // dV += P·dO, dK += dX·Q.");
    sh.accumulate(w, "v_word", "or", "v_words", &|_, _| None, &|w, ch, c| {
        sh.broadcast_products(w, "dv", "pr", (ch, c))
    });
    sh.accumulate(w, "k_word", "qr", "k_words", &|_, _| None, &|w, ch, c| {
        sh.broadcast_products(w, "dk", "dx", (ch, c))
    });
    let _ = writeln!(w, "    }}");
    let _ = writeln!(w, "    }}");
    let _ = writeln!(w, "    // dK = scale · Σ dX q; dV = Σ P dO.");
    for c in 0..quads {
        for r in 0..4 {
            let _ = writeln!(w, "    if key0 + {}u < p.len_k {{", 4 * c + r);
            // 0 past the key length (backward_common.wgsl, key_limit).
            let _ = writeln!(w, "        let seen = key0 + {}u < key_limit(b);", 4 * c + r);
            sh.store(w, "store_dk", "k_rows", "dk", (c, r), " * p.scale", true);
            sh.store(w, "store_dv", "v_rows", "dv", (c, r), "", true);
            let _ = writeln!(w, "    }}");
        }
    }
    let _ = writeln!(w, "}}");
}

/// Bytes the texel backward's dX scratch takes at most by default
/// ([`crate::Context::limit_backward_scratch`] changes it): 64 MiB, one layer of the texel
/// grid. Larger problems run in more bands, down to [`MIN_BAND_ROWS`].
pub const SCRATCH_BYTES: u64 = 64 << 20;

/// The fewest query rows of a band where the problem has more: each band re-runs the
/// dK/dV pass's setup and the read-modify-write of its gradients (about 12 ms for 8
/// heads of 2048 keys at D 64 on Mesa 22.3, against about 100 ms of work per 512
/// rows), so a row's dX larger than the budget's share grows the scratch instead.
pub const MIN_BAND_ROWS: usize = 512;

/// The texel backward's generated variants (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    VARIANTS.iter().flat_map(|v| [v.dq(), v.dkdv()]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Capabilities {
        Capabilities::for_tests(Some((8, 8)), 32768, Some((22, 3)))
    }

    const DENSE: &[u32] = &[64 * 8 * 128, 64 * 128, 64];

    #[test]
    fn variants_take_whole_words_key_ranges_and_head_dims_up_to_128() {
        for dtype in [DType::F32, DType::F16] {
            let v = variant_for(dtype, (64, 64), DENSE, false, &caps()).expect("D 64");
            assert_eq!((v.dtype, v.max_dim()), (dtype, 64));
            assert_eq!(variant_for(dtype, (64, 64), DENSE, true, &caps()), None);
            let v = variant_for(dtype, (128, 64), DENSE, false, &caps()).expect("D 128");
            assert_eq!((v.rows, v.max_dim()), (16, 128));
            assert_eq!(variant_for(dtype, (136, 64), DENSE, false, &caps()), None);
            assert_eq!(variant_for(dtype, (64, 62), DENSE, false, &caps()), None);
            assert_eq!(variant_for(dtype, (64, 64), &[64, 64, 66], false, &caps()), None);
        }
        assert!(variant_for(DType::F32, (36, 36), &[36, 36, 36], false, &caps()).is_some());
        assert_eq!(variant_for(DType::F16, (36, 36), &[36, 36, 36], false, &caps()), None);
        let no_subgroups = Capabilities::for_tests(None, 32768, Some((22, 3)));
        assert_eq!(variant_for(DType::F32, (64, 64), DENSE, false, &no_subgroups), None);
        let mesa_25 = Capabilities::for_tests(Some((8, 8)), 32768, Some((25, 0)));
        assert_eq!(variant_for(DType::F32, (64, 64), DENSE, false, &mesa_25), None);
        assert_eq!(
            variant_for(
                DType::F32,
                (64, 64),
                DENSE,
                false,
                &Capabilities::for_tests(Some((8, 8)), 32768, None)
            ),
            None
        );
    }

    #[test]
    fn generated_entry_points_loop_only_over_blocks_and_heads() {
        for v in VARIANTS {
            let dq = entry_point(v, Pass::Dq);
            assert_eq!(dq.matches("for (").count(), 1, "{}", v.name);
            let dkdv = entry_point(v, Pass::DkDv);
            assert_eq!(dkdv.matches("for (").count(), 2, "{}", v.name);
            // dK/dV: each owned element of a word is broadcast once per quad and word,
            // in both products. dQ computes no products: it reads dX, each lane 4 keys
            // of every row of its half of the owned rows a block, each broadcast once.
            let per_product = v.rows / 4 * v.groups * LANES * v.word_elems();
            assert_eq!(dkdv.matches("let b_").count() as u32, 2 * per_product, "{}", v.name);
            assert_eq!(dq.matches("let b_").count(), 0, "{}", v.name);
            assert_eq!(dq.matches("dx_fetch(").count() as u32, v.rows / 2, "{}", v.name);
            assert_eq!(dq.matches("let t_").count() as u32, v.rows * 4, "{}", v.name);
            assert_eq!(
                dkdv.matches("store_dx(").count() as u32,
                v.rows / 4 * PER_LANE,
                "{}",
                v.name
            );
        }
    }

    #[test]
    fn the_loop_model_counts_every_trip() {
        for keys in [1usize, 15, 16, 17, 1000, 65_535] {
            // Blocks of 16 from a start rounded down to 4, and the exit.
            let trips = (keys + 3).div_ceil(16) as u64 + 1;
            assert!(trips <= dq_iterations(keys), "{keys} keys");
            assert!(4 * trips <= dkdv_iterations(keys, 4), "{keys} rows");
        }
    }
}
