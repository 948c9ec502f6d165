"""Choose between runs of the ``uci-bnn`` experiment per split, on validation only (``--select-from``).

Runs of the same splits and seeds that differ in one budget setting (say the Adam epochs E) are two grids of
the same method; the protocol allows either to be chosen per split as long as the choice looks at the training
rows only. Each run's ``uci_bnn_choices.csv`` holds the validation log-likelihood of the grid point it chose
(the same validation rows and standardisation in every run, which depend only on the data set, split and
seed), so for every (data set, split, method) present in all runs the row of the run with the best validation
log-likelihood is kept; its test numbers are never compared. Ties keep the earlier run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .._common import read_rows

#: Columns of the CSV that says which run each selected row came from.
SOURCE_FIELDS = ["dataset", "split", "method", "run"]

Key = tuple[str, str, str]


def _keyed(rows: Sequence[Mapping[str, str]]) -> dict[Key, Mapping[str, str]]:
    return {(r["dataset"], r["split"], r["method"]): r for r in rows}


def _load(folder: Path) -> tuple[dict[Key, Mapping[str, str]], dict[Key, Mapping[str, str]]]:
    results, choices = folder / "uci_bnn.csv", folder / "uci_bnn_choices.csv"
    if not results.is_file() or not choices.is_file():
        raise ValueError(f"{folder} holds no uci_bnn.csv and uci_bnn_choices.csv of a run")
    return _keyed(read_rows(results)), _keyed(read_rows(choices))


def select_by_validation(
    folders: Sequence[Path],
) -> tuple[list[Mapping[str, str]], list[Mapping[str, str]], list[dict[str, str]]]:
    """Per (data set, split, method) present in every run of ``folders``, the row of the best-validated run.

    Parameters
    ----------
    folders : sequence of Path
        Output folders of at least two runs (their ``uci_bnn.csv`` and ``uci_bnn_choices.csv``).

    Returns
    -------
    (list, list, list)
        The selected result rows and choice rows (in the order of the first run's rows) and, for each, which
        run it came from (the folder's name, columns :data:`SOURCE_FIELDS`).

    Raises
    ------
    ValueError
        Fewer than two folders, two folders of the same name, a folder without a run, or a result row without
        its choice row.
    """
    if len(folders) < 2:
        raise ValueError("--select-from needs at least two run folders")
    names = [Path(folder).name for folder in folders]
    if len(set(names)) < len(names):
        raise ValueError(f"--select-from names each run by its folder's name, which must differ: {names}")
    runs = [_load(Path(folder)) for folder in folders]
    for folder, (results, choices) in zip(folders, runs):
        missing = sorted(set(results) - set(choices))
        if missing:
            raise ValueError(f"{folder}: rows without a validation choice, e.g. {missing[0]}")
    first_results = runs[0][0]
    common = [key for key in first_results if all(key in results for results, _ in runs[1:])]
    rows, choice_rows, sources = [], [], []
    for key in common:
        scores = [float(choices[key]["validation_ll"]) for _, choices in runs]
        best = max(range(len(runs)), key=lambda i: (scores[i], -i))  # ties: the earlier run
        rows.append(runs[best][0][key])
        choice_rows.append(runs[best][1][key])
        sources.append({"dataset": key[0], "split": key[1], "method": key[2], "run": names[best]})
    return rows, choice_rows, sources
