//! llvmpipe (Mesa's CPU driver behind lavapipe and the GL llvmpipe adapter) up to Mesa
//! 22.x ends the loops of a shader invocation after 65535 iterations in total, counted
//! across all its loops (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`), and the shader then
//! goes on with wrong results; loops with a constant trip count are unrolled and do not
//! count. Mesa 25 has no such cap. A context knows its device's cap from a probe
//! ([`super::loop_probe`], [`Gpu::loop_cap`]). This module bounds the iterations each
//! kernel with data-dependent loops needs, from the structure of its WGSL loops. Under a
//! cap, the fused kernels split a long key range across dispatches that each stay within
//! it ([`keys_per_dispatch`]), resuming from the previous dispatch's output and
//! log-sum-exp; the other kernels refuse what does not fit ([`check`]).

use super::flash::FlashConfig;
use super::matmul::LinearTiling;
use crate::error::{Error, Result};
use crate::gpu::{Capabilities, Gpu};
use crate::kernels::policy::Policy;
use crate::options::FusedTiling;
use crate::problem::AttentionShape;

/// Loop iterations Mesa 22's llvmpipe allows one invocation.
pub const LLVMPIPE_LOOP_CAP: u64 = 65535;

/// Worst-case loop iterations of one invocation of the fused kernel (every key block
/// raising the running maximum, i.e. rescaling the accumulator), from the tiling's
/// model in the registry. Loops with a constant trip count are counted too, since
/// Mesa 22 keeps them as loops: measured, a subgroup model that counted its 4-trip
/// masking loop as 4 rather than 5 (its exit check) let the driver cut the kernel short.
///
/// For the tensor-core tiling, also the variant that will run on this adapter (the
/// picker's, or one a tuning table or `tune` pins): the registry's model counts the
/// one-band forms only, since the two-band ones count twice the rows and would refuse
/// the picker's variants at D 256 for no reason.
pub fn fused_iterations(config: &FlashConfig, s: &AttentionShape, caps: &Capabilities, policy: &Policy) -> u64 {
    let model = (config.spec().iterations)(s);
    match caps.coop_subgroup_size() {
        Some(sg) if config.tiling == FusedTiling::Coop => {
            let v = super::flash::coop_variant_for(s.head_dim as u32, s.head_dim_v as u32, caps, policy);
            model.max(coop_variant_iterations(s, v, sg))
        }
        _ => model,
    }
}

/// `flash_subgroup.wgsl`, each loop counting one more trip for the check that ends
/// it (measured on Mesa 22.3: at D 64, 3431 blocks pass and 3432 fail without masks):
/// the larger of its two variants' counts, blocks of 16 and of 32 keys, as the adapter
/// picks one ([`super::flash::subgroup_keys_per_block`]; 16 counts more but for the
/// shortest key ranges).
pub fn subgroup_iterations(s: &AttentionShape) -> u64 {
    let buffer_kernel = subgroup_iterations_per(s, 16).max(subgroup_iterations_per(s, 32));
    if super::flash_texel::may_serve(s.head_dim as u32, s.head_dim_v as u32) {
        buffer_kernel.max(super::flash_texel::iterations(s.len_k as u64))
    } else {
        buffer_kernel
    }
}

/// Per block of `keys` keys: the block itself, the K octets, the masking loops over 4
/// quads each (worst case: every block masked) and the V octets (which also rescale).
/// Around it: Q load by octets, accumulator resume over padded dims, 4 rows stored.
pub fn subgroup_iterations_per(s: &AttentionShape, keys: u64) -> u64 {
    let blocks = (s.len_k as u64).div_ceil(keys);
    let (d8, dv8) = ((s.head_dim as u64).div_ceil(8), (s.head_dim_v as u64).div_ceil(8));
    let dv = s.head_dim_v as u64;
    let prologue = (d8 + 1) + (8 * dv8 + 1);
    let epilogue = 5 + 4 * (dv + 1);
    let masking = keys / 16 * (4 + 1);
    // The block loop's own exit, then per block: its trip, K octets, masking, V octets.
    1 + blocks * (1 + (d8 + 1) + masking + (dv8 + 1)) + prologue + epilogue
}

