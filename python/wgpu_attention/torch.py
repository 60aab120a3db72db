"""PyTorch adapter: ``scaled_dot_product_attention`` on CPU torch tensors, with
autograd.

Tensors go to the GPU kernels through zero-copy NumPy views (``tensor.numpy()``) and
come back as tensors over the returned arrays (``torch.from_numpy``), so the only
copies are the uploads and downloads themselves. The call is an
``torch.autograd.Function`` whose backward runs :func:`wgpu_attention.sdpa_backward`,
so a model can swap it in for ``torch.nn.functional.scaled_dot_product_attention``
(see :func:`swapped_in`) and train through it. Only float32 and float16 CPU tensors are
taken (the kernels' dtypes); masks get no gradient; ``dropout_p`` must be 0. The
tensors the backward reads (q, k, v, the output, the log-sum-exp, a mask) are kept with
``ctx.save_for_backward``, so an in-place edit of one before the backward raises
PyTorch's "modified by an inplace operation" error, as its own SDPA does.

Importing this module needs torch; the rest of the package does not.
"""

import contextlib

import numpy as np
import torch

from . import _native

__all__ = ["scaled_dot_product_attention", "swapped_in"]

_DTYPES = (torch.float32, torch.float16)


def _array(name, t):
    """A NumPy view of a CPU tensor (no copy where torch allows one)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"invalid {name}: on {t.device}; wgpu_attention.torch takes CPU tensors (.cpu() first)")
    if name != "attn_mask" and t.dtype not in _DTYPES:
        raise ValueError(f"invalid {name}: dtype {t.dtype} is not supported; use torch.float32 or torch.float16")
    if t.dtype == torch.bfloat16:
        raise ValueError(f"invalid {name}: bfloat16 has no NumPy dtype; use float32 or a bool mask")
    return t.detach().resolve_conj().resolve_neg().numpy()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, attn_mask, options):
        q, k, v = _array("query", query), _array("key", key), _array("value", value)
        mask = None if attn_mask is None else _array("attn_mask", attn_mask)
        out, lse = _native.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True, **options)
        output = torch.from_numpy(out)
        ctx.options = options
        # Saved through autograd, not as NumPy views on ctx: the tensors' version
        # counters then make backward raise after an in-place edit of any of them (as
        # PyTorch's own SDPA does) instead of differentiating the edited values.
        ctx.save_for_backward(query, key, value, output, torch.from_numpy(lse), attn_mask)
        return output

    @staticmethod
    def backward(ctx, d_out):
        query, key, value, output, lse, attn_mask = ctx.saved_tensors
        q, k, v = _array("query", query), _array("key", key), _array("value", value)
        mask = None if attn_mask is None else _array("attn_mask", attn_mask)
        grads = _native.sdpa_backward(q, k, v, _array("out", output), lse.numpy(),
                                      _array("d_out", d_out.to(output.dtype)), attn_mask=mask, **ctx.options)
        dq, dk, dv = (torch.from_numpy(g) for g in grads)
        return dq, dk, dv, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment="top_left", key_lengths=None, window=None,
                                 alibi_slopes=None, softcap=None, kernel="auto", precision="highest",
                                 position_offset=None, context=None):
    """``torch.nn.functional.scaled_dot_product_attention`` on the wgpu-attention kernels.

    Same arguments and semantics as PyTorch's (bool mask = may attend, float mask =
    added; GQA with ``enable_gqa=True``), plus the keyword options of
    :func:`wgpu_attention.scaled_dot_product_attention`. CPU tensors of float32 or
    float16, shape ``(..., L, E)``; differentiable with respect to query, key and value.
    ``dropout_p`` other than 0 raises ``ValueError``. The mask and options may be
    tensors or arrays; ``key_lengths`` and ``alibi_slopes`` also lists.
    """
    if dropout_p != 0.0:
        raise ValueError(f"invalid dropout_p: {dropout_p} is not supported: wgpu-attention has no dropout (pass 0.0)")
    options = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, causal_alignment=causal_alignment,
                   key_lengths=_plain(key_lengths), window=window, alibi_slopes=_plain(alibi_slopes),
                   softcap=softcap, kernel=kernel, precision=precision, position_offset=position_offset,
                   context=context)
    return _Attention.apply(query, key, value, attn_mask, options)


def _plain(x):
    """Tensors as arrays (key lengths, slopes), copied: the backward must see the
    forward's values even if the caller edits theirs in place meanwhile."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().copy()
    if isinstance(x, (np.ndarray, list)):
        return x.copy()
    return x


@contextlib.contextmanager
def swapped_in():
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` is this
    package's (for code that calls it as ``F.scaled_dot_product_attention``)."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
