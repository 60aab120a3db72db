"""Scaled dot-product attention on any GPU wgpu reaches (Vulkan, Metal, DX12, GL, and
Mesa's software drivers), with PyTorch's ``scaled_dot_product_attention`` signature on
NumPy arrays.

>>> import numpy as np, wgpu_attention as wa
>>> q = np.random.default_rng(0).standard_normal((2, 8, 128, 64), dtype=np.float32)
>>> out = wa.scaled_dot_product_attention(q, q, q, is_causal=True)

Everything runs on ``default_context()`` (the adapter ``WGPU_ADAPTER_NAME`` and
``WGPU_BACKEND`` name, else wgpu's default) unless ``context=Context(...)`` is given.
``merge_attentions`` combines attention over blocks of the keys by their log-sum-exp
(``position_offset=`` places each block); ``wgpu_attention.ring`` runs ring attention
over ``torch.distributed``. ``wgpu_attention.torch`` wraps the functions for torch
tensors, with autograd;
``python -m wgpu_attention.bench`` times them against PyTorch's.
"""

import os

# Mesa's Vulkan device-select layer asks libwayland for a display while the loader
# lists devices, and on a headless machine (no XDG_RUNTIME_DIR) that prints "error:
# XDG_RUNTIME_DIR is invalid or not set in the environment." on stderr, twice, though
# nothing failed. Adapters are picked by name here (WGPU_ADAPTER_NAME, Context), so
# the layer is turned off as the CLI does (src/cli/mod.rs), unless the caller set
# NODEVICE_SELECT; before the native module exists, so before any adapter is listed.
if "XDG_RUNTIME_DIR" not in os.environ:
    os.environ.setdefault("NODEVICE_SELECT", "1")

from ._native import (  # noqa: E402  (after the environment above)
    Context,
    KvCache,
    MultiHeadAttention,
    PagedKvCache,
    SequenceId,
    __version__,
    default_context,
    merge_attentions,
    scaled_dot_product_attention,
    sdpa_backward,
)

__all__ = [
    "Context",
    "KvCache",
    "MultiHeadAttention",
    "PagedKvCache",
    "SequenceId",
    "__version__",
    "default_context",
    "merge_attentions",
    "scaled_dot_product_attention",
    "sdpa_backward",
]
