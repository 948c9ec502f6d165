"""Loader for the four UCI regression datasets shipped with the package.

The copies live in ``onlinefa/data/uci/<folder>/`` (see the README there for columns, licence and
citation) and are read with :mod:`importlib.resources`, so nothing is downloaded at run time and the
loader works from a wheel, a zip or a source checkout alike.
"""

from __future__ import annotations

import io
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # importlib.resources.abc is Python >= 3.11; only the annotations need it
    from importlib.resources.abc import Traversable

__all__ = ["UCI_DATASETS", "load_uci"]

#: Canonical dataset names accepted by :func:`load_uci`, mapped to their folder under ``data/uci``.
UCI_DATASETS: dict[str, str] = {
    "energy": "energy",
    "boston": "bostonHousing",
    "concrete": "concrete",
    "yacht": "yacht",
}

#: Other spellings accepted by :func:`load_uci` (matched case-insensitively), mapped to a canonical name.
_ALIASES: dict[str, str] = {"bostonhousing": "boston"}


def _dataset_folder(name: str) -> Traversable:
    """Return the packaged folder of dataset ``name``, raising for unknown names."""
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}")
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in UCI_DATASETS:
        known = ", ".join(repr(n) for n in UCI_DATASETS)
        raise ValueError(f"unknown UCI dataset {name!r}; expected one of {known} (or 'bostonHousing')")
    return resources.files("onlinefa") / "data" / "uci" / UCI_DATASETS[key]


def _read_indices(resource: Traversable) -> NDArray[np.intp]:
    """Read a file of zero-based column indices, one per line."""
    values = np.loadtxt(io.StringIO(resource.read_text()), dtype=np.intp, ndmin=1)
    return np.asarray(values, dtype=np.intp)


def load_uci(name: str) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Load one of the packaged UCI regression datasets.

    Parameters
    ----------
    name : str
        ``"energy"`` (Energy Efficiency, heating load), ``"boston"`` or ``"bostonHousing"`` (Boston
        Housing), ``"concrete"`` (Concrete Compressive Strength) or ``"yacht"`` (Yacht Hydrodynamics).
        Case-insensitive.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features)
        The raw (unstandardised) inputs: 768x8, 506x13, 1030x8 and 308x6 respectively.
    y : ndarray of shape (n_samples,)
        The regression target.

    Raises
    ------
    ValueError
        If ``name`` is not one of the datasets above.
    TypeError
        If ``name`` is not a string.

    Notes
    -----
    The data come from the UCI Machine Learning Repository (CC BY 4.0; cite Dua and Graff, 2017).
    Boston Housing carries a known ethical problem and is kept only to reproduce published results.

    Examples
    --------
    >>> X, y = load_uci("yacht")
    >>> X.shape, y.shape
    ((308, 6), (308,))
    """
    folder = _dataset_folder(name)
    table = np.loadtxt(io.StringIO(folder.joinpath("data.txt").read_text()), dtype=np.float64, ndmin=2)
    feature_columns = _read_indices(folder.joinpath("index_features.txt"))
    target_column = _read_indices(folder.joinpath("index_target.txt"))
    if target_column.size != 1:
        raise ValueError(f"dataset {name!r} must have exactly one target column, found {target_column.size}")
    X = np.ascontiguousarray(table[:, feature_columns])
    y = np.ascontiguousarray(table[:, int(target_column[0])])
    return X, y
