"""Predictive metrics of the ``uci-bnn`` experiment, in the target's original units."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = ["mixture_log_likelihood", "rmse", "tune_noise_variance", "mean_and_standard_error"]

FloatArray = NDArray[np.float64]

#: Candidate noise variances (standardised target units) searched by :func:`tune_noise_variance`.
NOISE_GRID: FloatArray = np.geomspace(1e-5, 4.0, 241)


def _log_mixture(draws: FloatArray, y: FloatArray, noise_variance: FloatArray) -> FloatArray:
    """log (1/S) Σ_s N(y_n; draws[s, n], σ²) for each σ² of ``noise_variance`` (V,), shape (V, N)."""
    residual2 = (y[None, :] - draws) ** 2  # (S, N)
    var = noise_variance[:, None, None]
    log_density = -0.5 * residual2[None] / var - 0.5 * np.log(2.0 * np.pi * var)  # (V, S, N)
    peak = log_density.max(axis=1)
    out: FloatArray = peak + np.log(np.mean(np.exp(log_density - peak[:, None, :]), axis=1))
    return out


def mixture_log_likelihood(draws: FloatArray, y: FloatArray, noise_variance: float, y_mean: float,
                           y_std: float) -> float:
    """Mean test log-likelihood per point, in original units, of an equal mixture of Gaussians.

    The predictive density of the original target y_n is (1/S) Σ_s N(y_n; y_mean + y_std μ_s(x_n),
    y_std² σ²): computed as logsumexp_s log N((y_n − y_mean)/y_std; μ_s, σ²) − log S − log y_std.

    Parameters
    ----------
    draws : ndarray of shape (S, N)
        μ_s(x_n), network outputs in standardised target units (S = 1 for a point estimate).
    y : ndarray of shape (N,)
        Targets in original units.
    noise_variance : float
        σ², in standardised units (> 0).
    y_mean, y_std : float
        The training standardisation of the target.

    Returns
    -------
    float
    """
    if noise_variance <= 0.0 or y_std <= 0.0:
        raise ValueError("noise_variance and y_std must be > 0")
    z = (np.asarray(y, dtype=np.float64) - y_mean) / y_std
    draws = np.atleast_2d(np.asarray(draws, dtype=np.float64))
    return float(np.mean(_log_mixture(draws, z, np.array([noise_variance]))[0]) - math.log(y_std))


def rmse(draws: FloatArray, y: FloatArray, y_mean: float, y_std: float) -> float:
    """RMSE of the predictive mean (the average of the draws), in original units."""
    prediction = y_mean + y_std * np.atleast_2d(draws).mean(axis=0)
    return float(np.sqrt(np.mean((prediction - y) ** 2)))


def tune_noise_variance(draws: FloatArray, y_standardised: FloatArray) -> tuple[float, float]:
    """σ² of :data:`NOISE_GRID` maximising the mean mixture log-likelihood (standardised units).

    Returns
    -------
    (float, float)
        The best σ² and its mean log-likelihood per point (standardised units).
    """
    draws = np.atleast_2d(draws)
    scores = np.empty(NOISE_GRID.size)
    for start in range(0, NOISE_GRID.size, 16):  # bounded temporaries: 16 × S × N
        block = NOISE_GRID[start : start + 16]
        scores[start : start + 16] = _log_mixture(draws, y_standardised, block).mean(axis=1)
    scores[~np.isfinite(scores)] = -np.inf
    best = int(np.argmax(scores))
    return float(NOISE_GRID[best]), float(scores[best])


def mean_and_standard_error(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (sample s.d. / √n; NaN for n < 2) of finite values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    mean = float(np.mean(finite))
    if len(finite) < 2:
        return mean, math.nan
    return mean, float(np.std(finite, ddof=1) / math.sqrt(len(finite)))
