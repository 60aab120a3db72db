//! A KV cache for generating tokens: keys and values of one attention layer kept on
//! the device with room to grow, one length per batch element, new rows written in
//! place (docs/design.md, "KV cache").

use crate::attention::{encode_sdpa_with_texels, AttentionOutput};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::kv_append;
use crate::kernels::kv_texels::{self, KvTexels};
use crate::options::AttentionOptions;
use crate::problem::AttentionShape;
use crate::rotary::Rotary;
use crate::tensor::{DType, Layout, Tensor};

/// Keys `[B, Hkv, capacity, D]` and values `[B, Hkv, capacity, Dv]` in one layout and
/// dtype, of which batch element `b` holds its first `lengths()[b]` rows.
///
/// [`KvCache::append`] writes new rows after each element's last one, never
/// reallocating; a cache that would overflow refuses ([`Error::CapacityExceeded`]) and
/// is left as it was, and [`KvCache::grow`] makes room explicitly. [`KvCache::attend`] runs attention of new
/// queries against what each element holds, positions aligned bottom-right to each
/// element's own length (the last query row sits at the last cached key).
///
/// Where split-K decode takes its subgroup design (CPU adapters with 8-lane subgroups:
/// lavapipe), the cache also keeps K and V as texels, a second copy of both that every
/// append updates and decode reads faster there ([`KvCache::has_texel_mirror`],
/// [`KvCache::set_texel_mirror`]; docs/design.md, "KV cache").
///
/// On the web, wgpu reports GPU validation errors after the call returns, so an
/// append the device rejects there (one every host-side check passed, which should
/// not happen) still advances the lengths; native targets wait for the verdict first.
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    lengths: Vec<u32>,
    texels: Option<KvTexels>,
    /// Keys are rotated as they are appended, queries as they attend.
    rotary: Option<Rotary>,
}

/// What a [`KvCache`] holds: sizes by name, so that none can be given for another.
///
/// ```
/// use wgpu_attention::{DType, KvCacheConfig, Layout};
/// let config = KvCacheConfig {
///     batch: 2,
///     heads_kv: 8,
///     capacity: 4096,
///     head_dim: 128,
///     head_dim_v: 128,
///     layout: Layout::Bshd,
///     dtype: DType::F16,
/// };
/// # let _ = config;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheConfig {
    /// Sequences (batch elements), each with its own length.
    pub batch: usize,
    /// Key/value heads (`Hkv`; query heads may be a multiple of it, GQA).
    pub heads_kv: usize,
    /// Rows each sequence can hold before [`KvCache::grow`].
    pub capacity: usize,
    /// Key head dim `D`.
    pub head_dim: usize,
    /// Value head dim `Dv` (usually `D`).
    pub head_dim_v: usize,
    /// Layout of the cache's own tensors (rows appended may come in either).
    pub layout: Layout,
    /// The cache's dtype, and that of the rows appended ([`Tensor::from_f32_as`] uploads
    /// f32 data as f16).
    pub dtype: DType,
}

impl KvCache {
    /// An empty cache as `config` describes.
    pub fn new(ctx: &Context, config: KvCacheConfig) -> Result<Self> {
        let KvCacheConfig {
            batch,
            heads_kv,
            capacity,
            head_dim,
            head_dim_v,
            layout,
            dtype,
        } = config;
        KvCache::allocate(
            ctx,
            [batch, heads_kv, capacity, head_dim],
            head_dim_v,
            layout,
            dtype,
            true,
        )
    }

    /// An empty cache that holds the keys and values of attention shape `s`: batch,
    /// kv heads and head dims as there, capacity Lk.
    pub(crate) fn for_shape(ctx: &Context, s: &AttentionShape, layout: Layout, dtype: DType) -> Result<Self> {
        let k_shape = [s.batch, s.heads_kv, s.len_k, s.head_dim];
        KvCache::allocate(ctx, k_shape, s.head_dim_v, layout, dtype, true)
    }

    /// An empty cache with K of shape `[B, Hkv, capacity, D]`, with a texel mirror
    /// where `mirror` and the adapter call for one.
    fn allocate(
        ctx: &Context,
        [batch, heads_kv, capacity, head_dim]: [usize; 4],
        head_dim_v: usize,
        layout: Layout,
        dtype: DType,
        mirror: bool,
    ) -> Result<Self> {
        if capacity == 0 || capacity > u32::MAX as usize / 2 {
            return Err(Error::unsupported("KV cache capacity", capacity, "1 to 2^31 - 1 rows"));
        }
        check_attendable(ctx, batch, heads_kv, capacity, head_dim, head_dim_v, dtype)?;
        // Buffers (and textures) start zeroed, so unwritten rows are finite, as masked
        // value rows must be.
        let k = Tensor::empty(ctx, [batch, heads_kv, capacity, head_dim], layout, dtype)?;
        let v = Tensor::empty(ctx, [batch, heads_kv, capacity, head_dim_v], layout, dtype)?;
        let texels = if mirror {
            KvTexels::for_new_cache(ctx, ctx.policy(), &k, &v)
        } else {
            None
        };
        Ok(KvCache {
            k,
            v,
            lengths: vec![0; batch],
            texels,
            rotary: None,
        })
    }

