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


@pytest.mark.parametrize("world,causal,order,seed,backward", [
    (2, False, "contiguous", 11, False),
    (2, True, "contiguous", 12, False),
    (4, False, "contiguous", 13, False),
    (4, True, "contiguous", 14, False),
    (4, True, "zigzag", 15, False),
    (2, True, "contiguous", 16, True),
    (4, True, "zigzag", 17, True),
])
def test_ring_matches_one_call(ctx, world, causal, order, seed, backward):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, str(EXAMPLE), "--world-size", str(world), "--seq", "128", "--heads", "2",
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
    what = f"{world} processes, causal {causal}, {order}, seed {seed}, backward {backward}"
    assert proc.returncode == 0, f"ring attention failed ({what}), exit {proc.returncode}:\n{output[-4000:]}"
    assert "PASS" in output, f"no verdict ({what}):\n{output[-4000:]}"
