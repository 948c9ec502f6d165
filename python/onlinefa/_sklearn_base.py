"""scikit-learn's estimator bases when scikit-learn is installed, a drop-in without it.

Imported only by the estimator modules (never by ``import onlinefa`` itself), so the core install stays
NumPy-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._params import ParamsMixin
from ._validation import check_seed


class _NotFittedError(ValueError, AttributeError):
    """Raised when a fitted attribute or method is used before ``fit``/``partial_fit``."""


if TYPE_CHECKING:
    EstimatorBase = ParamsMixin
    NotFittedError = _NotFittedError
else:
    try:
        from sklearn.base import BaseEstimator, TransformerMixin
        from sklearn.exceptions import NotFittedError
    except ImportError:
        EstimatorBase = ParamsMixin
        NotFittedError = _NotFittedError
    else:

        class EstimatorBase(TransformerMixin, BaseEstimator):
            """scikit-learn's transformer bases, in the order scikit-learn requires."""


def seed_from(random_state: object) -> int | None:
    """Seed for an estimator's random initialisation, following scikit-learn's ``random_state`` convention."""
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    try:
        return check_seed(random_state)
    except TypeError as err:
        raise TypeError(
            "random_state must be None, an int or a numpy RandomState/Generator, "
            f"got {type(random_state).__name__}"
        ) from err
