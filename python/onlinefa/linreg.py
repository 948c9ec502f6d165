"""Linear regression as a test bed for posterior approximations (thesis Chapter 6).

Three pieces, NumPy only:

* the closed-form posterior of Bayesian linear regression, N(m, S) with
  ``A = alpha I + beta X^T X``, ``b = beta X^T y``, ``m = A^{-1} b``, ``S = A^{-1}`` (thesis 2.11-2.14);
* a mini-batch SGD trainer for L2-regularised linear regression in the convention of PyTorch's
  ``SGD(weight_decay=lambda)`` on a mean-squared-error loss, whose parameter vector after every update
  (SWAG-style iterates), or its mean over disjoint windows of updates (finite-window iterate averaging,
  Mandt, Hoffman & Blei 2017), is handed to consumers such as ``OnlineEM.update`` one vector at a time,
  never stored;
* the negative log-likelihood of the whole data set and its analytic gradient, the input ``VIFA.step``
  expects.

The model is ``y = theta^T x + eps`` with ``eps ~ N(0, 1/beta)``; a bias is modelled by appending a
constant-1 column to ``X`` (:func:`add_bias_column`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "IterateConsumer",
    "LinearRegressionPosterior",
    "SGDPhase",
    "SGDResult",
    "add_bias_column",
    "init_parameters",
    "make_synthetic_regression",
    "mse_weight_decay_gradient",
    "negative_log_likelihood",
    "negative_log_likelihood_gradient",
    "posterior",
    "run_sgd",
    "sgd_iterates",
    "window_means",
]

FloatArray = NDArray[np.float64]

#: Anything that accepts one parameter vector, e.g. ``OnlineEM.update`` or ``list.append``.
IterateConsumer = Callable[[FloatArray], object]

SeedLike = int | np.random.Generator | None


# ---------------------------------------------------------------------------------------------------
# Input checking
# ---------------------------------------------------------------------------------------------------


def _as_design(X: ArrayLike) -> FloatArray:
    """Return ``X`` as a finite 2-D float64 array with at least one row and column."""
    design = np.asarray(X, dtype=np.float64)
    if design.ndim != 2 or design.shape[0] == 0 or design.shape[1] == 0:
        raise ValueError(f"X must be a non-empty 2-D array (n_samples, n_features), got shape {design.shape}")
    if not np.all(np.isfinite(design)):
        raise ValueError("X must contain only finite values")
    return design


def _as_data(X: ArrayLike, y: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Validate a design matrix and a target vector of matching length."""
    design = _as_design(X)
    target = np.asarray(y, dtype=np.float64)
    if target.ndim != 1 or target.shape[0] != design.shape[0]:
        raise ValueError(
            f"y must be a 1-D array with one entry per row of X ({design.shape[0]}), got shape {target.shape}"
        )
    if not np.all(np.isfinite(target)):
        raise ValueError("y must contain only finite values")
    return design, target


def _as_theta(theta: ArrayLike, n_features: int) -> FloatArray:
    """Validate a parameter vector of length ``n_features`` (returns a float64 copy)."""
    vector = np.array(theta, dtype=np.float64)
    if vector.shape != (n_features,):
        raise ValueError(f"theta must have shape ({n_features},), got {vector.shape}")
    if not np.all(np.isfinite(vector)):
        raise ValueError("theta must contain only finite values")
    return vector


