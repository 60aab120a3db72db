"""scaled_dot_product_attention and sdpa_backward against the float64 reference, for
every option, layout, stride pattern and dtype; and bad inputs raising cleanly."""

import threading

import numpy as np
import pytest

import wgpu_attention as wa
from conftest import assert_close, randn
from reference import attention, attention_backward

sdpa = wa.scaled_dot_product_attention


def qkv(seed, lead, lq, lk, d, dv=None, hkv=None, dtype=np.float32):
    """q (*lead, Lq, D), k (*lead', Lk, D), v (*lead', Lk, Dv); lead' has hkv heads."""
    dv = d if dv is None else dv
    kv_lead = lead if hkv is None else tuple(lead[:-1]) + (hkv,)
    return (randn(seed, *lead, lq, d, dtype=dtype), randn(seed + 1, *kv_lead, lk, d, dtype=dtype),
            randn(seed + 2, *kv_lead, lk, dv, dtype=dtype))


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)])
def test_leading_shapes(ctx, lead):
    seed = 100 + len(lead)
    q, k, v = qkv(seed, lead, 7, 9, 8, dv=5)
    out = sdpa(q, k, v)
    assert out.dtype == np.float32 and out.shape == lead + (7, 5)
    assert_close(out, attention(q, k, v)[0], seed, f"leading shape {lead}")


@pytest.mark.parametrize("causal_alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("lq,lk", [(5, 9), (9, 5), (6, 6)])
def test_causal(ctx, causal_alignment, lq, lk):
    seed = 200 + lq * 10 + lk
    q, k, v = qkv(seed, (2, 2), lq, lk, 16)
    out, lse = sdpa(q, k, v, is_causal=True, causal_alignment=causal_alignment, return_lse=True)
    ref, _, ref_lse = attention(q, k, v, is_causal=True, causal_alignment=causal_alignment)
    assert_close(out, ref, seed, "causal output")
    assert_close(lse, ref_lse.reshape(2, 2, lq), seed, "causal lse", atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(6, 10), (1, 10), (2, 1, 6, 10), (1, 3, 1, 10), (10,)])
@pytest.mark.parametrize("kind", ["bool", "float32", "float64", "float16"])
def test_masks(ctx, mask_shape, kind):
    seed = 300 + len(mask_shape)
    q, k, v = qkv(seed, (2, 3), 6, 10, 8)
    rng = np.random.default_rng(seed + 7)
    if kind == "bool":
        mask = rng.random(mask_shape) < 0.7
    else:
        mask = rng.standard_normal(mask_shape).astype(kind)
        mask[rng.random(mask_shape) < 0.2] = -np.inf
    out, w = sdpa(q, k, v, attn_mask=mask, need_weights=True)
    ref, ref_w, _ = attention(q, k, v, attn_mask=mask.astype(np.float32) if kind == "float16" else mask)
    assert_close(out, ref, seed, f"{kind} mask {mask_shape}")
    assert_close(w, ref_w, seed, f"{kind} mask {mask_shape} weights", atol=1e-5)


def test_mask_partial_batch_broadcast(ctx):
    # Five-dimensional inputs whose mask has one of two batch axes: expanded, not folded.
    seed = 350
    q, k, v = qkv(seed, (2, 3, 2), 4, 5, 8)
    mask = np.random.default_rng(seed).random((3, 1, 4, 5)) < 0.6
    assert_close(sdpa(q, k, v, attn_mask=mask), attention(q, k, v, attn_mask=mask)[0], seed, "partial mask")


def test_fully_masked_row(ctx):
    seed = 360
    q, k, v = qkv(seed, (1, 2), 3, 4, 8)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, w, lse = sdpa(q, k, v, attn_mask=mask, need_weights=True, return_lse=True)
    assert np.all(out[:, :, 1] == 0) and np.all(w[:, :, 1] == 0)
    assert np.all(lse[:, :, 1] == -np.inf)
    assert_close(out, attention(q, k, v, attn_mask=mask)[0], seed, "fully masked row")