    /// Whether the cache keeps K and V as texels too, for split-K decode's subgroup
    /// design (by default where that design is taken and the textures fit).
    pub fn has_texel_mirror(&self) -> bool {
        self.texels.is_some()
    }

    /// Keeps (`on`) or drops the texel mirror of K and V. Dropping frees its memory
    /// (about as much as the cache's own) and leaves decode reading the buffers; keeping
    /// one builds it from the rows held. A mirror serves only the subgroup decode
    /// design, so on other adapters `on` is refused with `Unsupported`, as it is past
    /// the device's texture limits.
    pub fn set_texel_mirror(&mut self, ctx: &Context, on: bool) -> Result<()> {
        let (k, v, lengths) = (&self.k, &self.v, &self.lengths);
        kv_texels::set_mirror(&mut self.texels, ctx, ctx.policy(), (k, v), on, |encoder, texels| {
            let from_start = vec![0; lengths.len()];
            texels.record_copy(ctx, encoder, k, v, &from_start, lengths, None)
        })
    }

    /// Rows each batch element can hold.
    pub fn capacity(&self) -> usize {
        self.k.shape()[2]
    }

    /// Rows each batch element holds.
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }

    /// The key tensor `[B, Hkv, capacity, D]`; rows past an element's length are not
    /// part of its sequence. Read it freely; writes other than through the cache never
    /// reach its texel mirror, which decode reads on lavapipe.
    pub fn keys(&self) -> &Tensor {
        &self.k
    }

    /// The value tensor `[B, Hkv, capacity, Dv]` (writes as for [`KvCache::keys`]).
    pub fn values(&self) -> &Tensor {
        &self.v
    }

    /// Appends all `n` rows of `k_new` `[B, Hkv, n, D]` and `v_new` `[B, Hkv, n, Dv]`
    /// (the cache's dtype, any layout) to every batch element.
    pub fn append(&mut self, ctx: &Context, k_new: &Tensor, v_new: &Tensor) -> Result<()> {
        let n = k_new.shape()[2];
        let counts = vec![u32::try_from(n).unwrap_or(u32::MAX); self.lengths.len()];
        self.append_rows(ctx, k_new, v_new, &counts)
    }

    /// Appends the first `counts[b]` of the `n` rows of `k_new` and `v_new` to batch
    /// element `b` (sequences of a batch that grow unevenly, e.g. ragged prompts).
    pub fn append_rows(&mut self, ctx: &Context, k_new: &Tensor, v_new: &Tensor, counts: &[u32]) -> Result<()> {
        self.k.check_context(ctx, "KV cache")?;
        self.check_rows(ctx, "k_new", k_new, self.k.shape()[3])?;
        self.check_rows(ctx, "v_new", v_new, self.v.shape()[3])?;
        check_append(
            (k_new, v_new),
            counts,
            &self.lengths,
            self.capacity(),
            "KvCache::grow makes room",
        )?;
        ctx.record_and_submit("submitting a KV cache append", |encoder| {
            kv_append::encode(
                ctx,
                encoder,
                k_new,
                &self.k,
                &self.lengths,
                counts,
                None,
                self.rotary.as_ref(),
            )?;
            kv_append::encode(ctx, encoder, v_new, &self.v, &self.lengths, counts, None, None)?;
            match &self.texels {
                Some(texels) => texels.record_copy(ctx, encoder, &self.k, &self.v, &self.lengths, counts, None),
                None => Ok(()),
            }
        })?;
        for (len, count) in self.lengths.iter_mut().zip(counts) {
            *len += count;
        }
        Ok(())
    }

    /// Reallocates to hold `capacity` rows per batch element, keeping every held row.
    pub fn grow(&mut self, ctx: &Context, capacity: usize) -> Result<()> {
        let held = self.lengths.iter().copied().max().unwrap_or(0) as usize;
        if capacity < held {
            return Err(Error::invalid(
                "KV cache capacity",
                format!("{capacity} rows cannot keep the {held} a batch element holds"),
            ));
        }
        let [b, h, _, d] = self.k.shape();
        let dv = self.v.shape()[3];
        let mirror = self.texels.is_some();
        let mut grown = KvCache::allocate(ctx, [b, h, capacity, d], dv, self.k.layout(), self.k.dtype(), mirror)?;
        let from_start = vec![0; b];
        ctx.record_and_submit("submitting a KV cache growth", |encoder| {
            kv_append::encode(ctx, encoder, &self.k, &grown.k, &from_start, &self.lengths, None, None)?;
            kv_append::encode(ctx, encoder, &self.v, &grown.v, &from_start, &self.lengths, None, None)?;
            match &grown.texels {
                Some(texels) => texels.record_copy(ctx, encoder, &grown.k, &grown.v, &from_start, &self.lengths, None),
                None => Ok(()),
            }
        })?;
        grown.lengths = std::mem::take(&mut self.lengths);
        grown.rotary = self.rotary;
        *self = grown;
        Ok(())
    }

    /// Sets the rotary embedding (or none) of an empty cache: from then on appended
    /// keys are rotated as they are written, row s of batch element b at its position
    /// `len[b] + s` (one kernel: the append's copy), and [`KvCache::attend`] rotates
    /// the queries, row i at `len[b] − Lq + i` (saturating at 0), before attending.
    /// Refused while the cache holds rows (they would be rotated otherwise, or not).
    pub fn set_rotary(&mut self, rotary: Option<Rotary>) -> Result<()> {
        if let Some(r) = &rotary {
            r.check(self.k.shape()[3])?;
        }
        if self.lengths.iter().any(|&l| l > 0) {
            return Err(Error::invalid(
                "KvCache::set_rotary",
                "the cache holds rows; set the rotary embedding while it is empty (KvCache::clear)",
            ));
        }
        self.rotary = rotary;
        Ok(())
    }

    /// The rotary embedding appends and attention apply, if any.
    pub fn rotary(&self) -> Option<&Rotary> {
        self.rotary.as_ref()
    }

    /// Forgets every row: the buffers are kept and zeroed again, so nothing of the old
    /// rows remains (no attention result depends on rows past a length in any case).
    pub fn clear(&mut self, ctx: &Context) -> Result<()> {
        self.k.check_context(ctx, "KV cache")?;
        ctx.record_and_submit("submitting a KV cache clear", |encoder| {
            encoder.clear_buffer(self.k.buffer(), 0, None);
            encoder.clear_buffer(self.v.buffer(), 0, None);
            // The mirror takes the zeroed rows: clearing a texture needs a feature
            // WebGPU lacks, and new textures would cost memory and, on Mesa 22.3, the
            // old ones' destruction breaks timestamps (docs/design.md, "KV cache").
            match &self.texels {
                Some(texels) => {
                    let every_row = vec![self.capacity() as u32; self.lengths.len()];
                    let from_start = vec![0; self.lengths.len()];
                    texels.record_copy(ctx, encoder, &self.k, &self.v, &from_start, &every_row, None)
                }
                None => Ok(()),
            }
        })?;
        self.lengths.fill(0);
        Ok(())
    }

    /// Attention of `q` `[B, Hq, Lq, D]` against the rows each batch element holds:
    /// keys past an element's length are masked, and positions are aligned bottom-right
    /// to that length (query `i` of element `b` sits at `len[b] − Lq + i`) for the
    /// causal mask, the window and ALiBi. Every other option applies as in
    /// [`crate::sdpa`] with `Lk` = the capacity (an explicit mask spans the capacity's
    /// keys); `key_lengths` must be left unset (the cache supplies them).
    ///
    /// With more query rows than an element holds, its first rows sit before key 0:
    /// under the causal mask they see no key (zero output, log-sum-exp −inf), and
    /// without it they see every held key, like the rest.
    pub fn attend(&self, ctx: &Context, q: &Tensor, options: &AttentionOptions) -> Result<AttentionOutput> {
        ctx.record_and_submit("submitting attention", |encoder| {
            self.encode_attend(ctx, encoder, q, options)
        })
    }

    /// Like [`KvCache::attend`], but records into the caller's encoder (as
    /// [`crate::encode_sdpa`] does).
    pub fn encode_attend(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let options = self.attend_options(options)?;
        let queries = (q, &self.lengths[..]);
        crate::rotary::with_cache_queries(ctx, encoder, queries, self.rotary.as_ref(), |encoder, q| {
            encode_sdpa_with_texels(ctx, encoder, q, &self.k, &self.v, None, self.texels.as_ref(), &options)
        })
    }

    /// [`KvCache::attend`] with the output read back in the same submission (one
    /// submission and one wait per generated token; see [`crate::sdpa_read_async`]).
    /// Returns the outputs and the output's elements as f32.
    pub async fn attend_read_async(
        &self,
        ctx: &Context,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<(AttentionOutput, Vec<f32>)> {
        crate::attention::read_async(ctx, |encoder| self.encode_attend(ctx, encoder, q, options)).await
    }

    /// [`KvCache::attend_read_async`], blocking. Native targets only.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn attend_read(
        &self,
        ctx: &Context,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<(AttentionOutput, Vec<f32>)> {
        pollster::block_on(self.attend_read_async(ctx, q, options))
    }

    /// The caller's options with the cache's lengths and bottom-right alignment to them.
    pub(crate) fn attend_options(&self, options: &AttentionOptions) -> Result<AttentionOptions> {
        attend_options(&self.lengths, options)
    }

    fn check_rows(&self, ctx: &Context, what: &str, t: &Tensor, dim: usize) -> Result<()> {
        let [b, h, _, _] = self.k.shape();
        check_new_rows(ctx, what, t, ("B", b), h, dim, self.k.dtype())
    }
}

