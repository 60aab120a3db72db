"""KvCache, PagedKvCache and MultiHeadAttention against the float64 reference."""

import numpy as np
import pytest

import wgpu_attention as wa
from conftest import assert_close, randn
from reference import attention


def test_kv_cache_decode(ctx):
    seed = 3000
    b, hq, hkv, d, cap = 2, 4, 2, 16, 64
    cache = wa.KvCache(b, hkv, cap, d)
    k_all, v_all = randn(seed, b, hkv, 40, d), randn(seed + 1, b, hkv, 40, d)
    cache.append(k_all[:, :, :30], v_all[:, :, :30])
    cache.append(k_all[:, :, 30:32], v_all[:, :, 30:32], counts=[2, 1])
    assert cache.lengths == [32, 31] and cache.capacity == cap
    q = randn(seed + 2, b, hq, 2, d)
    out, lse = cache.attend(q, is_causal=True, return_lse=True)
    assert out.shape == (b, hq, 2, d)
    for i, n in enumerate(cache.lengths):
        kk = np.concatenate([k_all[i:i + 1, :, :30], k_all[i:i + 1, :, 30:n]], axis=2)
        vv = np.concatenate([v_all[i:i + 1, :, :30], v_all[i:i + 1, :, 30:n]], axis=2)
        ref, _, ref_lse = attention(q[i:i + 1], kk, vv, is_causal=True, causal_alignment="bottom_right")
        assert_close(out[i:i + 1], ref, seed, f"cache sequence {i}")
        assert_close(lse[i:i + 1], ref_lse, seed, f"cache sequence {i} lse")
    cache.grow(128)
    assert cache.capacity == 128 and cache.lengths == [32, 31]
    assert cache.keys().shape == (b, hkv, 128, d)
    assert_close(cache.keys()[:, :, :30], k_all[:, :, :30], seed, "keys read back", atol=0, rtol=0)
    cache.clear()
    assert cache.lengths == [0, 0]
    with pytest.raises(ValueError):
        cache.append(k_all[:, :1], v_all[:, :1])  # wrong head count
    with pytest.raises(ValueError, match="capacity"):
        cache.append(np.zeros((b, hkv, 200, d), np.float32), np.zeros((b, hkv, 200, d), np.float32))
    assert "KvCache(" in repr(cache)


def test_kv_cache_int8(ctx):
    seed = 3020
    b, hq, hkv, d, cap = 2, 4, 2, 32, 64
    cache = wa.KvCache(b, hkv, cap, d, kv_dtype="int8")
    assert cache.kv_dtype == "int8" and "int8" in repr(cache)
    k, v = randn(seed, b, hkv, 40, d), randn(seed + 1, b, hkv, 40, d)
    cache.append(k, v, counts=[40, 33])
    # What the cache holds: each row quantized symmetrically to int8 with one scale.
    top = np.abs(k).max(axis=-1, keepdims=True)
    want_k = np.clip(np.round(k / top * 127), -127, 127) * (top / 127)
    held_k = cache.keys()[:, :, :40]
    assert_close(held_k[0], want_k[0], seed, "dequantized keys", atol=float(top.max()) / 127 * 1.01, rtol=0)
    assert np.all(cache.keys()[1, :, 33:] == 0), "rows past a length stay zero"
    q = randn(seed + 2, b, hq, 1, d)
    for kernel in ["auto", "decode"]:
        out = cache.attend(q, kernel=kernel)
        for i, n in enumerate(cache.lengths):
            kk, vv = cache.keys()[i:i + 1, :, :n], cache.values()[i:i + 1, :, :n]
            ref = attention(q[i:i + 1], kk, vv)[0]
            assert_close(out[i:i + 1], ref, seed, f"int8 cache {kernel} sequence {i}")
            unquantized = attention(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])[0]
            assert_close(out[i:i + 1], unquantized, seed, f"int8 against unquantized {i}", atol=0.05, rtol=0)
    with pytest.raises(ValueError, match="does not grow"):
        cache.grow(128)
    with pytest.raises(ValueError, match="kv_dtype"):
        wa.KvCache(1, 1, 8, 8, kv_dtype="int4")
    with pytest.raises(ValueError, match="multiple of 4"):
        wa.KvCache(1, 1, 8, 6, kv_dtype="int8")
    cache.clear()
    assert cache.lengths == [0, 0] and np.all(cache.values() == 0)


