//! The uniform block shared by the attention kernels (`struct Params` in
//! `shaders/attention_common.wgsl`; a test checks the two layouts agree).

use bytemuck::{Pod, Zeroable};

/// Mirror of WGSL `Params`. All fields are 4-byte scalars, so WGSL's uniform layout is
/// the C layout; the size is a multiple of 16 as uniform buffers require.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct AttentionParams {
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub len_q: u32,
    pub len_k: u32,
    pub head_dim: u32,
    pub head_dim_v: u32,
    pub scale: f32,
    pub q_stride_b: u32,
    pub q_stride_h: u32,
    pub q_stride_s: u32,
    /// Keys `j > p(i) + right` are masked (a causal mask is `right = 0`).
    pub has_right: u32,
    pub k_stride_b: u32,
    pub k_stride_h: u32,
    pub k_stride_s: u32,
    /// Query `i`'s aligned position is `p(i) = i + pos_offset`.
    pub pos_offset: i32,
    pub v_stride_b: u32,
    pub v_stride_h: u32,
    pub v_stride_s: u32,
    pub has_key_lengths: u32,
    pub o_stride_b: u32,
    pub o_stride_h: u32,
    pub o_stride_s: u32,
    pub mask_kind: u32,
    pub m_stride_b: u32,
    pub m_stride_h: u32,
    pub m_stride_q: u32,
    pub m_stride_k: u32,
    pub bh_start: u32,
    pub bh_count: u32,
    /// Keys the fused kernels walk in this dispatch: `key_begin .. key_stop`. With
    /// `key_begin > 0` they resume from the output and log-sum-exp left by the
    /// previous range (see `kernels::loop_budget`).
    pub key_begin: u32,
    pub key_stop: u32,
    /// Split-K decode: key splits, each a partial result (`flash_decode.wgsl`); 1 elsewhere.
    pub splits: u32,
    pub right: u32,
    /// Keys `j < p(i) − left` are masked (sliding window).
    pub has_left: u32,
    pub left: u32,
    /// Soft cap of the scaled scores; 0 for none.
    pub softcap: f32,
    /// ALiBi slopes follow the key lengths in the side words (`[B]` then `[Hq]`).
    pub has_alibi: u32,
    /// Bottom-right positions measured from each batch element's key length (a KV
    /// cache) instead of `Lk`.
    pub align_to_lengths: u32,
    /// Paged K and V: rows per page (0 for contiguous K and V). Key `j` of batch
    /// element `b` is row `j % page_size` of page `table[b][j / page_size]`, the block
    /// table being side words `table_offset ..` with `table_stride` entries per element.
    pub page_size: u32,
    pub table_offset: u32,
    pub table_stride: u32,
    /// Elements between consecutive pages of K and of V.
    pub k_page_stride: u32,
    pub v_page_stride: u32,
}

/// `mask_kind` values, as the WGSL constants `MASK_*`.
pub const MASK_NONE: u32 = 0;
pub const MASK_BOOL: u32 = 1;
pub const MASK_ADDITIVE: u32 = 2;

impl AttentionParams {
    /// Whether a problem has rules beyond visible key ranges: explicit masks,
    /// soft-capping or ALiBi (the WGSL's `only_key_ranges()` is false).
    pub fn full_rules(&self) -> bool {
        self.mask_kind != 0 || self.softcap != 0.0 || self.has_alibi != 0
    }

    /// Every stride of K and V (batch, head, row, page; K's then V's): what decides
    /// whether their rows can be read as whole 16-byte words.
    pub fn kv_strides(&self) -> [u32; 8] {
        [
            self.k_stride_b,
            self.k_stride_h,
            self.k_stride_s,
            self.k_page_stride,
            self.v_stride_b,
            self.v_stride_h,
            self.v_stride_s,
            self.v_page_stride,
        ]
    }
}
