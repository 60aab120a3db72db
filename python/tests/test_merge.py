"""merge_attentions and position_offset: the keys cut at random into blocks, each block
attended with its position_offset, the partials merged by lse, equal one call over all
the keys and the float64 reference, for every rule; bad inputs raise ValueError."""

import numpy as np
import pytest

import wgpu_attention as wa
from conftest import assert_close, randn
from reference import attention, attention_backward

sdpa = wa.scaled_dot_product_attention


def cuts(rng, lk, parts):
    """Sorted block edges 0 = e0 < e1 < ... < e_n = lk (every block non-empty)."""
    inner = np.sort(rng.choice(np.arange(1, lk), size=min(parts, lk) - 1, replace=False))
    return [0, *inner.tolist(), lk]


RULES = {
    "none": {},
    "causal_top_left": dict(is_causal=True, causal_alignment="top_left"),
    "causal_bottom_right": dict(is_causal=True, causal_alignment="bottom_right"),
    "window": dict(window=(3, 2)),
    "causal_window": dict(is_causal=True, window=(4, 0)),
    "alibi": dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
    "causal_alibi": dict(is_causal=True, causal_alignment="bottom_right", alibi_slopes=[0.3, 0.2, 0.1, 0.05]),
    "key_lengths": dict(key_lengths=[13, 5]),
    "softcap": dict(softcap=2.0, scale=0.7),
    "bool_mask": "bool",
    "float_mask": "float",
    "gqa": dict(enable_gqa=True),
}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("lq,lk", [(9, 17), (17, 9), (12, 12), (1, 20)])
def test_random_blocks_merge_to_one_call(ctx, rule, lq, lk):
    seed = 4100 + 31 * list(RULES).index(rule) + lq * 3 + lk
    rng = np.random.default_rng(seed)
    hkv = 2 if rule == "gqa" else 4
    q = randn(seed, 2, 4, lq, 16)
    k, v = randn(seed + 1, 2, hkv, lk, 16), randn(seed + 2, 2, hkv, lk, 8)
    options = RULES[rule]
    mask = None
    if isinstance(options, str):
        if options == "bool":
            mask = rng.random((2, 1, lq, lk)) < 0.7
        else:
            mask = rng.standard_normal((lq, lk)).astype(np.float32)
            mask[rng.random((lq, lk)) < 0.2] = -np.inf
        options = {}
    options = dict(options)
    if "key_lengths" in options:
        options["key_lengths"] = [min(n, lk) for n in options["key_lengths"]]
    whole, _, whole_lse = attention(q, k, v, attn_mask=mask, **{n: x for n, x in options.items() if n != "enable_gqa"})
    one, one_lse = sdpa(q, k, v, attn_mask=mask, return_lse=True, **options)
    top_left = options.get("is_causal") and options.get("causal_alignment", "top_left") == "top_left"
    g = 0 if top_left else lk - lq  # the queries' offset on the whole key axis
    for trial in range(3):
        edges = cuts(rng, lk, int(rng.integers(1, 5)))
        outs, lses = [], []
        for lo, hi in zip(edges, edges[1:]):
            part = dict(options)
            if "key_lengths" in part:
                part["key_lengths"] = [int(np.clip(n - lo, 0, hi - lo)) for n in options["key_lengths"]]
            block_mask = None if mask is None else mask[..., lo:hi]
            out, lse = sdpa(q, k[..., lo:hi, :], v[..., lo:hi, :], attn_mask=block_mask, return_lse=True,
                            position_offset=g - lo, **part)
            outs.append(out)
            lses.append(lse)
        # Merged in a random order: the merge is a sum.
        order = rng.permutation(len(outs))
        out, lse = wa.merge_attentions([outs[i] for i in order], [lses[i] for i in order])
        what = f"{rule} Lq={lq} Lk={lk} blocks {edges}"
        assert out.dtype == np.float32 and out.shape == one.shape and lse.shape == one_lse.shape
        assert_close(out, whole, seed, f"{what}: merged vs float64", atol=5e-5)
        assert_close(lse, whole_lse, seed, f"{what}: merged lse vs float64", atol=5e-5)
        assert_close(out, one, seed, f"{what}: merged vs one call", atol=5e-5)


