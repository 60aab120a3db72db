"""A float64 NumPy reference of the attention this package computes, forward and
backward, with every option: masks (bool, additive), causal in both alignments, key
lengths, sliding window, ALiBi, soft-capping, scale, GQA. Arrays in PyTorch's order
(..., H, L, E); the library's semantics (docs/design.md, "Semantics")."""

import numpy as np


def _fold(x):
    """(..., H, L, E) -> (B, H, L, E) with 2-D inputs as one head."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        return x[None, None]
    if x.ndim == 3:
        return x[None]
    return x.reshape((-1,) + x.shape[-3:])


def _fold_mask(mask, q, lk):
    """A mask broadcast to the scores (..., Hq, Lq, Lk) in q's terms, folded to 4-D."""
    if mask is None:
        return None
    full = np.broadcast_to(np.asarray(mask), np.shape(q)[:-1] + (lk,))
    return full.reshape(_fold(q).shape[:3] + (lk,))


def _visible_and_bias(q_shape, k_shape, attn_mask, is_causal, causal_alignment, key_lengths, window, alibi_slopes,
                      position_offset=None):
    """(B, Hq, Lq, Lk) bool visibility and additive bias (ALiBi + float mask); query i
    sits at i + position_offset where given, else at the alignment's offset."""
    b, hq, lq, _ = q_shape
    lk = k_shape[2]
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    offset = 0 if (is_causal and causal_alignment == "top_left") else lk - lq
    if position_offset is not None:
        offset = position_offset
    pos = i + offset
    visible = np.ones((b, hq, lq, lk), dtype=bool)
    if is_causal:
        visible &= j <= pos
    if key_lengths is not None:
        lens = np.asarray(key_lengths).reshape(b, 1, 1, 1)
        visible &= j[None, None] < lens
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            visible &= j >= pos - left
        if right is not None and right >= 0:
            visible &= j <= pos + right
    bias = np.zeros((b, hq, lq, lk))
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64).reshape(1, hq, 1, 1)
        bias = bias - slopes * np.abs(pos - j)[None, None]
    if attn_mask is not None:
        full = attn_mask  # already (B, Hq, Lq, Lk)
        if full.dtype == bool:
            visible &= full
        else:
            visible &= full != -np.inf
            bias = bias + np.where(full == -np.inf, 0.0, full)
    return visible, bias


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, causal_alignment="top_left",
              key_lengths=None, window=None, alibi_slopes=None, softcap=None, position_offset=None):
    """Returns (out, weights, lse) in float64; out in q's leading shape."""
    lead = np.shape(q)[:-1]
    qf, kf, vf = _fold(q), _fold(k), _fold(v)
    b, hq, lq, d = qf.shape
    hkv = kf.shape[1]
    group = hq // hkv
    kf = np.repeat(kf, group, axis=1)
    vf = np.repeat(vf, group, axis=1)
    attn_mask = _fold_mask(attn_mask, q, kf.shape[2])
    visible, bias = _visible_and_bias(qf.shape, kf.shape, attn_mask, is_causal, causal_alignment,
                                      key_lengths, window, alibi_slopes, position_offset)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    x = np.einsum("bhid,bhjd->bhij", qf, kf) * scale
    s = softcap * np.tanh(x / softcap) if softcap is not None else x
    s = s + bias
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(s - m_safe), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    lse = np.where(total[..., 0] > 0, (m_safe + np.log(np.where(total > 0, total, 1.0)))[..., 0], -np.inf)
    out = np.einsum("bhij,bhjd->bhid", w, vf)
    ev = vf.shape[-1]
    return out.reshape(lead[:-1] + (lq, ev)), w, lse


def attention_backward(q, k, v, d_out, attn_mask=None, is_causal=False, scale=None, causal_alignment="top_left",
                       key_lengths=None, window=None, alibi_slopes=None, softcap=None, position_offset=None):
    """(dq, dk, dv) in float64, each in its input's shape."""
    qf, kf0, vf0 = _fold(q), _fold(k), _fold(v)
    b, hq, lq, d = qf.shape
    hkv = kf0.shape[1]
    group = hq // hkv
    kf = np.repeat(kf0, group, axis=1)
    vf = np.repeat(vf0, group, axis=1)
    attn_mask = _fold_mask(attn_mask, q, kf.shape[2])
    visible, bias = _visible_and_bias(qf.shape, kf.shape, attn_mask, is_causal, causal_alignment,
                                      key_lengths, window, alibi_slopes, position_offset)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    x = np.einsum("bhid,bhjd->bhij", qf, kf) * scale
    if softcap is not None:
        t = np.tanh(x / softcap)
        s = softcap * t
        dsdx = 1.0 - t * t
    else:
        s = x
        dsdx = np.ones_like(x)
    s = np.where(visible, s + bias, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(s - m_safe), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    do = _fold(d_out)
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, vf)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dx = ds * dsdx * scale
    dq = np.einsum("bhij,bhjd->bhid", dx, kf)
    dk = np.einsum("bhij,bhid->bhjd", dx, qf)
    dk = dk.reshape(b, hkv, group, *dk.shape[2:]).sum(axis=2)
    dv = dv.reshape(b, hkv, group, *dv.shape[2:]).sum(axis=2)
    return dq.reshape(np.shape(q)), dk.reshape(np.shape(k)), dv.reshape(np.shape(v))
