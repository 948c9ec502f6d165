"""Tests of :class:`onlinefa.VIFA` (thesis §4.3, Algorithm 3) against independent references.

References used here, none of them the implementation's own formulas:

* the closed-form negative ELBO of a factor-analysis q under a Gaussian prior and a quadratic negative
  log-likelihood NLL(θ) = ½ (θ − μ)ᵀ P (θ − μ), whose expectation under q is closed-form
  (E_q[NLL] = ½ tr(P S) + ½ (c − μ)ᵀ P (c − μ), S = F Fᵀ + Ψ), differentiated by central finite differences;
* a literal NumPy transcription of Algorithm 3, lines 9–20 (with the erratum: the likelihood gradient is
  the full-data one), including Adam and per-group clipping;
* the Gaussian target itself: with a flat prior and that NLL the exact posterior is N(μ, P⁻¹).

With SGD and every learning rate 1, one step moves each parameter by exactly minus its gradient, so
``old − new`` *is* the gradient the implementation applied; that is how gradients are read out.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onlinefa

FloatArray = npt.NDArray[np.float64]
Params = tuple[FloatArray, FloatArray, FloatArray]

ALPHA = 0.7
UNIT_LR: dict[str, Any] = {"lr_mean": 1.0, "lr_loadings": 1.0, "lr_log_noise": 1.0}


# -- problems and references ---------------------------------------------------------------------
def gaussian_target(n_features: int, seed: int) -> tuple[FloatArray, FloatArray]:
    """Mean μ and covariance Σ (eigenvalues 0.2 … 2, random eigenvectors) of a Gaussian target."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((n_features, n_features)))
    covariance: FloatArray = (basis * np.geomspace(0.2, 2.0, n_features)) @ basis.T
    return rng.standard_normal(n_features), covariance


def start_point(n_features: int, n_components: int, seed: int) -> dict[str, FloatArray]:
    """A generic starting point (init, init_mean, init_noise_variance) for a VIFA."""
    rng = np.random.default_rng(seed)
    return {
        "init": rng.standard_normal((n_features, n_components)),
        "init_mean": rng.standard_normal(n_features),
        "init_noise_variance": rng.uniform(0.3, 1.5, n_features),
    }


def make_vifa(n_features: int, n_components: int, seed: int = 0, **kwargs: Any) -> onlinefa.VIFA:
    """A VIFA at a generic starting point; ``kwargs`` override the defaults (SGD, all rates 1, α = 0.7)."""
    options: dict[str, Any] = {"prior_precision": ALPHA, **UNIT_LR, "seed": seed}
    options.update(start_point(n_features, n_components, seed + 1000))
    options.update(kwargs)
    return onlinefa.VIFA(n_features, n_components, **options)


def params(vi: onlinefa.VIFA) -> Params:
    """(c, F, β) of a model."""
    return vi.mean, vi.loadings, vi.log_noise_variance


def negative_elbo(
    c: FloatArray, f: FloatArray, beta: FloatArray, alpha: float, mu: FloatArray, precision: FloatArray
) -> float:
    """E_q[log q] − E_q[log p(θ)] + E_q[NLL(θ)] up to constants, in closed form (4.41, 4.46, (4.39)).

    −½ log|S| + (α/2)(tr S + cᵀc) + ½ tr(P S) + ½ (c − μ)ᵀ P (c − μ), with S = F Fᵀ + diag(exp β).
    """
    s = f @ f.T + np.diag(np.exp(beta))
    _, log_det = np.linalg.slogdet(s)
    r = c - mu
    return float(-0.5 * log_det + 0.5 * alpha * (np.trace(s) + c @ c) + 0.5 * np.trace(precision @ s) + 0.5 * r @ precision @ r)


def finite_difference_gradient(objective: Callable[[FloatArray, FloatArray, FloatArray], float], point: Params) -> Params:
    """Central differences (step 1e-6) of ``objective`` w.r.t. each entry of (c, F, β)."""
    eps = 1e-6
    out = []
    for which, value in enumerate(point):
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            up, down = [p.copy() for p in point], [p.copy() for p in point]
            up[which][index] += eps
            down[which][index] -= eps
            grad[index] = (objective(*up) - objective(*down)) / (2 * eps)
        out.append(grad)
    return out[0], out[1], out[2]


