"""Ring attention across processes with torch.distributed (gloo), each process on its
own wgpu_attention.Context, checked against one process over the whole sequence.

    python python/examples/ring_attention.py --world-size 4 --causal --order zigzag
    torchrun --nproc-per-node 4 python/examples/ring_attention.py --causal

Launched directly, it starts --world-size processes with torch.multiprocessing.spawn
on MASTER_ADDR:MASTER_PORT (default 127.0.0.1 and a free port). Under torchrun (RANK
and WORLD_SIZE set) it joins the group torchrun made; across machines give torchrun
--nnodes, --node-rank and a reachable --master-addr (gloo runs over TCP).

Every rank draws the whole q, k, v from one seed and keeps its shard
(wgpu_attention.ring.shard; where --seq does not divide evenly, shards differ in length
by a row, as np.array_split cuts them); rank 0 gathers the outputs, computes the same attention in
one call over the whole sequence (and in float64 NumPy), prints the largest difference
and the timings, and exits 1 if the difference is beyond the tolerance (below). With
--backward the same for the gradients (wgpu_attention.ring.ring_attention_backward
against one sdpa_backward call and float64 NumPy) of a random d_out.
"""

import argparse
import os
import socket
import sys
import time

# Quiets Mesa's device-select layer on headless machines before anything lists Vulkan
# devices, as `import wgpu_attention` does (see its __init__) and the CLI.
if "XDG_RUNTIME_DIR" not in os.environ:
    os.environ.setdefault("NODEVICE_SELECT", "1")

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import wgpu_attention as wa
from wgpu_attention.ring import ORDERS, chunks_of, ring_attention, ring_attention_backward, shard, unshard


