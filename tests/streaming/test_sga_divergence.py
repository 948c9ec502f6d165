"""A diverging SGA run raises the numerical-breakdown error instead of continuing silently.

Plain SGD on β = log ψ (the thesis's Algorithm 1, ``scaling="unit"``) with a fixed learning rate diverges
on badly scaled features: ψ jumps many orders of magnitude past every scale of the data and F follows
(covariance errors of 10^136 with finite values). The promise: the update whose pass applies such a step
raises :class:`onlinefa.NumericalBreakdownError` (an ``ArithmeticError``) and leaves the model exactly as
it was, and no convergent run ever sees the error. The criterion (ψ_new > 10⁶ · max(ψ_old, d²) for some
feature) is transcribed independently below on the NumPy reference of Algorithm 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from reference import ReferenceOnlineSGA
from engine_state import engine_state

D, K, T = 30, 3, 400
OVERSHOOT = 1e6


def scaled_stream(spread: float, seed: int) -> npt.NDArray[np.float64]:
    """FA samples whose features are scaled by 10^U(-spread, spread)."""
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((D, K))
    scale = 10.0 ** rng.uniform(-spread, spread, D)
    x = rng.standard_normal((T, K)) @ loadings.T + rng.standard_normal((T, D))
    return x * scale


def initial_loadings(seed: int) -> npt.NDArray[np.float64]:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((D, K)))
    return q


def first_overshooting_sample(stream: npt.NDArray[np.float64], lr: float, n_warmup: int) -> int | None:
    """Index of the first sample whose gradient step (reference Algorithm 1) moves some ψ_d past
    10⁶ · max(ψ_d before, d_d²); None if no step does."""
    reference = ReferenceOnlineSGA(initial_loadings(0), lr, n_warmup)
    for t, row in enumerate(stream):
        psi_before = reference.psi.copy()
        with np.errstate(over="ignore"):  # exp(β) of a diverged step may overflow: that step is the answer
            reference.update(row)
        d = row - reference.mean
        if np.any(reference.psi > OVERSHOOT * np.maximum(psi_before, d * d)):
            return t
    return None


def assert_same_state(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert left.keys() == right.keys()
    for key, value in left.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == right[key].dtype and value.tobytes() == right[key].tobytes(), key
        else:
            assert value == right[key], key


@pytest.mark.parametrize(("spread", "lr"), [(4.0, 1e-3), (2.0, 1e-2), (2.0, 1e-1)])
def test_divergent_sga_step_raises_and_leaves_the_model_unchanged(spread: float, lr: float) -> None:
    stream = scaled_stream(spread, seed=1)
    n_warmup = 20
    diverging = first_overshooting_sample(stream, lr, n_warmup)
    assert diverging is not None, "the reference run must diverge for this case to test anything"
    model = onlinefa.OnlineSGA.algorithm1(D, K, lr=lr, n_warmup=n_warmup, init=initial_loadings(0))
    # The core applies sample t's step in the pass of sample t + 1, so that update must raise.
    model.update(stream[: diverging + 1])
    before = engine_state(model)
    with pytest.raises(onlinefa.NumericalBreakdownError, match="diverged") as caught:
        model.update(stream[diverging + 1 : diverging + 2])
    assert isinstance(caught.value, ArithmeticError)
    assert_same_state(engine_state(model), before)
    # A whole-stream update raises too, and leaves the untouched model as it was.
    fresh = onlinefa.OnlineSGA.algorithm1(D, K, lr=lr, n_warmup=n_warmup, init=initial_loadings(0))
    with pytest.raises(onlinefa.NumericalBreakdownError):
        fresh.update(stream)
    assert fresh.n_seen == 0


@pytest.mark.parametrize("lr", [1e-3, 1e-2, 1e-1])
def test_convergent_unit_scaled_runs_never_raise(lr: float) -> None:
    stream = scaled_stream(0.0, seed=2)
    assert first_overshooting_sample(stream, lr, 20) is None
    model = onlinefa.OnlineSGA.algorithm1(D, K, lr=lr, n_warmup=20, init=initial_loadings(0))
    model.update(stream)
    assert np.isfinite(model.covariance()).all()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_data_scaled_sga_fits_badly_scaled_features_without_raising(dtype: str) -> None:
    # The default data scaling bounds each log ψ step to ±1, so the criterion can never fire; on the
    # stream that diverges under unit scaling it stays within the scale of the data.
    stream = scaled_stream(4.0, seed=1)
    model = onlinefa.OnlineSGA(D, K, seed=0, dtype=dtype)
    model.update(stream.astype(dtype))
    largest_variance = stream.var(axis=0).max()
    assert model.noise_variance.max() <= 10 * largest_variance
    assert np.abs(model.loadings).max() ** 2 <= 10 * largest_variance