def _positive(value: float, name: str) -> float:
    """Return ``value`` as a float, raising unless it is finite and > 0."""
    number = float(value)
    if not math.isfinite(number) or number <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _rng(seed: SeedLike) -> np.random.Generator:
    """Turn a seed or Generator into a Generator (a Generator is used as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, a numpy Generator or None, got {type(seed).__name__}")
    return np.random.default_rng(seed)


def add_bias_column(X: ArrayLike) -> FloatArray:
    """Append a constant-1 column to ``X`` so that the last parameter acts as the bias.

    Parameters
    ----------
    X : array_like of shape (n_samples, n_features)
        Inputs.

    Returns
    -------
    ndarray of shape (n_samples, n_features + 1)
        ``[X, 1]``.
    """
    design = _as_design(X)
    return np.hstack([design, np.ones((design.shape[0], 1))])


# ---------------------------------------------------------------------------------------------------
# Closed-form posterior and likelihood
# ---------------------------------------------------------------------------------------------------


class LinearRegressionPosterior(NamedTuple):
    """The Gaussian posterior N(mean, covariance) of Bayesian linear regression."""

    mean: FloatArray
    """(D,) posterior mean m = A^{-1} b."""
    covariance: FloatArray
    """(D, D) posterior covariance S = A^{-1}."""


def posterior(
    X: ArrayLike, y: ArrayLike, *, prior_precision: float, noise_precision: float
) -> LinearRegressionPosterior:
    """Closed-form posterior of Bayesian linear regression (thesis 2.11-2.14).

    With prior ``theta ~ N(0, alpha^{-1} I)`` and likelihood ``y_n ~ N(theta^T x_n, beta^{-1})``,
    the posterior is N(m, S) with ``A = alpha I + beta X^T X``, ``b = beta X^T y``, ``m = A^{-1} b`` and
    ``S = A^{-1}``.

    Parameters
    ----------
    X : array_like of shape (n_samples, n_features)
        Inputs (append a constant-1 column for a bias).
    y : array_like of shape (n_samples,)
        Targets.
    prior_precision : float
        alpha > 0, the precision of the isotropic Gaussian prior.
    noise_precision : float
        beta > 0, the precision (inverse variance) of the observation noise.

    Returns
    -------
    LinearRegressionPosterior
        ``(mean, covariance)``, shapes (D,) and (D, D).
    """
    design, target = _as_data(X, y)
    alpha = _positive(prior_precision, "prior_precision")
    beta = _positive(noise_precision, "noise_precision")
    n_features = design.shape[1]
    precision = alpha * np.eye(n_features) + beta * (design.T @ design)
    # A is symmetric positive definite (alpha > 0): Cholesky A = L L^T, then solve with the factor.
    factor = np.linalg.cholesky(precision)
    factor_inverse = np.linalg.solve(factor, np.eye(n_features))
    covariance = factor_inverse.T @ factor_inverse
    covariance = 0.5 * (covariance + covariance.T)
    mean = covariance @ (beta * (design.T @ target))
    return LinearRegressionPosterior(mean=mean, covariance=covariance)


def negative_log_likelihood(theta: ArrayLike, X: ArrayLike, y: ArrayLike, *, noise_precision: float) -> float:
    """Negative log-likelihood of the data set, ``-log p(y | X, theta)`` (thesis 2.7, constants kept).

    ``beta/2 * sum_n (y_n - theta^T x_n)^2 - N/2 log(beta) + N/2 log(2 pi)``.

    Parameters
    ----------
    theta : array_like of shape (n_features,)
        Parameter vector.
    X : array_like of shape (n_samples, n_features)
        Inputs.
    y : array_like of shape (n_samples,)
        Targets.
    noise_precision : float
        beta > 0.

    Returns
    -------
    float
        The negative log-likelihood summed over the rows of ``X``.
    """
    design, target = _as_data(X, y)
    beta = _positive(noise_precision, "noise_precision")
    vector = _as_theta(theta, design.shape[1])
    residual = target - design @ vector
    n_samples = design.shape[0]
    return float(0.5 * beta * residual @ residual - 0.5 * n_samples * math.log(beta / (2.0 * math.pi)))


def negative_log_likelihood_gradient(
    theta: ArrayLike,
    X: ArrayLike,
    y: ArrayLike,
    *,
    noise_precision: float,
    n_total: int | None = None,
) -> FloatArray:
    """Gradient in theta of the full-data negative log-likelihood, ``beta X^T (X theta - y)``.

    This is the input ``VIFA.step`` expects. Given a mini-batch (``X``, ``y``) of a data set of
    ``n_total`` rows, the batch gradient is scaled by ``n_total / batch_size``: the mini-batch mean
    times N, an unbiased estimate of the full-data gradient under uniform sampling of the batch.

    Parameters
    ----------
    theta : array_like of shape (n_features,)
        Parameter vector at which to evaluate the gradient.
    X : array_like of shape (batch_size, n_features)
        Inputs (the whole data set or a mini-batch of it).
    y : array_like of shape (batch_size,)
        Targets.
    noise_precision : float
        beta > 0.
    n_total : int, optional
        Number of rows of the whole data set; default: ``len(X)`` (no scaling).

    Returns
    -------
    ndarray of shape (n_features,)
        The (estimated) gradient of the full-data negative log-likelihood.
    """
    design, target = _as_data(X, y)
    beta = _positive(noise_precision, "noise_precision")
    vector = _as_theta(theta, design.shape[1])
    batch_size = design.shape[0]
    total = batch_size if n_total is None else int(n_total)
    if total < batch_size:
        raise ValueError(f"n_total must be >= the number of rows given ({batch_size}), got {n_total}")
    gradient: FloatArray = (beta * total / batch_size) * (design.T @ (design @ vector - target))
    return gradient


def make_synthetic_regression(
    n_samples: int = 1000,
    *,
    feature_covariance: ArrayLike = ((1.0, 0.5), (0.5, 1.0)),
    prior_precision: float = 0.01,
    noise_precision: float = 0.1,
    seed: SeedLike = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Synthetic data of thesis Section 6.1.1.

    ``x_n ~ N(0, feature_covariance)``, ``theta ~ N(0, alpha^{-1} I)``, ``y_n = theta^T x_n + eps_n`` with
    ``eps_n ~ N(0, 1/beta)``. Defaults: 1000 samples in two dimensions, alpha = 0.01, beta = 0.1.

    Parameters
    ----------
    n_samples : int, default 1000
        Number of rows.
    feature_covariance : array_like of shape (D, D), default [[1, .5], [.5, 1]]
        Covariance of the inputs (symmetric positive semi-definite).
    prior_precision : float, default 0.01
        alpha, the precision of the prior the true parameter is drawn from.
    noise_precision : float, default 0.1
        beta, the precision of the observation noise.
    seed : int, numpy.random.Generator or None
        Source of randomness.

    Returns
    -------
    X : ndarray of shape (n_samples, D)
    y : ndarray of shape (n_samples,)
    theta : ndarray of shape (D,)
        The parameter vector that generated ``y``.
    """
    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    covariance = np.asarray(feature_covariance, dtype=np.float64)
    if covariance.ndim != 2 or covariance.shape[0] != covariance.shape[1] or covariance.shape[0] == 0:
        raise ValueError(f"feature_covariance must be a square matrix, got shape {covariance.shape}")
    alpha = _positive(prior_precision, "prior_precision")
    beta = _positive(noise_precision, "noise_precision")
    rng = _rng(seed)
    n_features = int(covariance.shape[0])
    X = rng.multivariate_normal(np.zeros(n_features), covariance, size=int(n_samples), method="cholesky")
    theta: FloatArray = rng.normal(0.0, 1.0 / math.sqrt(alpha), size=n_features)
    y: FloatArray = X @ theta + rng.normal(0.0, 1.0 / math.sqrt(beta), size=int(n_samples))
    return X, y, theta