def test_kv_cache_f16_fed_f32(ctx):
    if not ctx.supports_f16:
        pytest.skip("no f16")
    seed = 3050
    cache = wa.KvCache(1, 2, 16, 8, dtype="float16")
    k, v = randn(seed, 1, 2, 5, 8), randn(seed + 1, 1, 2, 5, 8)
    cache.append(k, v)  # float32 rows, stored as float16
    q = randn(seed + 2, 1, 2, 1, 8)
    out = cache.attend(q)
    assert out.dtype == np.float16
    ref = attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))[0]
    assert_close(out, ref, seed, "f16 cache", atol=2e-3, rtol=2e-3)


def test_paged_kv_cache(ctx):
    seed = 3100
    hkv, d = 2, 8
    pool = wa.PagedKvCache(16, 4, hkv, d)
    a, b = pool.add_sequence(), pool.add_sequence()
    assert a != b and len({a, b}) == 2
    k, v = randn(seed, 2, hkv, 7, d), randn(seed + 1, 2, hkv, 7, d)
    pool.append([a, b], k, v, counts=[7, 3])
    assert pool.sequence_length(a) == 7 and pool.sequence_length(b) == 3
    assert pool.free_pages == 16 - 2 - 1 and pool.page_size == 4
    q = randn(seed + 2, 2, 4, 1, d)
    out = pool.attend([a, b], q, is_causal=True)
    for i, (sid, n) in enumerate([(a, 7), (b, 3)]):
        ref = attention(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], is_causal=True,
                        causal_alignment="bottom_right")[0]
        assert_close(out[i:i + 1], ref, seed, f"paged sequence {i}")
    pool.remove_sequence(b)
    assert pool.free_pages == 16 - 2
    with pytest.raises(ValueError):
        pool.sequence_length(b)
    with pytest.raises(ValueError, match="pages"):
        pool.append([a], np.zeros((1, hkv, 80, d), np.float32), np.zeros((1, hkv, 80, d), np.float32))
    assert pool.sequence_length(a) == 7  # the refused append changed nothing
    with pytest.raises(ValueError, match="SequenceId"):
        pool.attend([0], q[:1])


def mha_weights(seed, e, bias=True):
    rng = np.random.default_rng(seed)
    w = {"in_proj_weight": rng.uniform(-0.3, 0.3, (3 * e, e)).astype(np.float32),
         "out_proj.weight": rng.uniform(-0.3, 0.3, (e, e)).astype(np.float32)}
    if bias:
        w["in_proj_bias"] = rng.uniform(-0.1, 0.1, 3 * e).astype(np.float32)
        w["out_proj.bias"] = rng.uniform(-0.1, 0.1, e).astype(np.float32)
    return w


def mha_reference(w, x, heads, kv=None, **options):
    e = x.shape[-1]
    wq, wk, wv = np.split(w["in_proj_weight"].astype(np.float64), 3)
    bq, bk, bv = np.split(w.get("in_proj_bias", np.zeros(3 * e)).astype(np.float64), 3)
    key = x if kv is None else kv
    split = lambda y: y.reshape(y.shape[0], y.shape[1], heads, -1).transpose(0, 2, 1, 3)
    q, k, v = split(x @ wq.T + bq), split(key @ wk.T + bk), split(key @ wv.T + bv)
    out, weights, _ = attention(q, k, v, **options)
    out = out.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], e)
    return out @ w["out_proj.weight"].T + w.get("out_proj.bias", np.zeros(e)), weights


