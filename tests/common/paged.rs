//! Paged inputs for the paged-KV tests: a pool of random pages, a shuffled block table,
//! and the same keys gathered into ordinary tensors, so attention through the table can
//! be compared bit for bit with attention over the gathered keys.

use wgpu_attention::check::Rng;
use wgpu_attention::{
    relayout, sdpa, sdpa_paged, AttentionOptions, AttentionOutput, Context, DType, Layout, PageTable, Tensor,
};

pub const HKV: usize = 2;
pub const D: usize = 20;
pub const DV: usize = 12;
/// Not a multiple of 4, so pages cut the kernels' groups of 4 keys.
pub const PAGE: usize = 5;

pub struct PagedInputs {
    pub table: PageTable,
    /// Pools `[P, HKV, PAGE, dim]` in BSHD (vLLM's `[P, page, Hkv, dim]`).
    pub k_pages: Tensor,
    pub v_pages: Tensor,
    /// The keys the table gives each batch element, `[B, HKV, pages · PAGE, dim]` BHSD.
    pub k: Tensor,
    pub v: Tensor,
}

impl PagedInputs {
    /// `batch` sequences of `per_sequence` pages each, drawn in a shuffled order from a
    /// pool of `pages` (some never used); every page holds finite values.
    pub fn new(
        ctx: &Context,
        dtype: DType,
        rng: &mut Rng,
        (batch, per_sequence, pages): (usize, usize, usize),
    ) -> Self {
        let mut order: Vec<u32> = (0..pages as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let table = PageTable::new(batch, per_sequence, order[..batch * per_sequence].to_vec()).expect("table");
        let mut pool = |dim| {
            let data = super::rounded(dtype, rng.vec(pages * HKV * PAGE * dim, -1.0, 1.0));
            let shape = [pages, HKV, PAGE, dim];
            let bshd = relayout(&data, shape, Layout::Bhsd, Layout::Bshd);
            let pool = Tensor::from_f32_as(ctx, shape, Layout::Bshd, dtype, &bshd).expect("upload pool");
            let gathered = gather(&data, dim, &table);
            let dense = Tensor::from_f32_as(
                ctx,
                [batch, HKV, per_sequence * PAGE, dim],
                Layout::Bhsd,
                dtype,
                &gathered,
            )
            .expect("upload");
            (pool, dense)
        };
        let (k_pages, k) = pool(D);
        let (v_pages, v) = pool(DV);
        PagedInputs {
            table,
            k_pages,
            v_pages,
            k,
            v,
        }
    }

    /// Attention of `q` through the table equals attention over the gathered keys bit
    /// for bit: output, lse (when asked for) and weights (when asked for).
    pub fn assert_same(&self, ctx: &Context, q: &Tensor, options: &AttentionOptions, what: &str) {
        let want = sdpa(ctx, q, &self.k, &self.v, options).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = sdpa_paged(ctx, q, &self.k_pages, &self.v_pages, &self.table, options)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let bits = |t: Option<&Tensor>| -> Option<Vec<u32>> {
            t.map(|t| {
                t.to_f32_vec(ctx)
                    .expect("read back")
                    .iter()
                    .map(|x| x.to_bits())
                    .collect()
            })
        };
        let all = |o: &AttentionOutput| [bits(Some(&o.out)), bits(o.lse.as_ref()), bits(o.weights.as_ref())];
        for (name, (g, w)) in ["output", "lse", "weights"]
            .iter()
            .zip(all(&got).into_iter().zip(all(&want)))
        {
            assert!(
                g == w,
                "{what}: {name} through the table differs from the gathered keys'"
            );
        }
    }
}

/// The keys the table gives batch element by batch element: `[B, HKV, pages · PAGE,
/// dim]` BHSD from a pool `[P, HKV, PAGE, dim]` BHSD.
fn gather(pool: &[f32], dim: usize, table: &PageTable) -> Vec<f32> {
    let mut out = Vec::new();
    for b in 0..table.batch() {
        for h in 0..HKV {
            for &page in table.pages(b).expect("a row per batch element") {
                out.extend_from_slice(&pool[((page as usize * HKV + h) * PAGE) * dim..][..PAGE * dim]);
            }
        }
    }
    out
}
