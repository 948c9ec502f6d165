"""Input the torch streaming models refuse: a bad batch (NaN, infinity, a magnitude beyond the state dtype's
range, a wrong shape) raises ValueError naming the first bad row, and the state map stays bit for bit as it was."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from onlinefa.torch._online_em import OnlineEM  # noqa: E402
from onlinefa.torch._online_sga import OnlineSGA  # noqa: E402
from device_parity import assert_same_state, state_map, stream  # noqa: E402


@pytest.mark.parametrize("model_class", [OnlineEM, OnlineSGA], ids=["OnlineEM", "OnlineSGA"])
@pytest.mark.parametrize("bad", ["nan", "inf", "huge", "shape"])
def test_a_bad_batch_is_refused_before_any_row(model_class: Any, bad: str) -> None:
    d, k = 30, 3
    X = stream(50, d, 6)
    model = model_class(d, k, seed=0).update(torch.as_tensor(X[:20]))
    before = state_map(model)
    batch = torch.as_tensor(X[20:30]).clone()
    if bad == "shape":
        batch = batch[:, :-1]
    else:
        batch[5, 3] = {"nan": float("nan"), "inf": float("inf"), "huge": 1e120}[bad]
    with pytest.raises(ValueError, match="row 5|shape"):
        model.update(batch)
    assert_same_state(state_map(model), before)