/// `flash_attention.wgsl`'s registers entry. Per block of 4 keys: K vec4s, V vec4s,
/// rescale vec4s, the block itself, two 4-trip key loops. Around it: Q load,
/// accumulator resume and store (each vec4 with a 4-trip loop inside).
pub fn registers_iterations(s: &AttentionShape) -> u64 {
    let blocks = s.len_k.div_ceil(4) as u64;
    let (d4, dv4) = ((s.head_dim as u64).div_ceil(4), (s.head_dim_v as u64).div_ceil(4));
    blocks * (d4 + 2 * dv4 + 9) + 5 * d4 + 10 * dv4
}

/// `flash_attention.wgsl`'s shared entry: the registers loop over each block of 4 keys,
/// plus per tile the tile loop itself and the cooperative load (each trip a vec4 load
/// with a 4-trip tail loop, counted as 5). The most of the variants the shape may get
/// (kernels::flash::shared_for): the run-time kernel walks the head dims' vec4s; a
/// head-dim class walks 16 per lane (a constant) and stages rows of 16 per lane, over
/// 64 invocations per lane of a row.
pub fn shared_iterations(s: &AttentionShape) -> u64 {
    let run_time = ((s.head_dim as u64).div_ceil(4), (s.head_dim_v as u64).div_ceil(4));
    let lanes = match s.head_dim.max(s.head_dim_v) {
        0..=64 => 1,
        65..=128 => 2,
        _ => 4,
    };
    // The class's row_sum_lanes per block of 4 keys: a loop of log2(lanes) shuffles or
    // lanes - 1 workgroup-memory reads (the larger), and its exit check.
    let sums = if lanes > 1 {
        s.len_k.div_ceil(4) as u64 * lanes
    } else {
        0
    };
    let class = shared_loops(s, (16, 16), 32 * lanes, 64 * lanes) + sums;
    class.max(shared_loops(s, run_time, run_time.0 + run_time.1, 64))
}

/// The shared entry's loop trips for a lane walking (d4, dv4) vec4s of its row, with
/// `staged` vec4s of K and V per key in the tile and `invocations` in the workgroup.
fn shared_loops(s: &AttentionShape, (d4, dv4): (u64, u64), staged: u64, invocations: u64) -> u64 {
    // The tile's vec4s less the lanes' sums where they take workgroup memory (at most
    // one slot per invocation past the first 64 rows' single lanes).
    let tile_vec4 = if invocations > 64 { 1024 - invocations } else { 1024 };
    let tile_keys = (tile_vec4 / staged) / 4 * 4;
    let tiles = (s.len_k as u64).div_ceil(tile_keys);
    let load_trips = (tile_keys * staged).div_ceil(invocations);
    let blocks = s.len_k.div_ceil(4) as u64;
    blocks * (d4 + 2 * dv4 + 9) + 5 * d4 + 10 * dv4 + tiles * (1 + 5 * load_trips)
}

/// `flash_blocked.wgsl`, every loop counted with its exit check (its inner loops have
/// constant trip counts and are normally unrolled), for the variant of the head-dim
/// class that needs the most (the adapter picks one by its workgroup memory). Per
/// tile of BC keys: the tile loop; the staging loads (V of this tile and K of the
/// next: each a quad with load4's 4-trip tail loop, counted as 5); the score clear;
/// the score loop over the head dim (MRS Q rows per step); the masking; the softmax
/// step (the TCS partial maxima of each row); the V and K stores; the rescale; the
/// probs x V loop (TCS quads of keys, each over MRO rows and OC columns). Around it: the
/// Q copy (qload4's 4-trip loop in each), the first K tile, the state set-up and
/// resume, the sums, the stores and the log-sum-exps.
pub fn blocked_iterations(s: &AttentionShape) -> u64 {
    let need = s.head_dim.max(s.head_dim_v) as u32;
    let Some(class) = super::flash::BLOCKED_VARIANTS
        .iter()
        .map(|v| v.dmax)
        .find(|&d| need <= d)
    else {
        return u64::MAX;
    };
    let d4 = (s.head_dim as u64).div_ceil(4);
    super::flash::BLOCKED
        .iter()
        .filter(|v| v.variant.dmax == class)
        .map(|v| {
            let (br, bc, dmax) = (
                u64::from(v.variant.br),
                u64::from(v.variant.bc),
                u64::from(v.variant.dmax),
            );
            let nt = 128;
            let tcs = bc / 4;
            let (mrs, mro, oc) = (u64::from(v.mrs), u64::from(v.mro), dmax / 32);
            let items = bc * (dmax / 4) / nt;
            let load = 1 + 5; // a trip and load4's tail loop
            let tiles = (s.len_k as u64).div_ceil(bc);
            let per_tile = 1
                + (items * (1 + 2 * 5) + 1)
                + (mrs + 1)
                + (d4 * (1 + mrs + 1) + 1)
                + (mrs + 1)
                + (mrs * (1 + tcs) + 1)
                + 2 * (items + 1)
                + (mro * (1 + oc + 1) + 1)
                + (tcs * (1 + (mro + 1) + (oc + 1) + oc * (mro + 1)) + 1);
            let around = ((br * dmax / 4).div_ceil(nt) * load + 1)
                + (items * load + 1)
                + (mrs + 1)
                + (mro * (1 + (oc + 1) + oc * 5) + 1)
                + 1
                + (mrs + 1)
                + (mro * (1 + (tcs + 1) + (oc + 1) + oc * 5) + 1)
                + (mrs * (1 + tcs + 1) + 1);
            tiles * per_tile + around
        })
        .max()
        .unwrap_or(u64::MAX)
}

