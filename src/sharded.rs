//! Attention with the keys split across several [`Context`]s (devices, or several
//! contexts on one adapter) in one process: each shard attends its queries to its own
//! block of keys with the block's place on the whole key axis
//! ([`AttentionOptions::position_offset`]), its output and log-sum-exp travel to one
//! context through the host, and [`crate::merge_attentions`] combines them there
//! (docs/design.md, "Merging partial attentions"). Native only: the partials are read
//! back with blocking calls.

use crate::attention::sdpa;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::merge::{merge_attentions, Merged};
use crate::options::AttentionOptions;
use crate::tensor::{DType, Layout, Tensor};

/// One shard: keys `key_offset .. key_offset + Lk_shard` of the whole sequence, on
/// `ctx`, with the queries (every shard holds the same queries, uploaded to its own
/// context).
pub struct KeyShard<'a> {
    /// The context the shard's tensors belong to.
    pub ctx: &'a Context,
    /// `[B, Hq, Lq, D]`: the same queries on every shard.
    pub q: &'a Tensor,
    /// `[B, Hkv, Lk_shard, D]`.
    pub k: &'a Tensor,
    /// `[B, Hkv, Lk_shard, Dv]`.
    pub v: &'a Tensor,
    /// Where the shard's first key sits on the whole key axis.
    pub key_offset: usize,
}

/// Attention of the queries over the keys of every shard, `total_keys` in all, as one
/// call over all of them with `options` would give it: each shard attends on its own
/// context, its partial goes to `merge_ctx` (through the host unless it is that
/// context) and the partials are merged there. Key lengths, the causal mask, windows
/// and ALiBi are measured on the whole key axis (each shard's key lengths cut to its
/// block), and an explicit mask spans it (each shard takes its columns,
/// [`crate::Mask::key_columns`]). Weights and `align_to_key_lengths` are refused: they
/// do not split by key block here.
pub fn sdpa_sharded(
    merge_ctx: &Context,
    shards: &[KeyShard],
    total_keys: usize,
    options: &AttentionOptions,
) -> Result<Merged> {
    let refuse = |what: &str| Err(Error::unsupported("sharded attention", what.to_string(), "left out"));
    if options.need_weights {
        return refuse("attention weights");
    }
    if options.align_to_key_lengths {
        return refuse("align_to_key_lengths");
    }
    let covered: usize = shards.iter().map(|s| s.k.shape()[2]).sum();
    if shards.is_empty() || covered != total_keys {
        return Err(Error::invalid(
            "shards of sharded attention",
            format!("their keys add up to {covered}, not total_keys = {total_keys} (and there must be one shard)"),
        ));
    }
    check_tiling(shards, total_keys)?;
    let len_q = shards[0].q.shape()[2];
    let global = options.query_position_offset(len_q, total_keys);
    let mut partials = Vec::with_capacity(shards.len());
    for (n, shard) in shards.iter().enumerate() {
        let len = shard.k.shape()[2];
        if shard.key_offset + len > total_keys {
            return Err(Error::invalid(
                format!("shard {n} of sharded attention"),
                format!(
                    "keys {} .. {} past total_keys = {total_keys}",
                    shard.key_offset,
                    shard.key_offset + len
                ),
            ));
        }
        let mask = match &options.mask {
            Some(m) => Some(m.key_columns(shard.key_offset, len, total_keys)?),
            None => None,
        };
        let shard_options = AttentionOptions {
            mask,
            position_offset: Some(global - shard.key_offset as i64),
            key_lengths: options.key_lengths.as_ref().map(|lens| {
                lens.iter()
                    .map(|&l| (l as usize).clamp(shard.key_offset, shard.key_offset + len) - shard.key_offset)
                    .map(|l| l as u32)
                    .collect()
            }),
            need_lse: true,
            output_layout: Some(Layout::Bhsd),
            ..options.clone()
        };
        let out = sdpa(shard.ctx, shard.q, shard.k, shard.v, &shard_options)?;
        let lse = out.lse.ok_or_else(|| Error::invalid("sharded attention", "no lse"))?;
        partials.push(to_context(shard.ctx, merge_ctx, out.out, lse)?);
    }
    let outputs: Vec<&Tensor> = partials.iter().map(|(o, _)| o).collect();
    let lses: Vec<&Tensor> = partials.iter().map(|(_, l)| l).collect();
    merge_attentions(merge_ctx, &outputs, &lses)
}

/// Refuses shards that do not tile the key axis: taken in order of their offsets, each
/// must start where the one before it ended, the first at 0, the last ending at
/// `total_keys` (overlapping shards whose lengths happen to add up would count some
/// keys twice and silently give another answer).
fn check_tiling(shards: &[KeyShard], total_keys: usize) -> Result<()> {
    let mut blocks: Vec<(usize, usize, usize)> = shards
        .iter()
        .enumerate()
        .map(|(n, s)| (s.key_offset, s.k.shape()[2], n))
        .collect();
    blocks.sort_unstable();
    let mut next = 0;
    for (offset, len, n) in blocks {
        if offset != next {
            let how = if offset < next {
                "overlaps the keys of another shard"
            } else {
                "leaves a gap before it"
            };
            return Err(Error::invalid(
                format!("shard {n} of sharded attention"),
                format!(
                    "keys {offset} .. {} {how}: shards must tile 0 .. {total_keys} (the next free key is {next})",
                    offset + len
                ),
            ));
        }
        next = offset + len;
    }
    Ok(())
}

/// A partial's output and lse on `to`: themselves if `from` is `to`, else copied
/// through the host.
fn to_context(from: &Context, to: &Context, out: Tensor, lse: Tensor) -> Result<(Tensor, Tensor)> {
    if from.id() == to.id() {
        return Ok((out, lse));
    }
    let moved_out = match out.dtype() {
        DType::F32 => Tensor::from_f32(to, out.shape(), out.layout(), &out.to_f32_vec(from)?)?,
        DType::F16 => Tensor::from_f16(to, out.shape(), out.layout(), &out.to_f16_vec(from)?)?,
    };
    let moved_lse = Tensor::from_f32(to, lse.shape(), Layout::Bhsd, &lse.to_f32_vec(from)?)?;
    Ok((moved_out, moved_lse))
}
