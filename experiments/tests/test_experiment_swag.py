"""The ``swag`` experiment: its metrics against independent references, and a ``--short`` end-to-end run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sklearn.datasets import load_digits
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split

from onlinefa_experiments._calibration import (
    accuracy, classification_nll, expected_calibration_error, reliability_bins,
)  # fmt: skip
from onlinefa_experiments._swag_data import load_task
from onlinefa_experiments._swag_eval import mixture_variances, regression_metrics


def _random_probabilities(n: int, n_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((n, n_classes))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = rng.integers(0, n_classes, size=n)
    return probabilities, labels


def test_ece_matches_a_loop_over_bins() -> None:
    probabilities, labels = _random_probabilities(500, 4, seed=0)
    confidence, predicted = probabilities.max(axis=1), probabilities.argmax(axis=1)
    expected = 0.0
    for b in range(15):
        inside = (confidence > b / 15) & (confidence <= (b + 1) / 15)
        if inside.any():
            gap = abs(np.mean(predicted[inside] == labels[inside]) - np.mean(confidence[inside]))
            expected += inside.sum() / labels.size * gap
    assert expected_calibration_error(probabilities, labels) == pytest.approx(expected, rel=1e-12)
    assert reliability_bins(probabilities, labels).counts.sum() == 500


def test_nll_and_accuracy_match_scikit_learn() -> None:
    probabilities, labels = _random_probabilities(300, 5, seed=1)
    assert classification_nll(probabilities, labels) == pytest.approx(
        log_loss(labels, probabilities, labels=range(5)), rel=1e-10)
    assert accuracy(probabilities, labels) == pytest.approx(np.mean(probabilities.argmax(axis=1) == labels))


def test_regression_nll_is_the_gaussian_mixture_density() -> None:
    task = load_task("yacht")
    rng = np.random.default_rng(2)
    predictions = task.y_test[None, :] + 0.3 * rng.standard_normal((4, task.y_test.size))
    metrics = regression_metrics(predictions, task, noise_variance=0.2)
    # In raw units: y = scale·y_std + centre and the components are N(scale·f + centre, scale²·σ²).
    density = np.mean([stats.norm.pdf(task.target_scale * task.y_test, task.target_scale * f,
                                      task.target_scale * np.sqrt(0.2)) for f in predictions], axis=0)
    assert metrics["nll"] == pytest.approx(-np.mean(np.log(density)), rel=1e-10)
    rmse = task.target_scale * np.sqrt(np.mean((predictions.mean(axis=0) - task.y_test) ** 2))
    assert metrics["rmse"] == pytest.approx(rmse, rel=1e-12)


def test_mixture_variance_is_the_pooled_variance() -> None:
    rng = np.random.default_rng(3)
    groups = [rng.normal(loc, 1.0 + loc, size=(50, 3)) for loc in (0.0, 2.0, 5.0)]
    pooled = np.concatenate(groups).var(axis=0)
    mixed = mixture_variances([g.mean(axis=0) for g in groups], [g.var(axis=0) for g in groups])
    np.testing.assert_allclose(mixed, pooled, rtol=1e-12)


def test_paired_differences_pair_by_seed_and_multiswag_with_every_seed() -> None:
    from onlinefa_experiments._swag_report import paired_differences

    rows = [{"seed": "0", "method": "swag_diag", "nll": "1.0"}, {"seed": "1", "method": "swag_diag", "nll": "3.0"},
            {"seed": "1", "method": "swag", "nll": "2.5"}, {"seed": "0", "method": "swag", "nll": "1.25"},
            {"seed": "all", "method": "multiswag", "nll": "0.5"}]
    assert paired_differences(rows, "swag", "nll") == [0.25, -0.5]
    assert paired_differences(rows, "multiswag", "nll") == [-0.5, -2.5]


def _digits_test_split() -> tuple[np.ndarray, np.ndarray]:
    """The experiment's digits test split, rebuilt from scikit-learn directly."""
    bunch = load_digits()
    X_train, X_test, _, y_test = train_test_split(bunch.data, bunch.target, test_size=0.2, random_state=0,
                                                  stratify=bunch.target)
    scale = X_train.std(axis=0)
    scale[scale == 0.0] = 1.0
    return (X_test - X_train.mean(axis=0)) / scale, y_test


def _forward(theta: np.ndarray, X: np.ndarray, widths: list[int]) -> np.ndarray:
    """A ReLU MLP in NumPy, θ laid out as PyTorch's Linear layers (weight (out, in) row-major, then bias)."""
    offset, hidden = 0, X
    for layer, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        weight = theta[offset : offset + n_in * n_out].reshape(n_out, n_in)
        bias = theta[offset + n_in * n_out : offset + n_in * n_out + n_out]
        offset += n_in * n_out + n_out
        hidden = hidden @ weight.T + bias
        if layer < len(widths) - 2:
            hidden = np.maximum(hidden, 0.0)
    assert offset == theta.size
    return hidden


def test_short_run_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from onlinefa.cli import main

    assert main(["experiment", "swag", "--short", "--out", str(tmp_path)]) == 0
    with (tmp_path / "swag.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    methods = ["sgd", "swa", "swag_diag", "swag", "online_em", "online_sga", "vifa"]
    assert [r["method"] for r in rows] == [*methods, *methods, "multiswag"]
    assert [r["seed"] for r in rows] == ["0"] * 7 + ["1"] * 7 + ["all"]
    assert {r["dataset"] for r in rows} == {"digits"}

    table = (tmp_path / "swag.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert lines[0].startswith("| method | NLL | accuracy | ECE | var ratio (mean)")
    labels = [line.split(" | ")[0][2:] for line in lines[1:]]
    assert labels == ["SGD (final iterate)", "SWA", "SWAG-diagonal", "SWAG (rank K)", "OnlineEM (defaults)",
                      "OnlineSGA (defaults)", "VIFA (from SWAG)", "MultiSWAG"]
    assert (tmp_path / "reliability.png").stat().st_size > 0

    # SWAG-diagonal is drawn with scale 1/2 from N(θ̄, Σ_diag): half the iterates' variance, exactly.
    for row in rows:
        if row["method"] == "swag_diag":
            assert float(row["var_ratio"]) == pytest.approx(0.5, rel=1e-12)
            assert float(row["var_ratio_median"]) == pytest.approx(0.5, rel=1e-12)

    # SWA's NLL and accuracy recomputed from the saved θ_SWA with a NumPy forward pass.
    X_test, y_test = _digits_test_split()
    for seed in (0, 1):
        theta = np.load(tmp_path / f"swa_digits_seed{seed}.npy")
        logits = _forward(theta, X_test, [64, 50, 50, 10])
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        (row,) = [r for r in rows if r["method"] == "swa" and r["seed"] == str(seed)]
        assert float(row["nll"]) == pytest.approx(log_loss(y_test, probabilities, labels=range(10)), rel=1e-4)
        assert float(row["accuracy"]) == pytest.approx(np.mean(logits.argmax(axis=1) == y_test), abs=1.5 / 360)