def applied_gradient(vi: onlinefa.VIFA, grads: npt.ArrayLike) -> Params:
    """Step an SGD model whose learning rates are all 1 and return old − new for (c, F, β)."""
    before = params(vi)
    vi.step(grads)
    after = params(vi)
    return before[0] - after[0], before[1] - after[1], before[2] - after[2]


def reference_gradients(
    point: Params, grads: FloatArray, h: FloatArray, z: FloatArray, alpha: float
) -> Params:
    """Algorithm 3, lines 9–16, transcribed literally; the likelihood terms averaged over the L draws."""
    c, f, beta = point
    psi = np.exp(beta)
    n_draws, n_components = h.shape
    g_c = alpha * c + grads.mean(axis=0)  # line 9
    a = f / psi[:, None]  # line 10
    b = f.T @ a  # line 11
    c_mat = a @ np.linalg.inv(np.eye(n_components) + b)  # line 12
    d_mat = -a + c_mat @ b.T  # line 13
    g_f = d_mat + alpha * f + grads.T @ h / n_draws  # line 14
    s = -0.5 + 0.5 * (c_mat * a).sum(axis=1) * psi  # line 15
    g_beta = s + 0.5 * alpha * psi + 0.5 * (grads * (np.sqrt(psi) * z)).mean(axis=0)  # line 16
    return g_c, g_f, g_beta


class ReferenceVIFA:
    """NumPy Algorithm 3 (lines 9–20) with optional Adam (β₁ 0.9, β₂ 0.999, ε 1e-8) and clipping."""

    def __init__(self, point: Params, alpha: float, lrs: tuple[float, float, float], optimizer: str, clip: float | None):
        self.point = [p.copy() for p in point]
        self.alpha, self.lrs, self.optimizer, self.clip = alpha, lrs, optimizer, clip
        self.first = [np.zeros_like(p) for p in point]
        self.second = [np.zeros_like(p) for p in point]
        self.t = 0

    def step(self, grads: FloatArray, h: FloatArray, z: FloatArray) -> None:
        """One update from the gradients at the draws with noise (h, z)."""
        self.t += 1
        gradients = reference_gradients((self.point[0], self.point[1], self.point[2]), grads, h, z, self.alpha)
        for i, (g, lr) in enumerate(zip(gradients, self.lrs)):
            norm = float(np.linalg.norm(g))
            if self.clip is not None and norm > self.clip:
                g = g * (self.clip / norm)
            if self.optimizer == "sgd":
                self.point[i] = self.point[i] - lr * g  # lines 17–19
                continue
            self.first[i] = 0.9 * self.first[i] + 0.1 * g
            self.second[i] = 0.999 * self.second[i] + 0.001 * g * g
            m_hat = self.first[i] / (1 - 0.9**self.t)
            v_hat = self.second[i] / (1 - 0.999**self.t)
            self.point[i] = self.point[i] - lr * m_hat / (np.sqrt(v_hat) + 1e-8)


def draw_all(vi: onlinefa.VIFA) -> FloatArray:
    """Make the ``n_grad_samples`` training draws of one step; shape (L, D)."""
    return np.stack([vi.sample() for _ in range(vi.n_grad_samples)])


def state_arrays(vi: onlinefa.VIFA) -> dict[str, Any]:
    """The model's full checkpoint state (for exact comparisons)."""
    return dict(vi.__getstate__()["state"])


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Assert two checkpoint states are identical (same keys, dtypes and bits)."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


