"""The default OnlineEM on the streams users have: ordered SGD-like iterates and short snapshot streams.

References: the running squared deviations d̄²_d = (1/T) Σ_t (θ_t,d − θ̄_t,d)² transcribed in NumPy (θ̄_t the
mean after θ_t), and the iterates' empirical variances.
"""

from __future__ import annotations

import numpy as np

import onlinefa


def ordered_iterates(n_features: int = 300, n_samples: int = 250, seed: int = 0) -> np.ndarray:
    """An SGD-like ordered stream: an Ornstein–Uhlenbeck walk with 5 correlated directions around a drifting centre."""
    rng = np.random.default_rng(seed)
    theta, centre = np.zeros(n_features), np.zeros(n_features)
    drift = 0.02 * rng.standard_normal(n_features)
    directions = 0.3 * rng.standard_normal((n_features, 5))
    rows = []
    for _ in range(n_samples):
        centre += drift
        theta = theta + 0.2 * (centre - theta) + directions @ (0.3 * rng.standard_normal(5))
        theta += 0.05 * rng.standard_normal(n_features)
        rows.append(theta.copy())
    return np.array(rows)


def running_squared_deviations(x: np.ndarray) -> np.ndarray:
    """(1/T) Σ_t (θ_t − θ̄_t)², θ̄_t the running mean after including θ_t."""
    running_means = np.cumsum(x, axis=0) / np.arange(1, len(x) + 1)[:, None]
    return np.mean((x - running_means) ** 2, axis=0)


def marginal_variances(model: onlinefa.OnlineEM) -> np.ndarray:
    return np.sum(model.loadings**2, axis=1) + model.noise_variance


def test_default_marginal_variances_are_the_running_squared_deviations() -> None:
    # With whitening F = Ā, so diag(F Fᵀ) + ψ = rowsum(Ā²) + d̄² − rowsum(F ⊙ Ā) = d̄² exactly; the default's
    # equal weights make d̄² the plain average of the squared deviations.
    x = ordered_iterates()
    model = onlinefa.OnlineEM(x.shape[1], 20, seed=0).update(x)
    np.testing.assert_allclose(marginal_variances(model), running_squared_deviations(x), rtol=1e-9)


def test_default_width_is_the_width_of_ordered_iterates() -> None:
    # The iterates drift, so weighting late samples more (a forgetting schedule) measures 1.29 here (the
    # real-network streams measured 1.24-1.44); equal weights give (1/T) Σ (θ_t − θ̄_t)², within a few
    # percent of the variance about the final mean on this stream (0.99).
    x = ordered_iterates()
    model = onlinefa.OnlineEM(x.shape[1], 20, seed=0).update(x)
    ratio = marginal_variances(model) / x.var(axis=0)
    assert 0.9 <= float(np.mean(ratio)) <= 1.1
    assert 0.8 <= float(ratio.min()) and float(ratio.max()) <= 1.25


def test_warmup_is_k_plus_two_and_a_short_stream_still_gets_a_posterior() -> None:
    # SWAG's schedule: one snapshot per epoch for 20 epochs. K = 20 warms up for K + 2 = 22 snapshots, and
    # answers meanwhile with the first fit from the 20 snapshots (rank <= 19; tests/streaming/test_short_streams.py).
    x = ordered_iterates(n_features=120, n_samples=20)
    model = onlinefa.OnlineEM(120, 20, seed=0).update(x)
    assert model.n_warmup == 22 and not model.is_fitted
    _, loadings, noise = model.snapshot()
    assert loadings.shape == (120, 20) and np.all(np.isfinite(loadings)) and np.all(noise > 0)
    width = (np.sum(loadings**2, axis=1) + noise).mean() / x.var(axis=0).mean()
    assert 0.8 <= width <= 1.0  # d̄² about the running mean: (1 − H_20/20) / (1 − 1/20) = 0.86 if independent
    fitted = onlinefa.OnlineEM(120, 17, seed=0).update(x)
    mean, loadings, noise = fitted.snapshot()
    assert loadings.shape == (120, 17) and np.all(np.isfinite(loadings)) and np.all(noise > 0)
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-12, atol=1e-12)