def test_options(ctx):
    seed = 400
    q, k, v = qkv(seed, (2, 4), 8, 12, 16)
    cases = [
        dict(scale=0.3),
        dict(key_lengths=[12, 5]),
        dict(key_lengths=np.array([3, 12])),
        dict(window=(2, 1)),
        dict(window=(3, -1)),
        dict(window=(None, 0)),
        dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
        dict(softcap=2.0, scale=1.5),
        dict(is_causal=True, causal_alignment="bottom_right", window=(4, None), alibi_slopes=np.full(4, 0.1),
             key_lengths=[10, 12], softcap=5.0),
    ]
    for i, options in enumerate(cases):
        out, w, lse = sdpa(q, k, v, need_weights=True, return_lse=True, **options)
        ref, ref_w, ref_lse = attention(q, k, v, **options)
        what = f"options {options}"
        assert_close(out, ref, seed, what)
        assert_close(w, ref_w, seed, what + " weights", atol=1e-5)
        assert_close(lse, ref_lse, seed, what + " lse", atol=2e-5)


@pytest.mark.parametrize("kernel", ["auto", "fused", "materialized", "decode"])
def test_kernels(ctx, kernel):
    seed = 500
    q, k, v = qkv(seed, (1, 4), 2, 300, 32, hkv=2)
    out = sdpa(q, k, v, kernel=kernel, enable_gqa=True, is_causal=True, causal_alignment="bottom_right")
    ref = attention(q, k, v, is_causal=True, causal_alignment="bottom_right")[0]
    assert_close(out, ref, seed, f"kernel {kernel}")


def test_gqa(ctx):
    seed = 510
    q, k, v = qkv(seed, (2, 6), 5, 7, 8, hkv=2)
    assert_close(sdpa(q, k, v, enable_gqa=True), attention(q, k, v)[0], seed, "GQA")
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)
    q4, k3, v3 = qkv(seed, (1, 4), 5, 7, 8, hkv=3)
    with pytest.raises(ValueError):
        sdpa(q4, k3, v3, enable_gqa=True)


def test_precision_medium(ctx):
    # Without tensor cores medium runs f32 products; with them, f16 products: the
    # bound is the f16 one.
    seed = 520
    q, k, v = qkv(seed, (1, 2), 16, 16, 16)
    assert_close(sdpa(q, k, v, precision="medium"), attention(q, k, v)[0], seed, "medium", atol=3e-3, rtol=1e-2)


