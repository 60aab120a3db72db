"""``python -m wgpu_attention.bench``: this package against
``torch.nn.functional.scaled_dot_product_attention`` on the same machine (torch's CPU
kernels here; its own device where it has one), same shapes, and the per-call cost.

Every wgpu-attention figure is one whole call from NumPy arrays to NumPy arrays:
uploading q, k and v, the kernel, and reading the output back (copies in and out
included). torch's run on tensors already in its device's memory. Medians of
``--reps`` calls after warm-up ones. Compare figures only from one sitting: they move
with the machine's load.
"""

import argparse
import statistics
import time

import numpy as np

import wgpu_attention as wa

SHAPES = [  # (B, H, L, E)
    (1, 8, 512, 64),
    (1, 8, 1024, 64),
    (1, 8, 2048, 64),
    (4, 16, 512, 64),
]


def median_seconds(call, reps, warmup=2):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_call(ctx, calls):
    """Median seconds of one (1,1,1,1,1,64) f32 call, output returned, per kernel."""
    x = np.random.default_rng(0).standard_normal((1, 1, 1, 64)).astype(np.float32)
    rows = {}
    for kernel in ["fused", "decode"]:
        f = lambda: wa.scaled_dot_product_attention(x, x, x, kernel=kernel, context=ctx)
        rows[kernel] = median_seconds(f, calls, warmup=20)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m wgpu_attention.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="timed calls per case (default 5)")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls of the per-call case (default 1000)")
    parser.add_argument("--shape", action="append", metavar="B,H,L,E",
                        help="a shape to time (repeatable); default: a standard set")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--kernel", default="auto", help="auto, fused, materialized or decode")
    parser.add_argument("--causal", action="store_true", help="also time is_causal=True")
    parser.add_argument("--no-torch", action="store_true", help="time this package alone")
    parser.add_argument("--adapter", help="adapter name substring (default: WGPU_ADAPTER_NAME, then wgpu's pick)")
    args = parser.parse_args(argv)

    ctx = wa.Context(adapter=args.adapter) if args.adapter else wa.default_context()
    info = ctx.info
    print(f"adapter: {info['name']} ({info['backend']}, {info['device_type']}), driver {info['driver']} "
          f"{info['driver_info']}")
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch: not installed; timing this package alone (pip install torch)")
    if torch is not None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"torch {torch.__version__} on {device}"
              + (f", {torch.get_num_threads()} threads" if device == "cpu" else ""))

    rows = per_call(ctx, args.calls)
    print(f"per call, (1,1,1,1,1,64) float32, NumPy in and out, median of {args.calls}:")
    for kernel, seconds in rows.items():
        print(f"  {kernel:<8} {seconds * 1e6:8.1f} µs")

    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else SHAPES
    dtype = np.dtype(args.dtype)
    header = f"{'shape (B,H,L,E)':<20} {'causal':<7} {'wgpu-attention ms':>18}"
    if torch is not None:
        header += f" {'torch ms':>10} {'torch/ours':>11}"
    print(f"\n{args.dtype}, kernel {args.kernel}, median of {args.reps} (wgpu-attention: copies in and out included)")
    print(header)
    for shape in shapes:
        if len(shape) != 4:
            parser.error(f"--shape {shape}: give B,H,L,E")
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
        for causal in ([False, True] if args.causal else [False]):
            ours = median_seconds(lambda: wa.scaled_dot_product_attention(
                q, k, v, is_causal=causal, kernel=args.kernel, context=ctx), args.reps)
            line = f"{str(shape):<20} {str(causal):<7} {ours * 1e3:18.2f}"
            if torch is not None:
                tq, tk, tv = (torch.from_numpy(x).to(device) for x in (q, k, v))

                def run_torch():
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                    if device == "cuda":
                        torch.cuda.synchronize()

                with torch.no_grad():
                    theirs = median_seconds(run_torch, args.reps)
                line += f" {theirs * 1e3:10.2f} {theirs / ours:10.2f}x"
            print(line)


if __name__ == "__main__":
    main()