def test_mha_from_dict_and_file(ctx, tmp_path):
    seed = 3200
    e, heads = 16, 4
    w = mha_weights(seed, e)
    layer = wa.MultiHeadAttention(w, heads)
    assert (layer.embed_dim, layer.num_heads, layer.num_kv_heads) == (e, heads, heads)
    x = randn(seed + 1, 2, 5, e)
    out, weights = layer.forward(x, is_causal=True, need_weights=True)
    ref, ref_w = mha_reference(w, x.astype(np.float64), heads, is_causal=True)
    assert_close(out, ref, seed, "MHA self-attention", atol=5e-5)
    assert_close(weights, ref_w.mean(axis=1), seed, "MHA averaged weights", atol=1e-5)
    # Cross-attention, unbatched, per-head weights.
    kv = randn(seed + 2, 7, e)
    out, weights = layer.forward(x[0], kv, kv, need_weights=True, average_attn_weights=False)
    ref, ref_w = mha_reference(w, x[:1].astype(np.float64), heads, kv=kv[None].astype(np.float64))
    assert_close(out, ref[0], seed, "MHA cross-attention", atol=5e-5)
    assert weights.shape == (heads, 5, 7)


def test_mha_backward_shapes(ctx):
    seed = 3300
    e, heads = 8, 2
    layer = wa.MultiHeadAttention(mha_weights(seed, e), heads)
    x = randn(seed + 1, 2, 3, e)
    grads = layer.backward(randn(seed + 2, 2, 3, e), x)
    assert grads["query"].shape == x.shape
    for p in ["q_proj", "k_proj", "v_proj", "out_proj"]:
        assert grads[f"{p}.weight"].shape == (e, e) and grads[f"{p}.bias"].shape == (e,)


def test_mha_bad_inputs(ctx, tmp_path):
    seed = 3400
    w = mha_weights(seed, 8)
    with pytest.raises(ValueError, match="in_proj_weight"):
        wa.MultiHeadAttention({"foo": np.zeros(3, np.float32)}, 2)
    with pytest.raises(ValueError, match="int64"):
        wa.MultiHeadAttention({**w, "in_proj_bias": np.zeros(24, np.int64)}, 2)
    with pytest.raises(ValueError):
        wa.MultiHeadAttention(w, 3)  # 8 is not a multiple of 3
    with pytest.raises(FileNotFoundError):
        wa.MultiHeadAttention(str(tmp_path / "missing.safetensors"), 2)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(ValueError):
        wa.MultiHeadAttention(str(bad), 2)
    norm = {**w, "norm1.weight": np.ones(8, np.float32), "norm1.bias": np.zeros(8, np.float32)}
    with pytest.raises(ValueError, match="post_norm"):
        wa.MultiHeadAttention(norm, 2)
    wa.MultiHeadAttention(norm, 2, post_norm=True)
    with pytest.raises(ValueError, match="post_norm"):
        wa.MultiHeadAttention(w, 2, post_norm=True)
    layer = wa.MultiHeadAttention(w, 2)
    with pytest.raises(ValueError, match="query"):
        layer.forward(np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match="key and value"):
        layer.forward(np.zeros((2, 3, 8), np.float32), np.zeros((2, 3, 8), np.float32))


def write_safetensors(path, tensors):
    """The .safetensors format by hand: a little-endian u64 header length, the JSON
    header (dtype, shape, data offsets), then the data."""
    import json
    import struct

    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_mha_from_file_matches_dict(ctx, tmp_path):
    seed = 3500
    w = {f"encoder.layers.0.self_attn.{k}": v for k, v in mha_weights(seed, 16).items()}
    path = tmp_path / "layer.safetensors"
    write_safetensors(path, w)
    x = randn(seed + 1, 1, 4, 16)
    from_file = wa.MultiHeadAttention(str(path), 4, prefix="encoder.layers.0.").forward(x)
    from_dict = wa.MultiHeadAttention(w, 4, prefix="encoder.layers.0.").forward(x)
    assert np.array_equal(from_file, from_dict), f"seed {seed}"
    import pathlib
    assert np.array_equal(wa.MultiHeadAttention(pathlib.Path(path), 4, prefix="encoder.layers.0.").forward(x), from_dict)


