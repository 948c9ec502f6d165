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

#: Seconds a forked child may go without progress (its work takes well under one second of CPU).
CHILD_DEADLINE = 60.0

#: Seconds the spawned ranks of a run may go without progress before they are taken for hung.
RUN_DEADLINE = 120.0

#: Wall-clock bound of any child, progress or not (under the suite's per-test timeout).
HARD_DEADLINE = 900.0

#: CPU seconds the watched processes must use within a deadline window to count as making progress.
_PROGRESS_CPU_SECONDS = 0.05


def cpu_seconds(pids: list[int]) -> float | None:
    """CPU time (user + system, waited-for children included) the processes have used, from ``/proc``;
    None where ``/proc`` cannot tell (then only wall-clock deadlines apply)."""
    total, ticks = 0.0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # exited: its time no longer grows
        except OSError:
            return None
        total += sum(int(value) for value in fields[11:15]) / ticks  # utime, stime, cutime, cstime
    return total


class Progress:
    """Tells a hang from slowness: a run is hung when its processes used (almost) no CPU for ``stall``
    seconds (a deadlocked collective or a blocked child sleeps), or when ``HARD_DEADLINE`` has passed. A busy
    machine slows a run down but its processes keep using CPU, so it is not taken for hung."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.start = self.window_start = time.monotonic()
        self.window_cpu: float | None = None

    def hung(self, pids: list[int]) -> bool:
        now, used = time.monotonic(), cpu_seconds(pids)
        if now - self.start > HARD_DEADLINE:
            return True
        if used is None:  # no /proc: the stall bound applies to the wall clock
            return now - self.start > self.stall
        if self.window_cpu is None or used - self.window_cpu >= _PROGRESS_CPU_SECONDS:
            self.window_start, self.window_cpu = now, used
            return False
        return now - self.window_start > self.stall


def run_bounded(worker: Any, world: int, tmp: Path, *args: Any, deadline: float = RUN_DEADLINE) -> None:
    """Spawn ``world`` processes running ``worker(rank, world, str(tmp), *args)``; kill them and fail the
    test if they make no progress for ``deadline`` seconds (see :class:`Progress`)."""
    mp = pytest.importorskip("torch.multiprocessing")
    context = mp.spawn(worker, args=(world, str(tmp), *args), nprocs=world, join=False)
    progress = Progress(deadline)
    while not context.join(timeout=1.0):
        if progress.hung([process.pid for process in context.processes if process.pid is not None]):
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"the spawned ranks made no progress for {deadline} s (a hang)")


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
    progress = Progress(deadline)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while True:
            ready, _, _ = select.select([source], [], [], 1.0)
            if not ready and progress.hung([pid]):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child made no progress for {deadline} s (hang)")
            if not ready:
                continue
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
    ``hang_message`` if it makes no progress for ``deadline`` seconds (see :class:`Progress`)."""
    progress = Progress(deadline)
    while not progress.hung([pid]):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(hang_message)
