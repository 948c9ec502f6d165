"""Tiny end-to-end runs of the linear-regression experiments through ``onlinefa.cli.main``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from onlinefa import linreg
from onlinefa.cli import main
from onlinefa_experiments.linreg_iterates import gaussian_distances, synthetic_problem, trial_seeds

# Small settings shared by the synthetic experiments: 200 points, 20 pre-training epochs.
SMALL = ["--n-samples", "200", "--pretrain-epochs", "20", "--trials", "2", "--seed", "3"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_linreg_iterates_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "iterates"
    argv = ["experiment", "linreg-iterates", "--out", str(out), *SMALL, "--epochs", "3"]
    assert main(argv) == 0
    rows = _rows(out / "linreg_iterates.csv")
    assert len(rows) == 2 * 2 * 2  # lr x lambda x trials
    assert {int(row["n_iterates"]) for row in rows} == {3 * 200 // 100}
    table = (out / "table_6_1.md").read_text()
    assert "0.6200 ± 0.0750" in table and "W2²" in table  # thesis values beside ours
    assert (out / "figure_6_1.png").stat().st_size > 0

    # The CSV holds what an independent recomputation of one cell gives.
    seeds = trial_seeds(3, 1)
    problem = synthetic_problem(seeds, n_samples=200, prior_precision=0.01, noise_precision=0.1)
    start = linreg.init_parameters(2, seeds.init)
    start = linreg.run_sgd(problem.X, problem.y, start, linreg.SGDPhase(0.001, 0.0, 100, 20), seed=seeds.pretrain).theta
    iterates: list[np.ndarray] = []
    linreg.run_sgd(problem.X, problem.y, start, linreg.SGDPhase(0.01, 0.1, 100, 3), seed=seeds.method,
                   consumers=[iterates.append])
    stacked = np.array(iterates)
    expected = gaussian_distances(stacked.mean(axis=0), np.cov(stacked, rowvar=False), problem.posterior)
    (row,) = [r for r in rows if r["lr"] == "0.01" and r["weight_decay"] == "0.1" and r["trial"] == "1"]
    for name, value in expected.items():
        assert float(row[name]) == pytest.approx(value, rel=1e-12)
    assert float(row["w2_squared"]) == pytest.approx(float(row["w2"]) ** 2, rel=1e-12)

    # Resume: a second run computes nothing new.
    assert main(argv) == 0
    assert len(_rows(out / "linreg_iterates.csv")) == 8


def test_linreg_window_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "window"
    argv = ["experiment", "linreg-window", "--out", str(out), *SMALL, "--epochs", "4", "--settings", "100:2", "10:8"]
    assert main(argv) == 0
    rows = _rows(out / "linreg_window.csv")
    assert len(rows) == 2 * 2
    counts = {(row["batch_size"], row["window_size"]): int(row["n_window_means"]) for row in rows}
    assert counts == {("100", "2"): 4 * 2 // 2, ("10", "8"): 4 * 20 // 8}
    assert (out / "figure_6_2.md").exists() and (out / "figure_6_2.png").stat().st_size > 0


def test_linreg_window_rejects_too_few_window_means(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["experiment", "linreg-window", "--out", str(tmp_path), *SMALL, "--epochs", "1", "--settings", "100:2"]
    assert main(argv) == 2
    assert "only 1 window mean(s)" in capsys.readouterr().err


def test_uci_linreg_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "uci"
    argv = ["experiment", "uci-linreg", "--out", str(out), "--datasets", "yacht", "--folds", "3",
            "--pretrain-epochs", "20", "--epochs", "5", "--n-warmup", "10", "--n-ensemble", "4"]
    assert main(argv) == 0
    rows = _rows(out / "uci_linreg.csv")
    assert [int(row["fold"]) for row in rows] == [0, 1, 2]
    assert sum(int(row["n_test"]) for row in rows) == 308  # the folds partition the data
    for row in rows:
        assert int(row["batch_size"]) == int(row["n_train"]) // 10
        assert int(row["n_iterates"]) == 5 * 10  # last partial batch dropped: exactly 10 updates per epoch
        assert all(float(row[name]) > 0 for name in ("mse_pretrained", "mse_swa", "mse_sga_fa", "mse_em_fa"))
    table = (out / "table_a_1.md").read_text()
    assert "82.43 ± 7.28" in table and "ours (3 folds)" in table
    assert (out / "figure_6_4.png").stat().st_size > 0
    assert main(argv) == 0
    assert len(_rows(out / "uci_linreg.csv")) == 3


def test_linreg_vifa_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "vifa"
    argv = ["experiment", "linreg-vifa", "--out", str(out), "--n-samples", "200", "--trials", "2", "--epochs", "5",
            "--batch-size", "50", "--n-grad-samples", "2", "--seed", "1"]
    assert main(argv) == 0
    rows = _rows(out / "linreg_vifa.csv")
    assert [int(row["trial"]) for row in rows] == [0, 1]
    assert {int(row["n_steps"]) for row in rows} == {5 * 200 // 50}
    for row in rows:
        assert float(row["w2_squared"]) == pytest.approx(float(row["w2"]) ** 2, rel=1e-12)
    table = (out / "table_6_2.md").read_text()
    assert "0.2055 ± 0.0369" in table and "ours (2 trials)" in table
    assert (out / "figure_6_3.png").stat().st_size > 0
    assert main(argv) == 0
    assert len(_rows(out / "linreg_vifa.csv")) == 2


def test_linreg_vifa_rejects_a_batch_larger_than_the_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["experiment", "linreg-vifa", "--out", str(tmp_path), "--n-samples", "50", "--batch-size", "100"]
    assert main(argv) == 2
    assert "--batch-size" in capsys.readouterr().err


@pytest.mark.parametrize(("schedule", "expected"), [("constant", [1.0, 1.0, 1.0]), ("linear", [1.0, 0.75, 0.25]),
                                                    ("cosine", [1.0, 0.5 + 0.5 * np.cos(np.pi / 4), 0.5 - 0.5 * np.cos(np.pi / 4)])])
def test_schedule_factors(schedule: str, expected: list[float]) -> None:
    from onlinefa_experiments.linreg_vifa import schedule_factor

    np.testing.assert_allclose([schedule_factor(schedule, t, 4) for t in (0, 1, 3)], expected, rtol=1e-12)


def test_minibatch_stream_visits_every_row_once_per_epoch() -> None:
    from onlinefa_experiments.linreg_vifa import minibatch_stream

    stream = minibatch_stream(23, 5, np.random.default_rng(0))  # 4 batches per epoch, 3 rows dropped
    for _ in range(3):
        epoch = np.concatenate([next(stream) for _ in range(4)])
        assert len(epoch) == 20 and len(set(epoch.tolist())) == 20
