"""End-to-end run of ``onlinefa experiment gfa --quick`` and one table cell recomputed independently."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa.cli import main
from onlinefa_experiments.gfa import PATTERN, SIZES, TAUS, pattern_recovered, synthetic


@pytest.mark.slow
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
    if importlib.util.find_spec("torch") is not None:  # part (c); its absence is tested below
        assert "## (c) groups = parameter tensors" in table and "### detrended iterates" in table
        assert "0.weight (208), 0.bias (16), 2.weight (256), 2.bias (16), 4.weight (16), 4.bias (1)" in table
        assert (tmp_path / "gfa_layers.png").stat().st_size > 10_000


def test_generator_has_the_documented_structure() -> None:
    x = synthetic(0, n=20000)
    blocks = np.split(x, np.cumsum(SIZES)[:-1], axis=1)
    # Cross-covariance between groups 2 and 3 comes only from the factors active in both (1 and 3);
    # within-group residual variance is 1/τ_m — checked through the smallest eigenvalue of each block.
    for m, block in enumerate(blocks):
        smallest = np.linalg.eigvalsh(np.cov(block.T))[0]
        assert abs(smallest - 1 / TAUS[m]) < 0.1 / TAUS[m]
    assert PATTERN.shape == (3, 4)


def test_layers_part_is_skipped_cleanly_without_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["experiment", "gfa", "--quick", "--out", str(tmp_path)]) == 0
    assert "part (c), groups = network layers, skipped: PyTorch is not installed" in capsys.readouterr().out
    assert "## (c)" not in (tmp_path / "gfa.md").read_text()
    assert not (tmp_path / "gfa_layers.png").exists()


def test_detrending_and_factor_classification() -> None:
    from onlinefa_experiments._gfa_layers import detrended, factor_rows

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4)) + np.outer(np.arange(50), [1.0, -2.0, 0.0, 3.0])
    t = np.arange(50)
    reference = np.stack([x[:, j] - np.polyval(np.polyfit(t, x[:, j], 1), t) for j in range(4)], axis=1)
    np.testing.assert_allclose(detrended(x), reference, atol=1e-10)
    activity = np.array([[0.5, 0.0, 0.01], [0.3, 0.4, 0.0]])
    rows = factor_rows(activity, ["a", "b"])
    assert [(r["kind"], r["tensors"]) for r in rows] == [("shared", ["a", "b"]), ("private", ["b"]), ("inactive", [])]