@pytest.mark.parametrize("offset", [-7, -2, 0, 3, 11])
def test_position_offset_against_reference(ctx, offset):
    seed = 4200 + offset
    q, k, v = randn(seed, 2, 3, 6, 8), randn(seed + 1, 2, 3, 10, 8), randn(seed + 2, 2, 3, 10, 8)
    do = randn(seed + 3, 2, 3, 6, 8)
    for options in [dict(is_causal=True), dict(window=(2, 1)), dict(alibi_slopes=[0.5, 0.3, 0.1]),
                    dict(is_causal=True, causal_alignment="bottom_right", window=(3, 0))]:
        out, lse = sdpa(q, k, v, return_lse=True, position_offset=offset, **options)
        ref, _, ref_lse = attention(q, k, v, position_offset=offset, **options)
        what = f"offset {offset} {options}"
        assert_close(out, ref, seed, what)
        assert_close(lse, ref_lse, seed, f"{what} lse", atol=1e-5)
        grads = wa.sdpa_backward(q, k, v, out, lse, do, position_offset=offset, **options)
        ref_grads = attention_backward(q, k, v, do, position_offset=offset, **options)
        for name, got, want in zip("qkv", grads, ref_grads):
            assert_close(got, want, seed, f"{what} d{name}", atol=1e-4, rtol=1e-3)


def test_block_in_the_future_adds_nothing(ctx):
    # A causal block entirely after the queries: every row saw no key (lse -inf, output 0),
    # and merging it changes nothing.
    seed = 4300
    q, k, v = randn(seed, 1, 2, 4, 8), randn(seed + 1, 1, 2, 8, 8), randn(seed + 2, 1, 2, 8, 8)
    past, past_lse = sdpa(q, k[..., :4, :], v[..., :4, :], is_causal=True, return_lse=True, position_offset=0)
    future, future_lse = sdpa(q, k[..., 4:, :], v[..., 4:, :], is_causal=True, return_lse=True, position_offset=-4)
    assert np.all(future == 0) and np.all(future_lse == -np.inf)
    out, lse = wa.merge_attentions([future, past], [future_lse, past_lse])
    assert_close(out, past, seed, "with an empty block")
    assert_close(lse, past_lse, seed, "lse with an empty block")
    nobody, nobody_lse = wa.merge_attentions([future, future], [future_lse, future_lse])
    assert np.all(nobody == 0) and np.all(nobody_lse == -np.inf), "rows nobody saw: zeros and -inf"


def test_merge_single_float16_bshd_and_leading_shapes(ctx):
    seed = 4400
    q, k, v = randn(seed, 5, 8), randn(seed + 1, 9, 8), randn(seed + 2, 9, 8)
    out, lse = sdpa(q, k, v, return_lse=True)
    merged, merged_lse = wa.merge_attentions([out], [lse])
    assert merged.shape == (5, 8) and merged_lse.shape == (5,)
    assert_close(merged, out, seed, "one partial, 2-D")
    q, k, v = randn(seed, 2, 3, 6, 4, 8), randn(seed + 1, 2, 3, 10, 4, 8), randn(seed + 2, 2, 3, 10, 4, 8)
    outs, lses = zip(*(sdpa(q, k[..., lo:hi, :, :], v[..., lo:hi, :, :], layout="bshd", return_lse=True,
                            position_offset=4 - lo) for lo, hi in [(0, 3), (3, 10)]))
    out, lse = wa.merge_attentions(list(outs), list(lses), layout="bshd")
    one, one_lse = sdpa(q, k, v, layout="bshd", return_lse=True)
    assert out.shape == (2, 3, 6, 4, 8) and lse.shape == (2, 3, 4, 6)
    assert_close(out, one, seed, "bshd merge")
    assert_close(lse, one_lse, seed, "bshd merge lse")
    if not ctx.supports_f16:
        return
    h = [x.astype(np.float16) for x in (q, k, v)]
    outs, lses = zip(*(sdpa(h[0], h[1][..., lo:hi, :, :], h[2][..., lo:hi, :, :], layout="bshd", return_lse=True,
                            position_offset=4 - lo) for lo, hi in [(0, 7), (7, 10)]))
    out, lse = wa.merge_attentions(list(outs), list(lses), layout="bshd")
    assert out.dtype == np.float16
    assert_close(out, attention(*(np.swapaxes(x.astype(np.float32), -3, -2) for x in h))[0].swapaxes(-3, -2),
                 seed, "f16 merge", atol=2e-3, rtol=2e-3)


