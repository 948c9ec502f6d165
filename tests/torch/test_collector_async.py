"""The asynchronous SnapshotCollector: same posterior as the synchronous one, bounded buffers, errors raised
on the training thread, the cost of a snapshot in optimiser steps and its warning."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from onlinefa.torch import SlowCollectionWarning, SnapshotCollector  # noqa: E402
from engine_state import engine_state  # noqa: E402


def _net(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(net: Any, opt: Any, n_steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        x = torch.randn(8, 5, generator=g)
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()


class _Slow:
    """A posterior whose update sleeps (a worker that falls behind) and records what it saw."""

    def __init__(self, inner: Any, seconds: float = 0.0, fail_at: int | None = None) -> None:
        self.inner, self.seconds, self.fail_at = inner, seconds, fail_at
        self.seen: list[np.ndarray] = []
        self.threads: set[str] = set()

    def update(self, theta: np.ndarray) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        if self.fail_at is not None and len(self.seen) == self.fail_at:
            self.fail_at = None  # fails once
            raise ValueError("refused by the posterior")
        self.seen.append(theta.copy())
        self.inner.update(theta)


@pytest.mark.parametrize(("every", "n_buffers"), [(1, 1), (2, 2), (3, 4)])
def test_asynchronous_collection_fits_exactly_what_the_synchronous_one_fits(every: int, n_buffers: int) -> None:
    states = []
    for asynchronous in (False, True):
        net = _net()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        d = sum(p.numel() for p in net.parameters())
        em = onlinefa.OnlineEM(d, 3, seed=0, dtype="float32")
        posterior = _Slow(em, seconds=0.002 if asynchronous else 0.0)
        with warnings.catch_warnings():  # a worker slower than the steps is the point here, not the warning
            warnings.simplefilter("ignore", SlowCollectionWarning)
            with SnapshotCollector(posterior, net, every=every, asynchronous=asynchronous,
                                   n_buffers=n_buffers).attach(opt) as collector:
                _train(net, opt, 30)
        assert collector.n_snapshots == 30 // every == em.n_seen
        states.append((engine_state(em), posterior))
    (sync_state, sync_seen), (async_state, async_seen) = states
    for key, value in sync_state.items():
        assert np.array_equal(async_state[key], value) if isinstance(value, np.ndarray) else async_state[key] == value
    assert all(np.array_equal(a, b) for a, b in zip(sync_seen.seen, async_seen.seen))
    assert async_seen.threads == {"onlinefa-snapshot-feeder"} and "onlinefa-snapshot-feeder" not in sync_seen.threads


def test_a_slow_worker_applies_back_pressure_with_a_fixed_set_of_buffers() -> None:
    net = _net()
    d = sum(p.numel() for p in net.parameters())
    posterior = _Slow(onlinefa.OnlineEM(d, 2, seed=0), seconds=0.01)
    collector = SnapshotCollector(posterior, net, asynchronous=True, n_buffers=2)
    start = time.perf_counter()
    for _ in range(6):
        collector.collect()
    taken = time.perf_counter() - start
    feeder = collector._feeder
    assert feeder is not None and feeder._free.qsize() + feeder._work.unfinished_tasks <= 2
    collector.flush()
    # six updates of 10 ms through two buffers: the caller waited for at least four of them
    assert taken >= 0.035 and len(posterior.seen) == 6
    buffers = {id(b) for b in list(feeder._free.queue)}
    assert len(buffers) == 2  # the same two arrays were reused
    collector.close()


def test_a_background_error_is_raised_on_the_training_thread_and_later_snapshots_are_not_applied() -> None:
    net = _net()
    d = sum(p.numel() for p in net.parameters())
    posterior = _Slow(onlinefa.OnlineEM(d, 2, seed=0), seconds=0.005, fail_at=2)
    collector = SnapshotCollector(posterior, net, asynchronous=True, n_buffers=3)
    for _ in range(3):
        collector.collect()  # the third will fail in the worker
    with pytest.raises(ValueError, match="refused by the posterior"):
        for _ in range(3):
            collector.collect()
        collector.flush()
    assert len(posterior.seen) == 2 and posterior.inner.n_seen == 2
    collector.flush()  # reported once; the collector keeps working
    collector.collect()
    collector.flush()
    assert posterior.inner.n_seen == 3
    collector.close()
    assert collector._feeder is None


class _Clock:
    """An injected clock: only what a test adds to it passes, so no assertion depends on this machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Costly:
    """A posterior whose update costs ``seconds`` on the injected clock."""

    def __init__(self, inner: Any, clock: _Clock, seconds: float) -> None:
        self.inner, self.clock, self.seconds = inner, clock, seconds

    def update(self, theta: np.ndarray) -> None:
        self.clock.now += self.seconds
        self.inner.update(theta)


def _train_on_clock(net: Any, opt: Any, n_steps: int, clock: _Clock, step_seconds: float) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(n_steps):
        x = torch.randn(8, 5, generator=g)
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        clock.now += step_seconds  # the forward and backward passes of this step
        opt.step()


