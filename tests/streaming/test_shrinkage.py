"""The reporting shrinkage of OnlineEM (``shrink=True``, the default), against a NumPy transcription of the
spiked-model shrinker (Donoho, Gavish & Johnstone 2018) written from the formulas, not from the Rust code."""

from __future__ import annotations

import numpy as np
import pytest

import onlinefa
from onlinefa._gaussian import sample_noise, sample_seed
from onlinefa.datasets import make_fa_model, sample_fa
from onlinefa.metrics import relative_covariance_distance


def _population_spike(lam: float, gamma: float) -> tuple[float, float]:
    """(ℓ, c²) of a sample spike λ at aspect ratio γ: λ = ℓ + γ ℓ/(ℓ − 1) above (1 + √γ)², else (1, 0)."""
    if lam <= (1 + np.sqrt(gamma)) ** 2:
        return 1.0, 0.0
    b = lam + 1 - gamma
    ell = (b + np.sqrt(b * b - 4 * lam)) / 2
    c2 = (1 - gamma / (ell - 1) ** 2) / (1 + gamma / (ell - 1))
    return ell, min(max(c2, 0.0), 1.0)


def reference_shrunk(loadings: np.ndarray, psi: np.ndarray, n: float) -> tuple[np.ndarray, np.ndarray]:
    """The shrunk (F, ψ) from the SVD of G = Ψ^{-1/2} F, σ² from the trace by fixed-point iteration."""
    d = loadings.shape[0]
    gamma = d / max(n - 1, 1)
    u, s, _ = np.linalg.svd(loadings / np.sqrt(psi)[:, None], full_matrices=False)
    m = s**2
    sigma_sq = 1.0
    for _ in range(500):
        excess = sum(_population_spike((1 + mk) / sigma_sq, gamma)[0] - 1 for mk in m)
        sigma_sq = (d + m.sum()) / (d + excess)
    shrunk = []
    for mk in m:
        ell, c2 = _population_spike((1 + mk) / sigma_sq, gamma)
        shrunk.append(min(sigma_sq * (ell - 1) * c2, mk))
    new_f = np.sqrt(psi)[:, None] * u * np.sqrt(np.array(shrunk))
    new_psi = psi + np.sum(loadings**2, axis=1) - np.sum(new_f**2, axis=1)
    return new_f, new_psi


@pytest.fixture(scope="module")
def stream() -> tuple[np.ndarray, np.ndarray]:
    c, f, psi = make_fa_model(300, 6, spectrum=(1.0, 100.0), seed=3)
    return sample_fa(c, f, psi, 2_000, seed=4), f @ f.T + np.diag(psi)


@pytest.mark.parametrize("n_samples", [15, 60, 400])
@pytest.mark.parametrize("schedule", ["harmonic", "power"])
def test_reported_gaussian_is_the_shrunk_fit(stream, n_samples, schedule):
    x, _ = stream
    shrunk = onlinefa.OnlineEM(300, 6, seed=0, schedule=schedule).update(x[:n_samples])
    raw = onlinefa.OnlineEM(300, 6, seed=0, schedule=schedule, shrink=False).update(x[:n_samples])
    n = n_samples
    if schedule == "power":  # effective samples 1/Σ w², from the recursion of the weights
        s = 0.0
        for t in range(1, n_samples + 1):
            rho = max(t**-0.9, 1 / t)
            s = (1 - rho) ** 2 * s + rho**2
        n = 1 / s
    _, f, psi = raw.snapshot()
    ref_f, ref_psi = reference_shrunk(f, psi, n)
    mean, got_f, got_psi = shrunk.snapshot()
    np.testing.assert_allclose(got_f @ got_f.T, ref_f @ ref_f.T, rtol=1e-8, atol=1e-10 * np.abs(f).max() ** 2)
    np.testing.assert_allclose(got_psi, ref_psi, rtol=1e-9)
    np.testing.assert_array_equal(mean, raw.snapshot()[0])
    # The marginal variances are the fit's, and the queries read the shrunk Gaussian.
    np.testing.assert_allclose(np.sum(got_f**2, 1) + got_psi, np.sum(f**2, 1) + psi, rtol=1e-12)
    np.testing.assert_allclose(shrunk.log_prob(x[-3:]), onlinefa._gaussian.log_prob(x[-3:], mean, got_f, got_psi),
                               rtol=1e-10)
    latent, noise = sample_noise(2, 6, 300, sample_seed(1))
    np.testing.assert_allclose(shrunk.sample(2, seed=1), mean + latent @ got_f.T + np.sqrt(got_psi) * noise,
                               rtol=1e-10, atol=1e-12)


