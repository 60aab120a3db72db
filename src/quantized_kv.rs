//! int8 keys and values (docs/design.md, "int8 KV cache"): K and V stored as signed
//! 8-bit codes with one f32 scale per row (per token and kv head), symmetric over the
//! head dim: scale = max|x| / 127, code = round(x / max|x| · 127) clamped to ±127, read
//! back as code · scale. [`QuantizedKv`] holds such K and V, [`sdpa_quantized`] attends
//! to them, and [`QuantizedKvCache`] appends rows to them as a [`crate::KvCache`] does.
//!
//! Split-K decode reads the codes inside the kernel (the `lanes` design: a quarter of
//! f32's bytes, half of f16's); every other path (more query rows, attention weights,
//! adapters without fixed-size subgroups, head dims that are not whole 16-byte rows of
//! codes) attends to the dequantized values, made by one pass first.

use crate::attention::{self, encode_sdpa, AttentionOutput, ResolvedKernel};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::decode::{self, DecodeDesign, KvElements, LanesVariant};
use crate::kernels::kv_dequantize::DEQUANTIZE;
use crate::kernels::{dispatch_entries, kv_append, pipeline, AttentionBindings};
use crate::kv_cache::{attend_options, check_append, check_attendable, check_new_rows, KvCacheConfig};
use crate::options::{AttentionOptions, FusedTiling};
use crate::problem::AttentionShape;
use crate::rotary::Rotary;
use crate::tensor::{tensor_usage, DType, Layout, Tensor};
use bytemuck::{Pod, Zeroable};

/// K `[B, Hkv, S, D]` and V `[B, Hkv, S, Dv]` as int8 codes and row scales, in one
/// layout, standing for values of `dtype` (the queries' and the output's).
///
/// ```no_run
/// # fn main() -> wgpu_attention::Result<()> {
/// use wgpu_attention::{sdpa_quantized, AttentionOptions, Context, Layout, QuantizedKv, Tensor};
/// let ctx = Context::new()?;
/// let data: Vec<f32> = (0..2 * 4 * 1024 * 64).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
/// let k = Tensor::from_f32(&ctx, [2, 4, 1024, 64], Layout::Bhsd, &data)?;
/// let v = Tensor::from_f32(&ctx, [2, 4, 1024, 64], Layout::Bhsd, &data)?;
/// let q = Tensor::from_f32(&ctx, [2, 4, 1, 64], Layout::Bhsd, &data[..2 * 4 * 64])?;
/// let kv = QuantizedKv::quantize(&ctx, &k, &v)?;
/// let out = sdpa_quantized(&ctx, &q, &kv, &AttentionOptions::default())?;
/// # let _ = out;
/// # Ok(())
/// # }
/// ```
pub struct QuantizedKv {
    k_codes: wgpu::Buffer,
    v_codes: wgpu::Buffer,
    k_scales: wgpu::Buffer,
    v_scales: wgpu::Buffer,
    k_shape: [usize; 4],
    head_dim_v: usize,
    layout: Layout,
    dtype: DType,
    context: u64,
}

/// What [`QuantizedKv::read`] returns: codes in the layout's memory order, and one scale
/// per row in the same row order (the scale of code `e` is `scales[e / dim]`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    /// K's codes, `[B, Hkv, S, D]` in the layout's order.
    pub k_codes: Vec<i8>,
    /// K's scales, one per row of D codes.
    pub k_scales: Vec<f32>,
    /// V's codes, `[B, Hkv, S, Dv]` in the layout's order.
    pub v_codes: Vec<i8>,
    /// V's scales, one per row of Dv codes.
    pub v_scales: Vec<f32>,
}