def test_f16_overflow_refused(ctx):
    """float32 values beyond float16's range (|x| > 65504) would become infinities (NaN
    results, only a NumPy warning): refused naming the array, the value and its index,
    wherever this package converts to float16 (cache rows and queries, a layer's
    inputs and weights). Values just inside the range are taken."""
    if not ctx.supports_f16:
        pytest.skip("no f16")
    seed = 3060
    big, where = 70000.0, (0, 1, 3, 2)
    flat = int(np.ravel_multi_index(where, (1, 2, 5, 8)))
    cache = wa.KvCache(1, 2, 16, 8, dtype="float16")
    k, v = randn(seed, 1, 2, 5, 8), randn(seed + 1, 1, 2, 5, 8)
    for name in ("key", "value"):
        rows = {"key": k.copy(), "value": v.copy()}
        rows[name][where] = -big
        with pytest.raises(ValueError, match=rf"invalid {name}: value -70000(\.0)? at flat index {flat} is beyond "
                                             r"float16's range \(\|x\| <= 65504"):
            cache.append(rows["key"], rows["value"])
    assert cache.lengths == [0], "a refused append changed the cache"
    edge = k.copy()
    edge[where] = 65504.0
    cache.append(edge, v)
    q = randn(seed + 2, 1, 2, 1, 8)
    q[0, 0, 0, 5] = big
    with pytest.raises(ValueError, match="invalid query: value 70000"):
        cache.attend(q)
    # Strided (non-contiguous) rows: the index is in C order over the array as given.
    strided = np.swapaxes(np.ascontiguousarray(np.swapaxes(k, 1, 2)), 1, 2)
    strided[where] = big
    with pytest.raises(ValueError, match=f"at flat index {flat} "):
        cache.append(strided, v)

    e, heads = 8, 2
    w = mha_weights(seed, e)
    x = randn(seed + 3, 2, 3, e)
    layer = wa.MultiHeadAttention(w, heads, dtype="float16")
    x[1, 2, 7] = big
    with pytest.raises(ValueError, match=rf"invalid query: value 70000(\.0)? at flat index {3 * e + 2 * e + 7} "):
        layer.forward(x)
    with pytest.raises(ValueError, match="invalid d_out: value 70000"):
        layer.backward(x, x.clip(-1, 1))
    heavy = {**w, "in_proj_weight": w["in_proj_weight"].copy()}
    heavy["in_proj_weight"][e + 1, 3] = big  # a row of the key projection
    with pytest.raises(ValueError, match=rf"invalid weights 'k_proj.weight': value 70000(\.0)? at flat index {e + 3} "):
        wa.MultiHeadAttention(heavy, heads, dtype="float16")
    wa.MultiHeadAttention(heavy, heads)  # float32 holds it


def test_caches_from_two_threads(ctx):
    """append and attend on one cache from two threads at once take turns (the second
    used to fail with "Already mutably borrowed" while the first ran on the GPU), and
    every row arrives."""
    import threading

    seed = 3080
    b, h, d, n, calls = 1, 2, 16, 4, 40
    cache = wa.KvCache(b, h, n * calls, d)
    pool = wa.PagedKvCache(n * calls // 4 + 4, 4, h, d)
    sid = pool.add_sequence()
    k, v = randn(seed, b, h, n, d), randn(seed + 1, b, h, n, d)
    q = randn(seed + 2, b, h, 1, d)
    errors, start = [], threading.Barrier(2)

    def run(work):
        start.wait()
        try:
            for _ in range(calls):
                work()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    def writer():
        cache.append(k, v)
        pool.append([sid], k, v)

    def reader():
        cache.attend(q)
        pool.attend([sid], q)
        pool.add_sequence()
        assert "KvCache(" in repr(cache) and cache.capacity == n * calls

    threads = [threading.Thread(target=run, args=(f,)) for f in (writer, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"seed {seed}: {errors[:3]}"
    assert cache.lengths == [n * calls] and pool.sequence_length(sid) == n * calls
    ref = attention(q, np.tile(k, (1, 1, calls, 1)), np.tile(v, (1, 1, calls, 1)))[0]
    assert_close(cache.attend(q), ref, seed, "cache after threaded appends")
    assert_close(pool.attend([sid], q), ref, seed, "paged cache after threaded appends")
