"""``onlinefa fit``'s held-out figure is a number whenever one can be computed, and says why otherwise.

It once printed ``nan`` whenever the model was still warming up where the last batch of ``--batch-rows``
starts (e.g. any file with fewer rows than ``--batch-rows`` = 256): that batch was then never scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa.cli import main
from engine_state import engine_state

D, K = 6, 2


def save_samples(tmp_path: Path, n_rows: int) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((n_rows, K)) @ rng.standard_normal((K, D)) + 0.5 * rng.standard_normal((n_rows, D))
    path = tmp_path / "samples.npy"
    np.save(path, data)
    return path, data


def state_bytes(model: Any) -> dict[str, Any]:
    return {key: (value.tobytes() if isinstance(value, np.ndarray) else value)
            for key, value in engine_state(model).items()}


@pytest.mark.parametrize(("n_rows", "options", "reference"), [
    (50, [], lambda: onlinefa.OnlineEM(D, K, seed=0)),                       # warm-up 4: rows 6..50 held out
    (50, ["--method", "sga"], lambda: onlinefa.OnlineSGA(D, K, seed=0)),
    (150, ["--config", "thesis"], lambda: onlinefa.OnlineEM.algorithm2(D, K, seed=0)),  # warm-up 100
    (300, ["--batch-rows", "280", "--warmup", "285"],                        # last batch (20 rows) starts in warm-up
     lambda: onlinefa.OnlineEM(D, K, n_warmup=285, seed=0)),
])
def test_a_short_stream_is_scored_after_its_warm_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n_rows: int, options: list[str], reference: Any,
) -> None:
    samples, data = save_samples(tmp_path, n_rows)
    out = tmp_path / "model.ckpt"
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out), *options]) == 0
    summary = capsys.readouterr().out
    assert "nan" not in summary
    first_fit = reference().n_warmup + 1  # the rows the first fitted model needs
    n_held = n_rows - first_fit
    expected = float(np.mean(reference().update(data[:first_fit]).log_prob(data[first_fit:])))
    assert f"last {n_held} rows (every row after the first {first_fit}" in summary
    assert f": {expected:.4g} -> " in summary
    # Scoring splits the stream before the held-out rows; the model is the one fitted to all rows at once.
    assert state_bytes(onlinefa.load(out)) == state_bytes(reference().update(data))


def test_a_full_last_batch_is_scored_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples, data = save_samples(tmp_path, 120)
    assert main(["fit", str(samples), "-k", str(K), "-o", str(tmp_path / "m"), "--batch-rows", "50"]) == 0
    summary = capsys.readouterr().out
    expected = float(np.mean(onlinefa.OnlineEM(D, K, seed=0).update(data[:100]).log_prob(data[100:])))
    assert f"held-out average log-likelihood of the last 20 rows: {expected:.4g} -> " in summary


def test_no_row_left_to_score_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples, data = save_samples(tmp_path, 50)
    out = tmp_path / "model.ckpt"
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out), "--warmup", "49"]) == 0
    summary = capsys.readouterr().out
    assert "nan" not in summary
    assert "no held-out log-likelihood: all 50 rows were needed to reach the first fitted model" in summary
    assert state_bytes(onlinefa.load(out)) == state_bytes(onlinefa.OnlineEM(D, K, n_warmup=49, seed=0).update(data))