impl QuantizedKv {
    /// `k` and `v` (one dtype and layout, `[B, Hkv, S, D]` and `[B, Hkv, S, Dv]`, head
    /// dims multiples of 4), quantized on the device. A row holding NaN or an infinity
    /// gets codes 0 and a NaN scale: it reads back NaN throughout (docs/design.md,
    /// "int8 KV cache").
    pub fn quantize(ctx: &Context, k: &Tensor, v: &Tensor) -> Result<Self> {
        let [b, h, s, d] = k.shape();
        let [vb, vh, vs, dv] = v.shape();
        if (vb, vh, vs) != (b, h, s) {
            return Err(Error::shape(
                "v ([B, Hkv, S, Dv] of k)",
                format!("[{b}, {h}, {s}, Dv]"),
                format!("{:?}", v.shape()),
            ));
        }
        if v.dtype() != k.dtype() || v.layout() != k.layout() {
            return Err(Error::invalid(
                "k and v to quantize",
                "they must share a dtype and a layout",
            ));
        }
        let kv = QuantizedKv::empty(ctx, k.shape(), dv, k.layout(), k.dtype())?;
        check_new_rows(ctx, "k", k, ("B", b), h, d, k.dtype())?;
        let counts = vec![u32::try_from(s).unwrap_or(u32::MAX); b];
        let starts = vec![0; b];
        ctx.record_and_submit("submitting an int8 quantization", |encoder| {
            kv.encode_append(ctx, encoder, (k, v), &starts, &counts, None)
        })?;
        Ok(kv)
    }

    /// Zeroed codes and scales for K of `k_shape` and V of head dim `dv`.
    fn empty(ctx: &Context, k_shape: [usize; 4], dv: usize, layout: Layout, dtype: DType) -> Result<Self> {
        let [b, h, s, d] = k_shape;
        for (what, dim) in [("head dim of int8 K", d), ("head dim of int8 V", dv)] {
            if !dim.is_multiple_of(4) {
                return Err(Error::unsupported(
                    what,
                    dim,
                    "a multiple of 4 (four codes to a 32-bit word)",
                ));
            }
        }
        check_attendable(ctx, b, h, s, d, dv, dtype)?;
        let rows = crate::error::checked_product("int8 KV rows", &[b, h, s])?;
        let buffer = |label: &str, bytes: usize| ctx.create_buffer(label, bytes.max(4) as u64, tensor_usage());
        Ok(QuantizedKv {
            k_codes: buffer("int8 K codes", rows * d)?,
            v_codes: buffer("int8 V codes", rows * dv)?,
            k_scales: buffer("int8 K scales", rows * 4)?,
            v_scales: buffer("int8 V scales", rows * 4)?,
            k_shape,
            head_dim_v: dv,
            layout,
            dtype,
            context: ctx.id(),
        })
    }

    /// K's logical shape `[B, Hkv, S, D]`.
    pub fn k_shape(&self) -> [usize; 4] {
        self.k_shape
    }

    /// V's logical shape `[B, Hkv, S, Dv]`.
    pub fn v_shape(&self) -> [usize; 4] {
        let [b, h, s, _] = self.k_shape;
        [b, h, s, self.head_dim_v]
    }

    /// The layout of the codes (and so of the dequantized tensors).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The dtype the codes stand for: the queries', the output's and the dequantized
    /// tensors'.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of codes and scales on the device (K and V).
    pub fn byte_len(&self) -> u64 {
        [&self.k_codes, &self.v_codes, &self.k_scales, &self.v_scales]
            .iter()
            .map(|b| b.size())
            .sum()
    }

    pub(crate) fn check_context(&self, ctx: &Context, what: &str) -> Result<()> {
        if self.context != ctx.id() {
            return Err(Error::invalid(
                what,
                "belongs to another Context (another device); int8 K and V work only with the context that made them",
            ));
        }
        Ok(())
    }

    /// Element strides of K and V.
    fn strides(&self) -> ([usize; 4], [usize; 4]) {
        (self.layout.strides(self.k_shape), self.layout.strides(self.v_shape()))
    }

