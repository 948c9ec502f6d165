"""Spawning gloo ranks and forking children for the multi-process tests, with wall-clock bounds so that a
hang fails a test instead of blocking the suite."""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: Wall-clock bound of a forked child (its work takes well under one second).
CHILD_DEADLINE = 60.0

#: Wall-clock bound of one spawned run (a hang fails the test instead of blocking the suite).
RUN_DEADLINE = 120.0


def run_bounded(worker: Any, world: int, tmp: Path, *args: Any, deadline: float = RUN_DEADLINE) -> None:
    """Spawn ``world`` processes running ``worker(rank, world, str(tmp), *args)``; kill them and fail the
    test if they have not all finished after ``deadline`` seconds."""
    mp = pytest.importorskip("torch.multiprocessing")
    context = mp.spawn(worker, args=(world, str(tmp), *args), nprocs=world, join=False)
    end = time.monotonic() + deadline
    while not context.join(timeout=1.0):
        if time.monotonic() > end:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"the spawned ranks did not finish within {deadline} s (a hang)")


def factor_stream(n: int, n_features: int, n_components: int, seed: int = 0) -> np.ndarray:
    """``n`` rows of a rank-``n_components`` factor model plus noise, mean 1 (D = ``n_features``)."""
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((n, n_components)) @ rng.standard_normal((n_components, n_features))
    return factors + 0.4 * rng.standard_normal((n, n_features)) + 1.0


def run_in_fork(work: Callable[[], object], deadline: float = CHILD_DEADLINE) -> object:
    """Run ``work`` in a child made by os.fork and return its (pickled) result; fail if it raises or if
    it has not finished within ``deadline`` seconds (the child is then killed)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns about fork() in a multi-threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 0
        try:
            os.close(read_end)
            try:
                payload = pickle.dumps(("ok", work()))
            except BaseException:  # noqa: BLE001 - reported to the parent
                payload, status = pickle.dumps(("raised", traceback.format_exc())), 1
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        finally:
            os._exit(status)
    os.close(write_end)
    chunks: list[bytes] = []
    end = time.monotonic() + deadline
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while True:
            remaining = end - time.monotonic()
            ready, _, _ = select.select([source], [], [], max(remaining, 0.0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child did not finish within {deadline} s (hang)")
            chunk = source.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    assert kind == "ok", f"the forked child raised:\n{value}"
    return value


def wait_for_child(pid: int, deadline: float, hang_message: str) -> int:
    """Wait for the forked child ``pid`` and return its wait status; kill it and fail the test with
    ``hang_message`` if it has not exited after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(hang_message)
