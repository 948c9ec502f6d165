"""'onlinefa fit' on unusable files: a clear error (exit status 2, one line), never a signal or a traceback.

Run as a subprocess so that a SIGBUS (a memory-mapped read past the end of a truncated file) fails the test
instead of killing the test run. Cases: a ``.npy`` truncated inside its data, inside its header, or to
nothing, with and without ``--minibatch``; a file truncated while the fit reads it (it used to die of SIGBUS
through the memory map); an output path that is a symlink loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

T, D, K = 400, 6, 2


def run_fit(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from onlinefa.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "fit", *args], capture_output=True, text=True, timeout=120)


def samples(tmp_path: Path) -> Path:
    path = tmp_path / "samples.npy"
    np.save(path, np.random.default_rng(0).standard_normal((T, D)))
    return path


@pytest.mark.parametrize("minibatch", [False, True])
@pytest.mark.parametrize("keep", ["half the data", "one row short", "half the header", "nothing"])
def test_a_truncated_npy_is_a_clear_error(tmp_path: Path, keep: str, minibatch: bool) -> None:
    path = samples(tmp_path)
    size = path.stat().st_size
    header = size - T * D * 8
    length = {"half the data": header + T * D * 4, "one row short": size - D * 8, "half the header": header // 2,
              "nothing": 0}[keep]
    os.truncate(path, length)
    out = tmp_path / "model.ckpt"
    result = run_fit(str(path), "-k", str(K), "-o", str(out), *(["--minibatch", "32"] if minibatch else []))
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "samples.npy" in result.stderr, result.stderr
    assert not out.exists()


def test_an_output_symlink_loop_is_a_clear_error(tmp_path: Path) -> None:
    path = samples(tmp_path)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    result = run_fit(str(path), "-k", str(K), "-o", str(tmp_path / "a"))
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "cannot write" in result.stderr, result.stderr


TRUNCATE_DURING_FIT = """
import os, sys
from onlinefa import _cli_fit
from onlinefa.cli import main
path = sys.argv[1]
build = _cli_fit.build_model

def build_truncating(args, n_features):
    model = build(args, n_features)
    update = model.update

    def first_update_truncates(batch):
        out = update(batch)
        os.truncate(path, os.path.getsize(path) // 2)  # another process cuts the file while the fit runs
        model.update = update
        return out

    model.update = first_update_truncates
    return model

_cli_fit.build_model = build_truncating
sys.exit(main(sys.argv[2:]))
"""


def test_a_file_truncated_during_the_fit_is_a_clear_error(tmp_path: Path) -> None:
    path = samples(tmp_path)
    out = tmp_path / "model.ckpt"
    result = subprocess.run(
        [sys.executable, "-c", TRUNCATE_DURING_FIT, str(path), "fit", str(path), "-k", str(K), "-o", str(out),
         "--batch-rows", "50"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)  # was -7: SIGBUS through the memory map
    assert "truncated while it was read" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not out.exists()


@pytest.mark.parametrize("shape", ["(-3, 6)", "(400, -6)", "(-1,)", "(2**70, 6)"])
def test_a_npy_header_with_an_impossible_shape_is_a_clear_error(tmp_path: Path, shape: str) -> None:
    path = samples(tmp_path)
    data = bytearray(path.read_bytes())
    old = repr((T, D)).encode()
    start = data.index(old)
    new = shape.replace("2**70", str(2**70)).encode()
    # keep the header's length (the padding spaces before its newline absorb the difference)
    end = data.index(b"\n", start)
    header = data[start:end].replace(old, new, 1)
    data[start:end] = header[: end - start].ljust(end - start)
    path.write_bytes(bytes(data))
    out = tmp_path / "model.ckpt"
    result = run_fit(str(path), "-k", str(K), "-o", str(out))
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "samples.npy" in result.stderr, result.stderr
    assert not out.exists()