/// `flash_micro.wgsl`, each loop counting one more trip for its exit check, worst
/// case over its variants' lane counts (the partial loops run only with fewer than 16).
/// Per tile of 64 keys: the S slabs (a Q/K load of 4 quads, each `qload4`'s or
/// `load4`'s 4-trip loop, and 16 head-dim columns), the partial maxima, the V slabs (2
/// quads' loads, VK keys). Around it: the first slab's load, the resumed and stored
/// output quads (4-trip loops each), the partial sums. Tiles: one more than whole ones,
/// as the loop starts at a multiple of 4, not of 64.
pub fn micro_iterations(s: &AttentionShape) -> u64 {
    let need = s.head_dim.max(s.head_dim_v) as u64;
    let Some(dmax) = [64u64, 128, 256].into_iter().find(|&d| need <= d) else {
        return u64::MAX;
    };
    let load_qk = 4 * 5;
    let load_v = 2 * 5;
    let (vk, partials) = (2048 / dmax, 16);
    let slabs = (s.head_dim as u64).div_ceil(16);
    let per_tile =
        1 + (slabs * (1 + load_qk + 16 + 1) + 1) + partials + ((64 / vk) * (1 + load_v.max(load_qk) + vk + 1) + 1);
    let tiles = (s.len_k as u64).div_ceil(64) + 1;
    let quads = 4 * (dmax / 64) * 5;
    1 + tiles * per_tile + load_qk + 2 * quads + partials
}

/// `flash_coop.wgsl` as it runs under llvmpipe's cap: only there, with its coop
/// operations emulated (`kernels::coop_emulation`), so the model counts the
/// emulation's loops too. The kernel that runs may be any variant of the class a
/// tuning table or `Context::use_coop_variants` pins, on subgroups of 8 or 16 lanes
/// (`Context::emulate_cooperative_matrix` refuses narrower ones under a cap, where a
/// single tile could pass it), so this is the largest count over every such variant
/// that fits 32 KiB with one band per subgroup ([`coop_variant_iterations`]; a pinned
/// two-band form is counted by [`fused_iterations`]).
pub fn coop_iterations(s: &AttentionShape) -> u64 {
    let need = s.head_dim.max(s.head_dim_v) as u32;
    let Some(class) = [64, 128, 256].into_iter().find(|&c| need <= c) else {
        return u64::MAX;
    };
    [8, 16]
        .into_iter()
        .flat_map(|sg| {
            crate::kernels::tune::coop_forms(class, sg, 32 * 1024, u32::MAX)
                .into_iter()
                .filter(|v| v.bands == 1)
                .map(move |v| coop_variant_iterations(s, v, sg))
        })
        .max()
        .unwrap_or(u64::MAX)
}

