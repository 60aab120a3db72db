//! `KvCache` and `PagedKvCache`: keys and values kept on the device between calls, for
//! generating tokens (docs/design.md, "KV cache", "Paged KV").

use crate::arrays::{dtype_name, output, parse_dtype, read_input_as, Input, Values};
use crate::context::{resolve, PyContext};
use crate::exclusive::Exclusive;
use crate::options::{parse_layout, Raw};
use crate::sdpa::{attention_result, out_shape};
use crate::{value_error, OrPy};
use pyo3::prelude::*;
use std::sync::Arc;
use wgpu_attention::{
    AttentionOptions, AttentionOutput, Context, DType, KvCache, KvCacheConfig, Layout, PagedKvCache, PagedKvConfig,
    QuantizedKvCache, SequenceId, Tensor,
};

/// What a Python `KvCache` keeps: rows of its dtype, or int8 codes and row scales.
enum Store {
    Plain(KvCache),
    Int8(QuantizedKvCache),
}

impl Store {
    fn append_rows(
        &mut self,
        ctx: &Context,
        k: &Tensor,
        v: &Tensor,
        counts: Option<&[u32]>,
    ) -> wgpu_attention::Result<()> {
        match (self, counts) {
            (Store::Plain(c), None) => c.append(ctx, k, v),
            (Store::Plain(c), Some(n)) => c.append_rows(ctx, k, v, n),
            (Store::Int8(c), None) => c.append(ctx, k, v),
            (Store::Int8(c), Some(n)) => c.append_rows(ctx, k, v, n),
        }
    }

    fn attend_read(
        &self,
        ctx: &Context,
        q: &Tensor,
        options: &AttentionOptions,
    ) -> wgpu_attention::Result<(AttentionOutput, Vec<f32>)> {
        match self {
            Store::Plain(c) => c.attend_read(ctx, q, options),
            Store::Int8(c) => c.attend_read(ctx, q, options),
        }
    }

    fn clear(&mut self, ctx: &Context) -> wgpu_attention::Result<()> {
        match self {
            Store::Plain(c) => c.clear(ctx),
            Store::Int8(c) => c.clear(ctx),
        }
    }

    fn lengths(&self) -> &[u32] {
        match self {
            Store::Plain(c) => c.lengths(),
            Store::Int8(c) => c.lengths(),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Store::Plain(c) => c.capacity(),
            Store::Int8(c) => c.capacity(),
        }
    }

    /// `[B, Hkv, capacity, D]`.
    fn k_shape(&self) -> [usize; 4] {
        match self {
            Store::Plain(c) => c.keys().shape(),
            Store::Int8(c) => c.quantized().k_shape(),
        }
    }

    /// The keys (`keys`) or the values as a tensor of the cache's dtype: its own, or
    /// the int8 codes dequantized (only the one asked for).
    fn held(&self, ctx: &Context, keys: bool) -> wgpu_attention::Result<Held<'_>> {
        match self {
            Store::Plain(c) => Ok(Held::Borrowed(if keys { c.keys() } else { c.values() })),
            Store::Int8(c) => c.quantized().dequantize_one(ctx, keys).map(Held::Owned),
        }
    }
}

/// A cache's tensor, or one made from it.
enum Held<'a> {
    Borrowed(&'a Tensor),
    Owned(Tensor),
}

impl std::ops::Deref for Held<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        match self {
            Held::Borrowed(t) => t,
            Held::Owned(t) => t,
        }
    }
}

/// Reads a 4-D array of rows `(B, H, n, D)` (or `(B, n, H, D)` under a BSHD cache).
fn rows<'py>(
    ctx: &Context,
    name: &'static str,
    obj: &Bound<'py, PyAny>,
    axes: Layout,
    dtype: DType,
) -> PyResult<Input<'py>> {
    let input = read_input_as(ctx, name, obj, axes, dtype, "the cache's")?;
    if input.shape.len() != 4 {
        let order = match axes {
            Layout::Bhsd => "(B, H, n, D)",
            Layout::Bshd => "(B, n, H, D)",
        };
        return Err(value_error(name, format!("shape {:?} is not 4-D {order}", input.shape)));
    }
    Ok(input)
}

/// Counts per sequence, from a Python sequence of ints.
fn counts(obj: Option<Bound<'_, PyAny>>) -> PyResult<Option<Vec<u32>>> {
    obj.map(|c| {
        c.extract::<Vec<i64>>()
            .map_err(|_| value_error("counts", "must be a sequence of integers"))?
            .into_iter()
            .map(|n| u32::try_from(n).map_err(|_| value_error("counts", format!("{n} is not a row count"))))
            .collect()
    })
    .transpose()
}

