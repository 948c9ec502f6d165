"""``onlinefa fit``: its output is a model ``onlinefa.load`` reads back, equal to fitting in Python, and
every misuse is refused before any row is read."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import _cli_fit
from onlinefa._progress import Progress
from onlinefa.cli import main
from engine_state import engine_state

D, K, T = 8, 2, 300


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((T, K)) @ rng.standard_normal((K, D)) + 0.5 * rng.standard_normal((T, D))
    path = tmp_path / "samples.npy"
    np.save(path, data)
    return path


def state_bytes(model: Any) -> dict[str, Any]:
    return {key: (value.tobytes() if isinstance(value, np.ndarray) else value)
            for key, value in engine_state(model).items()}


@pytest.mark.parametrize(("options", "reference"), [
    ([], lambda data: onlinefa.OnlineEM(D, K, seed=0)),
    (["--method", "sga", "--lr", "0.01"], lambda data: onlinefa.OnlineSGA(D, K, lr=0.01, seed=0)),
    (["--config", "thesis"], lambda data: onlinefa.OnlineEM.algorithm2(D, K, seed=0)),
    (["--method", "sga", "--config", "thesis"], lambda data: onlinefa.OnlineSGA.algorithm1(D, K, seed=0)),
    (["--schedule", "constant", "--rho", "0.05", "--no-whiten", "--warmup", "7", "--seed", "3"],
     lambda data: onlinefa.OnlineEM(D, K, schedule="constant", rho=0.05, whiten=False, n_warmup=7, seed=3)),
])
def test_output_loads_back_as_the_model_fitted_in_python(
    samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], reference: Any,
) -> None:
    out = tmp_path / "model.ckpt"  # no .npz appended
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out), "--batch-rows", "64", *options]) == 0
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt", "samples.npy"]  # no temporary left over
    data = np.load(samples)
    expected = reference(data).update(data)
    loaded = onlinefa.load(out)
    assert type(loaded) is type(expected)
    assert state_bytes(loaded) == state_bytes(expected)
    summary = capsys.readouterr().out
    assert f"on {T} samples" in summary and "samples/s" in summary
    # The quality figure: mean log-likelihood of the last 44 rows under the model fitted to the first 256.
    before_last = reference(data).update(data[:256])
    held_out = float(np.mean(before_last.log_prob(data[256:])))
    assert f"last 44 rows: {held_out:.4g}" in summary


def test_load_reads_every_model_kind(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((60, 5))
    models = [onlinefa.OnlineEM(5, 2, seed=0).update(x), onlinefa.OnlineSGA(5, 2, seed=0).update(x),
              onlinefa.OnlineFactorAnalysis(2, random_state=0).fit(x),
              onlinefa.VIFA(5, 2, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3, seed=0)]
    for i, model in enumerate(models):
        path = tmp_path / f"m{i}"
        model.save(path)
        loaded = onlinefa.load(path)
        assert type(loaded) is type(model)
    np.testing.assert_array_equal(onlinefa.load(tmp_path / "m2").score_samples(x), models[2].score_samples(x))
    (tmp_path / "junk").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a valid onlinefa checkpoint"):
        onlinefa.load(tmp_path / "junk")


def negative_shape(tmp_path: Path) -> Path:
    path = tmp_path / "negative.npy"
    np.save(path, np.zeros((3, 4)))
    path.write_bytes(path.read_bytes().replace(b"(3, 4)", b"(-3, 4)"))
    return path


@pytest.mark.parametrize(("case", "needle"), [
    ("missing_dir", "does not exist"),
    ("output_is_dir", "not a regular file"),
    ("output_is_device", "not a regular file"),
    ("output_is_input", "is the input file"),
    ("zero_rows", "holds no rows"),
    ("negative_shape", "negative dimensions"),
    ("warm_up_only", "not more than the warm-up"),
    ("thesis_with_schedule", "--config default only"),
])
def test_misuse_is_refused_before_any_row_is_read(
    samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    case: str, needle: str,
) -> None:
    source, out, extra = samples, tmp_path / "model.ckpt", []
    if case == "missing_dir":
        out = tmp_path / "nowhere" / "model.ckpt"
    elif case == "output_is_dir":
        out = tmp_path
    elif case == "output_is_device":
        out = Path("/dev/null")
    elif case == "output_is_input":
        out = samples
    elif case == "zero_rows":
        source = tmp_path / "empty.npy"
        np.save(source, np.zeros((0, D)))
    elif case == "negative_shape":
        source = negative_shape(tmp_path)
    elif case == "warm_up_only":
        extra = ["--warmup", str(T)]
    elif case == "thesis_with_schedule":
        extra = ["--config", "thesis", "--schedule", "power"]

    def no_streaming(*args: Any) -> None:
        raise AssertionError("rows were read")

    monkeypatch.setattr(_cli_fit, "_stream", no_streaming)
    before = samples.read_bytes()
    assert main(["fit", str(source), "-k", str(K), "-o", str(out), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert samples.read_bytes() == before and not (tmp_path / "model.ckpt").exists()


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_batch_rows_must_be_a_positive_integer(samples: Path, tmp_path: Path, value: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", str(samples), "-k", str(K), "-o", str(tmp_path / "m"), "--batch-rows", value])
    assert exit_info.value.code == 2


def test_failed_fit_keeps_the_previous_output(samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.ckpt"
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out)]) == 0
    previous = out.read_bytes()
    bad = np.load(samples)
    bad[200, 3] = np.nan
    bad_path = tmp_path / "bad.npy"
    np.save(bad_path, bad)
    assert main(["fit", str(bad_path), "-k", str(K), "-o", str(out)]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert out.read_bytes() == previous


def test_progress_off_a_terminal_is_plain_lines_with_rate_and_eta() -> None:
    stream = io.StringIO()
    with Progress(100, "fit em", stream=stream) as bar:
        for _ in range(4):
            bar.advance(25)
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert text.count("\n") == 1 and text.startswith("fit em: 100/100 (100%),") and "/s, ETA 0:00:00" in text


def test_info_prints_class_configuration_and_state(samples: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.ckpt"
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out), "--schedule", "constant", "--rho", "0.05"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    model = onlinefa.load(out)
    assert text.startswith(f"{out}: OnlineEM\n")
    assert "schedule                 = 'constant'" in text and f"n_seen                   = {T}" in text
    assert f"mean                     array ({D},) float64, min {model.mean.min():.6g}, max {model.mean.max():.6g}" in text
    (tmp_path / "junk").write_bytes(b"junk")
    assert main(["info", str(tmp_path / "junk")]) == 2
    assert "not a valid onlinefa checkpoint" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "absent")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_info_into_a_closed_pipe_stops_quietly(samples: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "model.ckpt"
    assert main(["fit", str(samples), "-k", str(K), "-o", str(out)]) == 0
    # stdout is a pipe whose reader is gone (as after `| head`); line buffering makes the first print fail.
    code = (
        "import os, sys\n"
        "read_end, write_end = os.pipe()\n"
        "os.close(read_end)\n"
        "os.dup2(write_end, 1)\n"
        "sys.stdout.reconfigure(line_buffering=True)\n"
        "from onlinefa.cli import main\n"
        f"raise SystemExit(main(['info', {str(out)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 141 and result.stderr == "", result.stderr
