"""``snapshot(dtype="float32")``: the float64 snapshot's values rounded once, in new writable arrays (which
``torch.as_tensor`` takes without a warning); the default stays float64, cached and read-only."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import onlinefa


@pytest.mark.parametrize("cls", [onlinefa.OnlineEM, onlinefa.OnlineSGA])
@pytest.mark.parametrize("state", ["float32", "float64"])
def test_a_float32_snapshot_is_the_float64_one_rounded(cls: type, state: str) -> None:
    model = cls(40, 3, dtype=state, seed=0).update(np.random.default_rng(0).standard_normal((30, 40)))
    default = model.snapshot()
    small = model.snapshot(dtype="float32")
    for low, high in zip(small, default):
        assert low.dtype == np.float32 and high.dtype == np.float64
        assert low.flags.writeable and not high.flags.writeable
        np.testing.assert_array_equal(low, high.astype(np.float32))
    assert model.snapshot(dtype=np.float64)[1] is default[1]  # the cached arrays


def test_torch_takes_the_float32_snapshot_without_a_warning() -> None:
    torch = pytest.importorskip("torch")
    model = onlinefa.OnlineEM(20, 2, dtype="float32", seed=0).update(np.random.default_rng(1).standard_normal((9, 20)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean = torch.as_tensor(model.snapshot(dtype="float32")[0])
    assert mean.dtype == torch.float32


def test_another_dtype_is_refused() -> None:
    model = onlinefa.OnlineEM(5, 1, seed=0).update(np.random.default_rng(2).standard_normal((4, 5)))
    for dtype in ("float16", "int64", object()):
        with pytest.raises(ValueError, match="dtype must be"):
            model.snapshot(dtype=dtype)
