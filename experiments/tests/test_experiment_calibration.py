"""The ``calibration`` experiment: its metrics on hand-computed cases, ``--quick`` end to end on digits,
``--data`` with good and malformed files, and a run with the peers' libraries missing."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
from sklearn.metrics import roc_auc_score  # noqa: E402

from onlinefa.cli import main  # noqa: E402
from onlinefa_experiments._calibration import (  # noqa: E402
    auroc,
    brier_score,
    expected_calibration_error,
    predictive_entropy,
)


def test_brier_score_of_a_hand_computed_case() -> None:
    p = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    # row 1: (0.3² + 0.2² + 0.1²) = 0.14; row 2 (label 1): 0.5² + 0.5² = 0.5
    assert brier_score(p, np.array([0, 1])) == pytest.approx((0.14 + 0.5) / 2, abs=1e-15)


def test_ece_of_a_hand_computed_case() -> None:
    # Two bins (of 15) hold the predictions: conf 0.9 (two rows, one right) and conf 0.6 (one row, right).
    p = np.array([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6]])
    y = np.array([0, 1, 1])
    expected = (2 / 3) * abs(0.5 - 0.9) + (1 / 3) * abs(1.0 - 0.6)
    assert expected_calibration_error(p, y) == pytest.approx(expected, abs=1e-15)


def test_auroc_of_hand_computed_cases_and_against_scikit_learn() -> None:
    assert auroc(np.array([0.1, 0.2]), np.array([0.3, 0.4])) == 1.0
    assert auroc(np.array([0.3, 0.4]), np.array([0.1, 0.2])) == 0.0
    # one tie of four pairs counts a half: (1 + 1 + 0.5 + 0) / 4
    assert auroc(np.array([0.1, 0.3]), np.array([0.3, 0.2])) == pytest.approx(0.625)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 40).astype(float), rng.integers(1, 6, 30).astype(float)  # many ties
    assert auroc(a, b) == pytest.approx(roc_auc_score(np.r_[np.zeros(40), np.ones(30)], np.r_[a, b]), rel=1e-12)
    with pytest.raises(ValueError):
        auroc(np.array([]), np.array([1.0]))


def test_predictive_entropy_handles_zero_probabilities() -> None:
    entropy = predictive_entropy(np.array([[1.0, 0.0], [0.5, 0.5]]))
    assert entropy == pytest.approx([0.0, np.log(2.0)])


def _read(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_quick_run_on_digits_writes_every_output_and_resumes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    methods = ["map", "swa", "swa_temp", "swag_fa", "onlinefa", "multiswag_fa", "deep_ensemble"]
    assert main(["experiment", "calibration", "--quick", "--seeds", "1", "--out", str(out), "--methods", *methods]) == 0
    rows = _read(out / "calibration.csv")
    assert {r["seed"] for r in rows} == {"0"}, "an explicit --seeds wins over --quick's 2"
    assert list(rows[0]) == ["dataset", "seed", "method", "evaluation", "accuracy", "nll", "ece", "brier", "auroc",
                             "rmse"]
    assert {r["dataset"] for r in rows} == {"digits", "digits04"}
    assert {r["method"] for r in rows} == set(methods)
    evaluations = {r["evaluation"] for r in rows if r["dataset"] == "digits"}
    assert evaluations == {"clean", "shift:noise0.1", "shift:noise0.2", "shift:noise0.4", "shift:rotate15",
                           "shift:translate1", "ood:noise"}
    assert {r["evaluation"] for r in rows if r["dataset"] == "digits04"} == {"clean", "ood:digits59", "ood:noise"}
    for row in rows:
        assert (row["auroc"] != "") == row["evaluation"].startswith("ood:")
        assert (row["nll"] == "") == row["evaluation"].startswith("ood:")
    report = (out / "calibration.md").read_text()
    assert "| onlinefa |" in report and "Paired differences" in report
    assert (out / "calibration.png").stat().st_size > 10_000
    costs_before = (out / "costs.csv").read_text()
    capsys.readouterr()
    assert main(["experiment", "calibration", "--quick", "--seeds", "1", "--out", str(out), "--methods", *methods]) == 0
    assert (out / "costs.csv").read_text() == costs_before, "a finished seed must not run again"


def _npz(path: Path, **changes: object) -> Path:
    rng = np.random.default_rng(0)
    arrays: dict[str, object] = {
        "x_train": rng.standard_normal((60, 4)), "y_train": np.arange(60) % 3,
        "x_test": rng.standard_normal((20, 4)), "y_test": np.arange(20) % 3,
        "x_shift_blur": rng.standard_normal((10, 4)), "y_shift_blur": np.arange(10) % 3,
        "x_ood_far": 5 + rng.standard_normal((10, 4)),
    }
    arrays.update(changes)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_data_file_runs_with_its_shift_and_ood_sets(tmp_path: Path) -> None:
    data = _npz(tmp_path / "toy.npz")
    out = tmp_path / "out"
    assert main(["experiment", "calibration", "--quick", "--seeds", "1", "--data", str(data), "--out", str(out),
                 "--methods", "swa", "onlinefa"]) == 0
    rows = _read(out / "calibration.csv")
    assert {(r["dataset"], r["evaluation"]) for r in rows} == {("toy", "clean"), ("toy", "shift:blur"),
                                                              ("toy", "ood:far")}


@pytest.mark.parametrize(("changes", "message"), [
    ({"y_test": None}, "lacks y_test"),
    ({"y_train": np.arange(59) % 3}, "shape (60,)"),
    ({"x_test": np.full((20, 4), np.nan)}, "NaN"),
    ({"y_test": np.arange(20) % 3 + 1}, "out of range"),
    ({"y_shift_blur": None}, "has no y_shift_blur"),
    ({"x_ood_far": np.zeros((10, 3))}, "columns"),
])
def test_malformed_data_files_get_a_one_line_error_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                changes: dict[str, object], message: str) -> None:
    data = _npz(tmp_path / "bad.npz", **changes)
    assert main(["experiment", "calibration", "--quick", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "o" / "calibration.csv").exists()


def test_missing_peers_are_named_with_their_pip_install_and_the_rest_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for module in ("laplace", "ivon", "torch_uncertainty"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    data = _npz(tmp_path / "toy.npz")
    out = tmp_path / "out"
    assert main(["experiment", "calibration", "--quick", "--seeds", "1", "--data", str(data), "--out", str(out),
                 "--methods", "map", "laplace", "ivon", "swag_peer"]) == 0
    printed = capsys.readouterr().out
    for package in ("laplace-torch", "ivon-opt", "torch-uncertainty"):
        assert f"pip install {package}" in printed
    assert {r["method"] for r in _read(out / "calibration.csv")} == {"map"}


def test_a_uci_regression_set_reports_log_likelihood_and_rmse(tmp_path: Path) -> None:
    out = tmp_path / "uci"
    assert main(["experiment", "calibration", "--quick", "--seeds", "1", "--datasets", "yacht", "--out", str(out),
                 "--methods", "swa", "onlinefa", "deep_ensemble"]) == 0
    rows = _read(out / "calibration.csv")
    assert {(r["method"], r["evaluation"]) for r in rows} == {("swa", "clean"), ("onlinefa", "clean"),
                                                              ("deep_ensemble", "clean")}
    for row in rows:
        assert float(row["rmse"]) > 0 and np.isfinite(float(row["nll"])) and row["accuracy"] == row["auroc"] == ""
    assert "### yacht (regression)" in (out / "calibration.md").read_text()