def test_float16(ctx):
    if not ctx.supports_f16:
        pytest.skip(f"{ctx.adapter_name} has no f16")
    seed = 530
    q, k, v = qkv(seed, (2, 2), 9, 11, 16, dtype=np.float16)
    out, lse = sdpa(q, k, v, is_causal=True, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    ref, _, ref_lse = attention(q, k, v, is_causal=True)
    assert_close(out, ref, seed, "f16 output", atol=2e-3, rtol=2e-3)
    assert_close(lse, ref_lse, seed, "f16 lse", atol=1e-3)


def test_strides(ctx):
    seed = 600
    q, k, v = qkv(seed, (2, 3), 6, 8, 8)
    want = sdpa(q, k, v)
    variants = {
        "fortran": lambda x: np.asfortranarray(x),
        "bshd view": lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
        "step": lambda x: np.repeat(x, 2, axis=-1)[..., ::2],
        "reversed": lambda x: x[:, ::-1][:, ::-1],
        "read-only": lambda x: _read_only(x),
    }
    for name, make in variants.items():
        got = sdpa(make(q), make(k), make(v))
        assert np.array_equal(got, want), f"{name} inputs (seed {seed}) gave different results"


def _read_only(x):
    x = x.copy()
    x.flags.writeable = False
    return x


def test_bshd_view_output_is_a_view(ctx):
    # A (N, L, H, E) buffer viewed as (N, H, L, E) is read in place, and the output
    # comes back in the same memory order (a transposed view), equal in value.
    seed = 610
    q, k, v = qkv(seed, (2, 4), 5, 5, 8)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    out = sdpa(t(q), t(k), t(v))
    assert out.shape == (2, 4, 5, 8)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous
    assert_close(out, attention(q, k, v)[0], seed, "bshd view")


def test_layout_bshd(ctx):
    seed = 620
    q, k, v = qkv(seed, (2, 4), 5, 7, 8)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    out, w, lse = sdpa(t(q), t(k), t(v), layout="bshd", is_causal=True, need_weights=True, return_lse=True)
    ref, ref_w, ref_lse = attention(q, k, v, is_causal=True)
    assert out.shape == (2, 5, 4, 8)
    assert_close(out, t(ref), seed, "bshd")
    assert_close(w, ref_w, seed, "bshd weights", atol=1e-5)
    assert_close(lse, ref_lse, seed, "bshd lse")


@pytest.mark.parametrize("options", [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, causal_alignment="bottom_right", scale=0.4),
    dict(attn_mask="bool"),
    dict(attn_mask="float"),
    dict(key_lengths=[7, 4], window=(3, 2), alibi_slopes=[0.3, 0.2, 0.1, 0.05], softcap=3.0),
    dict(gqa=True),
])
def test_backward(ctx, options):
    seed = 700 + len(str(options))
    options = dict(options)
    hkv = 2 if options.pop("gqa", False) else None
    q, k, v = qkv(seed, (2, 4), 6, 7, 8, dv=6, hkv=hkv)
    rng = np.random.default_rng(seed + 9)
    if options.get("attn_mask") == "bool":
        options["attn_mask"] = rng.random((6, 7)) < 0.7
    elif options.get("attn_mask") == "float":
        options["attn_mask"] = rng.standard_normal((1, 4, 6, 7)).astype(np.float32)
    out, lse = sdpa(q, k, v, return_lse=True, enable_gqa=hkv is not None, **options)
    d_out = randn(seed + 3, *out.shape)
    dq, dk, dv = wa.sdpa_backward(q, k, v, out, lse, d_out, enable_gqa=hkv is not None, **options)
    rq, rk, rv = attention_backward(q, k, v, d_out, **options)
    for name, got, want in [("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)]:
        assert got.shape == want.shape and got.dtype == np.float32
        assert_close(got, want, seed, f"{name} with {options}", atol=5e-5, rtol=5e-4)


def test_backward_bad_inputs(ctx):
    seed = 790
    q, k, v = qkv(seed, (1, 2), 4, 4, 8)
    out, lse = sdpa(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="d_out"):
        wa.sdpa_backward(q, k, v, out, lse, out[..., :4])
    with pytest.raises(ValueError, match="lse"):
        wa.sdpa_backward(q, k, v, out, lse[..., :3], out)
    with pytest.raises(ValueError, match="out"):
        wa.sdpa_backward(q, k, v, out.astype(np.float16), lse, out)


@pytest.mark.parametrize("kernel", ["fused", "materialized"])
def test_backward_lse_nan_or_pos_inf_refused(ctx, kernel):
    """An lse no forward gives is refused, as merge_attentions refuses it: +inf (which
    gave zero gradients, silently) and NaN where out's row holds no NaN (which gave NaN
    gradients). -inf, a fully masked row's lse, keeps working and gives that row's query
    zero gradient."""
    seed = 795
    q, k, v = qkv(seed, (1, 2), 3, 4, 8)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, lse = sdpa(q, k, v, attn_mask=mask, return_lse=True)
    assert np.all(lse[:, :, 1] == -np.inf)
    d_out = randn(seed + 3, *out.shape)
    for bad in [np.nan, np.inf]:
        poisoned = lse.copy()
        poisoned[0, 1, 2] = bad
        with pytest.raises(ValueError, match=r"lse.*NaN or \+inf.*flat index 5"):
            wa.sdpa_backward(q, k, v, out, poisoned, d_out, attn_mask=mask, kernel=kernel)
    # A float64 lse is read as float32 first: a value beyond float32's range is +inf.
    with pytest.raises(ValueError, match=r"lse.*NaN or \+inf"), np.errstate(over="ignore"):
        wa.sdpa_backward(q, k, v, out, np.full(lse.shape, 1e300), d_out, attn_mask=mask, kernel=kernel)
    dq, dk, dv = wa.sdpa_backward(q, k, v, out, lse, d_out, attn_mask=mask, kernel=kernel)
    assert not dq[:, :, 1].any()
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), attention_backward(q, k, v, d_out, attn_mask=mask)):
        assert_close(got, want, seed, f"{name} with a fully masked row ({kernel})", atol=5e-5, rtol=5e-4)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_backward_of_nan_inputs_gives_nan(ctx, layout):
    """A forward over a query row holding NaN gives that row NaN in out and lse; the
    backward takes both and gives NaN gradients, as PyTorch does (the lse check refuses
    NaN only where out's row has none), in either layout."""
    seed = 797
    q, k, v = qkv(seed, (2, 3), 4, 5, 8)
    q[1, 2, 3, 0] = np.nan
    if layout == "bshd":
        q, k, v = (np.ascontiguousarray(np.swapaxes(x, -3, -2)) for x in (q, k, v))
    out, lse = sdpa(q, k, v, return_lse=True, layout=layout, kernel="fused")
    assert np.isnan(lse[1, 2, 3]) and np.isnan(lse).sum() == 1, "the fused forward's lse of a NaN row"
    d_out = randn(seed + 3, *out.shape)
    row = (1, 3, 2) if layout == "bshd" else (1, 2, 3)
    dq, dk, dv = wa.sdpa_backward(q, k, v, out, lse, d_out, layout=layout, kernel="fused")
    assert np.all(np.isnan(dq[row])) and np.isnan(dk).any(), layout
    # The materialized backward takes it too (what it then gives a NaN row is its own).
    wa.sdpa_backward(q, k, v, out, lse, d_out, layout=layout, kernel="materialized")
    # The same NaN where out's row is finite is refused: the index is the lse's own.
    poisoned = lse.copy()
    poisoned[1, 2, 3] = 0.0
    poisoned[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match=r"lse.*flat index 6, as float32, where out's row holds no NaN"):
        wa.sdpa_backward(q, k, v, out, poisoned, d_out, layout=layout)