/// The attention options of a cache's `attend` (the cache supplies key lengths).
#[allow(clippy::too_many_arguments)]
fn attend_options<'py>(
    ctx: &Context,
    q: &Input<'py>,
    len_k: usize,
    attn_mask: Option<Bound<'py, PyAny>>,
    is_causal: bool,
    scale: Option<f64>,
    window: Option<Bound<'py, PyAny>>,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    softcap: Option<f64>,
    need_weights: bool,
    return_lse: bool,
    kernel: &str,
    precision: &str,
) -> PyResult<AttentionOptions> {
    Raw {
        attn_mask,
        dropout_p: 0.0,
        is_causal,
        scale,
        // The cache aligns positions to each sequence's length.
        causal_alignment: "bottom_right".into(),
        key_lengths: None,
        window,
        alibi_slopes,
        softcap,
        need_weights,
        return_lse,
        kernel: kernel.to_string(),
        precision: precision.to_string(),
        position_offset: None,
    }
    .to_options(ctx, &q.scores(), len_k)
}

/// Runs `attend` without the GIL and returns what `scaled_dot_product_attention` would.
fn finish<'py>(
    py: Python<'py>,
    ctx: &Context,
    q: &Input<'py>,
    axes: Layout,
    head_dim_v: usize,
    len_k: usize,
    run: impl FnOnce() -> wgpu_attention::Result<(wgpu_attention::AttentionOutput, Vec<f32>)> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let (memory, values, weights, lse) = py
        .detach(|| -> wgpu_attention::Result<_> {
            let (result, values) = run()?;
            let weights = result.weights.as_ref().map(|w| w.to_f32_vec(ctx)).transpose()?;
            let lse = result.lse.as_ref().map(|l| l.to_f32_vec(ctx)).transpose()?;
            Ok((result.out.layout(), values, weights, lse))
        })
        .py_err()?;
    let out = output(py, Values::of(q.dtype, values), &out_shape(q, head_dim_v), axes, memory)?;
    attention_result(py, out, weights, lse, q, len_k)
}

/// One layer's keys and values for a batch of sequences, kept on the device with room
/// to grow (``wgpu_attention::KvCache``).
///
/// ``KvCache(batch, heads_kv, capacity, head_dim, head_dim_v=None, *, dtype="float32",
/// layout="bhsd", kv_dtype=None, context=None)``. Rows are appended as ``(B, Hkv, n, D)`` arrays
/// (``(B, n, Hkv, D)`` with ``layout="bshd"``), converted to the cache's dtype (float32
/// values beyond float16's range, ``|x| > 65504``, are refused with ``ValueError``);
/// ``attend`` runs a query ``(B, Hq, Lq, D)`` against what each sequence holds, its
/// positions aligned to the sequence's end (a causal mask is bottom-right), with
/// split-K decode for few query rows. Calls from several threads take turns.
///
/// ``kv_dtype="int8"`` keeps keys and values as int8 with one scale per row
/// (``wgpu_attention::QuantizedKvCache``): rows are quantized as they are appended,
/// queries and outputs stay ``dtype``; head dims must be multiples of 4, and the cache
/// cannot ``grow``. ``keys()``/``values()`` then return the dequantized values. A row
/// (one token of one kv head) holding NaN or an infinity is kept as NaN throughout: it
/// reads back NaN and every query row that attends to it gets NaN, never a finite number
/// that was not there.
#[pyclass(name = "KvCache", module = "wgpu_attention", frozen)]
pub struct PyKvCache {
    ctx: Arc<Context>,
    /// One call at a time: appends and attends from two threads take turns.
    cache: Exclusive<Store>,
    axes: Layout,
    dtype: DType,
    head_dim_v: usize,
    int8: bool,
}

