"""scikit-learn's estimator bases when scikit-learn is installed, a drop-in without it.

Imported only by the estimator modules (never by ``import onlinefa`` itself), so the core install stays
NumPy-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from .errors import NotFittedError as LibraryNotFittedError
from .errors import ConvergenceWarning as LibraryConvergenceWarning
from ._params import ParamsMixin
from ._pickle_tag import ClassTaggedPickle
from ._validation import as_numpy, check_seed, objects_to_float


if TYPE_CHECKING:

    class EstimatorBase(ClassTaggedPickle, ParamsMixin):
        """The estimators' base as the type checker sees it."""

    NotFittedError = LibraryNotFittedError
    ConvergenceWarning = LibraryConvergenceWarning
else:
    try:
        from sklearn.base import BaseEstimator, TransformerMixin
        from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning
        from sklearn.exceptions import NotFittedError as SklearnNotFittedError
    except ImportError:

        class EstimatorBase(ClassTaggedPickle, ParamsMixin):
            """The estimators' base without scikit-learn: its parameter conventions, class-tagged pickles."""

        NotFittedError = LibraryNotFittedError
        ConvergenceWarning = LibraryConvergenceWarning
    else:

        class EstimatorBase(ClassTaggedPickle, TransformerMixin, BaseEstimator):
            """scikit-learn's transformer bases, in the order scikit-learn requires, with class-tagged pickles."""

        class NotFittedError(LibraryNotFittedError, SklearnNotFittedError):
            """A query before fitting: both ``onlinefa.NotFittedError`` and scikit-learn's."""

        class ConvergenceWarning(LibraryConvergenceWarning, SklearnConvergenceWarning):
            """A fit that stopped at ``max_iter``: both ``onlinefa.errors.ConvergenceWarning`` and scikit-learn's."""


def seed_from(random_state: object) -> int | None:
    """Seed for an estimator's random initialisation, following scikit-learn's ``random_state`` convention:
    a ``RandomState`` gives one ``randint`` draw; None, ints, Generators and SeedSequences are read by
    :func:`onlinefa._validation.check_seed`."""
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    try:
        return check_seed(random_state)
    except TypeError as err:
        raise TypeError(
            "random_state must be None, an int, or a numpy RandomState, Generator or SeedSequence, "
            f"got {type(random_state).__name__}"
        ) from err


def _is_sparse(data: object) -> bool:
    return hasattr(data, "toarray") and hasattr(data, "nnz")


def as_real_matrix(data: object, estimator: str = "OnlineFactorAnalysis") -> NDArray[Any]:
    """``data`` as a 2-D real array (float32/float64 kept without copying; others to float64)."""
    if _is_sparse(data):
        raise TypeError(f"sparse input is not supported by {estimator}; pass a dense array")
    X = as_numpy(data)
    if X.dtype.kind == "c":
        raise ValueError("Complex data not supported; pass real-valued samples")
    if X.dtype.kind == "O":
        X = objects_to_float(X)  # numbers stored as objects; strings and others raise TypeError
    if X.dtype.kind not in "biuf":
        raise TypeError(f"expected real numeric samples, got an array of dtype {X.dtype}")
    if X.ndim != 2:
        shape_name = "scalar" if X.ndim == 0 else f"{X.ndim}D"
        raise ValueError(
            f"Expected a 2D array of shape (n_samples, n_features), got a {shape_name} array instead. "
            "Reshape your data either using array.reshape(-1, 1) if your data has a single feature or "
            "array.reshape(1, -1) if it contains a single sample."
        )
    if X.dtype not in (np.float32, np.float64) or not X.dtype.isnative:
        X = X.astype(np.float64)
    return X