/// The caller's options with a cache's `lengths` and bottom-right alignment to them.
pub(crate) fn attend_options(lengths: &[u32], options: &AttentionOptions) -> Result<AttentionOptions> {
    if options.key_lengths.is_some() {
        return Err(Error::invalid(
            "key lengths with a KV cache",
            "the cache supplies them (its lengths); leave AttentionOptions::key_lengths unset",
        ));
    }
    Ok(AttentionOptions {
        key_lengths: Some(lengths.to_vec()),
        align_to_key_lengths: true,
        ..options.clone()
    })
}

/// Refuses an append of the first `counts[b]` rows of `k_new` and `v_new` to a cache
/// of `capacity` rows whose batch element `b` holds `lengths[b]` rows: row counts that
/// differ, one count per element, none past the rows given or the capacity (`remedy`
/// says what makes room).
pub(crate) fn check_append(
    (k_new, v_new): (&Tensor, &Tensor),
    counts: &[u32],
    lengths: &[u32],
    capacity: usize,
    remedy: &str,
) -> Result<()> {
    let n = k_new.shape()[2];
    if v_new.shape()[2] != n {
        return Err(Error::shape(
            "rows of v_new",
            format!("{n} (from k_new)"),
            v_new.shape()[2],
        ));
    }
    if counts.len() != lengths.len() {
        return Err(Error::shape(
            "append counts",
            format!("{} entries (one per batch element)", lengths.len()),
            counts.len(),
        ));
    }
    for (b, (&count, &len)) in counts.iter().zip(lengths).enumerate() {
        if count as usize > n {
            return Err(Error::invalid(
                "append counts",
                format!("entry {b} is {count}, more than the {n} rows given"),
            ));
        }
        let needed = len as usize + count as usize;
        if needed > capacity {
            // The cache's own capacity, which the caller chose: not a device limit.
            return Err(Error::CapacityExceeded {
                what: format!("KV cache rows of batch element {b} ({len} held + {count} appended; {remedy})"),
                capacity: "the cache's capacity",
                unit: "rows",
                requested: needed as u64,
                max: capacity as u64,
            });
        }
    }
    Ok(())
}