# -- gradients -----------------------------------------------------------------------------------
def test_entropy_and_prior_gradient_matches_finite_differences() -> None:
    n_features, n_components = 5, 2
    vi = make_vifa(n_features, n_components, seed=1)
    point = params(vi)
    vi.sample()
    applied = applied_gradient(vi, np.zeros(n_features))  # g_θ = 0: only the closed-form terms remain
    zero = np.zeros((n_features, n_features))
    expected = finite_difference_gradient(
        lambda c, f, b: negative_elbo(c, f, b, ALPHA, np.zeros(n_features), zero), point
    )
    # Central differences with step 1e-6 on an O(1) smooth objective: truncation ~1e-12, rounding
    # ~1e-16/1e-6 = 1e-10; 1e-7 is far below any wrong term (the smallest entry of each term is O(0.1)).
    for got, want in zip(applied, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


@pytest.mark.parametrize("n_grad_samples", [1, 3])
def test_step_applies_algorithm_3_exactly(n_grad_samples: int) -> None:
    n_features, n_components = 6, 3
    vi = make_vifa(n_features, n_components, seed=2, n_grad_samples=n_grad_samples)
    point = params(vi)
    thetas = draw_all(vi)
    h, z = vi.pending_noise()
    psi = np.exp(point[2])
    # The remembered noise reproduces the draws (4.50).
    np.testing.assert_allclose(thetas, h @ point[1].T + point[0] + np.sqrt(psi) * z, rtol=0, atol=1e-13)
    grads = np.random.default_rng(3).standard_normal((n_grad_samples, n_features)) * 4.0
    applied = applied_gradient(vi, grads)
    expected = reference_gradients(point, grads, h, z, ALPHA)
    # Same arithmetic up to rounding (the implementation uses −A (I + B)⁻¹ for line 13's −A + C Bᵀ).
    for got, want in zip(applied, expected):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_expected_gradient_matches_finite_differences_of_the_negative_elbo() -> None:
    n_features, n_components, n_draws = 4, 2, 20_000
    mu, covariance = gaussian_target(n_features, 4)
    precision = np.linalg.inv(covariance).astype(np.float64)
    vi = make_vifa(n_features, n_components, seed=5, n_grad_samples=n_draws)
    point = params(vi)
    thetas = draw_all(vi)
    grads = (thetas - mu) @ precision  # ∇θ NLL of the quadratic "likelihood" at each draw
    h, z = vi.pending_noise()
    applied = applied_gradient(vi, grads)
    expected = finite_difference_gradient(
        lambda c, f, b: negative_elbo(c, f, b, ALPHA, mu, precision), point
    )
    # Monte Carlo standard error of each entry from the per-draw likelihood terms (4.51, 4.52, 4.61).
    per_draw = (
        grads,
        grads[:, :, None] * h[:, None, :],
        0.5 * grads * np.sqrt(np.exp(point[2])) * z,
    )
    for got, want, terms in zip(applied, expected, per_draw):
        standard_error = terms.std(axis=0) / np.sqrt(n_draws)
        # 5 standard errors (plus the finite-difference error): a per-entry two-sided normal tail of
        # 6e-7, i.e. < 1e-5 over the 16 entries; the likelihood terms are O(1) while 5 s.e. ≈ 0.05, so a
        # dropped or mis-scaled term (e.g. a missing ½ in 4.61) fails by 10 s.e. or more.
        assert np.all(np.abs(got - want) <= 5 * standard_error + 1e-6), (got, want, standard_error)


def test_expected_gradient_vanishes_at_the_exact_posterior() -> None:
    # With K = D − 1, F Fᵀ + Ψ represents Σ exactly: Ψ = λ_min I and F from the other eigenpairs.
    n_features, n_draws = 4, 20_000
    mu, covariance = gaussian_target(n_features, 6)
    precision = np.linalg.inv(covariance)
    eigenvalues, vectors = np.linalg.eigh(covariance)
    loadings = vectors[:, 1:] * np.sqrt(eigenvalues[1:] - eigenvalues[0])
    noise = np.full(n_features, eigenvalues[0])
    vi = onlinefa.VIFA(
        n_features, n_features - 1, prior_precision=0.0, **UNIT_LR, seed=7, init=loadings,
        init_mean=mu, init_noise_variance=noise, n_grad_samples=n_draws,
    )
    np.testing.assert_allclose(vi.covariance(), covariance, atol=1e-12)
    thetas = draw_all(vi)
    grads = (thetas - mu) @ precision
    h, z = vi.pending_noise()
    applied = applied_gradient(vi, grads)
    per_draw = (grads, grads[:, :, None] * h[:, None, :], 0.5 * grads * np.sqrt(noise) * z)
    for got, terms in zip(applied, per_draw):
        # Stationarity of the negative ELBO at the target, to Monte Carlo precision (5 s.e., see above).
        assert np.all(np.abs(got) <= 5 * terms.std(axis=0) / np.sqrt(n_draws) + 1e-12), got


def test_training_noise_is_standard_normal() -> None:
    n_features, n_components, n_draws = 300, 3, 2_000
    vi = make_vifa(n_features, n_components, seed=8, n_grad_samples=n_draws)
    draw_all(vi)
    h, z = vi.pending_noise()
    for noise in (h, z):
        n, width = noise.shape
        # Entry means: s.d. 1/√n; covariance entries: s.d. ≤ √(2/n) (≈ 1/√n off the diagonal).
        assert np.max(np.abs(noise.mean(axis=0))) < 5.0 / np.sqrt(n)
        cov = np.cov(noise[:, :8], rowvar=False)
        assert np.max(np.abs(cov - np.eye(cov.shape[0]))) < 5.0 * np.sqrt(2.0 / n)
    # z rows are independent across the D coordinates too (counter-based blocks of 256 rows).
    across = np.corrcoef(z[:, 250:262], rowvar=False)
    assert np.max(np.abs(across - np.eye(12))) < 5.0 / np.sqrt(n_draws)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_trajectory_matches_numpy_reference(optimizer: str, clip: float | None) -> None:
    n_features, n_components, n_draws = 7, 2, 2
    mu, covariance = gaussian_target(n_features, 9)
    precision = np.linalg.inv(covariance)
    lrs = (0.05, 0.02, 0.03)
    vi = make_vifa(
        n_features, n_components, seed=10, optimizer=optimizer, n_grad_samples=n_draws, clip_grad_norm=clip,
        lr_mean=lrs[0], lr_loadings=lrs[1], lr_log_noise=lrs[2],
    )
    reference = ReferenceVIFA(params(vi), ALPHA, lrs, optimizer, clip)
    for _ in range(30):
        grads = (draw_all(vi) - mu) @ precision * 3.0
        h, z = vi.pending_noise()
        vi.step(grads)
        reference.step(grads, h, z)
        # Rounding differences only (the two implementations order operations differently).
        for got, want in zip(params(vi), reference.point):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


# -- convergence to a Gaussian target ------------------------------------------------------------
def fitted_gaussian(n_components: int, seed: int, *, likelihood_scale: float = 1.0) -> tuple[FloatArray, FloatArray]:
    """Run Adam (η = 0.01, L = 4) on NLL = scale · ½ (θ − μ)ᵀ Σ⁻¹ (θ − μ), flat prior, D = 4.

    Returns the mean and covariance of q averaged over the last 2000 of 4000 steps (averaging removes
    most of the stationary fluctuation of constant-step Adam).
    """
    mu, covariance = gaussian_target(4, seed)
    precision = np.linalg.inv(covariance) * likelihood_scale
    vi = onlinefa.VIFA(
        4, n_components, prior_precision=0.0, lr_mean=0.01, lr_loadings=0.01, lr_log_noise=0.01,
        optimizer="adam", seed=seed, n_grad_samples=4,
    )

    def nll_gradient(theta: FloatArray) -> FloatArray:
        out: FloatArray = precision @ (theta - mu)
        return out

    vi.fit(nll_gradient, 2000)
    mean_sum, cov_sum = np.zeros(4), np.zeros((4, 4))
    for _ in range(2000):
        vi.fit(nll_gradient, 1)
        mean_sum += vi.mean
        cov_sum += vi.covariance()
    return mean_sum / 2000, cov_sum / 2000


# Measured over 30 other seeds (100–129) of this exact configuration: relative covariance error
# (Frobenius) 0.024 ± 0.009, worst 0.058, for K = 3 and 0.024 ± 0.010, worst 0.058, for K = 4; mean error
# in units of the target's standard deviations, ‖L⁻¹(m − μ)‖ with L Lᵀ = Σ, 0.023 ± 0.009, worst 0.044.
# The bounds 0.1 are > 8 s.d. above the typical errors, while the same run with a likelihood twice too
# strong (a wrong gradient scale, the control below) lands at relative covariance error 0.50.
COVARIANCE_RTOL = 0.1
MEAN_TOL = 0.1


@pytest.mark.parametrize("n_components", [3, 4])
def test_fitted_q_approaches_the_gaussian_target(n_components: int) -> None:
    mu, covariance = gaussian_target(4, 11)
    mean, fitted = fitted_gaussian(n_components, 11)
    relative = np.linalg.norm(fitted - covariance) / np.linalg.norm(covariance)
    assert relative < COVARIANCE_RTOL, relative
    whitened = np.linalg.solve(np.linalg.cholesky(covariance), mean - mu)
    assert np.linalg.norm(whitened) < MEAN_TOL, whitened


def test_gradient_scale_selects_the_tempered_target() -> None:
    # Control: doubling the likelihood gradient must give N(μ, Σ/2), not Σ — the test above can fail.
    mu, covariance = gaussian_target(4, 12)
    _, fitted = fitted_gaussian(3, 12, likelihood_scale=2.0)
    assert np.linalg.norm(fitted - covariance / 2) / np.linalg.norm(covariance / 2) < COVARIANCE_RTOL
    assert np.linalg.norm(fitted - covariance) / np.linalg.norm(covariance) > 0.4


# -- protocol, errors, determinism, checkpoints --------------------------------------------------
def test_step_without_sample_is_an_error_and_changes_nothing() -> None:
    vi = make_vifa(5, 2, seed=13, n_grad_samples=2)
    before = state_arrays(vi)
    with pytest.raises(RuntimeError, match="call sample"):
        vi.step(np.zeros((2, 5)))
    vi.sample()
    with pytest.raises(RuntimeError, match="1 pending"):
        vi.step(np.zeros((2, 5)))
    vi.sample()
    with pytest.raises(RuntimeError, match="already waiting"):
        vi.sample()
    pending = state_arrays(vi)
    assert pending["n_pending"] == 2 and before["n_pending"] == 0
    vi.step(np.zeros((2, 5)))
    with pytest.raises(RuntimeError):
        vi.step(np.zeros((2, 5)))


@pytest.mark.parametrize(
    ("grad", "error", "match"),
    [
        (np.zeros(5), ValueError, r"shape \(2, 5\)"),
        (np.zeros((2, 4)), ValueError, r"shape \(2, 5\)"),
        (np.zeros((3, 5)), ValueError, r"shape \(2, 5\)"),
        (np.array([[0.0] * 5, [0.0, np.nan, 0.0, 0.0, 0.0]]), ValueError, "row 1.*NaN"),
        (np.array([[np.inf] * 5, [0.0] * 5]), ValueError, "row 0.*infinity"),
        (np.full((2, 5), 1e200), ValueError, "1e100"),
        (np.full((2, 5), "a"), TypeError, "real numeric"),
        (np.zeros((2, 5), dtype=complex), TypeError, "real numeric"),
    ],
)
def test_bad_gradients_are_rejected_and_change_nothing(grad: Any, error: type[Exception], match: str) -> None:
    vi = make_vifa(5, 2, seed=14, n_grad_samples=2, optimizer="adam")
    draw_all(vi)
    before = state_arrays(vi)
    with pytest.raises(error, match=match):
        vi.step(grad)
    assert_same_state(state_arrays(vi), before)
    vi.step(np.ones((2, 5), dtype=np.float32))  # the pending draws are still usable
    assert vi.n_steps == 1 and vi.n_pending == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prior_precision": -1.0}, ValueError),
        ({"prior_precision": float("nan")}, ValueError),
        ({"prior_precision": "1"}, TypeError),
        ({"lr_mean": -0.1}, ValueError),
        ({"lr_loadings": float("inf")}, ValueError),
        ({"lr_log_noise": True}, TypeError),
        ({"optimizer": "rmsprop"}, ValueError),
        ({"n_grad_samples": 0}, ValueError),
        ({"n_grad_samples": 1.5}, TypeError),
        ({"clip_grad_norm": 0.0}, ValueError),
        ({"seed": -1}, ValueError),
        ({"init": np.zeros((5, 3))}, ValueError),
        ({"init_mean": np.zeros(4)}, ValueError),
        ({"init_mean": np.full(5, np.nan)}, ValueError),
        ({"init_noise_variance": np.array([1.0, 1.0, 0.0, 1.0, 1.0])}, ValueError),
        ({"dtype": "int32"}, ValueError),
    ],
)
def test_invalid_hyper_parameters_are_rejected(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        make_vifa(5, 2, **kwargs)


def test_dimensions_are_checked() -> None:
    with pytest.raises(ValueError, match="n_components"):
        onlinefa.VIFA(3, 4, prior_precision=1.0, **UNIT_LR)
    with pytest.raises(ValueError, match="n_components"):
        onlinefa.VIFA(3, 0, prior_precision=1.0, **UNIT_LR)
    with pytest.raises(TypeError, match="prior_precision"):
        onlinefa.VIFA(3, 1, **UNIT_LR)
    assert onlinefa.VIFA(3, 3, prior_precision=1.0, **UNIT_LR, seed=0).loadings.shape == (3, 3)


def test_divergence_is_reported() -> None:
    vi = make_vifa(4, 1, seed=15, lr_log_noise=1e3)
    vi.sample()
    with pytest.raises(onlinefa.NumericalBreakdownError, match="diverged|not positive definite"):
        vi.step(np.full(4, 1e6))
    with pytest.raises(onlinefa.NumericalBreakdownError):
        vi.sample()


def run_training(vi: onlinefa.VIFA, n_steps: int) -> None:
    """``n_steps`` steps on a fixed quadratic NLL (gradient 2 (θ − 1))."""
    for _ in range(n_steps):
        vi.step(2.0 * (draw_all(vi) - 1.0))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_same_seed_gives_bit_identical_training(dtype: str) -> None:
    kwargs: dict[str, Any] = {
        "prior_precision": 0.5, "lr_mean": 0.01, "lr_loadings": 0.01, "lr_log_noise": 0.01,
        "optimizer": "adam", "n_grad_samples": 2, "dtype": dtype,
    }
    runs = []
    for seed in (21, 21, 22):
        vi = onlinefa.VIFA(600, 3, seed=seed, **kwargs)
        run_training(vi, 20)
        runs.append(state_arrays(vi))
    assert_same_state(runs[0], runs[1])
    assert not np.array_equal(runs[0]["mean"], runs[2]["mean"])
    assert runs[0]["mean"].dtype == np.dtype(dtype)


def test_float32_state_tracks_float64() -> None:
    kwargs: dict[str, Any] = {
        "prior_precision": 0.5, "lr_mean": 0.01, "lr_loadings": 0.01, "lr_log_noise": 0.01,
        "optimizer": "sgd", "seed": 23,
    }
    wide = onlinefa.VIFA(50, 2, dtype="float64", **kwargs)
    narrow = onlinefa.VIFA(50, 2, dtype="float32", **kwargs)
    run_training(wide, 50)
    run_training(narrow, 50)
    # Same draws (same seed), parameters rounded to float32 after every step: each step adds ~6e-8
    # relative error and SGD at η = 0.01 contracts it, so 50 steps stay far below 1e-4 (a wrong term
    # would differ at O(η) = 1e-2).
    for a, b in zip(params(wide), params(narrow)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_checkpoint_resumes_bit_identically(optimizer: str, tmp_path: Path) -> None:
    vi = make_vifa(
        700, 3, seed=24, optimizer=optimizer, n_grad_samples=3, clip_grad_norm=5.0,
        lr_mean=0.01, lr_loadings=0.005, lr_log_noise=0.01,
    )
    run_training(vi, 4)
    vi.sample()  # one of three draws pending in the checkpoint
    pickled = pickle.loads(pickle.dumps(vi))
    vi.save(tmp_path / "vifa.npz")
    loaded = onlinefa.VIFA.load(tmp_path / "vifa.npz")
    for copy in (pickled, loaded):
        assert_same_state(state_arrays(copy), state_arrays(vi))
        assert (copy.n_pending, copy.seed, copy.optimizer) == (1, 24, optimizer)
    for model in (vi, pickled, loaded):
        model.sample()
        model.sample()
        h, z = model.pending_noise()  # θ of all three draws, the first one made before the checkpoint
        thetas = h @ model.loadings.T + model.mean + np.sqrt(model.noise_variance) * z
        model.step(2.0 * (thetas - 1.0))
        run_training(model, 3)
    assert_same_state(state_arrays(pickled), state_arrays(vi))
    assert_same_state(state_arrays(loaded), state_arrays(vi))
    with pytest.raises(ValueError, match="not a valid"):
        onlinefa.OnlineEM.load(tmp_path / "vifa.npz")


def test_broken_state_is_rejected() -> None:
    vi = make_vifa(5, 2, seed=25, optimizer="adam")
    state = state_arrays(vi)
    for key, value in [("n_pending", 3), ("loadings", np.zeros((5, 3))), ("optimizer", "lbfgs")]:
        broken = dict(state, **{key: value})
        with pytest.raises(ValueError, match="invalid state"):
            onlinefa.VIFA.__new__(onlinefa.VIFA).__setstate__({"class": "VIFA", "state": broken})
    missing = {k: v for k, v in state.items() if k != "adam_m_mean"}
    with pytest.raises(ValueError, match="adam_m_mean"):
        onlinefa.VIFA.__new__(onlinefa.VIFA).__setstate__({"class": "VIFA", "state": missing})


def test_model_draws_leave_the_training_stream_alone() -> None:
    plain = make_vifa(6, 2, seed=26)
    mixed = make_vifa(6, 2, seed=26)
    for _ in range(5):
        theta = plain.sample()
        assert mixed.sample(4, seed=1).shape == (4, 6)
        assert mixed.sample(seed=2).shape == (1, 6)
        np.testing.assert_array_equal(mixed.sample(), theta)
        plain.step(theta)
        mixed.step(theta)
    np.testing.assert_array_equal(mixed.sample(3, seed=5), plain.sample(3, seed=5))


def test_fit_equals_the_manual_loop_and_rates_can_change() -> None:
    manual = make_vifa(5, 2, seed=27, n_grad_samples=2, lr_mean=0.1, lr_loadings=0.1, lr_log_noise=0.1)
    helper = make_vifa(5, 2, seed=27, n_grad_samples=2, lr_mean=0.1, lr_loadings=0.1, lr_log_noise=0.1)

    def gradient(theta: FloatArray) -> FloatArray:
        out: FloatArray = 3.0 * theta
        return out

    for _ in range(6):
        manual.step(np.stack([gradient(manual.sample()) for _ in range(2)]))
    helper.fit(gradient, 6)
    assert_same_state(state_arrays(helper), state_arrays(manual))
    helper.set_learning_rates(lr_loadings=0.0)
    assert helper.learning_rates == (0.1, 0.0, 0.1)
    frozen = helper.loadings
    helper.fit(gradient, 2)
    np.testing.assert_array_equal(helper.loadings, frozen)
    with pytest.raises(ValueError, match="lr_mean"):
        helper.set_learning_rates(lr_mean=-1.0)
    assert "VIFA(n_features=5, n_components=2" in repr(helper)


@settings(max_examples=40)
@given(
    n_features=st.integers(1, 600),
    n_components=st.integers(1, 4),
    seed=st.integers(0, 2**64 - 1),
)
def test_draw_reconstructs_from_its_noise(n_features: int, n_components: int, seed: int) -> None:
    n_components = min(n_components, n_features)
    vi = onlinefa.VIFA(n_features, n_components, prior_precision=1.0, **UNIT_LR, seed=seed)
    theta = vi.sample()
    h, z = vi.pending_noise()
    expected = vi.loadings @ h[0] + vi.mean + np.sqrt(vi.noise_variance) * z[0]
    np.testing.assert_allclose(theta, expected, rtol=0, atol=1e-12)