/// One coop variant's loop trips under the emulation on `sg`-lane subgroups (`sg`
/// dividing 16), every loop counted with its exit check, every tile assumed to rescale
/// and to stage by elements or words, whichever loops more. Per tile: the P·V and score
/// chunks (a fragment load or store is 256/sg trips, a multiply-add 256/sg times 16
/// plus 2; a split variant's subgroups each take their part of the output tiles and
/// score chunks, Q's chunks in `qs` a load more each), the softmax over each lane's
/// rows, the rescale through `ss`, the staging (by elements, by words fetched and put,
/// or copied CW = 4 at a time). Around it: Q staging, fragments and their warm chain,
/// clears, the first tile, the last P·V, resume and store.
pub fn coop_variant_iterations(s: &AttentionShape, v: crate::kernels::flash::CoopVariant, sg: u32) -> u64 {
    let sg = u64::from(sg.clamp(1, 16));
    let (br, bc, dmax) = (u64::from(v.br), u64::from(v.bc), u64::from(v.dmax));
    let looped = |n: u64| n + 1;
    let slots = 256 / sg;
    let bands = u64::from(v.bands.max(1));
    let split = u64::from(v.split.max(1));
    let rows = (16 / (sg * split)).max(1) * bands;
    let nt = (br / (16 * bands) * sg * split).max(1);
    let (d16, kc) = (dmax / 16, bc / 16);
    let (oh, kh) = (d16 / split, (kc / split).max(1));
    let qr = u64::from(v.qr).min(d16);
    let qk = d16 - qr;
    let quads = bc / 4;
    let (load, store, mma) = (looped(slots), looped(slots), slots * 18 + 1);
    let npre = (bc * dmax / 4).div_ceil(nt);
    let copies = (bc * dmax / 4).div_ceil(4 * nt);
    let stage_one = looped((bc * dmax).div_ceil(nt))
        .max(2 * looped(npre))
        .max(looped(copies) + copies * looped(4));
    let pv = looped(kc) + kc * (looped(bands) + bands * load + looped(oh) + oh * (load + looped(bands) + bands * mma));
    let from_qs = if qr > 0 {
        looped(qr) + qr * (load + looped(bands) + bands * (load + mma))
    } else {
        0
    };
    let scores = looped(kh)
        + kh * (2 * looped(bands)
            + bands * (store + slots)
            + looped(qk)
            + qk * (load + looped(bands) + bands * mma)
            + from_qs);
    let softmax = looped(rows) + rows * (2 * looped(quads) + 2 + 4);
    let rounds = d16.div_ceil(kc.max(1));
    let through_ss = looped(rounds)
        + rounds
            * (2 * looped(bands)
                + bands * (2 * looped(kc) + kc * (load + store))
                + looped(rows)
                + rows * looped(quads));
    let per_tile = 1 + 2 * looped(2) + 2 * stage_one + pv + scores + softmax + through_ss;
    let rows_out = looped(rounds)
        + rounds
            * (looped(rows)
                + rows * (looped(quads) + quads * looped(4))
                + looped(bands)
                + bands * (looped(kc) + kc * load));
    let around = looped((br * dmax).div_ceil(nt))
        + looped(bands)
        + bands * (looped(qk) + qk * load)
        + looped(bands)
        + bands * (looped(qk) + qk * mma + store)
        + looped(rows)
        + looped(d16 * bands)
        + looped((bc * (dmax + 8)).div_ceil(nt))
        + looped((16 * bands * (bc + 8)).div_ceil(sg))
        + stage_one
        + pv
        + 2 * rows_out
        + looped(rows);
    let tiles = (s.len_k as u64).div_ceil(bc);
    1 + tiles * per_tile + around
}

/// `flash_backward.wgsl`'s dQ pass over `keys` keys (each loop counting one more trip
/// for its exit check, and every qload4/doload4/load4 tail loop as 5 trips where it
/// can run). Per block of 4 keys: the block, the score dots (4 K loads each), the dP
/// dots (4 V loads each) and the dQ update (4 K loads each). Around it: the Q and dO
/// rows (a 4-trip loop per vec4), the store (4 trips per vec4). (d4, dv4) are the
/// vec4s each of a row's `lanes` walks; lanes past one add two butterflies of shuffles
/// per block (row_sum_lanes).
pub fn backward_dq_iterations((d4, dv4): (u64, u64), lanes: u32, keys: usize) -> u64 {
    let blocks = keys.div_ceil(4) as u64;
    let per_block = 1 + (d4 + 1 + 20) + (dv4 + 1 + 20) + (d4 + 1 + 20) + butterflies(lanes);
    1 + blocks * per_block + 6 * d4 + 6 * dv4 + 5 * d4 + 4
}