    /// Records the quantization of rows `0 .. counts[b]` of `k_new` and `v_new` into
    /// rows `starts[b] ..` (keys rotated by `rotary`). The caller has checked them.
    fn encode_append(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        (k_new, v_new): (&Tensor, &Tensor),
        starts: &[u32],
        counts: &[u32],
        rotary: Option<&Rotary>,
    ) -> Result<()> {
        let (k_strides, v_strides) = self.strides();
        let k = (&self.k_codes, &self.k_scales);
        kv_append::encode_quantize(ctx, encoder, k_new, k, k_strides, starts, counts, rotary)?;
        let v = (&self.v_codes, &self.v_scales);
        kv_append::encode_quantize(ctx, encoder, v_new, v, v_strides, starts, counts, None)
    }

    /// K and V as tensors of [`QuantizedKv::dtype`]: each code times its row's scale.
    pub fn dequantize(&self, ctx: &Context) -> Result<(Tensor, Tensor)> {
        ctx.record_and_submit("submitting an int8 dequantization", |encoder| {
            self.encode_dequantize(ctx, encoder)
        })
    }

    /// K (`keys`) or V alone as a tensor of [`QuantizedKv::dtype`].
    pub fn dequantize_one(&self, ctx: &Context, keys: bool) -> Result<Tensor> {
        self.check_context(ctx, "int8 K and V")?;
        let (shape, codes, scales) = if keys {
            (self.k_shape, &self.k_codes, &self.k_scales)
        } else {
            (self.v_shape(), &self.v_codes, &self.v_scales)
        };
        let out = Tensor::empty(ctx, shape, self.layout, self.dtype)?;
        ctx.record_and_submit("submitting an int8 dequantization", |encoder| {
            encode_dequantize_one(ctx, encoder, (codes, scales), &out)
        })?;
        Ok(out)
    }

    /// [`QuantizedKv::dequantize`], recorded into the caller's encoder.
    pub fn encode_dequantize(&self, ctx: &Context, encoder: &mut wgpu::CommandEncoder) -> Result<(Tensor, Tensor)> {
        self.check_context(ctx, "int8 K and V")?;
        let k = Tensor::empty(ctx, self.k_shape, self.layout, self.dtype)?;
        let v = Tensor::empty(ctx, self.v_shape(), self.layout, self.dtype)?;
        encode_dequantize_one(ctx, encoder, (&self.k_codes, &self.k_scales), &k)?;
        encode_dequantize_one(ctx, encoder, (&self.v_codes, &self.v_scales), &v)?;
        Ok((k, v))
    }

    /// Reads the codes and scales back (for checks against [`crate::reference`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&self, ctx: &Context) -> Result<QuantizedRows> {
        self.check_context(ctx, "int8 K and V")?;
        let k_elems = self.k_shape.iter().product::<usize>();
        let v_elems = self.v_shape().iter().product::<usize>();
        let rows = k_elems / self.k_shape[3];
        let read = |buffer: &wgpu::Buffer, n: usize| pollster::block_on(ctx.read_buffer_async(buffer, n as u64));
        let codes = |buffer: &wgpu::Buffer, n: usize| -> Result<Vec<i8>> {
            // Reads move whole 4-byte words (every head dim is a multiple of 4).
            Ok(read(buffer, n)?.into_iter().map(|b| b as i8).collect())
        };
        let scales =
            |buffer: &wgpu::Buffer| -> Result<Vec<f32>> { Ok(bytemuck::pod_collect_to_vec(&read(buffer, 4 * rows)?)) };
        Ok(QuantizedRows {
            k_codes: codes(&self.k_codes, k_elems)?,
            k_scales: scales(&self.k_scales)?,
            v_codes: codes(&self.v_codes, v_elems)?,
            v_scales: scales(&self.v_scales)?,
        })
    }
}

/// Mirror of WGSL `DequantizeParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct DequantizeParams {
    words: u32,
    dim: u32,
    pad0: u32,
    pad1: u32,
}

