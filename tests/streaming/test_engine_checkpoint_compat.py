"""Checkpoints written before the streaming engine (deferred running moments, Ā-space sums) still load and
continue the same stream as the release that wrote them.

The fixtures in tests/data were saved by that release mid-stream (pending update outstanding) together with its
state after 20 more samples. float64 must continue to rounding level (the new arithmetic forms the same sums in
another order); float32 state now does float32 per-row arithmetic, so it agrees to float32 rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import onlinefa

DATA = Path(__file__).resolve().parents[1] / "data"


def stream() -> np.ndarray:
    rng = np.random.default_rng(5)
    return rng.standard_normal((60, 12)) @ np.diag(np.linspace(1, 3, 12)) + np.arange(12)


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-12), ("float32", 1e-5)])
def test_pre_engine_checkpoint_loads_and_continues(dtype: str, rtol: float) -> None:
    model = onlinefa.OnlineEM.load(DATA / f"online_em_v0_1_{dtype}.ofa")
    assert model.n_seen == 40
    model.update(stream()[40:])
    expected = np.load(DATA / f"online_em_v0_1_{dtype}_expected.npz")
    assert model.n_seen == int(expected["n_seen"])
    for name in ("mean", "loadings", "noise_variance"):
        got = np.asarray(getattr(model, name), np.float64)
        want = expected[name]
        error = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert error <= rtol, f"{name}: {error:.2e}"
