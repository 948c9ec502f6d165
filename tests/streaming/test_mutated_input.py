"""An input array changed by another thread while an update reads it never poisons the model.

The update releases the GIL, so another thread can overwrite the batch between the validation and the
pass. Whatever the update then reports (a ValueError for values it refuses, a breakdown, or success),
the model must stay finite and keep working: the next clean batch updates it and queries are finite.
The models are large (D·K > 2¹⁸), where no backup copy of the state is kept.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import onlinefa

D, K = 100_000, 3


@pytest.mark.parametrize("bad", [np.nan, 1e300])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
@pytest.mark.slow
def test_batch_overwritten_during_updates_never_poisons_the_model(model_class: str, dtype: str, bad: float) -> None:
    rng = np.random.default_rng(0)
    model = getattr(onlinefa, model_class)(D, K, seed=0, dtype=dtype, n_warmup=3)
    model.update(rng.standard_normal((6, D)))
    x = rng.standard_normal((4, D))
    clean = x.copy()
    stop = threading.Event()

    def overwrite() -> None:  # a few bad values at a time, mostly clean, so validation often passes
        while not stop.is_set():
            for row in range(len(x)):
                x[row, ::997] = bad
                x[row] = clean[row]

    writer = threading.Thread(target=overwrite)
    writer.start()
    try:
        for _ in range(150):
            try:
                model.update(x)
            except (ValueError, ArithmeticError):
                pass
    finally:
        stop.set()
        writer.join()
    assert np.isfinite(model.mean).all()
    model.update(rng.standard_normal((3, D)))
    assert np.isfinite(model.log_prob(rng.standard_normal((2, D)))).all()
