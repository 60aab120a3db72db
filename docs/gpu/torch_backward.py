#!/usr/bin/env python3
"""PyTorch SDPA's backward on the same GPU as a yardstick for `bench --kernel fused+backward`:
forward and backward (autograd.grad of a kept graph) per backend, CUDA-event medians, TFLOP/s
counting the forward as 4*B*Hq*Lq*Lk*D and the backward as 2.5x that (halved for causal).
usage: torch_backward.py B,Hq,Hkv,Lq,Lk,D ..."""
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch_sdpa import median_ms as timeit  # the forward's yardstick, beside this script

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"

backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}
print("shape | causal | dtype | backend | forward ms | backward ms | backward TFLOP/s | backward/forward time")
for spec in sys.argv[1:]:
    B, Hq, Hkv, Lq, Lk, D = map(int, spec.split(","))
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(B, Hq, Lq, D, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype, requires_grad=True)
        d_out = torch.randn(B, Hq, Lq, D, device=dev, dtype=dtype)
        for causal in (False, True):
            flops = 4 * B * Hq * Lq * Lk * D / (2 if causal else 1)
            for name, be in backends.items():
                try:
                    with sdpa_kernel(be):
                        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
                        out = f()
                        g = lambda: torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
                        g(); torch.cuda.synchronize()
                        tf = timeit(lambda: f().detach())
                        tb = timeit(g)
                    print(f"{spec} | {causal} | {str(dtype)[6:]} | {name} | {tf:.3f} | {tb:.3f} | {2.5*flops/tb/1e9:.2f} | {tb/tf:.2f}")
                except Exception as e:
                    print(f"{spec} | {causal} | {str(dtype)[6:]} | {name} | n/a ({type(e).__name__}: {str(e)[:80]})")