#[pymethods]
impl PyKvCache {
    #[new]
    #[pyo3(signature = (batch, heads_kv, capacity, head_dim, head_dim_v=None, *, dtype="float32", layout="bhsd",
        kv_dtype=None, context=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        batch: usize,
        heads_kv: usize,
        capacity: usize,
        head_dim: usize,
        head_dim_v: Option<usize>,
        dtype: &str,
        layout: &str,
        kv_dtype: Option<&str>,
        context: Option<Bound<'_, PyContext>>,
    ) -> PyResult<Self> {
        let int8 = match kv_dtype {
            None => false,
            Some("int8") => true,
            Some(other) => return Err(value_error("kv_dtype", format!("'{other}' is not None or 'int8'"))),
        };
        let ctx = resolve(py, context.as_ref())?;
        let (dtype, axes) = (parse_dtype(dtype)?, parse_layout(layout)?);
        let head_dim_v = head_dim_v.unwrap_or(head_dim);
        let config = KvCacheConfig {
            batch,
            heads_kv,
            capacity,
            head_dim,
            head_dim_v,
            layout: axes,
            dtype,
        };
        let cache = if int8 {
            Store::Int8(QuantizedKvCache::new(&ctx, config).py_err()?)
        } else {
            Store::Plain(KvCache::new(&ctx, config).py_err()?)
        };
        Ok(PyKvCache {
            ctx,
            cache: Exclusive::new(cache),
            axes,
            dtype,
            head_dim_v,
            int8,
        })
    }

    /// Appends rows: all ``n`` rows of ``key`` ``(B, Hkv, n, D)`` and ``value``
    /// ``(B, Hkv, n, Dv)`` to every sequence, or the first ``counts[b]`` to sequence b.
    #[pyo3(signature = (key, value, counts=None))]
    fn append(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        counts: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let k = rows(&self.ctx, "key", key, self.axes, self.dtype)?.upload(&self.ctx)?;
        let v = rows(&self.ctx, "value", value, self.axes, self.dtype)?.upload(&self.ctx)?;
        let counts = self::counts(counts)?;
        let turn = self.cache.turn(py, "KvCache")?;
        let mut guard = turn.get();
        let (ctx, cache) = (&self.ctx, &mut *guard);
        py.detach(|| cache.append_rows(ctx, &k, &v, counts.as_deref())).py_err()
    }

    /// Attention of ``query`` ``(B, Hq, Lq, D)`` (Hq a multiple of Hkv) against the rows
    /// each sequence holds; options and return value as
    /// :func:`scaled_dot_product_attention` (a mask spans the capacity's keys).
    #[pyo3(signature = (query, attn_mask=None, is_causal=false, scale=None, *, window=None, alibi_slopes=None,
        softcap=None, need_weights=false, return_lse=false, kernel="auto", precision="highest"))]
    #[allow(clippy::too_many_arguments)]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        attn_mask: Option<Bound<'py, PyAny>>,
        is_causal: bool,
        scale: Option<f64>,
        window: Option<Bound<'py, PyAny>>,
        alibi_slopes: Option<Bound<'py, PyAny>>,
        softcap: Option<f64>,
        need_weights: bool,
        return_lse: bool,
        kernel: &str,
        precision: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let q = rows(&self.ctx, "query", query, self.axes, self.dtype)?;
        let turn = self.cache.turn(py, "KvCache")?;
        let guard = turn.get();
        let cache = &*guard;
        let len_k = cache.capacity();
        let options = attend_options(
            &self.ctx,
            &q,
            len_k,
            attn_mask,
            is_causal,
            scale,
            window,
            alibi_slopes,
            softcap,
            need_weights,
            return_lse,
            kernel,
            precision,
        )?;
        let qt = q.upload(&self.ctx)?;
        let ctx = &*self.ctx;
        finish(py, ctx, &q, self.axes, self.head_dim_v, len_k, || {
            cache.attend_read(ctx, &qt, &options)
        })
    }

    /// Reallocates to hold ``capacity`` rows per sequence, keeping every row held (not
    /// for an int8 cache: ``ValueError``).
    fn grow(&self, py: Python<'_>, capacity: usize) -> PyResult<()> {
        let turn = self.cache.turn(py, "KvCache")?;
        let mut guard = turn.get();
        let ctx = &self.ctx;
        match &mut *guard {
            Store::Plain(cache) => py.detach(|| cache.grow(ctx, capacity)).py_err(),
            Store::Int8(_) => Err(value_error(
                "grow",
                "an int8 KvCache does not grow: make a larger one and append the rows again",
            )),
        }
    }

    /// Forgets every row (the memory is kept).
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let turn = self.cache.turn(py, "KvCache")?;
        let mut guard = turn.get();
        let (ctx, cache) = (&self.ctx, &mut *guard);
        py.detach(|| cache.clear(ctx)).py_err()
    }

    /// Rows each sequence holds.
    #[getter]
    fn lengths(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        Ok(self.cache.turn(py, "KvCache")?.get().lengths().to_vec())
    }

    /// Rows each sequence can hold before ``grow``.
    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.cache.turn(py, "KvCache")?.get().capacity())
    }

    /// ``"float32"`` or ``"float16"``.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.dtype)
    }

    /// ``"int8"`` for an int8 cache, else ``None``.
    #[getter]
    fn kv_dtype(&self) -> Option<&'static str> {
        self.int8.then_some("int8")
    }

    /// The keys held, ``(B, Hkv, capacity, D)`` in the cache's dtype (a copy; an int8
    /// cache's dequantized).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let turn = self.cache.turn(py, "KvCache")?;
        let cache = turn.get();
        let k = py.detach(|| cache.held(&self.ctx, true)).py_err()?;
        read_back(py, &self.ctx, &k, self.axes)
    }

    /// The values held, ``(B, Hkv, capacity, Dv)`` (a copy, as ``keys``).
    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let turn = self.cache.turn(py, "KvCache")?;
        let cache = turn.get();
        let v = py.detach(|| cache.held(&self.ctx, false)).py_err()?;
        read_back(py, &self.ctx, &v, self.axes)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let turn = self.cache.turn(py, "KvCache")?;
        let cache = turn.get();
        let int8 = if self.int8 { ", kv_dtype='int8'" } else { "" };
        let [b, h, cap, d] = cache.k_shape();
        Ok(format!(
            "KvCache(batch={b}, heads_kv={h}, capacity={cap}, head_dim={d}, head_dim_v={}, dtype={:?}{int8}, lengths={:?})",
            self.head_dim_v,
            dtype_name(self.dtype),
            cache.lengths()
        ))
    }
}

