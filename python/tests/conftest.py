"""Shared fixtures: the context (skipping, or failing under
WGPU_ATTENTION_REQUIRE_ADAPTER=1 as the Rust suite does, when no adapter exists) and
seeded random inputs whose seed every failure message names."""

import os

import numpy as np
import pytest

import wgpu_attention as wa


@pytest.fixture(scope="session")
def ctx():
    try:
        return wa.default_context()
    except RuntimeError as e:
        if os.environ.get("WGPU_ATTENTION_REQUIRE_ADAPTER") == "1":
            pytest.fail(f"no adapter, and WGPU_ATTENTION_REQUIRE_ADAPTER=1: {e}")
        pytest.skip(f"no GPU adapter: {e}")


def randn(seed, *shape, dtype=np.float32):
    """Seeded standard normal values (never all zeros)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_close(got, want, seed, what, atol=2e-5, rtol=2e-4):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what} (seed {seed}): shape {got.shape} != {want.shape}"
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), f"{what} (seed {seed}): non-finite entries differ"
    assert np.array_equal(got[~finite], want[~finite]), f"{what} (seed {seed}): infinities differ"
    err = np.abs(got[finite] - want[finite])
    bound = atol + rtol * np.abs(want[finite])
    worst = int(np.argmax(err - bound)) if err.size else 0
    assert np.all(err <= bound), (
        f"{what} (seed {seed}): max error {err.max():.3g} (at flat index {worst}: got "
        f"{got[finite][worst]!r}, want {want[finite][worst]!r}); bound atol={atol} rtol={rtol}"
    )