def positive(text):
    """An argparse type: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def seconds(text):
    """An argparse type: a number of seconds above 0."""
    try:
        t = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not t > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return t


def parse(argv=None):
    """The arguments, or an argparse error (one line, exit 2) for any the run would
    refuse: checked here, in the launching process, before any worker starts."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=positive, default=2, help="processes to spawn (ignored under torchrun)")
    p.add_argument("--batch", type=positive, default=1)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--heads-kv", type=positive, default=None, help="key/value heads (GQA); default --heads")
    p.add_argument("--seq", type=positive, default=512, help="global sequence length")
    p.add_argument("--dim", type=positive, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--window", type=int, nargs=2, default=None, metavar=("LEFT", "RIGHT"))
    p.add_argument("--order", choices=ORDERS, default="contiguous", help="how the sequence is sharded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=positive, default=3, help="timed repetitions (after one warm-up)")
    p.add_argument("--timeout", type=seconds, default=300.0, help="seconds before a collective gives up")
    p.add_argument("--backward", action="store_true", help="also the gradients of a random d_out")
    args = p.parse_args(argv)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world_size
    if args.heads % (args.heads_kv or args.heads):
        p.error(f"--heads {args.heads} is not a multiple of --heads-kv {args.heads_kv}")
    chunks = len(chunks_of(0, world, args.order)[0]) * world
    if args.seq < chunks:
        p.error(f"--seq {args.seq} is shorter than the {chunks} chunks {world} processes take in the {args.order} "
                "order (one row each at least)")
    return args


def under_torchrun():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs(args):
    rng = np.random.default_rng(args.seed)
    hkv = args.heads_kv or args.heads
    q = rng.standard_normal((args.batch, args.heads, args.seq, args.dim)).astype(np.float32)
    k = rng.standard_normal((args.batch, hkv, args.seq, args.dim)).astype(np.float32)
    v = rng.standard_normal((args.batch, hkv, args.seq, args.dim)).astype(np.float32)
    return q, k, v


def gather_rows(x, lengths, rank):
    """Every rank's ``x`` ``(B, H, lengths[r], E)`` on rank 0 (None elsewhere): padded to
    the longest for the gather (gloo's takes one size from every rank), cut back after."""
    padded = np.zeros(x.shape[:-2] + (max(lengths), x.shape[-1]), x.dtype)
    padded[..., :x.shape[-2], :] = x
    parts = [torch.empty_like(torch.from_numpy(padded)) for _ in lengths] if rank == 0 else None
    dist.gather(torch.from_numpy(padded), parts, dst=0)
    return [p.numpy()[..., :n, :] for p, n in zip(parts, lengths)] if rank == 0 else None


def visible_mask(n, causal, window):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = np.ones((n, n), dtype=bool)
    if causal:
        visible &= j <= i
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
    return visible


def reference64(q, k, v, causal, window):
    """Float64 attention over the whole sequence (self-attention, one axis)."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    v = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    visible = visible_mask(q.shape[2], causal, window)
    s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return np.einsum("bhij,bhjd->bhid", e / e.sum(-1, keepdims=True), v), (m + np.log(e.sum(-1, keepdims=True)))[..., 0]


def reference64_backward(q, k, v, d_out, causal, window):
    """Float64 gradients (dq, dk, dv) of attention over the whole sequence."""
    group = q.shape[1] // k.shape[1]
    q64, d64 = q.astype(np.float64), d_out.astype(np.float64)
    k64 = np.repeat(k.astype(np.float64), group, axis=1)
    v64 = np.repeat(v.astype(np.float64), group, axis=1)
    scale = 1 / np.sqrt(q.shape[-1])
    s = np.einsum("bhid,bhjd->bhij", q64, k64) * scale
    s = np.where(visible_mask(q.shape[2], causal, window), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    p = p / np.maximum(p.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
    o = np.einsum("bhij,bhjd->bhid", p, v64)
    dp = np.einsum("bhid,bhjd->bhij", d64, v64)
    ds = p * (dp - (d64 * o).sum(-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", ds, k64) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q64) * scale
    dv = np.einsum("bhij,bhid->bhjd", p, d64)
    fold = lambda x: x.reshape(x.shape[0], k.shape[1], group, *x.shape[2:]).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def check_backward(rank, world, args, ctx, q, k, v, mine, out, lse, options, report):
    """The ring's gradients against one call and float64 (rank 0 judges, adding its
    lines to ``report``); True if within the tolerance (always on other ranks)."""
    d_out = np.random.default_rng(args.seed + 1).standard_normal(
        (args.batch, args.heads, args.seq, args.dim)).astype(np.float32)
    my_d_out = shard(d_out, rank, world, args.order)
    ring_attention_backward(*mine, out, lse, my_d_out, **options)  # warm-up
    times, stats = [], {}
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        grads = ring_attention_backward(*mine, out, lse, my_d_out, stats=stats, **options)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    lengths = [shard(q, r, world, args.order).shape[-2] for r in range(world)]
    gathered = [gather_rows(g, lengths, rank) for g in grads]
    timing = torch.tensor([min(times), stats["communication_s"]], dtype=torch.float64)
    timings = [torch.empty_like(timing) for _ in range(world)] if rank == 0 else None
    dist.gather(timing, timings, dst=0)
    if rank != 0:
        return True
    window = options["window"]
    sdpa_options = dict(is_causal=args.causal, window=window, enable_gqa=q.shape[1] != k.shape[1], context=ctx)
    single_out, single_lse = wa.scaled_dot_product_attention(q, k, v, return_lse=True, **sdpa_options)
    wa.sdpa_backward(q, k, v, single_out, single_lse, d_out, **sdpa_options)  # warm-up
    t0 = time.perf_counter()
    single = wa.sdpa_backward(q, k, v, single_out, single_lse, d_out, **sdpa_options)
    t_single = time.perf_counter() - t0
    exact = reference64_backward(q, k, v, d_out, args.causal, window)
    _, exact_lse = reference64(q, k, v, args.causal, window)
    eps = float(np.finfo(np.float32).eps)
    lse_max = float(np.abs(exact_lse[np.isfinite(exact_lse)]).max())
    ok = True
    report.append(f"  backward: ring {max(t[0].item() for t in timings) * 1e3:.1f} ms (best of {args.reps}), one process "
          f"{t_single * 1e3:.1f} ms; communication {np.mean([t[1].item() for t in timings]) * 1e3:.1f} ms per rank")
    for name, parts, one, e in zip(("dq", "dk", "dv"), gathered, single, exact):
        ring = unshard(parts, args.order)
        err = float(np.abs(ring - one).max())
        err_single = float(np.abs(one - e).max())
        # Each pair's gradients round as the single call's do (at most its error against
        # float64); the P partials of a key block or query chunk add in float32, and each
        # pair's probabilities exp(s - lse) carry the ring's lse, about 2 ulp of |lse| off
        # the single call's: relative 2 eps (1 + |lse|) of the largest gradient per partial.
        tol = 2 * err_single + 2 * (2 * world + 1) * eps * (1 + lse_max) * float(np.abs(e).max())
        report.append(f"    {name}: max |ring - one call| = {err:.3g} (tolerance {tol:.3g}); against float64: one call "
              f"{err_single:.3g}, ring {float(np.abs(ring - e).max()):.3g}")
        ok &= err <= tol
    return ok


def run(rank, world, args):
    ctx = wa.Context()
    q, k, v = inputs(args)
    mine = [shard(x, rank, world, args.order) for x in (q, k, v)]
    window = tuple(args.window) if args.window else None
    options = dict(is_causal=args.causal, window=window, order=args.order, context=ctx)
    ring_attention(*mine, **options)  # warm-up: every process compiles its pipelines
    dist.barrier()
    ring_times, comm_times, stats = [], [], {}
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        out, lse = ring_attention(*mine, stats=stats, **options)
        dist.barrier()  # the ring is done when its slowest rank is
        ring_times.append(time.perf_counter() - t0)
        comm_times.append(stats["communication_s"])
    # Rank 0 gathers every rank's output (shards may differ in length) and its timings.
    gathered = gather_rows(out, [shard(q, r, world, args.order).shape[-2] for r in range(world)], rank)
    timing = torch.tensor([min(ring_times), float(np.median(comm_times)), float(stats["calls"]),
                           float(stats["skipped"])], dtype=torch.float64)
    timings = [torch.empty_like(timing) for _ in range(world)] if rank == 0 else None
    dist.gather(timing, timings, dst=0)
    backward_ok, report = True, []
    if args.backward:
        backward_ok = check_backward(rank, world, args, ctx, q, k, v, mine, out, lse, options, report)
    if rank != 0:
        return True
    ring = unshard(gathered, args.order)
    sdpa_options = dict(is_causal=args.causal, window=window, enable_gqa=q.shape[1] != k.shape[1], context=ctx)
    single, single_lse = wa.scaled_dot_product_attention(q, k, v, return_lse=True, **sdpa_options)  # warm-up
    single_times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        single = wa.scaled_dot_product_attention(q, k, v, **sdpa_options)
        single_times.append(time.perf_counter() - t0)
    exact, exact_lse = reference64(q, k, v, args.causal, window)
    err = float(np.abs(ring - single).max())
    err_single = float(np.abs(single - exact).max())
    err_ring = float(np.abs(ring - exact).max())
    # Tolerance: the ring's partials round as the single call does (each at most its
    # error against float64), and the merge scales each by exp(lse_n - lse), whose
    # argument carries about 2 ulp of |lse| (relative error 2 eps (1 + |lse|) per weight,
    # up to 2P merges per row chain), times the largest |v|.
    eps = float(np.finfo(np.float32).eps)
    lse_max = float(np.abs(exact_lse[np.isfinite(exact_lse)]).max())
    tol = 2 * err_single + 2 * (2 * world + 1) * eps * (1 + lse_max) * float(np.abs(v).max())
    t_ring = max(t[0].item() for t in timings)
    comm = [t[1].item() for t in timings]
    calls = int(sum(t[2].item() for t in timings))
    skipped = int(sum(t[3].item() for t in timings))
    t_single = min(single_times)
    print(f"ring attention: {world} processes, order {args.order}, causal {args.causal}, window {window}, "
          f"shape (B={args.batch}, H={args.heads}, L={args.seq}, E={args.dim}), adapter {ctx.adapter_name}")
    print(f"  max |ring - one call| = {err:.3g} (tolerance {tol:.3g}); against float64: ring {err_ring:.3g}, "
          f"one call {err_single:.3g}")
    print(f"  time: ring {t_ring * 1e3:.1f} ms (best of {args.reps}), one process {t_single * 1e3:.1f} ms "
          f"({t_single / t_ring:.2f}x); communication {np.mean(comm) * 1e3:.1f} ms per rank on average "
          f"({100 * np.mean(comm) / t_ring:.0f}% of the ring's time; per rank: "
          f"{', '.join(f'{100 * c / t_ring:.0f}%' for c in comm)}); {calls} attention calls, {skipped} chunk pairs "
          f"skipped")
    for line in report:
        print(line)
    ok = err <= tol and backward_ok
    print("  PASS" if ok else "  FAIL: beyond the tolerance")
    return ok


def worker(rank, world, args):
    from datetime import timedelta

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    try:
        ok = run(rank, world, args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def main():
    args = parse()
    if under_torchrun():
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    try:
        mp.spawn(worker, args=(args.world_size, args), nprocs=args.world_size, join=True)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:  # its traceback is in e
        print(f"ring attention failed: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
