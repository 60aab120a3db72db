//! The block table of a paged KV cache (docs/design.md, "Paged KV"): which pool pages
//! hold each sequence's keys, in order. The append, texel-mirror and attention kernels
//! read it; `crate::paged_kv` hands pages out.

use crate::error::{checked_product, Error, Result};
use crate::problem::AttentionShape;

/// Which pages of a pool hold each batch element's keys: `[B, pages_per_sequence]`
/// page indices, row `b` listing element `b`'s pages in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageTable {
    batch: usize,
    pages_per_sequence: usize,
    entries: Vec<u32>,
}

impl PageTable {
    /// A table of `batch` rows of `pages_per_sequence` entries, row-major.
    pub fn new(batch: usize, pages_per_sequence: usize, entries: Vec<u32>) -> Result<Self> {
        if batch == 0 || pages_per_sequence == 0 {
            return Err(Error::unsupported(
                "block table",
                format!("{batch} x {pages_per_sequence}"),
                "at least one batch element and one page per sequence",
            ));
        }
        let want = checked_product("block table entries", &[batch, pages_per_sequence])?;
        if entries.len() != want {
            return Err(Error::shape(
                "block table entries",
                format!("{want} ({batch} x {pages_per_sequence})"),
                entries.len(),
            ));
        }
        Ok(PageTable {
            batch,
            pages_per_sequence,
            entries,
        })
    }

    /// A table from each sequence's pages, shorter rows padded with their own last
    /// page (page 0 for a sequence without pages): padding is read only as masked keys
    /// (rows past the key lengths), and reading a sequence's own page keeps those rows
    /// finite wherever the sequence's own values are.
    pub fn from_sequences(sequences: &[&[u32]]) -> Result<Self> {
        let width = sequences.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
        let mut entries = Vec::with_capacity(sequences.len() * width);
        for pages in sequences {
            let pad = pages.last().copied().unwrap_or(0);
            entries.extend_from_slice(pages);
            entries.extend(std::iter::repeat_n(pad, width - pages.len()));
        }
        PageTable::new(sequences.len(), width, entries)
    }

    /// Rows of the table: the batch size `B`, one sequence per row.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Entries per row: the most pages any sequence in the batch uses.
    pub fn pages_per_sequence(&self) -> usize {
        self.pages_per_sequence
    }

    /// All entries, row-major `[B, pages_per_sequence]`.
    pub fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// Batch element `b`'s pages, in key order (`None` past the last element).
    pub fn pages(&self, b: usize) -> Option<&[u32]> {
        self.entries.chunks_exact(self.pages_per_sequence).nth(b)
    }

    /// The problem that attention of `q` `[B, Hq, Lq, D]` through this table over the
    /// pools `k` `[P, Hkv, page_size, D]` and `v` `[P, Hkv, page_size, Dv]` solves:
    /// keys `[B, Hkv, pages_per_sequence · page_size, D]`. Refuses pools that disagree
    /// and entries naming no page.
    pub(crate) fn logical_shape(&self, q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> Result<AttentionShape> {
        let [pages, heads_kv, page_size, d] = k;
        if v[..3] != k[..3] {
            return Err(Error::shape(
                "pages, heads and page size of the value pool",
                format!("{:?} (from the key pool)", &k[..3]),
                format!("{:?}", &v[..3]),
            ));
        }
        if q[0] != self.batch {
            return Err(Error::shape(
                "rows of the block table (one per batch element of q)",
                q[0],
                self.batch,
            ));
        }
        if page_size == 0 {
            return Err(Error::unsupported("page size", 0, "at least 1 row"));
        }
        if let Some((at, &page)) = self.entries.iter().enumerate().find(|(_, &e)| e as usize >= pages) {
            return Err(Error::invalid(
                "block table",
                format!(
                    "entry {} of batch element {} names page {page}, but the pool has {pages} pages",
                    at % self.pages_per_sequence,
                    at / self.pages_per_sequence
                ),
            ));
        }
        let len_k = checked_product(
            "keys per sequence (pages per sequence x page size)",
            &[self.pages_per_sequence, page_size],
        )?;
        AttentionShape::from_qkv(q, [self.batch, heads_kv, len_k, d], [self.batch, heads_kv, len_k, v[3]])
    }
}