BAD = [
    ("float64 query", lambda q, k, v: sdpa(q.astype(np.float64), k, v), ValueError, "float64"),
    ("int query", lambda q, k, v: sdpa(q.astype(np.int32), k, v), ValueError, "dtype"),
    ("mixed dtypes", lambda q, k, v: sdpa(q, k.astype(np.float16), v), ValueError, "dtype"),
    ("list query", lambda q, k, v: sdpa(q.tolist(), k, v), TypeError, "numpy.ndarray"),
    ("head dims differ", lambda q, k, v: sdpa(q, k[..., :4], v), ValueError, None),
    ("kv lengths differ", lambda q, k, v: sdpa(q, k, v[..., :3, :]), ValueError, None),
    ("batch differs", lambda q, k, v: sdpa(q, k[:1], v[:1]), ValueError, "batch"),
    ("rank differs", lambda q, k, v: sdpa(q, k[0], v[0]), ValueError, None),
    ("1-D", lambda q, k, v: sdpa(q.ravel(), k, v), ValueError, "axes"),
    ("empty feature axis", lambda q, k, v: sdpa(q[..., :0], k[..., :0], v), ValueError, "empty feature axis"),
    ("empty value feature axis", lambda q, k, v: sdpa(q, k, v[..., :0]), ValueError, "empty feature axis"),
    ("position offset too far", lambda q, k, v: sdpa(q, k, v, position_offset=2**31), ValueError,
     r"position_offset: 2147483648 is too far: query length 4 \+ key length 4 \+ \|position_offset\| = 2147483656, "
     r"at most 1073741824"),
    ("negative position offset too far", lambda q, k, v: sdpa(q, k, v, position_offset=-(2**40)), ValueError,
     "position_offset: -1099511627776 is too far"),
    ("empty key lengths count", lambda q, k, v: sdpa(q[:, :, :0], k, v, key_lengths=[4]), ValueError,
     "key_lengths: 1 entries"),
    ("empty head dims differ", lambda q, k, v: sdpa(q[:0], k[:0, ..., :4], v[:0]), ValueError, "head dim"),
    ("empty kv lengths differ", lambda q, k, v: sdpa(q, k[..., :0, :], v), ValueError, "sequence length of v"),
    ("NaN scale", lambda q, k, v: sdpa(q, k, v, scale=float("nan")), ValueError, "scale"),
    ("inf scale", lambda q, k, v: sdpa(q, k, v, scale=float("inf")), ValueError, "scale"),
    ("f32-overflowing scale", lambda q, k, v: sdpa(q, k, v, scale=1e300), ValueError, "scale"),
    ("dropout", lambda q, k, v: sdpa(q, k, v, dropout_p=0.1), ValueError, "dropout"),
    ("kernel name", lambda q, k, v: sdpa(q, k, v, kernel="fast"), ValueError, "kernel"),
    ("layout name", lambda q, k, v: sdpa(q, k, v, layout="nchw"), ValueError, "layout"),
    ("precision name", lambda q, k, v: sdpa(q, k, v, precision="low"), ValueError, "precision"),
    ("alignment name", lambda q, k, v: sdpa(q, k, v, is_causal=True, causal_alignment="left"), ValueError, "align"),
    ("mask shape", lambda q, k, v: sdpa(q, k, v, attn_mask=np.ones((3, 4), bool)), ValueError, "attn_mask"),
    ("mask rank", lambda q, k, v: sdpa(q, k, v, attn_mask=np.ones((1, 1, 1, 4, 4), bool)), ValueError, "attn_mask"),
    ("mask NaN", lambda q, k, v: sdpa(q, k, v, attn_mask=np.full((4, 4), np.nan, np.float32)), ValueError, "NaN"),
    ("mask +inf", lambda q, k, v: sdpa(q, k, v, attn_mask=np.full((4, 4), np.inf, np.float32)), ValueError, "inf"),
    ("mask int", lambda q, k, v: sdpa(q, k, v, attn_mask=np.ones((4, 4), np.int64)), ValueError, "attn_mask"),
    ("key lengths count", lambda q, k, v: sdpa(q, k, v, key_lengths=[4]), ValueError, "key lengths"),
    ("key length too long", lambda q, k, v: sdpa(q, k, v, key_lengths=[4, 5]), ValueError, "key lengths"),
    ("negative key length", lambda q, k, v: sdpa(q, k, v, key_lengths=[4, -1]), ValueError, "key_lengths"),
    ("key length float", lambda q, k, v: sdpa(q, k, v, key_lengths=[4, 2.5]), ValueError, "key_lengths"),
    ("window arity", lambda q, k, v: sdpa(q, k, v, window=(1, 2, 3)), ValueError, "window"),
    ("window string", lambda q, k, v: sdpa(q, k, v, window="1,2"), ValueError, "window"),
    ("alibi count", lambda q, k, v: sdpa(q, k, v, alibi_slopes=[0.1]), ValueError, "ALiBi"),
    ("alibi NaN", lambda q, k, v: sdpa(q, k, v, alibi_slopes=[0.1, np.nan]), ValueError, "ALiBi"),
    ("softcap 0", lambda q, k, v: sdpa(q, k, v, softcap=0.0), ValueError, "softcap"),
    ("softcap NaN", lambda q, k, v: sdpa(q, k, v, softcap=float("nan")), ValueError, "softcap"),
    ("head dim 300", lambda q, k, v: sdpa(*[randn(1, 1, 1, 2, 300)] * 3), ValueError, "head dim"),
    ("context type", lambda q, k, v: sdpa(q, k, v, context="gpu"), TypeError, None),
]


