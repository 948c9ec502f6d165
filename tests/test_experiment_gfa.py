"""End-to-end run of ``onlinefa experiment gfa --quick`` and one table cell recomputed independently."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import onlinefa
from onlinefa.cli import main
from onlinefa.experiments.gfa import PATTERN, SIZES, TAUS, pattern_recovered, synthetic


def test_quick_run_writes_tables_and_heat_map(tmp_path: Path) -> None:
    assert main(["experiment", "gfa", "--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "gfa.md").read_text()
    assert "| 0 | on | 4 | True |" in table
    assert "ridge (RidgeCV)" in table and "CCA (10 components)" in table
    assert (tmp_path / "gfa_activity.png").stat().st_size > 10_000
    # Seed 1's rotated row, recomputed with the public estimator.
    fit = onlinefa.GFA(8, list(SIZES), max_iter=300, tol=1e-9, random_state=1).fit(synthetic(1))
    tau = ", ".join(f"{t:.3f}" for t in fit.noise_precision_)
    assert f"| 1 | on | {fit.n_components_} | {pattern_recovered(fit.activity_)} | {tau} |" in table


def test_generator_has_the_documented_structure() -> None:
    x = synthetic(0, n=20000)
    blocks = np.split(x, np.cumsum(SIZES)[:-1], axis=1)
    # Cross-covariance between groups 2 and 3 comes only from the factors active in both (1 and 3);
    # within-group residual variance is 1/τ_m — checked through the smallest eigenvalue of each block.
    for m, block in enumerate(blocks):
        smallest = np.linalg.eigvalsh(np.cov(block.T))[0]
        assert abs(smallest - 1 / TAUS[m]) < 0.1 / TAUS[m]
    assert PATTERN.shape == (3, 4)
