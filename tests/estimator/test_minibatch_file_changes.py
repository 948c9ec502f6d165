"""``fit_minibatch(path)`` refuses a data file that changes during the fit, and a FIFO, with a clear error.

The fit reads the file in several passes; a file replaced (or rewritten) between passes used to be mixed
silently into the fit, and a FIFO blocked forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from onlinefa.minibatch import NpyRows, fit_minibatch

N, D = 600, 6


def _data(seed: int, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((D, 2))
    return scale * (rng.standard_normal((N, 2)) @ f.T + 0.3 * rng.standard_normal((N, D)))


def _fit(path: Path, on_rows: object) -> None:
    fit_minibatch(path, 2, batch_size=100, max_iter=4, tol=0, random_state=0, on_rows=on_rows)  # type: ignore[arg-type]


def _after_first_pass(action: object) -> object:
    """An ``on_rows`` callback that runs ``action`` once, right after the first pass's last batch."""
    seen = [0]

    def on_rows(rows: int) -> None:
        seen[0] += rows
        if seen[0] == N:
            action()  # type: ignore[operator]

    return on_rows


def test_file_replaced_between_passes_raises_naming_the_file(tmp_path: Path) -> None:
    path, other = tmp_path / "data.npy", tmp_path / "other.npy"
    np.save(path, _data(0))
    np.save(other, _data(1, scale=50.0))
    with pytest.raises(ValueError, match=r"data\.npy.*changed while it was being read.*inode"):
        _fit(path, _after_first_pass(lambda: os.replace(other, path)))


def test_file_rewritten_in_place_between_passes_raises(tmp_path: Path) -> None:
    path = tmp_path / "data.npy"
    np.save(path, _data(0))

    def rewrite() -> None:
        before = os.stat(path).st_mtime_ns
        with open(path, "r+b") as handle:  # same inode, same size, other values
            handle.seek(-D * 8, os.SEEK_END)
            handle.write(np.full(D, 7.0).tobytes())
        if os.stat(path).st_mtime_ns == before:  # a coarse clock: make the write's time visible
            os.utime(path, ns=(before + 10**9, before + 10**9))

    with pytest.raises(ValueError, match=r"data\.npy.*changed while it was being read.*modification time"):
        _fit(path, _after_first_pass(rewrite))


def test_file_appended_to_between_passes_raises(tmp_path: Path) -> None:
    path = tmp_path / "data.npy"
    np.save(path, _data(0))
    def append() -> None:
        with path.open("ab") as handle:
            handle.write(b"\0" * 64)

    with pytest.raises(ValueError, match=r"data\.npy.*changed.*size"):
        _fit(path, _after_first_pass(append))


def test_file_removed_during_the_last_pass_raises(tmp_path: Path) -> None:
    path = tmp_path / "data.npy"
    np.save(path, _data(0))
    seen = [0]

    def on_rows(rows: int) -> None:  # after the last batch of the fourth (last) pass
        seen[0] += rows
        if seen[0] == 4 * N:
            path.unlink()

    with pytest.raises(ValueError, match=r"data\.npy.*removed or renamed"):
        fit_minibatch(path, 2, batch_size=100, max_iter=4, tol=0, random_state=0, on_rows=on_rows)


def test_unchanged_file_fits_as_the_same_data_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "data.npy"
    x = _data(0)
    np.save(path, x)
    model, _ = fit_minibatch(path, 2, batch_size=100, max_iter=3, tol=0, random_state=0)
    mapped, _ = fit_minibatch(np.load(path, mmap_mode="r"), 2, batch_size=100, max_iter=3, tol=0, random_state=0)
    np.testing.assert_array_equal(model.loadings, mapped.loadings)


def test_truncated_file_refused_at_opening(tmp_path: Path) -> None:
    path = tmp_path / "data.npy"
    np.save(path, _data(0))
    os.truncate(path, os.stat(path).st_size - 8)
    with pytest.raises(ValueError, match=r"data\.npy: file is shorter than its header says"):
        NpyRows(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        from onlinefa import fit_minibatch
        try:
            fit_minibatch({str(fifo)!r}, 2)
        except ValueError as err:
            print("refused:", err)
    """)
    try:  # a child process, so that a blocking open fails the test instead of hanging the suite
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("fit_minibatch blocked on a FIFO")
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "pipe.npy" in done.stdout and "not a regular file" in done.stdout


def test_cli_minibatch_fit_of_a_replaced_file_fails_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import onlinefa.minibatch as minibatch
    from onlinefa.cli import main

    path, other, output = tmp_path / "data.npy", tmp_path / "other.npy", tmp_path / "model.npz"
    np.save(path, _data(0))
    np.save(other, _data(1, scale=50.0))
    one_pass = minibatch._one_pass
    passes = [0]

    def pass_then_replace(*args: object) -> None:  # the file is replaced right after the first pass
        one_pass(*args)  # type: ignore[arg-type]
        passes[0] += 1
        if passes[0] == 1:
            os.replace(other, path)

    monkeypatch.setattr(minibatch, "_one_pass", pass_then_replace)
    code = main(["fit", str(path), "-k", "2", "--minibatch", "100", "--passes", "4", "--seed", "0",
                 "-o", str(output)])
    err = capsys.readouterr().err
    assert code == 2
    assert "data.npy" in err and "changed while it was being read" in err and "nothing was written" in err
    assert passes[0] == 1 and not output.exists()
