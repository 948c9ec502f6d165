"""``repr(MiniBatchEM)`` shows its configuration like the other models' reprs, identically after load and pickle."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from engine_state import engine_state

D, K = 6, 2


@pytest.mark.parametrize("make", [
    lambda: onlinefa.MiniBatchEM(D, K, batch_size=4, seed=0),
    lambda: onlinefa.MiniBatchEM(D, K, batch_size=3, schedule="constant", rho=0.2, whiten=False, seed=0),
    lambda: onlinefa.MiniBatchEM(D, K, schedule="harmonic", noise_floor=1e-6, seed=0,
                                 mean=np.zeros(D), variance=np.ones(D)),
])
def test_repr_shows_the_configuration_also_after_load(make: Any, tmp_path: Path) -> None:
    model = make().update(np.random.default_rng(0).standard_normal((10, D)))
    text = repr(model)
    state = engine_state(model)  # what the engine actually runs with
    assert text.startswith(f"MiniBatchEM(n_features={D}, n_components={K}, batch_size={model.batch_size}, ")
    for name in ("whiten", "schedule", "noise_floor", "n_batches", "n_seen"):
        assert f"{name}={state[name]!r}" in text
    assert f"fixed_mean={state['fixed']!r}" in text
    assert ("kappa=" in text) == ("tau0=" in text) == (state["schedule"] == "power")
    assert ("rho=" in text) == (state["schedule"] == "constant")
    if state["schedule"] == "power":
        assert f"kappa={state['kappa']!r}" in text and f"tau0={state['tau0']!r}" in text
    if state["schedule"] == "constant":
        assert f"rho={state['rho']!r}" in text
    model.save(tmp_path / "m.ckpt")
    assert repr(onlinefa.load(tmp_path / "m.ckpt")) == text
    assert repr(pickle.loads(pickle.dumps(model))) == text


def test_repr_follows_the_counters() -> None:
    model = onlinefa.MiniBatchEM(D, K, batch_size=4, seed=0)
    assert repr(model).endswith("n_batches=0, n_seen=0)")
    model.update(np.random.default_rng(0).standard_normal((10, D)))
    assert repr(model).endswith("n_batches=3, n_seen=10)")