def test_snapshot_cost_is_reported_in_optimiser_steps_and_warns_once() -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    d = sum(p.numel() for p in net.parameters())
    clock = _Clock()
    posterior = _Costly(onlinefa.OnlineEM(d, 2, seed=0), clock, seconds=0.1)
    collector = SnapshotCollector(posterior, net, every=1)
    collector._clock = clock
    collector.attach(opt)
    with pytest.warns(SlowCollectionWarning, match="asynchronous=True") as caught:
        _train_on_clock(net, opt, 6, clock, step_seconds=0.01)
    assert len(caught) == 1 and "10.0 training steps" in str(caught[0].message)
    assert collector.seconds_per_snapshot == pytest.approx(0.1)
    assert collector.step_seconds == pytest.approx(0.01)
    assert collector.snapshot_cost_in_steps == pytest.approx(10.0)
    collector.close()


@pytest.mark.parametrize(("update_seconds", "step_seconds"), [(0.004, 0.001), (0.01, 0.02)])
def test_no_warning_for_a_cheap_snapshot_or_one_cheaper_than_a_step(update_seconds: float,
                                                                    step_seconds: float) -> None:
    """Below 5 ms a snapshot never warns; above, only when it costs more than a step."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    clock = _Clock()
    posterior = _Costly(onlinefa.OnlineEM(sum(p.numel() for p in net.parameters()), 2, seed=0), clock,
                        update_seconds)
    collector = SnapshotCollector(posterior, net, every=1)
    collector._clock = clock
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowCollectionWarning)
        with collector.attach(opt):
            _train_on_clock(net, opt, 8, clock, step_seconds)
    assert collector.snapshot_cost_in_steps == pytest.approx(update_seconds / step_seconds)


def test_the_asynchronous_collector_costs_the_loop_only_the_copy_while_a_buffer_is_free() -> None:
    """The worker's updates block until released: with four buffers and three snapshots the training thread
    never waits for them, so no time passes on its clock and nothing warns."""
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    release = threading.Event()

    class Blocked(_Slow):
        def update(self, theta: np.ndarray) -> None:
            release.wait(timeout=600)
            super().update(theta)

    posterior = Blocked(onlinefa.OnlineEM(sum(p.numel() for p in net.parameters()), 2, seed=0))
    clock = _Clock()
    quick = SnapshotCollector(posterior, net, every=4, asynchronous=True, n_buffers=4)
    quick._clock = clock
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowCollectionWarning)
        quick.attach(opt)
        _train_on_clock(net, opt, 12, clock, step_seconds=0.001)
        assert quick.n_snapshots == 3 and quick.seconds_per_snapshot == 0.0 and not posterior.seen
        release.set()
        quick.close()
    assert len(posterior.seen) == 3


def test_bad_options_are_refused() -> None:
    net = _net()
    em = onlinefa.OnlineEM(97, 2, seed=0)
    with pytest.raises(ValueError, match="n_buffers"):
        SnapshotCollector(em, net, asynchronous=True, n_buffers=0)
    with pytest.raises(TypeError, match="asynchronous"):
        SnapshotCollector(em, net, asynchronous=1)  # type: ignore[arg-type]


def _large_stream() -> np.ndarray:
    rng = np.random.default_rng(5)
    return rng.standard_normal((6, 300_000)).astype(np.float32)  # D·K above the engine's parallel gate


def _update_on_thread(x: np.ndarray, n_threads: int) -> dict[str, Any]:
    """An OnlineEM fed ``x`` from a new thread whose updates are limited to ``n_threads`` (0: no limit)."""
    from onlinefa import _core

    model = onlinefa.OnlineEM(x.shape[1], 4, seed=3, dtype="float32")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            _core.limit_update_threads(n_threads)
            model.update(x)
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return engine_state(model)


def test_limiting_the_update_threads_changes_no_bit() -> None:
    x = _large_stream()
    reference = _update_on_thread(x, 0)
    for n_threads in (1, 3):
        state = _update_on_thread(x, n_threads)
        for key, value in reference.items():
            assert np.array_equal(state[key], value) if isinstance(value, np.ndarray) else state[key] == value
    from onlinefa import _core

    with pytest.raises(ValueError, match="at most 4096"):
        _core.limit_update_threads(5000)
    with pytest.raises(OverflowError):
        _core.limit_update_threads(-1)


def test_a_limited_thread_pool_works_in_a_forked_child() -> None:
    # The limit's pool made before fork() has no thread in the child: the child's updates remake it
    # instead of waiting forever for a thread that is not there.
    from onlinefa import _core
    from spawn_helpers import run_in_fork

    x = _large_stream()
    _core.limit_update_threads(1)
    try:
        model = onlinefa.OnlineEM(x.shape[1], 4, seed=3, dtype="float32").update(x[:3])
        n_seen = run_in_fork(lambda: model.update(x[3:]).n_seen)
    finally:
        _core.limit_update_threads(0)
    assert n_seen == 6