def test_merge_bad_inputs(ctx):
    seed = 4500
    q, k, v = randn(seed, 1, 2, 4, 8), randn(seed + 1, 1, 2, 6, 8), randn(seed + 2, 1, 2, 6, 8)
    out, lse = sdpa(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="no partial outputs"):
        wa.merge_attentions([], [])
    with pytest.raises(ValueError, match="lses for 2 outputs"):
        wa.merge_attentions([out, out], [lse])
    with pytest.raises(ValueError, match="outputs\\[1\\]"):
        wa.merge_attentions([out, out[..., :3, :]], [lse, lse])
    with pytest.raises(ValueError, match="outputs\\[1\\]"):
        wa.merge_attentions([out, out.astype(np.float16)], [lse, lse])
    with pytest.raises(ValueError, match="lses\\[1\\] has shape"):
        wa.merge_attentions([out, out], [lse, lse[..., None]])
    with pytest.raises(ValueError, match="NaN"):
        wa.merge_attentions([out, out], [lse, np.full_like(lse, np.nan)])
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        wa.merge_attentions([out], [np.full_like(lse, np.inf)])
    with pytest.raises(ValueError, match="floating"):
        wa.merge_attentions([out], [lse.astype(np.int32)])
    with pytest.raises(ValueError, match="dtype"):
        wa.merge_attentions([out.astype(np.float64)], [lse])
    with pytest.raises(ValueError, match="layout"):
        wa.merge_attentions([out], [lse], layout="hsbd")
    with pytest.raises(TypeError):
        wa.merge_attentions([out.tolist()], [lse])
    with pytest.raises(ValueError, match="position_offset"):
        sdpa(q, k, v, position_offset=2**31)
    with pytest.raises((ValueError, OverflowError)):
        sdpa(q, k, v, position_offset=2**70)


def test_merging_a_forward_over_nan_inputs_gives_nan_rows(ctx):
    # A NaN in a query row: each block's forward gives that row NaN, its lse NaN too;
    # the merge takes them (as sdpa_backward does) and gives the row NaN, the others
    # the one-call answer. NaN beside a row without NaN is still refused.
    q, k, v = randn(4190, 1, 2, 5, 16), randn(4191, 1, 2, 12, 16), randn(4192, 1, 2, 12, 8)
    q[0, 1, 3, 7] = np.nan
    one, one_lse = sdpa(q, k, v, return_lse=True)
    parts = [sdpa(q, k[:, :, a:b], v[:, :, a:b], return_lse=True) for a, b in [(0, 5), (5, 12)]]
    out, lse = wa.merge_attentions([p[0] for p in parts], [p[1] for p in parts])
    assert np.all(np.isnan(out[0, 1, 3])) and np.isnan(lse[0, 1, 3])
    finite = np.ones(lse.shape, bool)
    finite[0, 1, 3] = False
    rows = np.broadcast_to(finite[..., None], out.shape)
    assert np.isfinite(lse[finite]).all() and np.isfinite(out[rows]).all()
    assert_close(out[rows], one[rows], 4190, "merged out")
    assert_close(lse[finite], one_lse[finite], 4190, "merged lse")
    poisoned = parts[0][1].copy()
    poisoned[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="holds no NaN"):
        wa.merge_attentions([parts[0][0], parts[1][0]], [poisoned, parts[1][1]])