@pytest.mark.parametrize("name,call,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(ctx, name, call, error, match):
    q, k, v = qkv(800, (2, 2), 4, 4, 8)
    with pytest.raises(error, match=match):
        call(q, k, v)


EMPTY = [
    ("batch", (0, 2), 3, 5),
    ("heads", (2, 0), 3, 5),
    ("query rows", (2, 2), 0, 5),
    ("keys", (2, 2), 3, 0),
    ("extra batch axis", (2, 0, 2), 3, 5),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("what,lead,lq,lk", EMPTY, ids=[e[0] for e in EMPTY])
def test_empty_axes_give_empty_results(ctx, what, lead, lq, lk, layout, dtype):
    """An empty batch, head or sequence axis gives what PyTorch's SDPA gives: an empty
    output of the right shape and dtype, or zeros where there are no keys (every row
    fully masked: an lse of -inf); the backward gives zero gradients of each input's
    shape. Nothing is uploaded, so f16 needs no adapter support here."""
    seed = 1200 + len(what)
    q, k, v = qkv(seed, lead, lq, lk, 8, dv=6, dtype=dtype)
    if layout == "bshd":
        q, k, v = (np.ascontiguousarray(np.swapaxes(x, -3, -2)) for x in (q, k, v))
    mask = np.random.default_rng(seed).random((lq, lk)) < 0.5
    out, weights, lse = sdpa(q, k, v, attn_mask=mask, is_causal=True, need_weights=True, return_lse=True,
                             layout=layout)
    want = q.shape[:-1] + (6,)
    assert out.shape == want and out.dtype == dtype, (what, out.shape, out.dtype)
    # Scores are (..., H, Lq, Lk) in either layout (lead ends with the heads).
    assert weights.shape == lead + (lq, lk) and weights.dtype == np.float32
    assert lse.shape == lead + (lq,) and lse.dtype == np.float32
    assert not out.any() and not weights.any() and np.all(lse == -np.inf)
    d_out = randn(seed + 3, *out.shape, dtype=dtype)
    grads = wa.sdpa_backward(q, k, v, out, lse, d_out, attn_mask=mask, is_causal=True, layout=layout)
    for name, g, x in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == dtype and not g.any(), (what, name, g.shape)


def test_huge_sizes_refused_before_copying(ctx):
    # A broadcast view of 2^42 float32 costs nothing until copied: the size is refused
    # first, with the device's limit in the message.
    huge = np.broadcast_to(np.zeros(1, np.float32), (1 << 14, 1 << 8, 1 << 12, 256))
    with pytest.raises(ValueError, match="max_buffer_size"):
        sdpa(huge, huge, huge)
    # One long key sequence (2^28 keys of 256 features: 256 GiB) beside a small query.
    q = np.zeros((1, 1, 1, 256), np.float32)
    keys = np.broadcast_to(np.zeros(1, np.float32), (1, 1, 1 << 28, 256))
    with pytest.raises(ValueError, match="key of shape"):
        sdpa(q, keys, keys)


def test_memory_flat_over_1000_calls(ctx):
    """RSS after 1000 more calls stays within 8 MiB of where it was after 200 (the
    pools warm): nothing leaks per call, arrays in or out, weights and lse included."""
    import os

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    seed = 900
    q, k, v = qkv(seed, (2, 4), 32, 48, 16)
    mask = np.random.default_rng(seed).random((32, 48)) < 0.8

    def call(i):
        out, w, lse = sdpa(q, k, v, attn_mask=mask, is_causal=i % 2 == 0, need_weights=True, return_lse=True)
        wa.sdpa_backward(q, k, v, out, lse, out)[0] if i % 10 == 0 else None

    for i in range(200):
        call(i)
    before = rss()
    for i in range(1000):
        call(i)
    after = rss()
    assert after - before < 8 << 20, f"RSS grew by {(after - before) / 2**20:.1f} MiB over 1000 calls (seed {seed})"


def test_threads(ctx):
    """Calls from several threads at once (the GIL is released around the GPU work)
    each get their own right answer."""
    results = {}

    def work(seed):
        q, k, v = qkv(seed, (1, 2), 16, 16, 8)
        for _ in range(5):
            results[seed] = (sdpa(q, k, v, is_causal=True), attention(q, k, v, is_causal=True)[0])

    threads = [threading.Thread(target=work, args=(1000 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    for seed, (got, want) in results.items():
        assert_close(got, want, seed, "threaded call")


def test_explicit_context(ctx):
    other = wa.Context()
    seed = 1100
    q, k, v = qkv(seed, (1, 1), 3, 3, 8)
    assert_close(sdpa(q, k, v, context=other), attention(q, k, v)[0], seed, "explicit context")
    assert "Context(" in repr(other)
    with pytest.raises(RuntimeError, match="no GPU adapter"):
        wa.Context(adapter="no such adapter anywhere")
    with pytest.raises(ValueError, match="backend"):
        wa.Context(backend="nonsense")


def test_docstrings():
    for f in [wa.scaled_dot_product_attention, wa.sdpa_backward, wa.Context, wa.default_context]:
        assert f.__doc__ and len(f.__doc__) > 40, f
    assert "attn_mask" in wa.scaled_dot_product_attention.__doc__
    assert "(query, key, value, attn_mask=None" in wa.scaled_dot_product_attention.__text_signature__
