"""`onlinefa demo`, the README's main job: its table against an independent recomputation."""

from __future__ import annotations

import numpy as np
import pytest

import onlinefa
from onlinefa.cli import main
from onlinefa.datasets import make_fa_model, sample_fa
from onlinefa.metrics import relative_covariance_distance


def test_demo_prints_the_errors_of_each_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--only", "synthetic", "--features", "60", "--components", "3", "--seed", "4"]) == 0
    rows = {line[:22].strip(): line[22:].split() for line in capsys.readouterr().out.splitlines()}
    # Recompute the default EM row from the public API: same model, stream and seeds as the demo.
    c, loadings, psi = make_fa_model(60, 3, spectrum=(1.0, 100.0), seed=4)
    samples = sample_fa(c, loadings, psi, 20_000, seed=5)
    model = onlinefa.OnlineEM(60, 3, seed=4)
    expected = []
    done = 0
    for t in (1_000, 5_000, 20_000):
        model.update(samples[done:t])
        done = t
        expected.append(relative_covariance_distance(model.covariance(), loadings @ loadings.T + np.diag(psi)))
    printed = [float(v) for v in rows["online EM"][:3]]
    np.testing.assert_allclose(printed, expected, atol=5e-5)  # printed with 4 decimals
    for name in ("online EM", "online SGA", "Algorithm 2", "Algorithm 1"):
        errors = [float(v) for v in rows[name][:3]]
        assert errors[2] < errors[0], name  # more samples, better fit
