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
import threading
from typing import Any, Callable

import numpy as np
import pytest

from spawn_helpers import CHILD_DEADLINE, run_in_fork

import onlinefa
from onlinefa import MiniBatchEM, OnlineFactorAnalysis, fit_minibatch
from engine_state import engine_state

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() exists on POSIX systems only")



def data(n: int, d: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, k)) @ rng.standard_normal((k, d)) + 0.5 * rng.standard_normal((n, d))


def state_bytes(model: Any) -> list[tuple[str, bytes]]:
    return [(key, value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
            for key, value in sorted(engine_state(model).items())]


def test_minibatch_models_work_in_a_child_of_a_parent_that_used_the_pool() -> None:
    # The parent first runs an update large enough to use the thread pool (D = 3000, K = 50, batch 64).
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