# ---------------------------------------------------------------------------------------------------
# SGD with weight decay, iterates and window averages
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SGDPhase:
    """One phase of mini-batch SGD on ``mean((y - X theta)^2)`` with PyTorch-style weight decay.

    Each update is ``theta <- theta - lr * (2/B X_b^T (X_b theta - y_b) + weight_decay * theta)``; each
    epoch visits the rows in a fresh random order in batches of ``batch_size``.

    Parameters
    ----------
    lr : float
        Learning rate (> 0).
    weight_decay : float
        L2 coefficient lambda (>= 0), added to the gradient as ``lambda * theta``. Its fixed point is the
        ridge solution ``(X^T X + N lambda / 2 I)^{-1} X^T y``.
    batch_size : int
        Rows per update (>= 1).
    n_epochs : int
        Number of passes over the data (>= 0).
    drop_last : bool, default False
        Skip the final, smaller batch of an epoch when ``batch_size`` does not divide the number of rows
        (like ``torch.utils.data.DataLoader(drop_last=True)``).
    """

    lr: float
    weight_decay: float
    batch_size: int
    n_epochs: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        """Validate the hyper-parameters."""
        _positive(self.lr, "lr")
        if not math.isfinite(float(self.weight_decay)) or float(self.weight_decay) < 0.0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if int(self.n_epochs) < 0:
            raise ValueError(f"n_epochs must be >= 0, got {self.n_epochs!r}")

    def updates_per_epoch(self, n_samples: int) -> int:
        """Number of mini-batch updates one epoch over ``n_samples`` rows makes.

        Parameters
        ----------
        n_samples : int
            Rows of the training data.

        Returns
        -------
        int
            ``n_samples // batch_size`` with ``drop_last``, else ``ceil(n_samples / batch_size)``.
        """
        full, remainder = divmod(int(n_samples), int(self.batch_size))
        return full if self.drop_last or remainder == 0 else full + 1


