"""Threads: concurrent updates are serialised batch by batch, readers see whole batches, and the GIL is
released while the engine works.

How corruption would show: the engines apply rows in order, and the state after a sequence of batches
is a deterministic function of that sequence. If concurrent calls were serialised per *batch*, the final
state is bit-identical to one of the serial orders of the batches; interleaved rows, lost updates or a
torn state give a state that matches none of them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from onlinefa import OnlineFactorAnalysis
from engine_state import engine_state

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]
D, K = 24, 3


def new_model(model_class: str, dtype: str = "float64") -> Any:
    extra = {"lr": 2e-3} if model_class == "OnlineSGA" else {}
    return getattr(onlinefa, model_class)(D, K, n_warmup=30, seed=0, dtype=dtype, **extra)


def state_bytes(model: Any) -> dict[str, Any]:
    """The engine state with arrays as bytes, so states compare bit for bit with ==."""
    return {k: (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v
            for k, v in engine_state(model).items()}


def run_together(functions: list[Callable[[], None]]) -> None:
    """Start one thread per function, released at the same moment by a barrier; re-raise any error."""
    barrier = threading.Barrier(len(functions))
    errors: list[BaseException] = []

    def runner(function: Callable[[], None]) -> None:
        barrier.wait()
        try:
            function()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            errors.append(err)

    threads = [threading.Thread(target=runner, args=(f,)) for f in functions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_concurrent_distinct_batches_equal_some_serial_order(model_class: str, dtype: str, fa_stream: StreamFactory) -> None:
    stream = fa_stream(D, K, 4 * 1500, 0).astype(dtype)
    batches = np.split(stream, 4)
    serial_states = []
    for order in itertools.permutations(range(4)):
        model = new_model(model_class, dtype)
        for index in order:
            model.update(batches[index])
        serial_states.append(state_bytes(model))
    for _ in range(3):
        shared = new_model(model_class, dtype)
        run_together([lambda b=batch: shared.update(b) for batch in batches])
        final = state_bytes(shared)
        assert final["n_seen"] == 6000
        assert any(final == state for state in serial_states), "state matches no serial order of the batches"


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_many_threads_with_identical_batches_equal_the_serial_stream(model_class: str, fa_stream: StreamFactory) -> None:
    # With identical batches every serial order is the same sequence, so the expected state is unique;
    # rows of different calls interleaved (or a lost update) would change it.
    batch = fa_stream(D, K, 64, 1)
    n_threads, calls_per_thread = 6, 40
    serial = new_model(model_class)
    for _ in range(n_threads * calls_per_thread):
        serial.update(batch)
    shared = new_model(model_class)

    def worker() -> None:
        for _ in range(calls_per_thread):
            shared.update(batch)

    run_together([worker] * n_threads)
    assert state_bytes(shared) == state_bytes(serial)


def test_readers_only_ever_see_whole_batches(fa_stream: StreamFactory) -> None:
    batch = fa_stream(D, K, 500, 2)
    model = new_model("OnlineEM")
    model.update(batch)
    seen_counts: list[int] = []
    finished = threading.Event()
    queries = batch[:5]

    def writer() -> None:
        for _ in range(30):
            model.update(batch)
        finished.set()

    def reader() -> None:
        while not finished.is_set():
            state = engine_state(model)
            seen_counts.append(int(state["n_seen"]))
            assert np.isfinite(model.log_prob(queries)).all()
            assert np.isfinite(model.transform(queries)).all()
            assert (model.noise_variance > 0).all()

    run_together([writer, writer, reader, reader])
    assert seen_counts, "the readers never ran"
    assert all(count % 500 == 0 for count in seen_counts), "a reader saw a partly applied batch"
    assert model.n_seen == 500 * 61


def test_estimator_partial_fit_from_threads(fa_stream: StreamFactory) -> None:
    batches = np.split(fa_stream(D, K, 3 * 400, 3), 3)
    serial_states = []
    for order in itertools.permutations(range(3)):
        fa = OnlineFactorAnalysis(K, n_warmup=30, random_state=1)
        for index in order:
            fa.partial_fit(batches[index])
        serial_states.append(state_bytes(fa._model))
    for _ in range(3):
        shared = OnlineFactorAnalysis(K, n_warmup=30, random_state=1)  # unfitted: the threads race to create the model
        run_together([lambda b=batch: shared.partial_fit(b) for batch in batches])
        assert shared.n_samples_seen_ == 1200
        assert any(state_bytes(shared._model) == state for state in serial_states)


def counter_ticks_during(call: Callable[[], object]) -> tuple[int, float]:
    """Run ``call`` while a counter thread stamps the time of each loop iteration; return the number of
    stamps in the middle half of the call, and its duration.

    If ``call`` held the GIL, the counter could not run between the call's start and end, except within
    one switch interval (5 ms) at either edge; the middle half of a call lasting well over 20 ms is
    therefore free of stamps unless the GIL is released.
    """
    stamps: list[float] = []
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())

    thread = threading.Thread(target=counter)
    thread.start()
    try:
        time.sleep(0.01)
        start = time.perf_counter()
        call()
        end = time.perf_counter()
    finally:
        stop.set()
        thread.join()
    duration = end - start
    middle = [s for s in stamps if start + 0.25 * duration < s < start + 0.75 * duration]
    return len(middle), duration


# The counter loop runs at ~10^5-10^6 iterations/s when it holds the GIL: 100 stamps in the middle
# half of the call cannot come from the edges and are far below what a free-running thread achieves.
MIN_TICKS = 100
MIN_DURATION = 0.04  # s; several switch intervals, so that the middle half is clear of the edges


def test_other_threads_run_while_an_update_is_in_progress() -> None:
    rng = np.random.default_rng(0)
    model = onlinefa.OnlineEM(2000, 10, n_warmup=10, seed=0)
    X = rng.standard_normal((1500, 2000))
    ticks, duration = counter_ticks_during(lambda: model.update(X))
    assert duration > MIN_DURATION, f"update too short ({duration:.3f} s) for the test to be meaningful"
    assert ticks > MIN_TICKS, f"only {ticks} counter ticks during the update: is the GIL held?"


def test_gil_is_released_for_the_estimator_too() -> None:
    rng = np.random.default_rng(1)
    fa = OnlineFactorAnalysis(10, algorithm="sga", n_warmup=10, random_state=0)
    fa.partial_fit(rng.standard_normal((20, 2000)))
    X = rng.standard_normal((1500, 2000))
    ticks, duration = counter_ticks_during(lambda: fa.partial_fit(X))
    assert duration > MIN_DURATION, f"partial_fit too short ({duration:.3f} s) for the test to be meaningful"
    assert ticks > MIN_TICKS, f"only {ticks} counter ticks during partial_fit: is the GIL held?"
