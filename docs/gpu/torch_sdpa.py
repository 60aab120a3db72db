#!/usr/bin/env python3
"""PyTorch SDPA on the same GPU as a yardstick for `bench`'s fused rows: every backend
PyTorch has there (flash, efficient, cuDNN, math), f32 (TF32 off) and f16, full and
causal, CUDA-event medians, TFLOP/s counting 4*B*Hq*Lq*Lk*D (halved for causal), as
`bench` does. torch_backward.py takes its timer from here.
usage: torch_sdpa.py B,Hq,Hkv,Lq,Lk,D ..."""
import sys, statistics, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def median_ms(fn, reps=10):
    """Median milliseconds of `fn` over `reps` calls after two warm-ups, by CUDA events."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); fn(); end.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(specs):
    print("shape | causal | dtype | backend | ms | TFLOP/s")
    for spec in specs:
        B, Hq, Hkv, Lq, Lk, D = map(int, spec.split(","))
        for dtype in (torch.float32, torch.float16):
            q = torch.randn(B, Hq, Lq, D, device=dev, dtype=dtype)
            k = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype)
            v = torch.randn(B, Hkv, Lk, D, device=dev, dtype=dtype)
            for causal in (False, True):
                flops = 4 * B * Hq * Lq * Lk * D / (2 if causal else 1)
                for name, backend in backends.items():
                    row = f"{spec} | {causal} | {str(dtype)[6:]} | {name}"
                    try:
                        with sdpa_kernel(backend):
                            ms = median_ms(lambda: F.scaled_dot_product_attention(
                                q, k, v, is_causal=causal, enable_gqa=Hq != Hkv))
                        print(f"{row} | {ms:.3f} | {flops / ms / 1e9:.1f}")
                    except Exception as e:  # a backend that does not take this case
                        print(f"{row} | - | {type(e).__name__}")


if __name__ == "__main__":
    main(sys.argv[1:])
