"""Evaluation part of the ``swag`` experiment: predictive metrics and posterior-variance ratios."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._calibration import accuracy, classification_nll, expected_calibration_error
from ._swag_data import Task

FloatArray = NDArray[np.float64]


def softmax(logits: FloatArray) -> FloatArray:
    """Row-wise softmax, shifted by the row maximum."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    weights = np.exp(shifted)
    out: FloatArray = weights / weights.sum(axis=1, keepdims=True)
    return out


def classification_metrics(probabilities: FloatArray, task: Task) -> dict[str, float]:
    """Test NLL, accuracy and ECE (15 bins) of predictive probabilities (N, C)."""
    labels = task.y_test.astype(np.int64)
    return {
        "nll": classification_nll(probabilities, labels),
        "accuracy": accuracy(probabilities, labels),
        "ece": expected_calibration_error(probabilities, labels),
    }


def regression_metrics(predictions: FloatArray, task: Task, noise_variance: float) -> dict[str, float]:
    """Test NLL and RMSE, in the raw target's units, of an equally weighted mixture of Gaussians.

    Parameters
    ----------
    predictions : ndarray of shape (S, N)
        Standardised predictions of S parameter vectors; the predictive density of y_n is
        (1/S) Σ_s N(y_n; f_s(x_n), σ²) with σ² = ``noise_variance`` (standardised units).
    task : Task
    noise_variance : float

    Returns
    -------
    dict
        ``nll`` (mean over test points, raw units: + log of the target's s.d.) and ``rmse`` of the mean
        prediction (raw units).
    """
    residual = task.y_test[None, :] - predictions
    log_density = -0.5 * residual**2 / noise_variance - 0.5 * np.log(2.0 * np.pi * noise_variance)
    peak = log_density.max(axis=0)
    log_mixture = peak + np.log(np.mean(np.exp(log_density - peak), axis=0))
    nll = float(-np.mean(log_mixture) + np.log(task.target_scale))
    rmse = float(np.sqrt(np.mean((predictions.mean(axis=0) - task.y_test) ** 2)) * task.target_scale)
    return {"nll": nll, "rmse": rmse}


def marginal_variances(gaussian: Any, scale: float) -> FloatArray:
    """scale · diag(F Fᵀ + Ψ) of a :class:`onlinefa.torch.GaussianParameters`."""
    out: FloatArray = scale * (np.sum(gaussian.loadings**2, axis=1) + gaussian.noise_variance)
    return out


def variance_ratios(posterior_variance: FloatArray, iterate_variance: FloatArray) -> dict[str, float]:
    """How wide the posterior is relative to the SGD iterates it was fitted to.

    Returns
    -------
    dict
        ``var_ratio`` = mean(posterior variances) / mean(iterate variances) (over parameters), and
        ``var_ratio_median`` = the median of the per-parameter ratios over parameters whose iterates moved.
    """
    moved = iterate_variance > 0.0
    return {
        "var_ratio": float(posterior_variance.mean() / iterate_variance.mean()),
        "var_ratio_median": float(np.median(posterior_variance[moved] / iterate_variance[moved])),
    }


def mixture_variances(means: Sequence[FloatArray], variances: Sequence[FloatArray]) -> FloatArray:
    """Per-parameter variance of an equally weighted mixture: mean of variances + variance of means."""
    out: FloatArray = np.mean(variances, axis=0) + np.var(np.stack(means), axis=0)
    return out
