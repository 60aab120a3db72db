"""Ring attention (python/examples/ring_attention.py) with 2 and 4 processes on loopback,
causal and not, contiguous and zigzag, forward and backward: each run must agree with one
call over the whole sequence (the example exits 1 otherwise). Small shapes: every process compiles its own
pipelines. Each run has a deadline; on it the whole process group is killed."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="ring attention needs torch.distributed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch has no gloo backend", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ring_attention.py"
DEADLINE_S = 180


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world,causal,order,seed,backward,seq", [
    (2, False, "contiguous", 11, False, 128),
    (2, True, "contiguous", 12, False, 128),
    (4, False, "contiguous", 13, False, 128),
    (4, True, "contiguous", 14, False, 128),
    (4, True, "zigzag", 15, False, 128),
    (2, True, "contiguous", 16, True, 128),
    (4, True, "zigzag", 17, True, 128),
    # Unequal shards (np.array_split's 4, 3, 3 rows; zigzag chunks of 2 and 1 rows):
    # gloo aborted on messages of different sizes.
    (3, True, "contiguous", 18, True, 10),
    (3, True, "zigzag", 19, True, 10),
    # World size 1: one local call (the backward sent to itself: "Pair is not connected").
    (1, True, "contiguous", 20, True, 16),
])
def test_ring_matches_one_call(ctx, world, causal, order, seed, backward, seq):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, str(EXAMPLE), "--world-size", str(world), "--seq", str(seq), "--heads", "2",
           "--heads-kv", "1", "--dim", "32", "--order", order, "--seed", str(seed), "--reps", "1",
           "--timeout", str(DEADLINE_S)]
    if causal:
        cmd.append("--causal")
    if backward:
        cmd.append("--backward")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"ring attention (seed {seed}) ran past {DEADLINE_S} s: {' '.join(cmd)}\n{output[-4000:]}")
    what = f"{world} processes, causal {causal}, {order}, seed {seed}, backward {backward}, seq {seq}"
    assert proc.returncode == 0, f"ring attention failed ({what}), exit {proc.returncode}:\n{output[-4000:]}"
    assert "PASS" in output, f"no verdict ({what}):\n{output[-4000:]}"


@pytest.mark.parametrize("argv,message", [
    (["--world-size", "0"], "argument --world-size: 0 is not at least 1"),
    (["--world-size", "3", "--seq", "2"], "--seq 2 is shorter than the 3 chunks 3 processes take"),
    (["--world-size", "2", "--seq", "3", "--order", "zigzag"], "--seq 3 is shorter than the 4 chunks"),
    (["--heads", "3", "--heads-kv", "2"], "--heads 3 is not a multiple of --heads-kv 2"),
])
def test_bad_arguments_refused_before_spawning(argv, message):
    """Arguments the run would refuse are an argparse error in the launching process:
    exit 2 with one error line, no worker started (--world-size 0 used to exit 0 having
    checked nothing; a bad --seq a 30-line double traceback)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, str(EXAMPLE), *argv], env=env, capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert proc.returncode == 2, f"{argv}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize("length,world,order", [(10, 3, "contiguous"), (10, 3, "zigzag"), (32, 3, "contiguous"),
                                                (7, 2, "zigzag"), (9, 1, "zigzag")])
def test_shard_unshard_unequal(length, world, order):
    """shard cuts as np.array_split does (chunks one row apart at most) and unshard puts
    the shards back; contiguous shards of any cut go back too."""
    from wgpu_attention.ring import shard, unshard

    seed = 30 + length + world
    x = np.random.default_rng(seed).standard_normal((2, 3, length, 4)).astype(np.float32)
    shards = [shard(x, r, world, order) for r in range(world)]
    assert sum(s.shape[-2] for s in shards) == length
    if order == "contiguous":
        for got, want in zip(shards, np.array_split(x, world, axis=-2)):
            assert np.array_equal(got, want), f"seed {seed}"
    assert np.array_equal(unshard(shards, order), x), f"seed {seed}"
    cut = np.split(x, [1, 7], axis=-2)  # any contiguous cut
    assert np.array_equal(unshard(cut, "contiguous"), x), f"seed {seed}"
    with pytest.raises(ValueError, match="zigzag cut"):
        unshard([x[..., :1, :], x[..., 1:, :]], "zigzag")


RANK_SCRIPT = """
import os, sys
from datetime import timedelta
import numpy as np
import torch.distributed as dist
import wgpu_attention as wa
from wgpu_attention.ring import ring_attention, ring_attention_backward

rank, world, seed = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(sys.argv[1])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
rng = np.random.default_rng(seed)
q, k, v, d_out = (rng.standard_normal((1, 2, 10, 8)).astype(np.float32) for _ in range(4))
mine = lambda x: np.array_split(x, world, axis=-2)[rank]
out, lse = ring_attention(mine(q), mine(k), mine(v), is_causal=True)
grads = ring_attention_backward(mine(q), mine(k), mine(v), out, lse, mine(d_out), is_causal=True)
one, one_lse = wa.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
ones = wa.sdpa_backward(q, k, v, one, one_lse, d_out, is_causal=True)
for name, got, want in [("out", out, one), ("lse", lse, one_lse), *zip(("dq", "dk", "dv"), grads, ones)]:
    want = mine(want) if want.ndim == 4 else np.array_split(want, world, axis=-1)[rank]
    assert got.shape == want.shape and np.allclose(got, want, atol=2e-5, rtol=2e-4), (rank, name)
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "PASS")
"""


def test_ring_functions_take_array_split_shards(ctx):
    """ring_attention and its backward on np.array_split's unequal shards (4, 3, 3 rows
    of L = 10 over 3 ranks), launched as torchrun would: each rank's part of one call
    over the whole sequence (gloo aborted, SIGABRT, on the blocks' different sizes)."""
    seed, world = 40, 3
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(seed)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=DEADLINE_S)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for r, (p, output) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"rank {r} PASS" in output, f"rank {r} (seed {seed}), exit {p.returncode}:\n" \
                                                                  f"{output[-3000:]}"