def test_short_streams_beat_the_thesis_algorithm(stream):
    """At T ≤ 2D the reported default fit is more accurate than thesis Algorithm 2 and than the raw fit (the
    maximum-likelihood fit overstates the factors when γ = D/T is not small); on this fixed stream the
    raw fit loses to Algorithm 2 at every T ≤ 100."""
    x, truth = stream
    models = {
        "default": onlinefa.OnlineEM(300, 6, seed=0),
        "raw": onlinefa.OnlineEM(300, 6, seed=0, shrink=False),
        "algorithm2": onlinefa.OnlineEM.algorithm2(300, 6, seed=0),
    }
    done = 0
    for t in (10, 30, 100, 300, 600):
        errors = {}
        for name, model in models.items():
            model.update(x[done:t])
            errors[name] = relative_covariance_distance(model.covariance(), truth)
        done = t
        assert errors["default"] < errors["algorithm2"], (t, errors)
        assert errors["default"] < errors["raw"], (t, errors)


def test_the_shrinkage_vanishes_as_the_stream_grows():
    """Factors far above the detection edge lose O(γ) of their strength (γ = D/(T − 1)): the change of the
    reported covariance is below γ relative to its scale, and ten times more samples shrink it > 5-fold."""
    c, f, psi = make_fa_model(30, 2, spectrum=(1.0, 100.0), seed=5)
    x = sample_fa(c, f, psi, 3_000, seed=6)
    changes = []
    for t in (300, 3_000):
        shrunk = onlinefa.OnlineEM(30, 2, seed=0).update(x[:t])
        cov = onlinefa.OnlineEM(30, 2, seed=0, shrink=False).update(x[:t]).covariance()
        changes.append(np.abs(shrunk.covariance() - cov).max() / np.abs(cov).max())
    assert changes[1] < 30 / 2_999
    assert changes[1] < changes[0] / 5


def test_checkpoints_keep_the_setting_and_old_ones_report_the_fit(stream, tmp_path):
    x, _ = stream
    model = onlinefa.OnlineEM(300, 6, seed=0).update(x[:50])
    model.save(tmp_path / "m.ofa")
    back = onlinefa.OnlineEM.load(tmp_path / "m.ofa")
    np.testing.assert_array_equal(back.covariance(), model.covariance())
    assert "shrink=True" in repr(back)
    state = model._core.get_state()
    del state["shrink"]  # a checkpoint written before the option existed
    old = onlinefa.OnlineEM.__new__(onlinefa.OnlineEM)
    old._restore(state)
    raw = onlinefa.OnlineEM(300, 6, seed=0, shrink=False).update(x[:50])
    np.testing.assert_array_equal(old.covariance(), raw.covariance())
    assert "shrink=False" in repr(old)


def test_the_estimator_and_algorithm2_report_the_fit(stream):
    x, _ = stream
    est = onlinefa.OnlineFactorAnalysis(n_components=6, random_state=0).fit(x[:50])
    raw = onlinefa.OnlineEM(300, 6, seed=0, shrink=False).update(x[:50])
    np.testing.assert_allclose(est.get_covariance(), raw.covariance(), rtol=1e-12)
    assert "shrink=False" in repr(onlinefa.OnlineEM.algorithm2(300, 6, seed=0))


def test_queries_follow_the_model_after_each_update():
    """The map is computed once per sample count (and reused by the next query): after each update the queries
    report the new fit's shrinkage, not the previous one's. Three strong factors (strengths ~400 against an edge
    of ~10 at T = 20) keep the map far from 0 and I, so it changes from one count to the next."""
    rng = np.random.default_rng(8)
    loadings, psi = 2.0 * rng.standard_normal((100, 3)), rng.uniform(0.5, 2.0, 100)
    x = rng.standard_normal((60, 3)) @ loadings.T + np.sqrt(psi) * rng.standard_normal((60, 100))
    model = onlinefa.OnlineEM(100, 3, seed=0)
    raw = onlinefa.OnlineEM(100, 3, seed=0, shrink=False)
    previous = None
    for stop in (20, 21, 60):
        model.update(x[model.n_seen:stop])
        raw.update(x[raw.n_seen:stop])
        mean, f, psi_fit = raw.snapshot()
        ref_f, ref_psi = reference_shrunk(f, psi_fit, stop)
        expected = onlinefa._gaussian.log_prob(x[-2:], mean, ref_f, ref_psi)
        for _ in range(2):
            np.testing.assert_allclose(model.log_prob(x[-2:]), expected, rtol=1e-9)
        assert previous is None or not np.allclose(expected, previous, rtol=1e-6)
        previous = expected
