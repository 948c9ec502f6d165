"""End-to-end and unit tests of the ``fa-synthetic`` experiment (thesis §5, Figures 5.1 and 5.2)."""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from sklearn.decomposition import FactorAnalysis

import onlinefa
from onlinefa.cli import main
from onlinefa.datasets import make_fa_model, sample_fa
from onlinefa_experiments import available, fa_synthetic
from onlinefa.metrics import relative_covariance_distance, relative_mean_distance, wasserstein2

TINY = [
    "--dims", "12", "--spectra", "1:10", "1:100", "--n-components", "2",
    "--max-samples", "300", "--trials", "2", "--seed", "5",
]  # fmt: skip
# 2 spectra × 2 trials × checkpoints (100, 200, 300) × 6 methods × 4 metrics (W2 is on for D = 12).
ALL_METHODS = ("batch", "online-em", "online-sga", "em-whiten", "em-whiten-kappa", "em-kappa")
TINY_ROWS = 2 * 2 * 3 * len(ALL_METHODS) * 4


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def value_of(rows: list[dict[str, str]], **match: str) -> float:
    hits = [row for row in rows if all(row[key] == value for key, value in match.items())]
    assert len(hits) == 1, (match, len(hits))
    return float(hits[0]["value"])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fa_synthetic")
    assert main(["experiment", "fa-synthetic", *TINY, "--out", str(out)]) == 0
    return out


def test_experiment_is_registered() -> None:
    assert available()["fa-synthetic"] is fa_synthetic


def test_tiny_run_writes_every_cell_and_the_outputs(tiny_run: Path) -> None:
    rows = read_csv(tiny_run / fa_synthetic.CSV_NAME)
    assert len(rows) == TINY_ROWS
    cells = {(r["spectrum_high"], r["seed"], r["n_samples"], r["method"], r["metric"]) for r in rows}
    assert len(cells) == TINY_ROWS  # no duplicates
    assert {r["n_samples"] for r in rows} == {"100", "200", "300"}
    assert {r["seed"] for r in rows} == {"5", "6"}
    assert {r["method"] for r in rows} == set(ALL_METHODS)
    assert {r["metric"] for r in rows} == {"covariance_distance", "mean_distance", "wasserstein2", "seconds"}
    assert all(math.isfinite(float(r["value"])) and float(r["value"]) >= 0.0 for r in rows)
    for name in (fa_synthetic.FIGURE_COVARIANCE, fa_synthetic.FIGURE_W2):
        assert (tiny_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tiny_run / fa_synthetic.TABLE_NAME).read_text(encoding="utf-8")
    assert "| 12 | [1, 10] | 300 |" in table and "0.0454 ± 0.0077" not in table  # thesis has no D = 12 row
    summary = read_csv(tiny_run / fa_synthetic.SUMMARY_NAME)
    assert len(summary) == 2 * 3 * len(ALL_METHODS) * 4  # (spectrum, T, method, metric), over two trials


def test_recorded_values_match_an_independent_rerun(tiny_run: Path) -> None:
    # Seed 6, spectrum [1, 100]: regenerate model and stream as documented (one generator: model, then
    # rows), fit each method directly on the first 300 rows, and compare with the CSV.
    rows = read_csv(tiny_run / fa_synthetic.CSV_NAME)
    rng = np.random.default_rng(6)
    c, loadings, psi = make_fa_model(12, 2, (1.0, 100.0), seed=rng)
    stream = sample_fa(c, loadings, psi, 300, seed=rng)
    true_cov = loadings @ loadings.T + np.diag(psi)
    batch = FactorAnalysis(n_components=2, svd_method="randomized", random_state=6).fit(stream)
    em = onlinefa.OnlineEM.algorithm2(12, 2, n_warmup=100, seed=6)
    em.update(stream)
    sga = onlinefa.OnlineSGA.algorithm1(12, 2, lr=1e-3, n_warmup=100, seed=6)
    sga.update(stream)
    whitened = onlinefa.OnlineEM(12, 2, n_warmup=100, seed=6, whiten=True, schedule="power", kappa=0.9,
                                 scaling="unit", shrink=False)
    whitened.update(stream)
    estimates = {
        "batch": (batch.mean_, batch.get_covariance()),
        "online-em": (em.mean, em.loadings @ em.loadings.T + np.diag(em.noise_variance)),
        "online-sga": (sga.mean, sga.loadings @ sga.loadings.T + np.diag(sga.noise_variance)),
        "em-whiten-kappa": (whitened.mean, whitened.covariance()),
    }
    for method, (mean, cov) in estimates.items():
        where = {"seed": "6", "spectrum_high": "100.0", "n_samples": "300", "method": method}
        # The experiment fed the online models 100 + 100 + 100 rows; exact sequential semantics make that
        # equal to one update of 300 rows up to rounding.
        expected = {
            "covariance_distance": relative_covariance_distance(cov, true_cov),
            "mean_distance": relative_mean_distance(mean, c),
            "wasserstein2": wasserstein2(c, true_cov, mean, cov),
        }
        for metric, value in expected.items():
            assert value_of(rows, metric=metric, **where) == pytest.approx(value, rel=1e-9), (method, metric)