/// A cache tensor as an array in the caller's axis order.
fn read_back<'py>(py: Python<'py>, ctx: &Context, t: &Tensor, axes: Layout) -> PyResult<Bound<'py, PyAny>> {
    let values = py.detach(|| t.to_f32_vec(ctx)).py_err()?;
    let [b, h, s, d] = t.shape();
    let shape = match axes {
        Layout::Bhsd => [b, h, s, d],
        Layout::Bshd => [b, s, h, d],
    };
    output(py, Values::of(t.dtype(), values), &shape, axes, t.layout())
}

/// One sequence of a :class:`PagedKvCache`.
#[pyclass(name = "SequenceId", module = "wgpu_attention", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PySequenceId {
    id: SequenceId,
}

#[pymethods]
impl PySequenceId {
    fn __repr__(&self) -> String {
        format!("{:?}", self.id)
    }
}

/// Keys and values of many sequences in one pool of fixed-size pages, vLLM-style
/// (``wgpu_attention::PagedKvCache``).
///
/// ``PagedKvCache(pages, page_size, heads_kv, head_dim, head_dim_v=None, *,
/// dtype="float32", layout="bhsd", context=None)``. ``add_sequence()`` gives a
/// :class:`SequenceId`; ``append(ids, key, value)`` writes rows ``(N, Hkv, n, D)`` to
/// the N sequences ``ids``, taking free pages as they grow; ``attend(ids, query)``
/// runs ``(N, Hq, Lq, D)`` against what each holds; ``remove_sequence`` frees its pages.
#[pyclass(name = "PagedKvCache", module = "wgpu_attention", frozen)]
pub struct PyPagedKvCache {
    ctx: Arc<Context>,
    /// One call at a time, as [`PyKvCache`]'s.
    cache: Exclusive<PagedKvCache>,
    axes: Layout,
    dtype: DType,
    head_dim_v: usize,
}

fn ids_of(ids: &Bound<'_, PyAny>) -> PyResult<Vec<SequenceId>> {
    let ids = ids
        .try_iter()
        .map_err(|_| value_error("ids", "must be a sequence of SequenceId"))?;
    ids.map(|id| {
        let id = id?;
        id.cast::<PySequenceId>()
            .map(|s| s.get().id)
            .map_err(|_| value_error("ids", "must be a sequence of SequenceId (from add_sequence)"))
    })
    .collect()
}