/// Refuses a cache that attention could never read: no batch elements or heads, a head
/// dim past the kernels' limit, or f16 on an adapter without it. `rows` is the rows one
/// batch element (or page) holds.
pub(crate) fn check_attendable(
    ctx: &Context,
    batch: usize,
    heads_kv: usize,
    rows: usize,
    head_dim: usize,
    head_dim_v: usize,
    dtype: DType,
) -> Result<()> {
    AttentionShape::from_qkv(
        [batch, heads_kv, 1, head_dim],
        [batch, heads_kv, rows, head_dim],
        [batch, heads_kv, rows, head_dim_v],
    )?;
    if dtype == DType::F16 {
        ctx.require_f16("an f16 KV cache")?;
    }
    Ok(())
}

/// New rows `t` for a cache must be `[batch, heads, n, dim]` in the cache's dtype;
/// `batch` is named (`B`, `sequences`) for the error, and `t` must be `ctx`'s.
pub(crate) fn check_new_rows(
    ctx: &Context,
    what: &str,
    t: &Tensor,
    (batch_name, batch): (&str, usize),
    heads: usize,
    dim: usize,
    dtype: DType,
) -> Result<()> {
    t.check_context(ctx, what)?;
    let [tb, th, _, td] = t.shape();
    if (tb, th, td) != (batch, heads, dim) {
        return Err(Error::shape(
            format!("{what} ([{batch_name}, Hkv, n, dim] of the cache)"),
            format!("[{batch}, {heads}, n, {dim}]"),
            format!("{:?}", t.shape()),
        ));
    }
    if t.dtype() != dtype {
        return Err(Error::shape(
            format!("dtype of {what}"),
            format!(
                "{} (the cache's; upload f32 data as {} with Tensor::from_f32_as(ctx, shape, layout, DType::{}, data))",
                dtype.name(),
                dtype.name(),
                match dtype {
                    DType::F32 => "F32",
                    DType::F16 => "F16",
                }
            ),
            t.dtype().name(),
        ));
    }
    Ok(())
}
