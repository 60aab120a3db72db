//! Paged KV (vLLM-style): keys and values of many sequences kept in one pool of
//! fixed-size pages, each sequence owning a list of pages in order (its block table), so
//! sequences of different lengths share memory without reserving their longest length
//! (docs/design.md, "Paged KV").
//!
//! [`PageTable`] is the table the kernels read through ([`crate::sdpa_paged`]);
//! [`PagedKvCache`] owns a pool and hands its pages out to sequences as they grow.

use crate::attention::{encode_sdpa_with_texels, AttentionOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::kv_append;
use crate::kernels::kv_texels::{self, KvTexels};
pub use crate::kernels::page_table::PageTable;
use crate::kv_cache::{check_attendable, check_new_rows};
use crate::options::AttentionOptions;
use crate::rotary::Rotary;
use crate::tensor::{DType, Layout, Tensor};

/// Identifies one sequence of a [`PagedKvCache`]: a slot and the generation of its
/// occupant, so the id of a removed sequence never names the one that reuses its slot.
/// An id does not name its cache: one given to another cache may name a sequence there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SequenceId {
    slot: usize,
    generation: u64,
}

#[derive(Clone, Debug, Default)]
struct Sequence {
    generation: u64,
    pages: Vec<u32>,
    len: u32,
}

/// One attention layer's keys and values for many sequences in a pool of pages: K
/// `[P, Hkv, page_size, D]` and V `[P, Hkv, page_size, Dv]` in one layout and dtype
/// (BSHD is vLLM's `[P, page_size, Hkv, D]`).
///
/// Sequences are added and removed at will; appending rows takes free pages as a
/// sequence needs them (an append the free pages cannot hold is refused with
/// [`crate::Error::CapacityExceeded`] and changes nothing), and removing a sequence frees its pages for others. [`PagedKvCache::attend`]
/// runs attention of a batch of sequences' new queries against what each holds, as
/// [`crate::KvCache::attend`] does.
///
/// Like [`crate::KvCache`], the pool keeps a texel mirror of K and V where split-K
/// decode takes its subgroup design (lavapipe), which every page clear and append
/// updates and decode reads instead of the buffers ([`PagedKvCache::set_texel_mirror`]
/// drops it; docs/design.md, "KV cache").
pub struct PagedKvCache {
    k: Tensor,
    v: Tensor,
    texels: Option<KvTexels>,
    free: Vec<u32>,
    sequences: Vec<Option<Sequence>>,
    /// Generations handed out so far.
    generations: u64,
    /// Keys are rotated as they are appended, queries as they attend.
    rotary: Option<Rotary>,
}

/// What a [`PagedKvCache`] holds: sizes by name, so that none can be given for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedKvConfig {
    /// Pages in the pool, shared by every sequence.
    pub pages: usize,
    /// Rows per page (vLLM uses 16).
    pub page_size: usize,
    /// Key/value heads (`Hkv`).
    pub heads_kv: usize,
    /// Key head dim `D`.
    pub head_dim: usize,
    /// Value head dim `Dv` (usually `D`).
    pub head_dim_v: usize,
    /// Layout of the pool's tensors `[pages, Hkv, page_size, D]` (`Bshd`: vLLM's
    /// `[pages, page_size, Hkv, D]`).
    pub layout: Layout,
    /// The pool's dtype, and that of the rows appended.
    pub dtype: DType,
}

