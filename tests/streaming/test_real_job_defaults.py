"""Promises of the default configuration on data at any scale (network weights are ~1e-2, variances ~1e-4).

* Scale equivariance: fitting c·X gives c times the mean and c² times the covariance, for c from 1e-4 to 1e4.
  Both models are deterministic given their seed, and every quantity of the ``scaling="data"`` algorithm
  scales exactly (latents are unit-free), so the only difference is rounding: relative 1e-9 is ~10⁶ ulps of
  headroom over a few hundred updates, while the thesis's unit-scale algorithm misses by orders of magnitude.
* Short streams (20–50 snapshots) give a fitted posterior whose marginal variances are on the data's scale.
* ``mean`` is the exact running average θ_SWA whatever schedule the covariance statistics use.
* Queries before warm-up ends raise NotFittedError instead of returning the initialisation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import NotFittedError

D, K = 60, 3
SCALES = (1e-4, 1.0, 1e4)


def weight_scale_stream(n_samples: int, seed: int) -> np.ndarray:
    """Factor-analysis samples on a network-weight scale: loadings ~0.01, ψ ~1e-5, offset ~0.1."""
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((D, K)) * 0.01
    psi = rng.uniform(0.5, 1.5, D) * 1e-5
    offset = rng.standard_normal(D) * 0.1
    latents = rng.standard_normal((n_samples, K))
    return offset + latents @ loadings.T + rng.standard_normal((n_samples, D)) * np.sqrt(psi)


def covariance_of(model: Any) -> np.ndarray:
    loadings, psi = model.loadings, model.noise_variance
    return np.asarray(loadings @ loadings.T + np.diag(psi))


MODELS = {
    "em": lambda: onlinefa.OnlineEM(D, K, seed=0),
    "sga": lambda: onlinefa.OnlineSGA(D, K, seed=0),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("scale", SCALES)
def test_default_models_are_scale_equivariant(name: str, scale: float) -> None:
    X = weight_scale_stream(300, 1)
    reference = MODELS[name]().update(X)
    scaled = MODELS[name]().update(X * scale)
    np.testing.assert_allclose(scaled.mean, scale * reference.mean, rtol=1e-9, atol=0)
    np.testing.assert_allclose(covariance_of(scaled), scale**2 * covariance_of(reference), rtol=1e-9,
                               atol=1e-9 * scale**2 * np.abs(covariance_of(reference)).max())


def test_thesis_algorithm_is_not_scale_equivariant() -> None:
    # The contrast that motivates the defaults: Algorithm 2 starts at ψ = 1 with an absolute floor.
    X = weight_scale_stream(300, 1)
    unit = onlinefa.OnlineEM.algorithm2(D, K, n_warmup=20, seed=0).update(X)
    scaled = onlinefa.OnlineEM.algorithm2(D, K, n_warmup=20, seed=0).update(X * 1e-4)
    ratio = np.trace(covariance_of(scaled)) / np.trace(covariance_of(unit))
    assert not 0.5e-8 < ratio < 2e-8


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("n_samples", [20, 50])
def test_short_streams_give_a_posterior_on_the_data_scale(name: str, n_samples: int) -> None:
    X = weight_scale_stream(n_samples, 2)
    model = MODELS[name]().update(X)
    assert model.is_fitted
    # The total variance of the fit against the samples' own (unbiased) total variance: a posterior that
    # kept its ψ = 1 initialisation is 10⁴× too wide, a collapsed one 100× too narrow. With 20 samples of
    # 60 features the sample total variance itself is within ±30% of the truth, hence [0.25, 4].
    ratio = np.trace(covariance_of(model)) / X.var(axis=0, ddof=1).sum()
    assert 0.25 < ratio < 4.0


@pytest.mark.parametrize("schedule", ["power", "constant", "harmonic"])
def test_mean_is_the_exact_running_average(schedule: str) -> None:
    rng = np.random.default_rng(3)
    walk = np.cumsum(rng.standard_normal((2000, D)), axis=0)  # a drifting stream, where forgetting matters
    em = onlinefa.OnlineEM(D, K, seed=0, schedule=schedule, rho=0.05).update(walk)
    sga = onlinefa.OnlineSGA(D, K, seed=0, schedule=schedule, rho=0.05).update(walk)
    for model in (em, sga):
        np.testing.assert_allclose(model.mean, walk.mean(axis=0), rtol=1e-10, atol=1e-10)


def test_unit_scaling_mean_follows_the_schedule() -> None:
    rng = np.random.default_rng(3)
    walk = np.cumsum(rng.standard_normal((500, D)), axis=0)
    em = onlinefa.OnlineEM(D, K, seed=0, schedule="constant", rho=0.05, scaling="unit").update(walk)
    expected = walk[0].copy()
    for t, row in enumerate(walk[1:], start=2):
        expected += max(0.05, 1.0 / t) * (row - expected)
    np.testing.assert_allclose(em.mean, expected, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_queries_before_warmup_ends_raise_not_fitted_or_answer_the_first_fit(name: str) -> None:
    model = MODELS[name]()
    X = weight_scale_stream(K + 2, 4)  # n_warmup="auto" is K + 2: still warming up afterwards
    model.update(X)
    assert not model.is_fitted
    np.testing.assert_allclose(model.mean, X.mean(axis=0), rtol=1e-12)
    queries = (lambda: model.loadings, lambda: model.noise_variance, lambda: model.sample(2),
               lambda: model.log_prob(X), lambda: model.transform(X), model.snapshot)
    for query in queries:
        if name == "em":  # the first fit from the K + 2 weight-scale samples (tests/streaming/test_short_streams.py)
            answer = query()
            for part in answer if isinstance(answer, tuple) else (answer,):
                assert np.isfinite(part).all()
        else:
            with pytest.raises(NotFittedError, match="warm-up"):
                query()
    model.update(X[:1])
    assert model.is_fitted and model.loadings.shape == (D, K)


def test_warmup_start_is_measured_in_the_data_units() -> None:
    X = weight_scale_stream(K + 2, 5)
    em = onlinefa.OnlineEM(D, K, seed=0).update(X)
    loadings, psi = em.initial_parameters()
    # σ̂² = mean over features of the running d̄² under the default harmonic schedule, d_t = θ_t − θ̄_t.
    mean = np.zeros(D)
    dsq = np.zeros(D)
    for t, row in enumerate(X, start=1):
        mean += (row - mean) / t
        dsq += (1.0 / t) * ((row - mean) ** 2 - dsq)
    sigma_sq = dsq.mean()
    np.testing.assert_allclose(psi, np.full(D, sigma_sq), rtol=1e-12)
    init = onlinefa.OnlineEM(D, K, seed=0).initial_parameters()[0]  # F₀ (σ = 1 before any sample)
    np.testing.assert_allclose(loadings, init * np.sqrt(sigma_sq), rtol=1e-12)


def test_snapshot_is_cached_read_only_and_refreshed_by_update() -> None:
    X = weight_scale_stream(40, 6)
    em = onlinefa.OnlineEM(D, K, seed=0).update(X[:30])
    first = em.snapshot()
    assert em.loadings is first[1] and not first[1].flags.writeable
    em.update(X[30:])
    second = em.snapshot()
    assert second[1] is not first[1]
    _, _, loadings, noise_variance = em._core.snapshot()
    np.testing.assert_array_equal(second[1], loadings)
    np.testing.assert_array_equal(second[2], noise_variance)


def test_sga_feature_frozen_during_warm_up_does_not_diverge() -> None:
    # Parameters that do not move during warm-up (dead units, a frozen layer) start at the noise floor
    # (~1e-10 σ̂²). The latents can explain at most K of them once they move, so the others meet d²/ψ ~ 1e10,
    # and an unbounded log-ψ step threw their ψ to the state's ceiling (1e150), where the gradient (→ −½)
    # cannot bring it back. The noise variance must stay on the data's scale: below the largest squared
    # deviation any feature ever showed, times 10.
    X = weight_scale_stream(200, 3)
    X[:20, :5] = X[0, :5]  # five features (> K) frozen during and after the warm-up of K + 2 = 5 samples
    model = onlinefa.OnlineSGA(D, K, seed=0).update(X)
    largest_square = float(np.max((X - X.mean(axis=0)) ** 2))
    assert np.isfinite(model.loadings).all()
    assert model.noise_variance.max() < 10 * largest_square
