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