fn encode_dequantize_one(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    (codes, scales): (&wgpu::Buffer, &wgpu::Buffer),
    out: &Tensor,
) -> Result<()> {
    let words = out.len() / 4;
    let params = DequantizeParams {
        words: words as u32,
        dim: out.shape()[3] as u32,
        ..Default::default()
    };
    let params = ctx.create_buffer_init(
        "dequantize params",
        bytemuck::bytes_of(&params),
        wgpu::BufferUsages::UNIFORM,
    )?;
    let pipeline = pipeline(ctx, &DEQUANTIZE, out.dtype(), &[])?;
    // A 2D grid: rows of at most the device's workgroups per dimension.
    let max = ctx.capabilities().max_workgroups_per_dim as usize;
    let groups = words.div_ceil(64).max(1);
    let (x, y) = (groups.min(max), groups.div_ceil(max));
    let entries = [
        (0, params.as_entire_binding()),
        (1, codes.as_entire_binding()),
        (2, scales.as_entire_binding()),
        (3, out.buffer().as_entire_binding()),
    ]
    .map(|(binding, resource)| wgpu::BindGroupEntry { binding, resource });
    dispatch_entries(ctx, encoder, &pipeline, &entries, [x as u32, y as u32, 1])
}

/// Attention of `q` `[B, Hq, Lq, D]` against int8 K and V, as [`crate::sdpa`] against
/// their dequantized values (every option applies as there).
pub fn sdpa_quantized(
    ctx: &Context,
    q: &Tensor,
    kv: &QuantizedKv,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    ctx.record_and_submit("submitting attention", |encoder| {
        encode_sdpa_quantized(ctx, encoder, q, kv, options)
    })
}

/// [`sdpa_quantized`], recorded into the caller's encoder.
pub fn encode_sdpa_quantized(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    kv: &QuantizedKv,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    q.check_context(ctx, "q")?;
    kv.check_context(ctx, "int8 K and V")?;
    let shape = AttentionShape::from_qkv(q.shape(), kv.k_shape(), kv.v_shape())?;
    if q.dtype() != kv.dtype() {
        return Err(Error::shape(
            "dtype of q (that of the int8 K and V's values)",
            kv.dtype().name(),
            q.dtype().name(),
        ));
    }
    shape.check_options(options)?;
    if reads_codes(ctx, q.dtype(), &shape, options)? {
        return ctx.scoped("recording int8 decode", || {
            encode_int8_decode(ctx, encoder, q, kv, &shape, options)
        });
    }
    let (k, v) = kv.encode_dequantize(ctx, encoder)?;
    encode_sdpa(ctx, encoder, q, &k, &v, options)
}

/// Whether attention reads the codes inside split-K decode's `lanes` design: where
/// `options` resolve to split-K decode without weights or a tiling asked for, and the
/// adapter and head dims suit that design (else the dequantized values are attended).
pub fn reads_codes(ctx: &Context, dtype: DType, shape: &AttentionShape, options: &AttentionOptions) -> Result<bool> {
    if options.need_weights || options.tiling != FusedTiling::Auto {
        return Ok(false);
    }
    if attention::resolve_kernel(ctx, dtype, options, shape)? != ResolvedKernel::Decode {
        return Ok(false);
    }
    let whole_words = shape.head_dim.is_multiple_of(16) && shape.head_dim_v.is_multiple_of(16);
    Ok(whole_words
        && decode::lanes_subgroup(ctx)
            .and_then(|sg| LanesVariant::for_problem(shape.head_dim, shape.head_dim_v, KvElements::Int8, sg))
            .is_some())
}