/// `flash_backward.wgsl`'s dK/dV pass over `rows` query rows of each of the group's
/// query heads. Per block of 4 rows: the block, the score dots (4 qload4 of 5 trips
/// each per vec4), the dP dots and dV update (4 doload4 per vec4) and the dK update (4
/// qload4 per vec4). Around it: the two searches for the rows the keys are visible to,
/// the K and V rows, the group loop, the stores. (d4, dv4) and `lanes` as for dQ.
pub fn backward_dkdv_iterations((d4, dv4): (u64, u64), lanes: u32, rows: usize, group: u64) -> u64 {
    let blocks = rows.div_ceil(4) as u64;
    let per_block = 1 + (d4 * 21 + 1) + (dv4 * 21 + 1) + (d4 * 21 + 1) + butterflies(lanes);
    // Two binary searches for the rows the workgroup's keys are visible to.
    let searches = 2 * (u64::from(usize::BITS - rows.leading_zeros()) + 2);
    1 + searches + group * (2 + blocks * per_block) + 6 * d4 + 6 * dv4 + 5 * (d4 + dv4) + 4
}

/// Two row_sum_lanes over `lanes` lanes: each a loop of log2(lanes) shuffles, or of
/// `lanes - 1` workgroup-memory reads without subgroups, and its exit check (none with
/// one lane). The larger: `lanes` trips each.
fn butterflies(lanes: u32) -> u64 {
    if lanes > 1 {
        2 * u64::from(lanes)
    } else {
        0
    }
}

/// `flash_backward_subgroup.wgsl`'s dQ pass over `keys` keys. Per block of 16 keys:
/// the block, the score octets, the dP octets, the masking loop over 4 quads and the
/// dQ octets. Around it: the Q and dO octets into workgroup memory, the accumulator
/// cleared, 4 rows stored.
pub fn backward_subgroup_dq_iterations(s: &AttentionShape, keys: usize) -> u64 {
    let blocks = keys.div_ceil(16) as u64;
    let (d8, dv8) = ((s.head_dim as u64).div_ceil(8), (s.head_dim_v as u64).div_ceil(8));
    let per_block = 1 + (d8 + 1) + (dv8 + 1) + 5 + (d8 + 1);
    let around = (d8 + 1) + (dv8 + 1) + (d8 + 1) + 5 + 4 * (s.head_dim as u64 + 1);
    1 + blocks * per_block + around
}

/// `flash_backward_subgroup.wgsl`'s dK/dV pass over `rows` query rows of each of the
/// group's query heads. Per block of 16 rows: the block, the score octets, the dP
/// octets, the masking loop over 4 quads, the dV and the dK octets. Around it: the two
/// searches for the rows the keys are visible to, the K and V octets, both
/// accumulators cleared, the group loop, 4 keys' dK and dV stored.
pub fn backward_subgroup_dkdv_iterations(s: &AttentionShape, rows: usize) -> u64 {
    let blocks = rows.div_ceil(16) as u64;
    let group = (s.heads_q / s.heads_kv.max(1)) as u64;
    let (d8, dv8) = ((s.head_dim as u64).div_ceil(8), (s.head_dim_v as u64).div_ceil(8));
    let per_block = 1 + (d8 + 1) + (dv8 + 1) + 5 + (dv8 + 1) + (d8 + 1);
    let searches = 2 * (u64::from(usize::BITS - rows.leading_zeros()) + 2);
    let stores = 5 + 4 * (s.head_dim as u64 + 1 + s.head_dim_v as u64 + 1);
    let around = searches + 2 * ((d8 + 1) + (dv8 + 1)) + stores;
    1 + group * (2 + blocks * per_block) + around
}

/// `backward_materialized.wgsl`'s longest invocation: dQ walks every key for each
/// head-dim element, dK/dV every row of the group's heads for each; dX's dot products
/// are short beside them.
pub fn backward_materialized_iterations(s: &AttentionShape) -> u64 {
    let group = (s.heads_q / s.heads_kv.max(1)) as u64;
    let (d, dv) = (s.head_dim as u64, s.head_dim_v as u64);
    let dq = 1 + d * (s.len_k as u64 + 2);
    let dkdv = 1 + d.max(dv) * (2 + group * (s.len_q as u64 + 2));
    let ds = 2 + d + dv;
    dq.max(dkdv).max(ds)
}

