"""``onlinefa experiment uci-bnn --data-dir``: a folder that is not a benchmark is refused in one line (exit 2),
before anything trains; the result files survive a kill at any point; a rerun with another budget is refused."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")

from onlinefa.cli import main  # noqa: E402

GOOD = {"index_features.txt": "0\n1\n", "index_target.txt": "2\n", "n_splits.txt": "3\n", "n_hidden.txt": "4\n",
        "n_epochs.txt": "2\n"}


def _write_set(root: Path, table: np.ndarray | str | None = None, **files: str) -> Path:
    folder = root / "data" / "toy-set" / "data"
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(table, str):
        (folder / "data.txt").write_text(table)
    else:
        if table is None:
            rng = np.random.default_rng(2)
            X = rng.normal(size=(40, 2))
            table = np.column_stack([X, X @ np.array([1.0, -1.0]) + 0.1 * rng.normal(size=40)])
        np.savetxt(folder / "data.txt", table)
    for name, text in {**GOOD, **files}.items():
        (folder / name).write_text(text)
    return root / "data"


def _run(data: Path, out: Path, *extra: str, methods: str = "map") -> int:
    return main(["experiment", "uci-bnn", "--quick", "--data-dir", str(data), "--datasets", "toy-set",
                 "--splits", "1", "--methods", methods, "--out", str(out), *extra])


def _nan_table() -> np.ndarray:
    table = np.random.default_rng(0).normal(size=(40, 3))
    table[7, 1] = np.nan
    return table


@pytest.mark.parametrize(("files", "table", "message"), [
    ({"index_features.txt": "0\n1\n2\n"}, None, "target would leak"),
    ({"index_features.txt": "0\n-1\n"}, None, "negative indices are refused"),
    ({"index_features.txt": "0\n5\n"}, None, "column 5 is out of range"),
    ({"index_features.txt": "0\n0\n"}, None, "names a column twice"),
    ({"index_features.txt": "0\n1.5\n"}, None, "integer column indices"),
    ({"index_target.txt": "9\n"}, None, "column 9 is out of range"),
    ({"n_splits.txt": "0\n"}, None, "n_splits.txt must hold one integer >= 1"),
    ({"n_splits.txt": "-3\n"}, None, "n_splits.txt must hold one integer >= 1"),
    ({"n_splits.txt": "abc\n"}, None, "n_splits.txt must hold one integer >= 1"),
    ({}, "", "holds no data"),
    ({}, "1 2 3\n4 5\n", "not a table of numbers"),
    ({}, _nan_table(), "non-finite values"),
])
def test_a_folder_that_is_not_a_benchmark_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str], table: object, message: str) -> None:
    data = _write_set(tmp_path, table, **files)  # type: ignore[arg-type]
    assert _run(data, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("onlinefa experiment: error:")
    assert not (tmp_path / "out" / "uci_bnn.csv").exists()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_torn_last_row_is_cut_and_the_row_written_again(tmp_path: Path) -> None:
    data, out = _write_set(tmp_path), tmp_path / "out"
    assert _run(data, out, methods="map,swa") == 0
    whole = (out / "uci_bnn.csv").read_bytes()
    rows = _rows(out / "uci_bnn.csv")
    torn = whole[: whole.rindex(b"swa") + 5]  # the last row cut mid-number, no newline
    (out / "uci_bnn.csv").write_bytes(torn)
    assert _run(data, out, methods="map,swa") == 0
    again = _rows(out / "uci_bnn.csv")
    assert [(r["method"], r["test_ll"]) for r in again] == [(r["method"], r["test_ll"]) for r in rows]
    assert len(_rows(out / "uci_bnn_choices.csv")) == 2


def test_a_result_row_without_its_choice_and_the_reverse_are_repaired(tmp_path: Path) -> None:
    data, out = _write_set(tmp_path), tmp_path / "out"
    assert _run(data, out, methods="map,swa") == 0
    rows, choices = _rows(out / "uci_bnn.csv"), _rows(out / "uci_bnn_choices.csv")
    # killed between the two appends of swa: its choice written, its result not
    lines = (out / "uci_bnn.csv").read_text().splitlines(keepends=True)
    (out / "uci_bnn.csv").write_text("".join(lines[:-1]))
    assert _run(data, out, methods="map,swa") == 0
    assert _same(_rows(out / "uci_bnn.csv"), rows) and _same(_rows(out / "uci_bnn_choices.csv"), choices)
    # a result kept without its choice (an older run's order of appends): rewritten as a pair
    lines = (out / "uci_bnn_choices.csv").read_text().splitlines(keepends=True)
    (out / "uci_bnn_choices.csv").write_text("".join(lines[:-1]))
    assert _run(data, out, methods="map,swa") == 0
    assert _same(_rows(out / "uci_bnn.csv"), rows) and _same(_rows(out / "uci_bnn_choices.csv"), choices)


def _same(left: list[dict[str, str]], right: list[dict[str, str]]) -> bool:
    """The same rows but for their timings (a refit takes its own time)."""
    def untimed(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in row.items() if not k.endswith("seconds")} for row in rows]
    return untimed(left) == untimed(right)


@pytest.mark.parametrize("other", [["--batch-size", "64"], ["--adam-lr", "0.001"]])  # (--quick sets E and K)
def test_a_rerun_with_another_budget_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                other: list[str]) -> None:
    data, out = _write_set(tmp_path), tmp_path / "out"
    assert _run(data, out) == 0
    before = (out / "uci_bnn.csv").read_bytes()
    capsys.readouterr()
    assert _run(data, out, *other) == 2
    err = capsys.readouterr().err
    assert other[0] in err and "another budget" in err and err.count("\n") == 1
    assert (out / "uci_bnn.csv").read_bytes() == before
    assert _run(data, out) == 0  # the recorded budget still resumes
