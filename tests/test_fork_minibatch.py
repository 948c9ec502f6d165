"""fork() and the mini-batch families: a child keeps working after its parent used the thread pool, and a
module-level lock that another thread held at the fork does not hang the child.

(1) After the parent ran a pool-sized ``MiniBatchEM.update`` (its products run on rayon's global pool), a
child made by ``fork()`` inherits a pool without threads; ``MiniBatchEM.update``, ``fit_minibatch`` and
``OnlineFactorAnalysis(batch_size > 1).fit`` in the child must finish, with the parent's bits.
(2) The first-fit locks of ``OnlineFactorAnalysis``, ``OnlineGFA`` and ``OnlineVBFA`` held by another
thread at the moment of the fork: the child's first ``partial_fit`` must finish.
Each child runs under a deadline and is killed on a hang, which fails the test.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
import traceback
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import onlinefa
from onlinefa import MiniBatchEM, OnlineFactorAnalysis, fit_minibatch

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() exists on POSIX systems only")

CHILD_DEADLINE = 60.0


def run_in_fork(work: Callable[[], object], deadline: float = CHILD_DEADLINE) -> object:
    """Run ``work`` in a child made by os.fork; its pickled result, or fail on an exception or a hang."""
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
            ready, _, _ = select.select([source], [], [], max(end - time.monotonic(), 0.0))
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


def data(n: int, d: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, k)) @ rng.standard_normal((k, d)) + 0.5 * rng.standard_normal((n, d))


def state_bytes(model: Any) -> list[tuple[str, bytes]]:
    return [(key, value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
            for key, value in sorted(model._core.get_state().items())]


def test_minibatch_models_work_in_a_child_of_a_parent_that_used_the_pool() -> None:
    # The parent runs the pool-sized update first (D = 3000, K = 50, batch 64).
    MiniBatchEM(3000, 50, batch_size=64, seed=0).update(data(64, 3000, 5, 0))
    x = data(300, 40, 3, 1)

    def work() -> tuple[Any, ...]:
        em = MiniBatchEM(40, 3, batch_size=64, seed=2).update(x)
        fitted, history = fit_minibatch(x, 3, batch_size=50, max_iter=3, tol=0.0, random_state=0)
        fa = OnlineFactorAnalysis(n_components=3, batch_size=50, max_iter=3, tol=0.0, random_state=0).fit(x)
        return state_bytes(em), state_bytes(fitted), history.scores, fa.components_, fa.noise_variance_

    in_child = run_in_fork(work)
    in_parent = work()
    assert in_child[:3] == in_parent[:3]
    assert np.array_equal(in_child[3], in_parent[3]) and np.array_equal(in_child[4], in_parent[4])


def _first_fit(name: str) -> Callable[[], object]:
    x = data(120, 6, 2, 3)
    if name == "OnlineFactorAnalysis":
        return lambda: OnlineFactorAnalysis(n_components=2, random_state=0).partial_fit(x).n_samples_seen_
    if name == "OnlineGFA":
        return lambda: onlinefa.OnlineGFA(2, [3, 3], random_state=0, batch_size=60).partial_fit(x).n_features_in_
    return lambda: onlinefa.OnlineVBFA(2, random_state=0).partial_fit(x).n_features_in_


LOCKS = {
    "OnlineFactorAnalysis": ("onlinefa.estimator", "_FIRST_MODEL_LOCK"),
    "OnlineGFA": ("onlinefa.online_gfa", "_FIRST_BATCH_LOCK"),
    "OnlineVBFA": ("onlinefa.vbfa", "_FIRST_ENGINE_LOCK"),
}


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_a_first_fit_lock_held_by_another_thread_at_the_fork_does_not_hang_the_child(name: str) -> None:
    import importlib

    module, attribute = LOCKS[name]
    lock = getattr(importlib.import_module(module), attribute)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(CHILD_DEADLINE)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10.0)
        work = _first_fit(name)
        result = run_in_fork(work)  # forked while the other thread holds the lock
    finally:
        release.set()
        holder.join()
    assert result == work()