fn encode_int8_decode(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    q: &Tensor,
    kv: &QuantizedKv,
    shape: &AttentionShape,
    options: &AttentionOptions,
) -> Result<AttentionOutput> {
    let dtype = q.dtype();
    let longest = options.key_lengths.as_ref().and_then(|l| l.iter().max());
    let keys = longest.map_or(shape.len_k, |&n| n as usize);
    let split = decode::choose_split(ctx, DecodeDesign::Lanes, shape, keys)?;
    let out = Tensor::empty(
        ctx,
        shape.out_shape(),
        options.output_layout.unwrap_or(q.layout()),
        dtype,
    )?;
    let lse = Tensor::empty(
        ctx,
        [shape.batch, shape.heads_q, shape.len_q, 1],
        Layout::Bhsd,
        DType::F32,
    )?;
    let (k_strides, v_strides) = kv.strides();
    let strides = [q.strides(), k_strides, v_strides, out.strides()];
    let params = crate::kernels::AttentionParams {
        splits: split.splits as u32,
        key_stop: split.keys as u32,
        ..attention::params_for(shape, None, strides, shape.len_k, options)
    };
    let params_buffer = attention::uniform(ctx, "int8 decode params", &params)?;
    let mask = attention::upload_words(ctx, "mask", &attention::mask_words(options))?;
    let side_words = attention::upload_words(
        ctx,
        "key lengths and ALiBi slopes",
        &attention::side_words(shape, options, None),
    )?;
    let partials = ctx.create_buffer("decode partials", split.partial_bytes(shape), tensor_usage())?;
    let bindings = AttentionBindings {
        params: &params_buffer,
        q: q.buffer(),
        k: &kv.k_codes,
        v: &kv.v_codes,
        output: out.buffer(),
        mask: &mask,
        side_words: &side_words,
        scores: &partials,
        lse: lse.buffer(),
        kv_texels: None,
        words_stand_in: None,
        kv_scales: Some((&kv.k_scales, &kv.v_scales)),
    };
    decode::encode(ctx, encoder, dtype, &bindings, &params, shape, split)?;
    Ok(AttentionOutput {
        out,
        weights: None,
        lse: options.need_lse.then_some(lse),
    })
}

/// A KV cache of int8 keys and values ([`QuantizedKv`], capacity rows per batch
/// element): rows are quantized as they are appended, one length per batch element,
/// attention aligned bottom-right to each element's length exactly as
/// [`crate::KvCache`] does. It reads a quarter of an f32 cache's bytes and half of an
/// f16 one's; what it costs in accuracy is in docs/design.md ("int8 KV cache").
///
/// Unlike [`crate::KvCache`] it does not grow (make a larger one and append the rows
/// again) and keeps no texel mirror; head dims must be multiples of 4.
///
/// Non-finite rows: an appended row (one token of one kv head) holding any NaN or
/// infinity is kept as codes 0 with a NaN scale, so all of it reads back NaN and every
/// query row that attends to it gets NaN, never a finite number that was not there.
/// Appends do not refuse such rows: the rows are device tensors, and looking for NaN in
/// them would mean a read back before every append.
pub struct QuantizedKvCache {
    kv: QuantizedKv,
    lengths: Vec<u32>,
    rotary: Option<Rotary>,
}