class SGDResult(NamedTuple):
    """What :func:`run_sgd` returns."""

    theta: FloatArray
    """(D,) parameter vector after the last update."""
    n_updates: int
    """Number of mini-batch updates made."""
    n_delivered: int
    """Number of vectors handed to the consumers (iterates or window means)."""


def init_parameters(n_features: int, seed: SeedLike = None) -> FloatArray:
    """Initial parameter vector, uniform on ``[-1/sqrt(D), 1/sqrt(D)]`` as ``torch.nn.Linear`` draws it.

    Parameters
    ----------
    n_features : int
        D, the number of parameters.
    seed : int, numpy.random.Generator or None
        Source of randomness.

    Returns
    -------
    ndarray of shape (n_features,)
    """
    if int(n_features) < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    bound = 1.0 / math.sqrt(int(n_features))
    return _rng(seed).uniform(-bound, bound, size=int(n_features))


def mse_weight_decay_gradient(theta: FloatArray, X: FloatArray, y: FloatArray, weight_decay: float) -> FloatArray:
    """Gradient of ``mean((y - X theta)^2)`` plus the weight-decay term ``weight_decay * theta``.

    Parameters
    ----------
    theta : ndarray of shape (D,)
    X : ndarray of shape (B, D)
    y : ndarray of shape (B,)
    weight_decay : float
        lambda >= 0.

    Returns
    -------
    ndarray of shape (D,)
        ``2/B X^T (X theta - y) + lambda theta``.
    """
    residual = X @ theta - y
    gradient: FloatArray = (2.0 / X.shape[0]) * (X.T @ residual) + weight_decay * theta
    return gradient


