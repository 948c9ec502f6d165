"""Checkpoint hygiene: leftovers of killed saves are removed, values no run can produce are refused with the
file named, and paths that are not regular files fail at once instead of hanging or reading forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa.checkpoint import STALE_TEMPORARY_SECONDS, save_state
from engine_state import engine_state

ROWS = np.random.default_rng(0).standard_normal((40, 6))
fcntl = pytest.importorskip("fcntl")


def _age(path: Path) -> None:
    """Pretend ``path`` was last written long ago."""
    old = time.time() - 10 * STALE_TEMPORARY_SECONDS
    os.utime(path, (old, old))


def _temporaries(directory: Path, name: str) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))


KILLED_SAVER = textwrap.dedent(
    """
    import sys, time, numpy as np, onlinefa, onlinefa.checkpoint as ckpt
    original = ckpt._write_archive
    def write_then_hang(handle, members):
        original(handle, members)      # the whole archive is in the temporary file ...
        handle.flush()
        print("written", flush=True)
        time.sleep(600)                # ... and the saver is killed before the rename
    ckpt._write_archive = write_then_hang
    em = onlinefa.OnlineEM(6, 2, seed=1).update(np.ones((3, 6)) * np.arange(3)[:, None])
    em.save(sys.argv[1])
    """
)


def test_temporary_file_of_a_killed_save_is_removed_by_the_next_save(tmp_path: Path) -> None:
    target = tmp_path / "fa.ckpt"
    model = onlinefa.OnlineEM(6, 2, seed=0).update(ROWS)
    model.save(target)
    saver = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert saver.stdout is not None and saver.stdout.readline().strip() == "written"
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.communicate()
    (leftover,) = _temporaries(tmp_path, target.name)
    assert leftover.stat().st_size > 0
    loaded = onlinefa.OnlineEM.load(target)  # the previous checkpoint survived the kill
    np.testing.assert_array_equal(loaded.loadings, model.loadings)

    model.save(target)  # a fresh leftover is kept (it could belong to a writer that has not locked yet)
    assert _temporaries(tmp_path, target.name) == [leftover]
    _age(leftover)
    model.save(target)
    assert _temporaries(tmp_path, target.name) == []
    np.testing.assert_array_equal(onlinefa.OnlineEM.load(target).loadings, model.loadings)


def test_a_save_in_progress_elsewhere_is_never_removed(tmp_path: Path) -> None:
    target = tmp_path / "fa.ckpt"
    busy = tmp_path / f".{target.name}.0123456789ab.tmp"
    busy.write_bytes(b"being written")
    _age(busy)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(600)",
         str(busy)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        onlinefa.OnlineEM(6, 2, seed=0).update(ROWS).save(target)
        assert busy.exists()
    finally:
        holder.kill()
        holder.communicate()


def test_only_temporaries_of_the_same_destination_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "fa.ckpt"
    others = [tmp_path / ".other.ckpt.0123456789ab.tmp", tmp_path / ".fa.ckpt.notatemporary.tmp",
              tmp_path / ".fa.ckpt.0123456789ab.tmp.keep"]
    for path in others:
        path.write_bytes(b"x")
        _age(path)
    onlinefa.OnlineEM(6, 2, seed=0).update(ROWS).save(target)
    assert all(path.exists() for path in others)


def _load_in_subprocess(path: str) -> subprocess.CompletedProcess[str]:
    """Load ``path`` with OnlineEM.load and with onlinefa.load in a child (a hang is a timeout, not a hung
    suite); each ValueError message is printed."""
    code = (
        "import sys, onlinefa\n"
        "for load in (onlinefa.OnlineEM.load, onlinefa.load):\n"
        "    try:\n        load(sys.argv[1])\n    except ValueError as e:\n        print(e)\n"
    )
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_loading_a_device_fails_at_once_naming_it() -> None:
    result = _load_in_subprocess("/dev/zero")  # used to read for ever
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all("'/dev/zero'" in line and "not a regular file" in line for line in lines)


def test_loading_a_fifo_or_directory_fails_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = _load_in_subprocess(str(fifo))  # used to block for ever waiting for a writer
    assert result.stdout.count("not a regular file") == 2
    with pytest.raises(ValueError, match="not a regular file"):
        onlinefa.OnlineEM.load(tmp_path)


def _em_state() -> dict[str, Any]:
    state: dict[str, Any] = engine_state(onlinefa.OnlineEM(6, 2, seed=0).update(ROWS))
    return state


def _sga_state() -> dict[str, Any]:
    state: dict[str, Any] = engine_state(onlinefa.OnlineSGA(6, 2, seed=0).update(ROWS))
    return state


def _with(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**state, **changes}


# Each value passes the format's checks (finite, right shape) but is one no run produces; before it was
# refused, each loaded and made every later update fail or return NaN.
EM_VALUES = {
    "pending_rho=1e300": {"pending_rho": 1e300},
    "pending_rho<0": {"pending_rho": -0.5},
    "b_bar=-1e300*I": {"b_bar": -1e300 * np.eye(2)},
    "b_bar asymmetric": {"b_bar": np.array([[1.0, 1.0], [-1.0, 1.0]])},
    "sigma with zero diagonal": {"sigma": np.zeros((2, 2))},
    "dsq_bar<0": {"dsq_bar": -np.ones(6)},
    "n_seen=2**64-1": {"n_seen": 2**64 - 1},
    "mean=1e200": {"mean": np.full(6, 1e200)},
}
SGA_VALUES = {
    "psi<0": {"psi": -np.ones(6)},
    "n_seen=2**64-1": {"n_seen": 2**64 - 1},
}


@pytest.mark.parametrize("case", sorted(EM_VALUES))
def test_em_values_no_run_produces_are_refused_naming_the_file(tmp_path: Path, case: str) -> None:
    path = tmp_path / "edited.ckpt"
    save_state(path, "OnlineEM", _with(_em_state(), **EM_VALUES[case]))
    entry = next(iter(EM_VALUES[case]))
    with pytest.raises(ValueError, match=rf"edited\.ckpt.*{entry}"):
        onlinefa.OnlineEM.load(path)


@pytest.mark.parametrize("case", sorted(SGA_VALUES))
def test_sga_values_no_run_produces_are_refused_naming_the_file(tmp_path: Path, case: str) -> None:
    path = tmp_path / "edited.ckpt"
    save_state(path, "OnlineSGA", _with(_sga_state(), **SGA_VALUES[case]))
    with pytest.raises(ValueError, match=r"edited\.ckpt"):
        onlinefa.OnlineSGA.load(path)


def test_untouched_states_still_load(tmp_path: Path) -> None:
    for kind, state in (("OnlineEM", _em_state()), ("OnlineSGA", _sga_state())):
        save_state(tmp_path / kind, kind, state)
        getattr(onlinefa, kind).load(tmp_path / kind).update(ROWS)


@pytest.mark.parametrize(
    "param, value", [("n_components", -2), ("n_components", 3), ("algorithm", "sga"), ("noise_floor", -1.0)]
)
def test_estimator_hyper_parameters_are_validated_on_load(tmp_path: Path, param: str, value: object) -> None:
    from onlinefa.estimator import _CHECKPOINT_KIND

    fa = onlinefa.OnlineFactorAnalysis(n_components=2, random_state=0).fit(ROWS)
    state = {**fa._checkpoint_state(), f"param.{param}": value}
    path = tmp_path / "sk.ckpt"
    save_state(path, _CHECKPOINT_KIND, state)
    with pytest.raises(ValueError, match=r"sk\.ckpt"):
        onlinefa.OnlineFactorAnalysis.load(path)
