"""Context.info is the CLI's `info --json` entry for the same adapter, key for key."""

import json
import os
import pathlib
import subprocess

import pytest

import wgpu_attention as wa

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cli():
    path = os.environ.get("WGPU_ATTENTION_CLI") or str(ROOT / "target" / "release" / "wgpu-attention")
    return path if os.access(path, os.X_OK) else None


def test_info_matches_cli(ctx):
    binary = cli()
    if binary is None:
        if os.environ.get("WGPU_ATTENTION_CLI"):
            pytest.fail(f"WGPU_ATTENTION_CLI={os.environ['WGPU_ATTENTION_CLI']} is not an executable")
        pytest.skip("no wgpu-attention binary (cargo build --release, or set WGPU_ATTENTION_CLI)")
    listed = json.loads(subprocess.run([binary, "info", "--json"], check=True, capture_output=True, text=True).stdout)
    info = ctx.info
    same = [a for a in listed if a["name"] == info["name"] and a["backend"] == info["backend"]]
    assert same, f"{info['name']} ({info['backend']}) not among the CLI's adapters {[a['name'] for a in listed]}"
    assert info == same[0]


def test_info_fields(ctx):
    info = ctx.info
    for key in ["name", "backend", "device_type", "driver_info", "f16", "fused_tilings", "limits"]:
        assert key in info, key
    assert info["f16"] == ctx.supports_f16
    assert info["name"] == ctx.adapter_name
    assert wa.default_context() is wa.default_context()


def test_first_call_prints_no_error_headless(ctx):
    """On a headless machine (no XDG_RUNTIME_DIR) Mesa's Vulkan device-select layer
    made the first call print "error: XDG_RUNTIME_DIR is invalid or not set in the
    environment." twice; importing the package turns the layer off as the CLI does
    (NODEVICE_SELECT=1, unless set)."""
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "NODEVICE_SELECT")}
    code = (
        "import os, wgpu_attention as wa, numpy as np\n"
        "q = np.random.default_rng(57).standard_normal((1, 2, 5, 8)).astype(np.float32)\n"
        "out = wa.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
        "assert out.shape == (1, 2, 5, 8) and np.isfinite(out).all()\n"
        "print(os.environ.get('NODEVICE_SELECT'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "error:" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "1"
    # A caller's own setting is kept.
    env["NODEVICE_SELECT"] = "0"
    proc = subprocess.run([sys.executable, "-c", "import os, wgpu_attention; print(os.environ['NODEVICE_SELECT'])"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr
