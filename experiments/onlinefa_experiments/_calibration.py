"""Predictive metrics of the ``swag`` and ``calibration`` experiments: NLL, accuracy, ECE, Brier, OOD AUROC.

NumPy only, except :func:`plot_reliability` (matplotlib). Calibration follows Guo et al., "On Calibration
of Modern Neural Networks" (2017), Section 2: predictions are binned by their confidence (the largest
class probability) into ``n_bins`` equal-width bins of (0, 1]; ECE = Σ_b (n_b / N) |acc_b − conf_b|.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Probabilities are clipped below at this value before taking logs (a zero probability of the true class
#: would otherwise give an infinite NLL).
PROBABILITY_FLOOR = 1e-12


class ReliabilityBins(NamedTuple):
    """Per-bin statistics of a reliability diagram (empty bins hold NaN confidence/accuracy)."""

    edges: FloatArray  #: (n_bins + 1,) bin edges 0, 1/n_bins, …, 1
    confidence: FloatArray  #: (n_bins,) mean confidence of the predictions in each bin
    accuracy: FloatArray  #: (n_bins,) fraction of those predictions that are correct
    counts: IntArray  #: (n_bins,) number of predictions in each bin


def _check_probabilities(probabilities: FloatArray, labels: IntArray) -> None:
    if probabilities.ndim != 2 or labels.shape != (probabilities.shape[0],):
        raise ValueError(
            f"need probabilities of shape (N, C) and labels of shape (N,), got {probabilities.shape} and {labels.shape}"
        )


def classification_nll(probabilities: FloatArray, labels: IntArray) -> float:
    """Mean negative log predictive probability of the true class.

    Parameters
    ----------
    probabilities : ndarray of shape (N, C)
        Predictive class probabilities (rows sum to 1).
    labels : ndarray of shape (N,)
        True classes in 0 … C − 1.

    Returns
    -------
    float
    """
    _check_probabilities(probabilities, labels)
    picked = probabilities[np.arange(labels.size), labels]
    return float(-np.mean(np.log(np.maximum(picked, PROBABILITY_FLOOR))))


def accuracy(probabilities: FloatArray, labels: IntArray) -> float:
    """Fraction of rows whose most probable class is the true one."""
    _check_probabilities(probabilities, labels)
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))


def reliability_bins(probabilities: FloatArray, labels: IntArray, n_bins: int = 15) -> ReliabilityBins:
    """Bin predictions by confidence into ``n_bins`` equal-width bins (b − 1)/n_bins < conf <= b/n_bins.

    Parameters
    ----------
    probabilities : ndarray of shape (N, C)
    labels : ndarray of shape (N,)
    n_bins : int, default=15

    Returns
    -------
    ReliabilityBins
    """
    _check_probabilities(probabilities, labels)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    confidence = probabilities.max(axis=1)
    correct = (np.argmax(probabilities, axis=1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.clip(np.ceil(confidence * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(index, weights=confidence, minlength=n_bins) / counts
        mean_accuracy = np.bincount(index, weights=correct, minlength=n_bins) / counts
    return ReliabilityBins(edges, mean_confidence, mean_accuracy, counts)


def expected_calibration_error(probabilities: FloatArray, labels: IntArray, n_bins: int = 15) -> float:
    """ECE = Σ_b (n_b / N) |acc_b − conf_b| over the non-empty bins of :func:`reliability_bins`."""
    bins = reliability_bins(probabilities, labels, n_bins)
    filled = bins.counts > 0
    weights = bins.counts[filled] / bins.counts.sum()
    return float(np.sum(weights * np.abs(bins.accuracy[filled] - bins.confidence[filled])))


def plot_reliability(
    panels: Mapping[str, Mapping[str, tuple[FloatArray, IntArray]]], path: Path, n_bins: int = 10,
    min_count: int = 20,
) -> None:
    """Reliability diagrams: one panel per data set, accuracy − confidence per bin for each method.

    Plotting accuracy minus confidence (0 = calibrated; below 0 = over-confident) keeps the methods'
    small differences visible, which the usual accuracy-against-confidence plot hides near the diagonal.

    Parameters
    ----------
    panels : mapping
        ``{data set: {method: (probabilities (N, C), labels (N,))}}``.
    path : Path
        Where to write the PNG.
    n_bins : int, default=10
        Bins of the curves and of the ECE in the legend (coarser than the table's 15: the curves pool
        few low-confidence predictions).
    min_count : int, default=20
        Bins with fewer predictions are not drawn (their accuracy is noise).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.2 * max(1, len(panels)), 4.0), squeeze=False)
    for ax, (title, methods) in zip(axes.flat, panels.items()):
        for method, (probabilities, labels) in methods.items():
            bins = reliability_bins(probabilities, labels, n_bins)
            shown = bins.counts >= min_count
            ece = expected_calibration_error(probabilities, labels, n_bins)
            ax.plot(bins.confidence[shown], (bins.accuracy - bins.confidence)[shown], marker="o", markersize=3,
                    label=f"{method} (ECE {ece:.3f}, {n_bins} bins)")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel("confidence (bin mean)")
        ax.set_ylabel("accuracy − confidence")
        ax.set_title(f"{title}: pooled over seeds (bins with >= {min_count} predictions)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def brier_score(probabilities: FloatArray, labels: IntArray) -> float:
    """Mean over rows of Σ_c (p_c − [c = y])², the multi-class Brier score (0 = perfect, at most 2).

    Parameters
    ----------
    probabilities : ndarray of shape (N, C)
    labels : ndarray of shape (N,)

    Returns
    -------
    float
    """
    _check_probabilities(probabilities, labels)
    onehot = np.zeros_like(probabilities)
    onehot[np.arange(labels.size), labels] = 1.0
    return float(np.mean(np.sum((probabilities - onehot) ** 2, axis=1)))


def predictive_entropy(probabilities: FloatArray) -> FloatArray:
    """−Σ_c p_c log p_c per row (0 log 0 = 0), shape (N,)."""
    p = np.asarray(probabilities, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0.0, p * np.log(p), 0.0)
    entropy: FloatArray = -terms.sum(axis=1)
    return entropy


def auroc(in_scores: FloatArray, out_scores: FloatArray) -> float:
    """Area under the ROC curve of telling ``out_scores`` (positives) from ``in_scores`` by a larger score.

    The Mann–Whitney statistic P(out > in) + ½ P(out = in), from the mid-ranks of the pooled scores.

    Parameters
    ----------
    in_scores : ndarray of shape (N_in,)
        Scores of in-distribution rows (e.g. predictive entropy on the clean test set).
    out_scores : ndarray of shape (N_out,)
        Scores of out-of-distribution rows.

    Returns
    -------
    float
        In [0, 1]; 0.5 when the scores do not separate the two.
    """
    a, b = np.asarray(in_scores, dtype=np.float64), np.asarray(out_scores, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or a.size == 0 or b.size == 0:
        raise ValueError(f"need two non-empty 1-D score arrays, got shapes {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("scores must be finite")
    pooled = np.concatenate([a, b])
    order = np.argsort(pooled, kind="mergesort")
    ranks = np.empty(pooled.size)
    sorted_scores = pooled[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], pooled.size]
    for start, end in zip(starts, ends):  # ties share their mean rank (1-based)
        ranks[order[start:end]] = 0.5 * (start + end - 1) + 1.0
    out_rank_sum = ranks[a.size:].sum()
    return float((out_rank_sum - b.size * (b.size + 1) / 2.0) / (a.size * b.size))