impl PagedKvCache {
    /// An empty pool as `config` describes.
    pub fn new(ctx: &Context, config: PagedKvConfig) -> Result<Self> {
        let PagedKvConfig {
            pages,
            page_size,
            heads_kv,
            head_dim,
            head_dim_v,
            layout,
            dtype,
        } = config;
        if pages == 0 || pages > u32::MAX as usize / 2 {
            return Err(Error::unsupported("KV pool pages", pages, "1 to 2^31 - 1"));
        }
        if page_size == 0 || page_size > u32::MAX as usize / 2 {
            return Err(Error::unsupported("KV page size", page_size, "1 to 2^31 - 1 rows"));
        }
        check_attendable(ctx, 1, heads_kv, page_size, head_dim, head_dim_v, dtype)?;
        // Pages are cleared when handed out, by buffer clears, which need whole 4-byte words.
        let odd = |dim: usize| {
            let bytes = heads_kv as u128 * page_size as u128 * dim as u128 * dtype.size() as u128;
            !bytes.is_multiple_of(4)
        };
        if odd(head_dim) || odd(head_dim_v) {
            return Err(Error::unsupported(
                "KV page size",
                page_size,
                "a page of f16 rows must hold an even number of elements (Hkv x page size x D and x Dv)",
            ));
        }
        // Buffers start zeroed, and a page is cleared again whenever it is handed to a
        // sequence: rows past a length are never another sequence's (no result depends
        // on them, docs/design.md "Semantics", but nothing of a freed page's last owner
        // should outlive it).
        let k = Tensor::empty(ctx, [pages, heads_kv, page_size, head_dim], layout, dtype)?;
        let v = Tensor::empty(ctx, [pages, heads_kv, page_size, head_dim_v], layout, dtype)?;
        // New textures are zeroed too.
        let texels = KvTexels::for_new_cache(ctx, ctx.policy(), &k, &v);
        Ok(PagedKvCache {
            k,
            v,
            texels,
            // Popped from the end: pages are handed out in ascending order.
            free: (0..pages as u32).rev().collect(),
            sequences: Vec::new(),
            generations: 0,
            rotary: None,
        })
    }

    /// Whether the pool keeps K and V as texels too, for split-K decode's subgroup
    /// design (by default where that design is taken and the textures fit).
    pub fn has_texel_mirror(&self) -> bool {
        self.texels.is_some()
    }

    /// Keeps (`on`) or drops the texel mirror of K and V, as
    /// [`crate::KvCache::set_texel_mirror`] does; keeping one copies the whole pool into
    /// it.
    pub fn set_texel_mirror(&mut self, ctx: &Context, on: bool) -> Result<()> {
        let (k, v) = (&self.k, &self.v);
        let every_page: Vec<u32> = (0..k.shape()[0] as u32).collect();
        kv_texels::set_mirror(&mut self.texels, ctx, ctx.policy(), (k, v), on, |encoder, texels| {
            texels.record_pages(ctx, encoder, k, v, &every_page)
        })
    }

    /// Rows per page.
    pub fn page_size(&self) -> usize {
        self.k.shape()[2]
    }

    /// Pages no sequence holds.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// The key pool `[P, Hkv, page_size, D]`. Read it freely; writes other than through
    /// the cache never reach its texel mirror, which decode reads on lavapipe.
    pub fn keys(&self) -> &Tensor {
        &self.k
    }

    /// The value pool `[P, Hkv, page_size, Dv]` (writes as for [`PagedKvCache::keys`]).
    pub fn values(&self) -> &Tensor {
        &self.v
    }

