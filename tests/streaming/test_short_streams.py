"""Short streams: OnlineEM answers during its warm-up with the first fit from the samples so far.

The reference is independent of the shortcut: the same model built with ``n_warmup = n_seen − 1`` and fed
the same samples has really ended its warm-up at the last sample, so every query must agree with it bit for
bit, while the queried model keeps warming up exactly as if it had never been asked.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import onlinefa
from onlinefa import NotFittedError
from engine_state import engine_state

D, K = 60, 20


def _stream(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((D, 3))
    return 5.0 + rng.standard_normal((n, 3)) @ loadings.T + 0.3 * rng.standard_normal((n, D))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n_seen", [2, 7, 20, 22])
def test_queries_during_warmup_equal_a_model_whose_warmup_ended_there(dtype: str, n_seen: int) -> None:
    x = _stream(n_seen)
    model = onlinefa.OnlineEM(D, K, seed=1, dtype=dtype).update(x)
    assert model.n_warmup == K + 2 and not model.is_fitted
    ended = onlinefa.OnlineEM(D, K, seed=1, dtype=dtype, n_warmup=n_seen - 1).update(x)
    assert ended.is_fitted
    for got, want in zip(model.snapshot(), ended.snapshot()):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.log_prob(x[:3]), ended.log_prob(x[:3]))
    np.testing.assert_array_equal(model.transform(x[:3]), ended.transform(x[:3]))
    np.testing.assert_array_equal(model.sample(4, seed=3), ended.sample(4, seed=3))
    # Rank at most n_seen − 1 (d_1 = 0), marginal variances the running d̄² (whitening).
    _, loadings, psi = model.snapshot()
    assert np.linalg.matrix_rank(loadings, tol=1e-6 * np.abs(loadings).max()) <= n_seen - 1
    dsq_bar = engine_state(model)["dsq_bar"]
    np.testing.assert_allclose(np.sum(loadings**2, axis=1) + psi, dsq_bar, rtol=1e-4 if dtype == "float32" else 1e-10)


def test_answering_during_warmup_changes_nothing() -> None:
    x = _stream(40)
    asked = onlinefa.OnlineEM(D, K, seed=2)
    never = onlinefa.OnlineEM(D, K, seed=2)
    for row in x[:10]:
        asked.update(row)
        never.update(row)
        if asked.n_seen >= 2:
            state = engine_state(asked)
            asked.snapshot()
            asked.sample(2, seed=0)
            after = engine_state(asked)
            assert all(np.array_equal(after[key], value) for key, value in state.items())
    assert not asked.is_fitted
    asked.update(x[10:])
    never.update(x[10:])
    assert asked.is_fitted
    for got, want in zip(asked.snapshot(), never.snapshot()):
        np.testing.assert_array_equal(got, want)
    # A checkpoint taken during the warm-up holds the warming-up model, not the provisional fit.
    warm = onlinefa.OnlineEM(D, K, seed=2).update(x[:5])
    warm.snapshot()
    copy = pickle.loads(pickle.dumps(warm))
    assert not copy.is_fitted and copy.n_seen == 5
    for got, want in zip(copy.update(x[5:]).snapshot(), never.snapshot()):
        np.testing.assert_array_equal(got, want)


def test_the_answer_follows_each_new_sample() -> None:
    x = _stream(6)
    model = onlinefa.OnlineEM(D, K, seed=4).update(x[:3])
    first = model.snapshot()[1]
    model.update(x[3])
    second = model.snapshot()[1]
    ended = onlinefa.OnlineEM(D, K, seed=4, n_warmup=3).update(x[:4])
    np.testing.assert_array_equal(second, ended.snapshot()[1])
    assert not np.array_equal(first, second)


def test_fewer_than_two_distinct_samples_and_sga_warmups_raise() -> None:
    x = _stream(3)
    model = onlinefa.OnlineEM(D, K, seed=0)
    with pytest.raises(NotFittedError, match="two samples that differ"):
        model.snapshot()
    model.update(x[0])
    with pytest.raises(NotFittedError, match="two samples that differ"):
        model.log_prob(x[:1])
    model.update(x[0])  # the same sample again: no scale to fit yet
    with pytest.raises(NotFittedError, match="two samples that differ"):
        model.sample(1, seed=0)
    model.update(x[1])
    assert model.snapshot()[1].shape == (D, K)
    sga = onlinefa.OnlineSGA(D, K, seed=0).update(x)
    with pytest.raises(NotFittedError, match="warm-up"):
        sga.snapshot()