def test_second_run_resumes_without_adding_rows(tiny_run: Path) -> None:
    before = (tiny_run / fa_synthetic.CSV_NAME).read_bytes()
    assert main(["experiment", "fa-synthetic", *TINY, "--out", str(tiny_run)]) == 0
    assert (tiny_run / fa_synthetic.CSV_NAME).read_bytes() == before


def test_missing_cells_are_recomputed_identically(tiny_run: Path, tmp_path: Path) -> None:
    rows = read_csv(tiny_run / fa_synthetic.CSV_NAME)
    dropped = [r for r in rows if r["method"] == "online-em" and r["n_samples"] == "300" and r["seed"] == "5"]
    dropped += [r for r in rows if r["method"] == "batch" and r["n_samples"] == "200" and r["metric"] == "wasserstein2"]
    kept = [r for r in rows if r not in dropped]
    assert len(dropped) == 2 * 4 + 4
    csv_path = tmp_path / fa_synthetic.CSV_NAME
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fa_synthetic.FIELDNAMES)
        writer.writeheader()
        writer.writerows(kept)
    assert main(["experiment", "fa-synthetic", *TINY, "--out", str(tmp_path)]) == 0
    resumed = read_csv(csv_path)
    assert len(resumed) == TINY_ROWS
    for row in dropped:
        if row["metric"] == "seconds":
            continue  # timings are not reproducible
        key = {k: row[k] for k in ("seed", "spectrum_high", "n_samples", "method", "metric")}
        assert value_of(resumed, **key) == pytest.approx(float(row["value"]), rel=1e-12)


def test_truncated_last_line_is_recomputed(tiny_run: Path, tmp_path: Path) -> None:
    # A run killed while writing leaves a partial line; it must not crash the resume nor count as done.
    text = (tiny_run / fa_synthetic.CSV_NAME).read_text()
    lines = text.splitlines(keepends=True)
    truncated = lines[-1].rsplit(",", 1)[0]  # drop the value of the last row
    (tmp_path / fa_synthetic.CSV_NAME).write_text("".join(lines[:-1]) + truncated)  # no final newline
    assert main(["experiment", "fa-synthetic", *TINY, "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / fa_synthetic.CSV_NAME)
    assert len(rows) == TINY_ROWS + 1  # every cell once, plus the truncated line
    complete = [r for r in rows if r["value"] and None not in r]
    assert len(complete) == TINY_ROWS
    assert {r["metric"] for r in complete} == {"covariance_distance", "mean_distance", "wasserstein2", "seconds"}
    cells = {(r["spectrum_high"], r["seed"], r["n_samples"], r["method"], r["metric"]) for r in complete}
    assert len(cells) == TINY_ROWS
    assert lines[-1].split(",")[:-1] == list(rows[-1].values())[:-1]  # re-measured on a line of its own


def test_quick_options_resolve_to_the_reduced_grid() -> None:
    parser = argparse.ArgumentParser()
    fa_synthetic.add_arguments(parser)
    config = fa_synthetic.config_from_args(parser.parse_args(["--quick"]))
    assert [s.n_features for s in config.settings] == [100, 100, 100]
    assert [s.spectrum for s in config.settings] == [(1.0, 10.0), (1.0, 100.0), (1.0, 1000.0)]
    assert config.checkpoints == (100, 200, 500, 1000, 2000, 5000)
    assert config.seeds == (0, 1)
    assert config.methods == ALL_METHODS
    full = fa_synthetic.config_from_args(parser.parse_args([]))
    assert full.checkpoints == fa_synthetic.CHECKPOINTS and len(full.seeds) == 10 and len(full.settings) == 6
    overridden = fa_synthetic.config_from_args(parser.parse_args(["--quick", "--trials", "3", "--dims", "50"]))
    assert overridden.seeds == (0, 1, 2) and {s.n_features for s in overridden.settings} == {50}


def test_checkpoints_end_at_max_samples() -> None:
    assert fa_synthetic.checkpoints_up_to(300) == (100, 200, 300)
    assert fa_synthetic.checkpoints_up_to(500) == (100, 200, 500)
    assert fa_synthetic.checkpoints_up_to(50) == (50,)


def test_bad_options_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "fa-synthetic", "--dims", "3", "--n-components", "3", "--out", str(tmp_path)]) == 2
    assert "n-components" in capsys.readouterr().err
    for bad in (["--spectra", "0:10"], ["--spectra", "10"], ["--max-samples", "0"], ["--methods", "nope"]):
        with pytest.raises(SystemExit):
            main(["experiment", "fa-synthetic", *bad, "--out", str(tmp_path)])


def test_standard_error_matches_scipy() -> None:
    values = [0.1, 0.4, 0.25, 0.3]
    summary = fa_synthetic.summarise_values(values)
    assert summary.mean == pytest.approx(np.mean(values), rel=1e-15)
    assert summary.stderr == pytest.approx(scipy.stats.sem(values), rel=1e-12)
    assert math.isnan(fa_synthetic.summarise_values([0.5]).stderr)
    assert fa_synthetic.format_summary(summary) == f"0.2625 ± {scipy.stats.sem(values):.4f} (n=4)"
