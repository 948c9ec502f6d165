"""The published train/test splits of the UCI regression benchmark, regenerated exactly.

Hernández-Lobato and Adams ("Probabilistic Backpropagation for Scalable Learning of Bayesian Neural
Networks", ICML 2015) drew 20 random 90/10 splits (5 for protein) per data set; Gal and Ghahramani
("Dropout as a Bayesian Approximation", ICML 2016) and every later paper on this benchmark reuse them.
They come from NumPy's legacy global generator seeded once per data set with 1, one
``np.random.choice(range(n), n, replace=False)`` permutation per split; the first
``int(round(0.9 n))`` rows of a permutation train, the rest test.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["published_splits", "validation_split"]

IndexArray = NDArray[np.intp]


def published_splits(n_rows: int, n_splits: int) -> list[tuple[IndexArray, IndexArray]]:
    """The benchmark's ``n_splits`` (train, test) row-index pairs for a data set of ``n_rows`` rows.

    Uses a private :class:`numpy.random.RandomState` seeded with 1 (the same stream as the legacy
    global generator after ``np.random.seed(1)``), so NumPy's global state is left untouched.

    Parameters
    ----------
    n_rows : int
        Number of rows n of the data set (>= 2).
    n_splits : int
        Number of splits to generate (>= 1); split i only depends on i, not on ``n_splits``.

    Returns
    -------
    list of (ndarray, ndarray)
        Per split the training rows (``int(round(0.9 n))`` of them, in permutation order) and the
        test rows.

    Raises
    ------
    ValueError
        ``n_rows`` < 2 or ``n_splits`` < 1.
    """
    if n_rows < 2 or n_splits < 1:
        raise ValueError(f"need n_rows >= 2 and n_splits >= 1, got {n_rows} and {n_splits}")
    generator = np.random.RandomState(1)
    n_train = int(round(n_rows * 9.0 / 10))
    splits: list[tuple[IndexArray, IndexArray]] = []
    for _ in range(n_splits):
        permutation = np.asarray(generator.choice(range(n_rows), n_rows, replace=False), dtype=np.intp)
        splits.append((permutation[:n_train], permutation[n_train:]))
    return splits


def validation_split(n_rows: int, seed: int) -> tuple[IndexArray, IndexArray]:
    """An 80/20 (fit, validation) split of ``n_rows`` training rows, as positions into them.

    Parameters
    ----------
    n_rows : int
        Size of the training part (>= 2).
    seed : int
        Seed of :func:`numpy.random.default_rng`.

    Returns
    -------
    (ndarray, ndarray)
        ``int(round(0.8 n))`` fit positions and the remaining validation positions.
    """
    if n_rows < 2:
        raise ValueError(f"need at least 2 training rows, got {n_rows}")
    permutation = np.random.default_rng(seed).permutation(n_rows).astype(np.intp)
    n_fit = min(n_rows - 1, max(1, int(round(0.8 * n_rows))))
    return permutation[:n_fit], permutation[n_fit:]
