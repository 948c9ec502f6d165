"""Data sets of the ``swag`` experiment (no downloads): scikit-learn's bundled sets and the packaged UCI data.

Each data set is split once (seed 0, 20 % test, stratified for classification) so every training seed
sees the same split and MultiSWAG can mix their posteriors; inputs are standardised with the training
part's mean and s.d. (constant columns only centred), regression targets too (``target_scale`` undoes it).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from onlinefa._uci import UCI_DATASETS, load_uci

FloatArray = NDArray[np.float64]

#: Classification sets bundled with scikit-learn.
CLASSIFICATION_SETS: tuple[str, ...] = ("digits", "breast_cancer")
#: Regression sets shipped in ``onlinefa/data/uci``.
REGRESSION_SETS: tuple[str, ...] = tuple(UCI_DATASETS)

#: Fraction of each data set held out for testing.
TEST_FRACTION = 0.2


class Task(NamedTuple):
    """A standardised train/test split."""

    name: str
    kind: str  #: "classification" or "regression"
    X_train: FloatArray
    y_train: FloatArray  #: class indices (as floats) or standardised targets
    X_test: FloatArray
    y_test: FloatArray
    n_outputs: int  #: classes, or 1 for regression
    target_scale: float  #: s.d. of the raw regression target (1 for classification)


def _raw(name: str) -> tuple[FloatArray, FloatArray, str]:
    if name in CLASSIFICATION_SETS:
        from sklearn import datasets

        loader = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer}[name]
        bunch = loader()
        return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.float64), "classification"
    if name in REGRESSION_SETS:
        X, y = load_uci(name)
        return X, y, "regression"
    known = ", ".join((*CLASSIFICATION_SETS, *REGRESSION_SETS))
    raise ValueError(f"unknown data set {name!r}; choose from {known}")


def _standardise(train: FloatArray, test: FloatArray) -> tuple[FloatArray, FloatArray]:
    centre = train.mean(axis=0)
    scale = train.std(axis=0)
    scale = np.where(scale > 0.0, scale, 1.0)
    return (train - centre) / scale, (test - centre) / scale


def load_task(name: str) -> Task:
    """Load, split (seed 0) and standardise data set ``name``.

    Parameters
    ----------
    name : str
        One of :data:`CLASSIFICATION_SETS` or :data:`REGRESSION_SETS`.

    Returns
    -------
    Task
    """
    from sklearn.model_selection import train_test_split

    X, y, kind = _raw(name)
    stratify = y if kind == "classification" else None
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=TEST_FRACTION, random_state=0,
                                                        stratify=stratify)
    X_train, X_test = _standardise(X_train, X_test)
    if kind == "classification":
        return Task(name, kind, X_train, y_train, X_test, y_test, int(y.max()) + 1, 1.0)
    target_scale = float(y_train.std())
    y_train_std, y_test_std = _standardise(y_train[:, None], y_test[:, None])
    return Task(name, kind, X_train, y_train_std[:, 0], X_test, y_test_std[:, 0], 1, target_scale)
