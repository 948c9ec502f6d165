"""A refused call of a mini-batch model changes nothing, however many mini-batches it spans.

``OnlineFactorAnalysis(batch_size > 1).partial_fit`` and ``MiniBatchEM.update`` split their input into
mini-batches of ``batch_size`` rows; a bad value in a later mini-batch must not leave the earlier ones
applied: the call raises ``ValueError`` naming the row, and ``n_samples_seen_`` and every byte of the
state are as before the call.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from onlinefa import MiniBatchEM, OnlineFactorAnalysis
from engine_state import engine_state

D, K, B = 8, 2, 10


def data(n: int, seed: int = 0, dtype: type = np.float64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, K)) @ rng.standard_normal((K, D)) + 0.3 * rng.standard_normal((n, D))
    return x.astype(dtype)


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key, value in b.items():
        assert np.array_equal(np.asarray(a[key]), np.asarray(value)), key
        assert np.asarray(a[key]).tobytes() == np.asarray(value).tobytes(), key


@pytest.mark.parametrize(("dtype", "bad", "message"), [
    (np.float64, 1e101, r"row 25 of X contains a value with \|x\| > 1e\+100; no row of this batch was applied"),
    (np.float32, 1e19, r"row 25 of X contains a value with \|x\| > 1e\+18; no row of this batch was applied"),
    (np.float64, np.nan, "NaN"),  # NaN/Inf are refused by the estimator's own input check
    (np.float32, -np.inf, "infinity"),
])
def test_a_bad_row_late_in_a_partial_fit_batch_applies_nothing(dtype: type, bad: float, message: str) -> None:
    fa = OnlineFactorAnalysis(n_components=K, batch_size=B, random_state=0).partial_fit(data(30))
    assert fa.n_samples_seen_ == 30
    before = pickle.dumps(fa)
    batch = data(40, seed=1, dtype=dtype)
    batch[25, 3] = bad  # mini-batches 0 and 1 (rows 0-19) are fine; the third holds the bad row
    with pytest.raises(ValueError, match=message):
        fa.partial_fit(batch)
    assert fa.n_samples_seen_ == 30
    assert pickle.dumps(fa) == before
    # ... and it continues exactly as a model that never saw the refused batch.
    good = data(40, seed=2)
    reference = pickle.loads(before).partial_fit(good)
    assert_same_state(engine_state(fa.partial_fit(good)._model), engine_state(reference._model))


def test_minibatch_em_update_with_a_bad_row_applies_nothing() -> None:
    model = MiniBatchEM(D, K, batch_size=B, seed=0).update(data(30))
    before = engine_state(model)
    batch = data(40, seed=1)
    batch[33, 0] = np.nan
    with pytest.raises(ValueError, match=r"row 33 of X contains NaN or infinity"):
        model.update(batch)
    rows = np.arange(39, -1, -1)  # the bad row is read at position 6 of the shuffled order
    with pytest.raises(ValueError, match=r"row 33 of X \(position 6 of rows\)"):
        model.update(batch, rows)
    assert_same_state(engine_state(model), before)
    assert model.n_seen == 30
