"""End-to-end run of ``onlinefa experiment vbfa-transform`` on a tiny grid, and its data generator."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa.cli import main
from onlinefa_experiments.vbfa_transform import covariance_eigenvalues, first_within, paper_dataset

TINY = ["--datasets", "2", "--components", "3", "--trials", "1", "--max-iter", "60", "--n-samples", "60",
        "--n-features", "12", "--init-noise-ratios", "0.01", "1.0", "--seed", "4"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_end_to_end_resume_and_independent_recomputation(tmp_path: Path) -> None:
    out = tmp_path / "vbfa"
    argv = ["experiment", "vbfa-transform", "--out", str(out), *TINY]
    assert main(argv) == 0
    rows = _rows(out / "vbfa_transform.csv")
    assert len(rows) == 2 * 3  # noise ratios × variants
    assert {r["variant"] for r in rows} == {"none", "start5", "start1"}
    assert (out / "vbfa_transform.png").stat().st_size > 0
    table = (out / "vbfa_transform.md").read_text()
    assert "Convergence speed" in table and "pruning" in table

    # One cell recomputed directly with the public estimator: same data, same seed, same settings.
    data = paper_dataset(2, 4, n_samples=60, n_features=12)
    fits = {name: onlinefa.VBFA(3, transformations=start is not None, transformations_start=start or 1, max_iter=60,
                                tol=1e-9, init_noise_ratio=1.0, random_state=4).fit(data.observed)
            for name, start in (("none", None), ("start5", 5), ("start1", 1))}
    best = max(float(m.elbo_[-1]) for m in fits.values())
    summary = _rows(out / "vbfa_transform_summary.csv")
    for name, model in fits.items():
        (row,) = [r for r in summary if r["variant"] == name and r["init_noise_ratio"] == "1.0"]
        assert float(row["final_elbo"]) == pytest.approx(float(model.elbo_[-1]), rel=1e-12)
        assert int(row["n_sweeps"]) == model.n_iter_
        hit = first_within(model.elbo_, best, 1e-3)
        assert (math.isnan(float(row["sweeps_0.001"])) if hit is None else int(float(row["sweeps_0.001"])) == hit)

    # Resume: a second run computes nothing new.
    assert main(argv) == 0
    assert len(_rows(out / "vbfa_transform.csv")) == 6


def test_inconsistent_options_exit_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["experiment", "vbfa-transform", "--out", str(tmp_path), "--datasets", "1", "--n-features", "6"]
    assert main(argv) == 2
    assert "--n-features >= 10" in capsys.readouterr().err


def test_paper_datasets_have_the_stated_spectra_and_missing_fraction() -> None:
    """Sample covariance of a large draw vs the §4.1 eigenvalues; held-out fraction vs 20 %.

    With N = 40000 the sample eigenvalues of a 50-dimensional Gaussian deviate from the true ones by at
    most ~(1 + √(D/N))² − 1 ≈ 7 % (Marchenko–Pastur edge, D/N = 1/800), so 10 % is a safe bound. The
    held-out count is Binomial(N·D, 0.2): 5 standard deviations is 0.0009 in fraction.
    """
    n = 40000
    for dataset in (1, 2, 3):
        data = paper_dataset(dataset, seed=dataset, n_samples=n)
        sample = np.sort(np.linalg.eigvalsh(np.cov(data.complete, rowvar=False)))
        np.testing.assert_allclose(sample, np.sort(covariance_eigenvalues(dataset)), rtol=0.1)
        assert abs(data.held_out.mean() - 0.2) < 5 * math.sqrt(0.2 * 0.8 / (n * 50))
        np.testing.assert_array_equal(np.isnan(data.observed), data.held_out)
    # The 50 means are N(0, 1) draws: their sample s.d. lies within 1 ± 0.4 (4 s.d. of a sample s.d. of 50).
    assert 0.6 < paper_dataset(1, seed=0, n_samples=n).complete.mean(axis=0).std() < 1.4
