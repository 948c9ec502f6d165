"""Serial order of concurrent calls on the mini-batch families (MiniBatchEM, OnlineGFA), and fork safety of
their per-model locks.

Two threads each calling ``MiniBatchEM.update`` with several mini-batches must end in the state of one of
the two serial orders, bit for bit; a reader of an ``OnlineGFA`` during ``partial_fit`` calls must only see
states that some prefix of the whole calls produces.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from spawn_helpers import wait_for_child

from onlinefa import OnlineGFA
from onlinefa._forklock import ModelLock
from onlinefa.minibatch import MiniBatchEM
from engine_state import engine_state


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads as often as possible, so that an unguarded interleaving shows up at once."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _state(model: MiniBatchEM) -> dict[str, np.ndarray]:
    return {key: np.array(value, copy=True) for key, value in engine_state(model).items()}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
                                        for k in a)


def _model() -> MiniBatchEM:
    return MiniBatchEM(12, 3, batch_size=4, seed=3)


class _PausingCore:
    """The engine of a MiniBatchEM, pausing briefly (GIL released) after every mini-batch, so that another
    thread runs in the middle of a multi-batch call whenever nothing stops it."""

    def __init__(self, core: Any) -> None:
        self._inner = core

    def update(self, *args: Any) -> None:
        self._inner.update(*args)
        time.sleep(2e-4)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _pausing(model: MiniBatchEM) -> MiniBatchEM:
    model._core = _PausingCore(model._core)  # type: ignore[assignment]
    return model


def test_two_threads_updating_one_minibatch_model_end_in_a_serial_order(fast_switching: None) -> None:
    rng = np.random.default_rng(0)
    first = rng.standard_normal((200, 12))  # 50 mini-batches per call
    second = 3.0 * rng.standard_normal((200, 12)) + 1.0
    start = rng.standard_normal((8, 12))
    serial = []
    for order in ((first, second), (second, first)):
        model = _model().update(start)
        for batch in order:
            model.update(batch)
        serial.append(_state(model))
    assert not _same(serial[0], serial[1])
    for trial in range(5):
        model = _pausing(_model().update(start))
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def run(batch: np.ndarray) -> None:
            try:
                barrier.wait()
                model.update(batch)
            except BaseException as err:  # pragma: no cover - reported below
                errors.append(err)

        threads = [threading.Thread(target=run, args=(batch,)) for batch in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert model.n_batches == 2 + 100
        end = _state(model)
        assert _same(end, serial[0]) or _same(end, serial[1]), f"trial {trial}: no serial order of the two calls"


def test_minibatch_reader_sees_only_whole_updates(fast_switching: None) -> None:
    rng = np.random.default_rng(1)
    start = rng.standard_normal((8, 12))
    calls = [rng.standard_normal((40, 12)) * (1 + i) for i in range(6)]  # 10 mini-batches per call
    probe = rng.standard_normal((5, 12))
    expected = []
    model = _model().update(start)
    expected.append(model.log_prob(probe))
    for batch in calls:
        expected.append(model.update(batch).log_prob(probe))
    model = _pausing(_model().update(start))
    seen: list[np.ndarray] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(model.log_prob(probe))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for batch in calls:
            model.update(batch)
    finally:
        done.set()
        reader.join(60)
    assert seen
    torn = [answer for answer in seen if not any(np.array_equal(answer, e) for e in expected)]
    assert not torn, f"{len(torn)} of {len(seen)} answers came from a state in the middle of an update"


def _gfa() -> OnlineGFA:
    return OnlineGFA(n_components=3, groups=[4, 4], random_state=0, batch_size=20)


def test_online_gfa_reader_sees_only_states_between_whole_calls(fast_switching: None) -> None:
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal((20, 8)) @ np.diag(np.linspace(1, 3, 8)) + i for i in range(40)]
    probe = rng.standard_normal((6, 8))
    reference = _gfa()
    reference.partial_fit(batches[0])
    expected = [reference.score_samples(probe)]
    covariances = [reference.get_covariance()]
    for batch in batches[1:]:
        reference.partial_fit(batch)
        expected.append(reference.score_samples(probe))
        covariances.append(reference.get_covariance())
    model = _gfa()
    model.partial_fit(batches[0])
    seen: list[np.ndarray] = []
    seen_cov: list[np.ndarray] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(model.score_samples(probe))
            seen_cov.append(model.get_covariance())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for batch in batches[1:]:
            # Let the reader answer at least once between two calls, however loaded the machine is, so that
            # its reads overlap every update (it keeps reading while partial_fit runs).
            wanted, give_up = len(seen) + 1, time.monotonic() + 30.0
            while len(seen) < wanted and time.monotonic() < give_up:
                time.sleep(0.001)
            model.partial_fit(batch)
    finally:
        done.set()
        reader.join(60)
    assert len(seen) >= len(batches) - 1
    torn = [a for a in seen if not any(np.array_equal(a, e) for e in expected)]
    torn_cov = [a for a in seen_cov if not any(np.array_equal(a, e) for e in covariances)]
    assert not torn and not torn_cov, (f"{len(torn)} of {len(seen)} scores and {len(torn_cov)} covariances "
                                       "came from a mixture of two states")


def test_online_gfa_two_writers_end_in_a_serial_order(fast_switching: None) -> None:
    rng = np.random.default_rng(3)
    first_batch = rng.standard_normal((20, 8))
    a, b = rng.standard_normal((20, 8)), 2 + rng.standard_normal((20, 8))
    serial = []
    for order in ((a, b), (b, a)):
        model = _gfa().partial_fit(first_batch)
        for batch in order:
            model.partial_fit(batch)
        serial.append(model.components_.copy())
    for _ in range(10):
        model = _gfa().partial_fit(first_batch)
        threads = [threading.Thread(target=model.partial_fit, args=(x,)) for x in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert model.n_batches_seen_ == 3
        assert any(np.array_equal(model.components_, s) for s in serial)


def test_models_with_locks_still_pickle() -> None:
    rng = np.random.default_rng(4)
    model = _model().update(rng.standard_normal((20, 12)))
    copy = pickle.loads(pickle.dumps(model))
    x = rng.standard_normal((9, 12))
    assert _same(_state(copy.update(x)), _state(model.update(x)))
    gfa = _gfa().partial_fit(rng.standard_normal((20, 8)))
    gfa_copy = pickle.loads(pickle.dumps(gfa))
    y = rng.standard_normal((20, 8))
    np.testing.assert_array_equal(gfa_copy.partial_fit(y).components_, gfa.partial_fit(y).components_)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_model_lock_held_by_another_thread_at_fork_raises_in_the_child_instead_of_hanging() -> None:
    lock = ModelLock()
    free = ModelLock()
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # child: exit code 0 only if the held lock raises and the free one works, at once
            code = 1
            try:
                with free:
                    pass
                try:
                    with lock:
                        pass
                except RuntimeError as err:
                    code = 0 if "forked" in str(err) else 2
            finally:
                os._exit(code)
        status = wait_for_child(pid, 30.0, "the child hung on a lock held at the fork")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        release.set()
        holder.join(30)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_minibatch_model_updated_by_another_thread_at_fork_raises_in_the_child() -> None:
    rng = np.random.default_rng(5)
    model = _model().update(rng.standard_normal((8, 12)))
    inside, release = threading.Event(), threading.Event()

    class Holding(_PausingCore):
        def update(self, *args: Any) -> None:
            self._inner.update(*args)
            inside.set()
            release.wait(30)

    model._core = Holding(model._core)  # type: ignore[assignment]
    writer = threading.Thread(target=model.update, args=(rng.standard_normal((40, 12)),))
    writer.start()
    inside.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # child: the model in use at the fork refuses at once; a fresh model works
            code = 1
            try:
                try:
                    model.snapshot()
                except RuntimeError as err:
                    code = 0 if "forked" in str(err) else 2
                _model().update(np.ones((8, 12)) + np.arange(12))
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        status = wait_for_child(pid, 60.0, "the child hung on the model's lock held at the fork")
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        release.set()
        writer.join(30)
    assert model.n_batches == 2 + 10