#[pymethods]
impl PyPagedKvCache {
    #[new]
    #[pyo3(signature = (pages, page_size, heads_kv, head_dim, head_dim_v=None, *, dtype="float32", layout="bhsd", context=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pages: usize,
        page_size: usize,
        heads_kv: usize,
        head_dim: usize,
        head_dim_v: Option<usize>,
        dtype: &str,
        layout: &str,
        context: Option<Bound<'_, PyContext>>,
    ) -> PyResult<Self> {
        let ctx = resolve(py, context.as_ref())?;
        let (dtype, axes) = (parse_dtype(dtype)?, parse_layout(layout)?);
        let head_dim_v = head_dim_v.unwrap_or(head_dim);
        let config = PagedKvConfig {
            pages,
            page_size,
            heads_kv,
            head_dim,
            head_dim_v,
            layout: axes,
            dtype,
        };
        let cache = PagedKvCache::new(&ctx, config).py_err()?;
        Ok(PyPagedKvCache {
            ctx,
            cache: Exclusive::new(cache),
            axes,
            dtype,
            head_dim_v,
        })
    }

    /// A new, empty sequence.
    fn add_sequence(&self, py: Python<'_>) -> PyResult<PySequenceId> {
        let id = self.cache.turn(py, "PagedKvCache")?.get().add_sequence();
        Ok(PySequenceId { id })
    }

    /// Frees the sequence's pages; its id names nothing afterwards.
    fn remove_sequence(&self, py: Python<'_>, id: &Bound<'_, PySequenceId>) -> PyResult<()> {
        let turn = self.cache.turn(py, "PagedKvCache")?;
        let result = turn.get().remove_sequence(id.get().id);
        result.py_err()
    }

    /// Rows the sequence holds.
    fn sequence_length(&self, py: Python<'_>, id: &Bound<'_, PySequenceId>) -> PyResult<usize> {
        let turn = self.cache.turn(py, "PagedKvCache")?;
        let result = turn.get().len(id.get().id);
        result.py_err()
    }

    /// Pages no sequence holds.
    #[getter]
    fn free_pages(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.cache.turn(py, "PagedKvCache")?.get().free_pages())
    }

    /// Rows per page.
    #[getter]
    fn page_size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.cache.turn(py, "PagedKvCache")?.get().page_size())
    }

    /// Appends all ``n`` rows of ``key`` ``(N, Hkv, n, D)`` and ``value`` to the N
    /// sequences ``ids`` in order, or the first ``counts[i]`` to ``ids[i]``. An append
    /// the free pages cannot hold raises ``ValueError`` and changes nothing.
    #[pyo3(signature = (ids, key, value, counts=None))]
    fn append(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        counts: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = ids_of(ids)?;
        let k = rows(&self.ctx, "key", key, self.axes, self.dtype)?.upload(&self.ctx)?;
        let v = rows(&self.ctx, "value", value, self.axes, self.dtype)?.upload(&self.ctx)?;
        let counts = self::counts(counts)?;
        let turn = self.cache.turn(py, "PagedKvCache")?;
        let mut guard = turn.get();
        let (ctx, cache) = (&self.ctx, &mut *guard);
        py.detach(|| match counts {
            None => cache.append(ctx, &ids, &k, &v),
            Some(c) => cache.append_rows(ctx, &ids, &k, &v, &c),
        })
        .py_err()
    }

    /// Attention of ``query`` ``(N, Hq, Lq, D)`` against what the N sequences ``ids``
    /// hold; options and return value as :meth:`KvCache.attend` (keys span the
    /// longest sequence's pages).
    #[pyo3(signature = (ids, query, attn_mask=None, is_causal=false, scale=None, *, window=None, alibi_slopes=None,
        softcap=None, need_weights=false, return_lse=false, kernel="auto", precision="highest"))]
    #[allow(clippy::too_many_arguments)]
    fn attend<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        query: &Bound<'py, PyAny>,
        attn_mask: Option<Bound<'py, PyAny>>,
        is_causal: bool,
        scale: Option<f64>,
        window: Option<Bound<'py, PyAny>>,
        alibi_slopes: Option<Bound<'py, PyAny>>,
        softcap: Option<f64>,
        need_weights: bool,
        return_lse: bool,
        kernel: &str,
        precision: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = ids_of(ids)?;
        let q = rows(&self.ctx, "query", query, self.axes, self.dtype)?;
        let turn = self.cache.turn(py, "PagedKvCache")?;
        let guard = turn.get();
        let cache = &*guard;
        let table = cache.table(&ids).py_err()?;
        let len_k = table.pages_per_sequence() * cache.page_size();
        let options = attend_options(
            &self.ctx,
            &q,
            len_k,
            attn_mask,
            is_causal,
            scale,
            window,
            alibi_slopes,
            softcap,
            need_weights,
            return_lse,
            kernel,
            precision,
        )?;
        let qt = q.upload(&self.ctx)?;
        let ctx = &*self.ctx;
        finish(py, ctx, &q, self.axes, self.head_dim_v, len_k, || {
            let out = cache.attend(ctx, &ids, &qt, &options)?;
            let values = out.out.to_f32_vec(ctx)?;
            Ok((out, values))
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let turn = self.cache.turn(py, "PagedKvCache")?;
        let cache = turn.get();
        let [p, h, size, d] = cache.keys().shape();
        Ok(format!(
            "PagedKvCache(pages={p}, page_size={size}, heads_kv={h}, head_dim={d}, head_dim_v={}, dtype={:?}, free_pages={})",
            self.head_dim_v,
            dtype_name(self.dtype),
            cache.free_pages()
        ))
    }
}