def sgd_iterates(
    X: ArrayLike, y: ArrayLike, theta: ArrayLike, phase: SGDPhase, seed: SeedLike = None
) -> Iterator[FloatArray]:
    """Run one SGD phase and yield the parameter vector after every mini-batch update.

    Parameters
    ----------
    X : array_like of shape (n_samples, D)
    y : array_like of shape (n_samples,)
    theta : array_like of shape (D,)
        Starting point (not modified).
    phase : SGDPhase
        Learning rate, weight decay, batch size, number of epochs.
    seed : int, numpy.random.Generator or None
        Source of the per-epoch shuffles.

    Yields
    ------
    ndarray of shape (D,)
        A fresh array after each update: ``phase.n_epochs * phase.updates_per_epoch(n_samples)`` in all.
    """
    design, target = _as_data(X, y)
    current = _as_theta(theta, design.shape[1])
    if phase.drop_last and phase.batch_size > design.shape[0] and phase.n_epochs > 0:
        raise ValueError(f"batch_size {phase.batch_size} exceeds the {design.shape[0]} rows with drop_last=True")
    rng = _rng(seed)
    n_samples = design.shape[0]
    n_batches = phase.updates_per_epoch(n_samples)
    lr, weight_decay, batch_size = float(phase.lr), float(phase.weight_decay), int(phase.batch_size)
    for _ in range(int(phase.n_epochs)):
        order = rng.permutation(n_samples)
        for start in range(0, n_batches * batch_size, batch_size):
            rows = order[start : start + batch_size]
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported just below
                current = current - lr * mse_weight_decay_gradient(current, design[rows], target[rows], weight_decay)
            if not np.all(np.isfinite(current)):
                raise FloatingPointError("SGD diverged (non-finite parameters); lower the learning rate")
            yield current


def window_means(iterates: Iterable[FloatArray], window_size: int) -> Iterator[FloatArray]:
    """Average consecutive iterates over disjoint windows (finite-window iterate averaging).

    Parameters
    ----------
    iterates : iterable of ndarray of shape (D,)
        Parameter vectors in the order SGD produced them.
    window_size : int
        Iterates per window (>= 1); 1 passes the iterates through unchanged.

    Yields
    ------
    ndarray of shape (D,)
        The mean of iterates ``[k W, (k + 1) W)`` for k = 0, 1, ...; a final incomplete window is dropped.
    """
    size = int(window_size)
    if size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size!r}")
    total: FloatArray | None = None
    count = 0
    for vector in iterates:
        total = np.array(vector, dtype=np.float64) if total is None else total + vector
        count += 1
        if count == size:
            yield total / size
            total, count = None, 0


def run_sgd(
    X: ArrayLike,
    y: ArrayLike,
    theta: ArrayLike,
    phase: SGDPhase,
    *,
    seed: SeedLike = None,
    window_size: int = 1,
    consumers: Sequence[IterateConsumer] = (),
) -> SGDResult:
    """Run one SGD phase, streaming its iterates (or window means) into ``consumers``.

    Pre-training is a call without consumers. To fit factor-analysis models to the SWAG-style iterates
    without storing them, pass their update methods::

        em, sga = onlinefa.OnlineEM(D, 3), onlinefa.OnlineSGA(D, 3)
        run_sgd(X, y, theta, SGDPhase(0.1, 1e-3, 100, 100), consumers=[em.update, sga.update])

    Parameters
    ----------
    X : array_like of shape (n_samples, D)
    y : array_like of shape (n_samples,)
    theta : array_like of shape (D,)
        Starting point (not modified).
    phase : SGDPhase
        The SGD hyper-parameters.
    seed : int, numpy.random.Generator or None
        Source of the per-epoch shuffles.
    window_size : int, default 1
        Hand over the mean of each disjoint window of this many iterates instead of every iterate.
    consumers : sequence of callables
        Each is called with every delivered vector, in order, e.g. ``OnlineEM.update`` or ``list.append``.

    Returns
    -------
    SGDResult
        The final parameter vector, the number of updates and the number of vectors delivered.
    """
    design, target = _as_data(X, y)
    start = _as_theta(theta, design.shape[1])
    for consumer in consumers:
        if not callable(consumer):
            raise TypeError(f"every consumer must be callable (e.g. model.update), got {type(consumer).__name__}")
    n_updates = 0
    final = start

    def counted() -> Iterator[FloatArray]:
        nonlocal n_updates, final
        for iterate in sgd_iterates(design, target, start, phase, seed):
            n_updates += 1
            final = iterate
            yield iterate

    n_delivered = 0
    for vector in window_means(counted(), window_size):
        for consumer in consumers:
            consumer(vector)
        n_delivered += 1
    return SGDResult(theta=final, n_updates=n_updates, n_delivered=n_delivered)
