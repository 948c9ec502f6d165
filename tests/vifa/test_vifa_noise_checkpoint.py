"""VIFA checkpoints name the noise generator their pending draws came from."""

from __future__ import annotations

import numpy as np
import pytest

import onlinefa
from onlinefa import _core


def stepped_model() -> onlinefa.VIFA:
    model = onlinefa.VIFA(50, 2, seed=3, prior_precision=0.1, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2)
    model.step(model.sample() - 1.0)
    return model


def test_a_checkpoint_names_its_noise_generator() -> None:
    assert stepped_model()._core.get_state()["noise"] == "philox4x32-10-box-muller"


def test_a_checkpoint_of_the_earlier_generator_loads_when_no_draw_is_pending() -> None:
    model = stepped_model()
    state = model._core.get_state()
    del state["noise"]
    restored = _core.VIFACore.from_state(state)
    np.testing.assert_array_equal(restored.get_state()["loadings"], state["loadings"])
    assert restored.n_pending == 0


def test_pending_draws_of_the_earlier_generator_are_refused_by_name() -> None:
    model = stepped_model()
    model.sample()
    state = model._core.get_state()
    _core.VIFACore.from_state(state)  # the current generator's pending draws resume
    del state["noise"]
    with pytest.raises(ValueError, match=r"1 pending draw\(s\) made with the noise generator `chacha8-ziggurat`"):
        _core.VIFACore.from_state(state)