    /// A new, empty sequence.
    pub fn add_sequence(&mut self) -> SequenceId {
        self.generations += 1;
        let sequence = Sequence {
            generation: self.generations,
            ..Default::default()
        };
        let slot = match self.sequences.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                self.sequences.push(None);
                self.sequences.len() - 1
            }
        };
        self.sequences[slot] = Some(sequence);
        SequenceId {
            slot,
            generation: self.generations,
        }
    }

    /// Forgets a sequence and frees its pages.
    pub fn remove_sequence(&mut self, id: SequenceId) -> Result<()> {
        self.sequence(id)?;
        let seq = self.sequences[id.slot].take().unwrap_or_default();
        self.free.extend(seq.pages.iter().rev());
        Ok(())
    }

    /// Rows a sequence holds.
    pub fn len(&self, id: SequenceId) -> Result<usize> {
        Ok(self.sequence(id)?.len as usize)
    }

    /// A sequence's pages, in key order.
    pub fn pages(&self, id: SequenceId) -> Result<&[u32]> {
        Ok(&self.sequence(id)?.pages)
    }

    /// The block table of `ids`, one row each.
    pub fn table(&self, ids: &[SequenceId]) -> Result<PageTable> {
        if ids.is_empty() {
            return Err(Error::invalid("sequences for a block table", "none given"));
        }
        let pages: Vec<&[u32]> = ids.iter().map(|&id| self.pages(id)).collect::<Result<_>>()?;
        PageTable::from_sequences(&pages)
    }

    /// Appends all `n` rows of `k_new` `[N, Hkv, n, D]` and `v_new` `[N, Hkv, n, Dv]`
    /// (the pool's dtype, any layout) to the sequences `ids` (N of them, distinct).
    pub fn append(&mut self, ctx: &Context, ids: &[SequenceId], k_new: &Tensor, v_new: &Tensor) -> Result<()> {
        let n = u32::try_from(k_new.shape()[2]).unwrap_or(u32::MAX);
        self.append_rows(ctx, ids, k_new, v_new, &vec![n; ids.len()])
    }

    /// Appends the first `counts[i]` of the `n` rows of `k_new` and `v_new` to sequence
    /// `ids[i]`.
    pub fn append_rows(
        &mut self,
        ctx: &Context,
        ids: &[SequenceId],
        k_new: &Tensor,
        v_new: &Tensor,
        counts: &[u32],
    ) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::invalid("sequences to append to", "none given"));
        }
        // Before anything is recorded, so a foreign pool is named as such rather than
        // surfacing as a wgpu validation error on the page clears.
        self.k.check_context(ctx, "paged KV pool")?;
        self.check_rows(ctx, "k_new", k_new, ids.len(), self.k.shape()[3])?;
        self.check_rows(ctx, "v_new", v_new, ids.len(), self.v.shape()[3])?;
        let n = k_new.shape()[2];
        if v_new.shape()[2] != n {
            return Err(Error::shape(
                "rows of v_new",
                format!("{n} (from k_new)"),
                v_new.shape()[2],
            ));
        }
        if counts.len() != ids.len() {
            return Err(Error::shape(
                "append counts",
                format!("{} entries (one per sequence)", ids.len()),
                counts.len(),
            ));
        }
        // Every check before any change: new page lists are built aside and kept only
        // once the writes are recorded and submitted.
        let page_size = self.page_size();
        let mut grown = Vec::with_capacity(ids.len());
        let mut pages_needed = 0;
        for (i, (&id, &count)) in ids.iter().zip(counts).enumerate() {
            if ids[..i].contains(&id) {
                return Err(Error::invalid(
                    "sequences to append to",
                    format!("{id:?} is listed twice"),
                ));
            }
            if count as usize > n {
                return Err(Error::invalid(
                    "append counts",
                    format!("entry {i} is {count}, more than the {n} rows given"),
                ));
            }
            let seq = self.sequence(id)?;
            let rows = seq.len as usize + count as usize;
            if rows > u32::MAX as usize / 2 {
                return Err(Error::unsupported("rows of one sequence", rows, "below 2^31"));
            }
            pages_needed += rows.div_ceil(page_size) - seq.pages.len();
            grown.push((seq.clone(), rows));
        }
        if pages_needed > self.free.len() {
            // The pool's own size, which the caller chose: not a device limit.
            return Err(Error::CapacityExceeded {
                what: format!(
                    "KV pool pages for appends to {} sequences (remove_sequence frees pages)",
                    ids.len()
                ),
                capacity: "the pool's free space",
                unit: "pages",
                requested: pages_needed as u64,
                max: self.free.len() as u64,
            });
        }
        let mut free = self.free.clone();
        let mut handed_out = Vec::new();
        for (seq, rows) in &mut grown {
            while seq.pages.len() * page_size < *rows {
                // Never empty: pages_needed was checked against the free pages above.
                let Some(page) = free.pop() else { break };
                seq.pages.push(page);
                handed_out.push(page);
            }
        }
        let starts: Vec<u32> = grown.iter().map(|(seq, _)| seq.len).collect();
        let table = PageTable::from_sequences(&grown.iter().map(|(seq, _)| &seq.pages[..]).collect::<Vec<_>>())?;
        ctx.record_and_submit("submitting a paged KV append", |encoder| {
            for pool in [&self.k, &self.v] {
                // A page is `[Hkv, page_size, dim]` contiguous elements in either layout.
                let page_bytes = (pool.strides()[0] * pool.dtype().size()) as u64;
                for &page in &handed_out {
                    encoder.clear_buffer(pool.buffer(), u64::from(page) * page_bytes, Some(page_bytes));
                }
            }
            kv_append::encode(
                ctx,
                encoder,
                k_new,
                &self.k,
                &starts,
                counts,
                Some(&table),
                self.rotary.as_ref(),
            )?;
            kv_append::encode(ctx, encoder, v_new, &self.v, &starts, counts, Some(&table), None)?;
            if let Some(texels) = &self.texels {
                // Cleared pages enter the mirror whole, so no former owner's rows stay
                // there past a length; then the appended rows (again where they lie in
                // those pages).
                texels.record_pages(ctx, encoder, &self.k, &self.v, &handed_out)?;
                texels.record_copy(ctx, encoder, &self.k, &self.v, &starts, counts, Some(&table))?;
            }
            Ok(())
        })?;
        for (&id, (mut seq, rows)) in ids.iter().zip(grown) {
            seq.len = rows as u32;
            self.sequences[id.slot] = Some(seq);
        }
        self.free = free;
        Ok(())
    }

    /// Attention of `q` `[N, Hq, Lq, D]` against what the sequences `ids` (N of them)
    /// hold: query `i` of sequence `ids[b]` sits at `len − Lq + i` for the causal mask,
    /// the window and ALiBi (as in [`crate::KvCache::attend`], also for Lq > len), and
    /// keys past each length are masked. Every other option
    /// applies as in [`crate::sdpa_paged`] (`Lk` = the longest sequence's pages times
    /// the page size); `key_lengths` must be left unset.
    pub fn attend(
        &self,
        ctx: &Context,
        ids: &[SequenceId],
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        if options.key_lengths.is_some() {
            return Err(Error::invalid(
                "key lengths with a paged KV cache",
                "the cache supplies them (its sequences' lengths); leave AttentionOptions::key_lengths unset",
            ));
        }
        let lengths: Vec<u32> = ids
            .iter()
            .map(|&id| self.len(id).map(|n| n as u32))
            .collect::<Result<_>>()?;
        let table = self.table(ids)?;
        let options = AttentionOptions {
            key_lengths: Some(lengths.clone()),
            align_to_key_lengths: true,
            ..options.clone()
        };
        ctx.record_and_submit("submitting attention", |encoder| {
            let queries = (q, &lengths[..]);
            crate::rotary::with_cache_queries(ctx, encoder, queries, self.rotary.as_ref(), |encoder, q| {
                let texels = self.texels.as_ref();
                encode_sdpa_with_texels(ctx, encoder, q, &self.k, &self.v, Some(&table), texels, &options)
            })
        })
    }

    /// Sets the rotary embedding (or none) while no sequence holds a row: appended keys
    /// are then rotated as they are written (row s of a sequence at its position
    /// `len + s`) and [`PagedKvCache::attend`] rotates the queries at `len − Lq + i`,
    /// as [`crate::KvCache::set_rotary`] does.
    pub fn set_rotary(&mut self, rotary: Option<Rotary>) -> Result<()> {
        if let Some(r) = &rotary {
            r.check(self.k.shape()[3])?;
        }
        if self.sequences.iter().flatten().any(|seq| seq.len > 0) {
            return Err(Error::invalid(
                "PagedKvCache::set_rotary",
                "a sequence holds rows; set the rotary embedding before anything is appended",
            ));
        }
        self.rotary = rotary;
        Ok(())
    }

    /// The rotary embedding appends and attention apply, if any.
    pub fn rotary(&self) -> Option<&Rotary> {
        self.rotary.as_ref()
    }

    fn sequence(&self, id: SequenceId) -> Result<&Sequence> {
        self.sequences
            .get(id.slot)
            .and_then(Option::as_ref)
            .filter(|s| s.generation == id.generation)
            .ok_or_else(|| Error::invalid("sequence", format!("{id:?} is not in this cache (removed?)")))
    }

    fn check_rows(&self, ctx: &Context, what: &str, t: &Tensor, sequences: usize, dim: usize) -> Result<()> {
        let heads = self.k.shape()[1];
        check_new_rows(ctx, what, t, ("sequences", sequences), heads, dim, self.k.dtype())
    }
}