/// The most keys (a multiple of 4) one dispatch of the fused kernel may walk within
/// a loop cap of `cap` iterations, or `None` if not even one block of 4 fits.
pub fn keys_per_dispatch(
    config: &FlashConfig,
    s: &AttentionShape,
    cap: u64,
    caps: &Capabilities,
    policy: &Policy,
) -> Option<usize> {
    let fits = |keys: usize| {
        let part = AttentionShape { len_k: keys, ..*s };
        fused_iterations(config, &part, caps, policy) <= cap
    };
    // Iterations grow with the keys: binary search for the last block count that fits.
    let (mut lo, mut hi) = (0usize, s.len_k.div_ceil(4));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(4 * mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (lo > 0).then_some(4 * lo)
}

/// Worst-case loop iterations of one invocation of the materialized path (the softmax
/// pass walks a row of scores three times; the other passes less).
pub fn materialized_iterations(s: &AttentionShape) -> u64 {
    3 * s.len_k as u64 + s.head_dim.max(s.head_dim_v) as u64
}

/// Loop iterations of one invocation of the linear layer over `k` inputs. Tiled: per
/// step of 16 along K, the 4-trip staging loop and the 16-trip inner loop; texture: one
/// trip per texel of 4. Plus the store loops.
pub fn linear_iterations(tiling: LinearTiling, k: usize) -> u64 {
    let k = k as u64;
    match tiling {
        LinearTiling::Tiled => k.div_ceil(16) * (1 + 4 + 16) + 16,
        // The first slab's 4 row loads (each with a 4-trip loop) and 4-trip transpose;
        // per slab of 16: the next slab's loads, the 16-trip inner loop (a 4-trip loop
        // in each), the transpose; then 8 x 2 stores. Each loop counts its exit check.
        LinearTiling::Blocked => {
            (4 * 6 + 1) + 5 + k.div_ceil(16) * (1 + (4 * 6 + 1) + (16 * 6 + 1) + 5) + 1 + 8 * 4 + 1
        }
        // One trip per texel of K, then per row group (2) four store loops of 4 trips,
        // each loop's exit check counted.
        LinearTiling::Texture => k.div_ceil(4) + 1 + 2 * 4 * 5,
        // Per slab of 32: the staging loop at its longest (128 x 32 pairs element by
        // element over 4 subgroups of at least 8: 128 trips) and two 16-wide steps; then
        // 16 output tiles of 256 / 8 elements per lane. Each loop counts its exit check.
        LinearTiling::Coop => 1 + k.div_ceil(32) * (1 + (128 + 1) + (2 + 1)) + 16 * (32 + 1),
    }
}

/// Loop iterations of one invocation of the strided GEMM (`gemm_strided.wgsl`) over a
/// contraction of `depth`: per step of 16, the step, the 4-trip staging loop and the
/// 16-trip inner loop; then the 4 x 4 stores. Each loop counts its exit check.
pub fn gemm_iterations(depth: usize) -> u64 {
    (depth as u64).div_ceil(16) * (1 + 5 + 17) + 1 + 4 * 5 + 1
}

/// Loop iterations of one invocation of the layer norm's backward row pass: four
/// passes over the row (mean, variance, the two sums, the gradient).
pub fn layer_norm_backward_row_iterations(width: usize) -> u64 {
    4 * (width as u64 + 1)
}

/// Loop iterations of one invocation of the layer norm's backward column pass over
/// `rows` rows.
pub fn layer_norm_backward_column_iterations(rows: usize) -> u64 {
    rows as u64 + 1
}

/// Loop iterations of one invocation of the layer norm: three passes over the row.
pub fn layer_norm_iterations(width: usize) -> u64 {
    3 * width as u64
}

/// Refuses, under a loop cap, work that needs more loop iterations per invocation than
/// the cap (it would silently stop early); `what` names the work.
pub fn check(ctx: &Gpu, what: impl FnOnce() -> String, needed: u64) -> Result<()> {
    match ctx.loop_cap() {
        Some(cap) if needed > cap => Err(over_cap(what(), needed, cap)),
        _ => Ok(()),
    }
}

/// The error for work (`what`) that would need `needed` loop iterations per invocation
/// under a cap of `cap`.
pub fn over_cap(what: String, needed: u64, cap: u64) -> Error {
    Error::LimitExceeded {
        what,
        limit: "the driver's cap on loop iterations per invocation: llvmpipe before Mesa 25",
        unit: "loop iterations",
        requested: needed,
        max: cap,
    }
}
