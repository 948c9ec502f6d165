"""``onlinefa.linreg``: closed-form posterior, likelihood gradient, SGD iterates and window averages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from onlinefa import linreg

FloatArray = NDArray[np.float64]


def _regression_data(n_samples: int, n_features: int, seed: int) -> tuple[FloatArray, FloatArray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features))
    y = X @ rng.normal(0.0, 3.0, n_features) + rng.normal(0.0, 1.5, n_samples)
    return X, y


# ---------------------------------------------------------------------------------------------------
# Posterior
# ---------------------------------------------------------------------------------------------------


def _posterior_by_conditioning(
    X: FloatArray, y: FloatArray, alpha: float, beta: float
) -> tuple[FloatArray, FloatArray]:
    """Posterior as Gaussian conditioning of the joint (theta, y) in the N x N "function-space" form.

    theta ~ N(0, I/alpha) and y = X theta + eps give Cov(theta, y) = X^T/alpha and
    Cov(y) = X X^T/alpha + I/beta, hence E[theta | y] = X^T/alpha Cov(y)^{-1} y and
    Cov[theta | y] = I/alpha - X^T/alpha Cov(y)^{-1} X/alpha: no D x D precision matrix involved.
    """
    n_samples, n_features = X.shape
    cov_y = X @ X.T / alpha + np.eye(n_samples) / beta
    gain = np.linalg.solve(cov_y, X).T / alpha  # (D, N) = X^T/alpha Cov(y)^{-1}
    return gain @ y, np.eye(n_features) / alpha - gain @ X / alpha


@settings(max_examples=40)
@given(
    n_samples=st.integers(1, 25),
    n_features=st.integers(1, 6),
    log_alpha=st.floats(-3.0, 2.0),
    log_beta=st.floats(-2.0, 2.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_posterior_matches_gaussian_conditioning(
    n_samples: int, n_features: int, log_alpha: float, log_beta: float, seed: int
) -> None:
    X, y = _regression_data(n_samples, n_features, seed)
    alpha, beta = 10.0**log_alpha, 10.0**log_beta
    result = linreg.posterior(X, y, prior_precision=alpha, noise_precision=beta)
    mean, covariance = _posterior_by_conditioning(X, y, alpha, beta)
    scale = 1.0 / alpha  # prior variance bounds every posterior (co)variance
    np.testing.assert_allclose(result.covariance, covariance, rtol=1e-7, atol=1e-9 * scale)
    np.testing.assert_allclose(result.mean, mean, rtol=1e-7, atol=1e-8 * (1.0 + np.abs(mean).max()))
    np.testing.assert_array_equal(result.covariance, result.covariance.T)


def test_posterior_mean_is_the_map_estimate() -> None:
    # The mean zeroes the gradient of the log posterior, beta X^T (y - X m) - alpha m (thesis 6.2),
    # and the covariance is the inverse Hessian alpha I + beta X^T X.
    X, y = _regression_data(200, 4, seed=3)
    alpha, beta = 0.5, 2.0
    result = linreg.posterior(X, y, prior_precision=alpha, noise_precision=beta)
    gradient = beta * X.T @ (y - X @ result.mean) - alpha * result.mean
    assert np.max(np.abs(gradient)) < 1e-9 * np.max(np.abs(beta * X.T @ y))
    np.testing.assert_allclose(result.covariance @ (alpha * np.eye(4) + beta * X.T @ X), np.eye(4), atol=1e-12)


def test_posterior_shrinks_to_the_prior_without_data_weight() -> None:
    # beta -> 0: the data carry no information and the posterior is the prior N(0, I/alpha).
    X, y = _regression_data(50, 3, seed=4)
    result = linreg.posterior(X, y, prior_precision=4.0, noise_precision=1e-14)
    np.testing.assert_allclose(result.covariance, np.eye(3) / 4.0, atol=1e-10)
    np.testing.assert_allclose(result.mean, 0.0, atol=1e-10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prior_precision": 0.0, "noise_precision": 1.0}, "prior_precision"),
        ({"prior_precision": 1.0, "noise_precision": -1.0}, "noise_precision"),
        ({"prior_precision": math.nan, "noise_precision": 1.0}, "prior_precision"),
    ],
)
def test_posterior_rejects_bad_precisions(kwargs: dict[str, float], message: str) -> None:
    X, y = _regression_data(10, 2, seed=0)
    with pytest.raises(ValueError, match=message):
        linreg.posterior(X, y, **kwargs)


def test_posterior_rejects_bad_shapes() -> None:
    X, y = _regression_data(10, 2, seed=0)
    with pytest.raises(ValueError, match="X must be a non-empty 2-D array"):
        linreg.posterior(X[:, 0], y, prior_precision=1.0, noise_precision=1.0)
    with pytest.raises(ValueError, match="one entry per row of X"):
        linreg.posterior(X, y[:-1], prior_precision=1.0, noise_precision=1.0)
    with pytest.raises(ValueError, match="finite"):
        linreg.posterior(np.where(X > 1, np.inf, X), y, prior_precision=1.0, noise_precision=1.0)


# ---------------------------------------------------------------------------------------------------
# Likelihood and its gradient
# ---------------------------------------------------------------------------------------------------


def test_negative_log_likelihood_is_a_sum_of_gaussian_log_densities() -> None:
    from scipy.stats import norm

    X, y = _regression_data(40, 3, seed=5)
    theta = np.array([0.3, -1.2, 2.0])
    beta = 0.7
    expected = -np.sum(norm.logpdf(y, loc=X @ theta, scale=1.0 / math.sqrt(beta)))
    assert linreg.negative_log_likelihood(theta, X, y, noise_precision=beta) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25)
@given(n_features=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), log_beta=st.floats(-2.0, 1.0))
def test_gradient_matches_finite_differences(n_features: int, seed: int, log_beta: float) -> None:
    X, y = _regression_data(30, n_features, seed)
    beta = 10.0**log_beta
    theta = np.random.default_rng(seed + 1).normal(0.0, 2.0, n_features)
    gradient = linreg.negative_log_likelihood_gradient(theta, X, y, noise_precision=beta)
    step = 1e-5
    for j in range(n_features):
        shift = np.zeros(n_features)
        shift[j] = step
        upper = linreg.negative_log_likelihood(theta + shift, X, y, noise_precision=beta)
        lower = linreg.negative_log_likelihood(theta - shift, X, y, noise_precision=beta)
        # The NLL is quadratic, so the central difference is exact up to rounding of values of size |NLL|.
        rounding = 1e-12 * (abs(upper) + abs(lower)) / step
        assert (upper - lower) / (2 * step) == pytest.approx(gradient[j], rel=1e-7, abs=10 * rounding + 1e-9)


def test_minibatch_gradient_scaling_is_unbiased_over_a_partition() -> None:
    # Averaging the scaled gradients of the batches of any partition into equal-size batches gives the
    # full-data gradient exactly: mean_b (N/B) g_b = (1/n_batches) (N/B) sum_b g_b = sum_b g_b.
    X, y = _regression_data(60, 3, seed=6)
    theta = np.array([1.0, -2.0, 0.5])
    full = linreg.negative_log_likelihood_gradient(theta, X, y, noise_precision=0.4)
    order = np.random.default_rng(0).permutation(60)
    scaled = [
        linreg.negative_log_likelihood_gradient(theta, X[rows], y[rows], noise_precision=0.4, n_total=60)
        for rows in order.reshape(6, 10)
    ]
    np.testing.assert_allclose(np.mean(scaled, axis=0), full, rtol=1e-12)
    with pytest.raises(ValueError, match="n_total"):
        linreg.negative_log_likelihood_gradient(theta, X, y, noise_precision=0.4, n_total=10)


# ---------------------------------------------------------------------------------------------------
# SGD trainer
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_samples", "batch_size", "drop_last", "per_epoch"),
    [(100, 10, False, 10), (100, 10, True, 10), (105, 10, False, 11), (105, 10, True, 10), (7, 10, False, 1)],
)
def test_iterate_count(n_samples: int, batch_size: int, drop_last: bool, per_epoch: int) -> None:
    X, y = _regression_data(n_samples, 2, seed=1)
    phase = linreg.SGDPhase(lr=0.01, weight_decay=0.001, batch_size=batch_size, n_epochs=7, drop_last=drop_last)
    collected: list[FloatArray] = []
    result = linreg.run_sgd(X, y, np.zeros(2), phase, seed=0, consumers=[collected.append])
    assert phase.updates_per_epoch(n_samples) == per_epoch
    assert result.n_updates == result.n_delivered == len(collected) == 7 * per_epoch
    np.testing.assert_array_equal(result.theta, collected[-1])


def test_full_batch_step_is_the_pytorch_update() -> None:
    # PyTorch: grad = d/dtheta mean((X theta - y)^2) = 2/N X^T (X theta - y); SGD(weight_decay=lam) adds
    # lam * theta; theta <- theta - lr * grad.
    X, y = _regression_data(20, 3, seed=2)
    theta = np.array([0.1, 0.2, -0.3])
    lr, lam = 0.05, 0.1
    expected = theta - lr * (2.0 / 20 * X.T @ (X @ theta - y) + lam * theta)
    phase = linreg.SGDPhase(lr=lr, weight_decay=lam, batch_size=20, n_epochs=1)
    (iterate,) = list(linreg.sgd_iterates(X, y, theta, phase, seed=0))
    np.testing.assert_allclose(iterate, expected, rtol=1e-13)


def test_full_batch_sgd_converges_to_the_ridge_solution() -> None:
    # Fixed point of the update: (X^T X + N lam / 2 I) theta = X^T y.
    X, y = _regression_data(50, 3, seed=7)
    lam = 0.2
    ridge = np.linalg.solve(X.T @ X + 50 * lam / 2 * np.eye(3), X.T @ y)
    phase = linreg.SGDPhase(lr=0.1, weight_decay=lam, batch_size=50, n_epochs=2000)
    result = linreg.run_sgd(X, y, np.zeros(3), phase, seed=0)
    np.testing.assert_allclose(result.theta, ridge, rtol=1e-10)


def test_each_epoch_visits_every_row_once() -> None:
    # With y = 0 and X = one-hot rows, an update only moves the coordinates of the rows in its batch, so
    # which coordinates changed identifies the batch; over an epoch each coordinate moves exactly once.
    n_samples = 12
    X, y = np.eye(n_samples), np.zeros(n_samples)
    phase = linreg.SGDPhase(lr=0.1, weight_decay=0.0, batch_size=5, n_epochs=3)
    previous = np.ones(n_samples)
    moved_per_epoch = [np.zeros(n_samples, dtype=int) for _ in range(3)]
    for index, iterate in enumerate(linreg.sgd_iterates(X, y, previous, phase, seed=4)):
        moved_per_epoch[index // 3] += iterate != previous
        previous = iterate
    for moved in moved_per_epoch:
        np.testing.assert_array_equal(moved, np.ones(n_samples, dtype=int))


def test_iterates_are_reproducible_and_seed_dependent() -> None:
    X, y = _regression_data(40, 2, seed=8)
    phase = linreg.SGDPhase(lr=0.05, weight_decay=0.0, batch_size=8, n_epochs=3)
    first = np.array(list(linreg.sgd_iterates(X, y, np.zeros(2), phase, seed=11)))
    second = np.array(list(linreg.sgd_iterates(X, y, np.zeros(2), phase, seed=11)))
    third = np.array(list(linreg.sgd_iterates(X, y, np.zeros(2), phase, seed=12)))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, third)


@pytest.mark.parametrize("window_size", [1, 3, 7, 10])
def test_window_means_average_disjoint_windows(window_size: int) -> None:
    X, y = _regression_data(30, 3, seed=9)
    phase = linreg.SGDPhase(lr=0.05, weight_decay=0.01, batch_size=4, n_epochs=5)  # 8 updates/epoch, 40 in all
    iterates = np.array(list(linreg.sgd_iterates(X, y, np.zeros(3), phase, seed=5)))
    means: list[FloatArray] = []
    result = linreg.run_sgd(X, y, np.zeros(3), phase, seed=5, window_size=window_size, consumers=[means.append])
    n_windows = 40 // window_size
    expected = iterates[: n_windows * window_size].reshape(n_windows, window_size, 3).mean(axis=1)
    assert result.n_updates == 40 and result.n_delivered == n_windows
    np.testing.assert_allclose(np.array(means), expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(result.theta, iterates[-1])


def test_every_consumer_sees_every_vector_in_order() -> None:
    X, y = _regression_data(20, 2, seed=10)
    phase = linreg.SGDPhase(lr=0.05, weight_decay=0.0, batch_size=5, n_epochs=2)
    first: list[FloatArray] = []
    second: list[FloatArray] = []
    linreg.run_sgd(X, y, np.zeros(2), phase, seed=1, window_size=2, consumers=[first.append, second.append])
    assert len(first) == 4
    np.testing.assert_array_equal(np.array(first), np.array(second))
    assert len({id(vector) for vector in first}) == 4  # fresh arrays, safe to keep


def test_run_sgd_does_not_modify_the_start() -> None:
    X, y = _regression_data(20, 2, seed=10)
    start = np.array([1.0, 2.0])
    linreg.run_sgd(X, y, start, linreg.SGDPhase(lr=0.05, weight_decay=0.0, batch_size=5, n_epochs=2), seed=0)
    np.testing.assert_array_equal(start, [1.0, 2.0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, "lr"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"batch_size": 0}, "batch_size"),
        ({"n_epochs": -1}, "n_epochs"),
    ],
)
def test_phase_validation(kwargs: dict[str, float], message: str) -> None:
    values: dict[str, float] = {"lr": 0.1, "weight_decay": 0.0, "batch_size": 10, "n_epochs": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        linreg.SGDPhase(**values)  # type: ignore[arg-type]


def test_run_sgd_input_errors() -> None:
    X, y = _regression_data(20, 2, seed=10)
    phase = linreg.SGDPhase(lr=0.05, weight_decay=0.0, batch_size=5, n_epochs=1)
    with pytest.raises(ValueError, match=r"theta must have shape \(2,\)"):
        linreg.run_sgd(X, y, np.zeros(3), phase)
    with pytest.raises(ValueError, match="window_size"):
        linreg.run_sgd(X, y, np.zeros(2), phase, window_size=0)
    with pytest.raises(TypeError, match="callable"):
        linreg.run_sgd(X, y, np.zeros(2), phase, consumers=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="drop_last"):
        linreg.run_sgd(X, y, np.zeros(2), linreg.SGDPhase(0.1, 0.0, 50, 1, drop_last=True))
    with pytest.raises(FloatingPointError, match="diverged"):
        linreg.run_sgd(100 * X, y, np.zeros(2), linreg.SGDPhase(10.0, 0.0, 20, 500))


def test_init_parameters_follow_torch_linear_bounds() -> None:
    draws = linreg.init_parameters(16, seed=0)
    assert draws.shape == (16,)
    assert np.all(np.abs(draws) <= 0.25)
    many = np.concatenate([linreg.init_parameters(4, seed=s) for s in range(500)])  # U(-1/2, 1/2)
    # 2000 uniform draws: the sample mean has s.d. (1/sqrt(12))/sqrt(2000) ~ 0.0065; allow 5 s.d.
    assert abs(many.mean()) < 0.033
    assert many.min() >= -0.5 and many.max() <= 0.5 and many.min() < -0.49 and many.max() > 0.49


def test_add_bias_column() -> None:
    X = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(linreg.add_bias_column(X), [[0, 1, 1], [2, 3, 1], [4, 5, 1]])


def test_synthetic_data_statistics() -> None:
    X, y, theta = linreg.make_synthetic_regression(
        20000, feature_covariance=[[1.0, 0.5], [0.5, 1.0]], prior_precision=0.01, noise_precision=0.1, seed=0
    )
    assert X.shape == (20000, 2) and y.shape == (20000,) and theta.shape == (2,)
    # Sample covariance entries of 20000 draws have s.d. <= sqrt(2/20000) = 0.01; allow 5 s.d.
    np.testing.assert_allclose(np.cov(X, rowvar=False), [[1.0, 0.5], [0.5, 1.0]], atol=0.05)
    # Residual variance 1/beta = 10 with s.d. 10 sqrt(2/20000) = 0.1; allow 5 s.d.
    assert np.var(y - X @ theta) == pytest.approx(10.0, abs=0.5)
    # The generating parameter is a typical draw from the posterior: squared Mahalanobis distance is
    # chi^2 with 2 degrees of freedom (P(> 13.8) = 0.001).
    exact = linreg.posterior(X, y, prior_precision=0.01, noise_precision=0.1)
    offset = theta - exact.mean
    assert offset @ np.linalg.solve(exact.covariance, offset) < 13.8
