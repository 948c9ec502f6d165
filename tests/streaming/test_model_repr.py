"""``repr`` of the streaming models shows their configuration, identically after ``load`` and pickle."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from engine_state import engine_state


@pytest.mark.parametrize("make", [
    lambda: onlinefa.OnlineEM(5, 2, seed=0),
    lambda: onlinefa.OnlineEM(5, 2, schedule="constant", rho=0.05, whiten=False, seed=0),
    lambda: onlinefa.OnlineEM.algorithm2(5, 2, seed=0),
    lambda: onlinefa.OnlineSGA(5, 2, lr=0.01, schedule="power", kappa=0.8, tau0=3.0, seed=0),
])
def test_repr_shows_the_configuration_also_after_load(make: Any, tmp_path: Path) -> None:
    model = make().update(np.random.default_rng(0).standard_normal((20, 5)))
    text = repr(model)
    state = engine_state(model)  # what the engine actually runs with
    for name in ("schedule", "scaling", "noise_floor", "n_warmup", "n_seen", "n_features", "n_components"):
        assert f"{name}={state[name]!r}" in text
    assert ("kappa=" in text) == (state["schedule"] == "power") and ("rho=" in text) == (state["schedule"] == "constant")
    if state["schedule"] == "power":
        assert f"kappa={state['kappa']!r}" in text and f"tau0={state['tau0']!r}" in text
    assert f"whiten={state['whiten']!r}" in text if "whiten" in state else f"lr={state['lr']!r}" in text
    model.save(tmp_path / "m.ckpt")
    assert repr(onlinefa.load(tmp_path / "m.ckpt")) == text
    assert repr(pickle.loads(pickle.dumps(model))) == text