impl QuantizedKvCache {
    /// An empty cache as `config` describes: `dtype` is that of the rows appended, the
    /// queries and the output; `layout` that of the codes.
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
        if capacity == 0 || capacity > u32::MAX as usize / 2 {
            return Err(Error::unsupported("KV cache capacity", capacity, "1 to 2^31 - 1 rows"));
        }
        let kv = QuantizedKv::empty(ctx, [batch, heads_kv, capacity, head_dim], head_dim_v, layout, dtype)?;
        Ok(QuantizedKvCache {
            kv,
            lengths: vec![0; batch],
            rotary: None,
        })
    }

    /// Rows each batch element can hold.
    pub fn capacity(&self) -> usize {
        self.kv.k_shape[2]
    }

    /// Rows each batch element holds.
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }

    /// The codes and scales, every row of the capacity (rows past a length are zero).
    pub fn quantized(&self) -> &QuantizedKv {
        &self.kv
    }

    /// Appends all `n` rows of `k_new` `[B, Hkv, n, D]` and `v_new` `[B, Hkv, n, Dv]`
    /// (the cache's dtype, any layout) to every batch element, quantizing them. A row
    /// holding NaN or an infinity is appended as NaN throughout (codes 0, a NaN scale),
    /// not refused.
    pub fn append(&mut self, ctx: &Context, k_new: &Tensor, v_new: &Tensor) -> Result<()> {
        let n = k_new.shape()[2];
        let counts = vec![u32::try_from(n).unwrap_or(u32::MAX); self.lengths.len()];
        self.append_rows(ctx, k_new, v_new, &counts)
    }

    /// Appends the first `counts[b]` of the `n` rows of `k_new` and `v_new` to batch
    /// element `b`, as [`crate::KvCache::append_rows`] does, quantizing them as
    /// [`QuantizedKvCache::append`] says (non-finite rows read back NaN).
    pub fn append_rows(&mut self, ctx: &Context, k_new: &Tensor, v_new: &Tensor, counts: &[u32]) -> Result<()> {
        self.kv.check_context(ctx, "KV cache")?;
        let [b, h, _, d] = self.kv.k_shape;
        check_new_rows(ctx, "k_new", k_new, ("B", b), h, d, self.kv.dtype)?;
        check_new_rows(ctx, "v_new", v_new, ("B", b), h, self.kv.head_dim_v, self.kv.dtype)?;
        let remedy = "an int8 cache does not grow: make a larger one";
        check_append((k_new, v_new), counts, &self.lengths, self.capacity(), remedy)?;
        ctx.record_and_submit("submitting an int8 KV cache append", |encoder| {
            let rows = (k_new, v_new);
            self.kv
                .encode_append(ctx, encoder, rows, &self.lengths, counts, self.rotary.as_ref())
        })?;
        for (len, count) in self.lengths.iter_mut().zip(counts) {
            *len += count;
        }
        Ok(())
    }

    /// Forgets every row, zeroing codes and scales.
    pub fn clear(&mut self, ctx: &Context) -> Result<()> {
        self.kv.check_context(ctx, "KV cache")?;
        ctx.record_and_submit("submitting an int8 KV cache clear", |encoder| {
            for buffer in [&self.kv.k_codes, &self.kv.v_codes, &self.kv.k_scales, &self.kv.v_scales] {
                encoder.clear_buffer(buffer, 0, None);
            }
            Ok(())
        })?;
        self.lengths.fill(0);
        Ok(())
    }

    /// Sets the rotary embedding of an empty cache, as [`crate::KvCache::set_rotary`]
    /// does (keys are rotated, then quantized).
    pub fn set_rotary(&mut self, rotary: Option<Rotary>) -> Result<()> {
        if let Some(r) = &rotary {
            r.check(self.kv.k_shape[3])?;
        }
        if self.lengths.iter().any(|&l| l > 0) {
            return Err(Error::invalid(
                "QuantizedKvCache::set_rotary",
                "the cache holds rows; set the rotary embedding while it is empty (QuantizedKvCache::clear)",
            ));
        }
        self.rotary = rotary;
        Ok(())
    }

    /// Attention of `q` against the rows each batch element holds, with the semantics
    /// of [`crate::KvCache::attend`].
    pub fn attend(&self, ctx: &Context, q: &Tensor, options: &AttentionOptions) -> Result<AttentionOutput> {
        ctx.record_and_submit("submitting attention", |encoder| {
            self.encode_attend(ctx, encoder, q, options)
        })
    }

    /// [`QuantizedKvCache::attend`], recorded into the caller's encoder.
    pub fn encode_attend(
        &self,
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<AttentionOutput> {
        let options = attend_options(&self.lengths, options)?;
        let queries = (q, &self.lengths[..]);
        crate::rotary::with_cache_queries(ctx, encoder, queries, self.rotary.as_ref(), |encoder, q| {
            encode_sdpa_quantized(ctx, encoder, q, &self.kv, &options)
        })
    }

    /// [`QuantizedKvCache::attend`] with the output read back in the same submission.
    pub async fn attend_read_async(
        &self,
        ctx: &Context,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<(AttentionOutput, Vec<f32>)> {
        attention::read_async(ctx, |encoder| self.encode_attend(ctx, encoder, q, options)).await
    }

    /// [`QuantizedKvCache::attend_read_async`], blocking. Native targets only.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn attend_read(
        &self,
        ctx: &Context,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> Result<(AttentionOutput, Vec<f32>)> {
        pollster::block_on(self.attend_read_async(ctx, q, options))
    }
}
