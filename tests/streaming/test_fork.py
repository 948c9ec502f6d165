"""fork(): a child process keeps working after the parent used the thread pool, gets results bit-identical
to the parent's, and fails with a clear error — instead of hanging — on a model another thread was
updating at the moment of the fork.

fork() copies only the calling thread. A child inherits rayon's global pool without its worker threads,
so without fork detection its first parallel pass waits forever; and it inherits the locks other threads
held. Every child here runs under a deadline: a hang makes the test fail (the child is killed), never
makes the suite hang.

The models are large enough (D·K >= 2^17 state elements, n·K³ >= 2^16 VB-FA items) that the parent runs
its passes on the pool; the child runs them on one thread. The passes split their work independently
of the thread count and add the pieces in a fixed order, so the child's state must equal the parent's
bit for bit (compared through SHA-256 digests of the raw state bytes).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import warnings
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from spawn_helpers import CHILD_DEADLINE, run_in_fork

import onlinefa
from engine_state import engine_state

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() exists on POSIX systems only")

D_LARGE, K = 70_000, 2  # D·K = 140 000 >= 2^17: the streaming passes run on the pool in the parent


def state_digest(model: Any) -> str:
    """SHA-256 of an engine's full state (arrays as raw bytes): equal digests mean bit-identical states."""
    digest = hashlib.sha256()
    for key, value in sorted(engine_state(model).items()):
        digest.update(key.encode())
        digest.update(value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
    return digest.hexdigest()


def arrays_digest(*arrays: npt.NDArray[Any]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def fa_batches(n_features: int, seed: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((n_features, K))
    rows = rng.standard_normal((12, K)) @ loadings.T + rng.standard_normal((12, n_features))
    return rows[:6], rows[6:]


def new_streaming_model(name: str) -> Any:
    if name == "OnlineEM":
        return onlinefa.OnlineEM(D_LARGE, K, n_warmup=2, seed=7)
    if name == "OnlineSGA":
        return onlinefa.OnlineSGA(D_LARGE, K, n_warmup=2, lr=1e-3, seed=7)
    return onlinefa.VIFA(D_LARGE, K, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3,
                         optimizer="adam", n_grad_samples=2, seed=7)


def advance(model: Any, batch: npt.NDArray[np.float64]) -> None:
    """One update (streaming models) or one VIFA step with the gradient of ½‖θ − x̄‖² at the draws."""
    if isinstance(model, onlinefa.VIFA):
        draws = np.stack([model.sample() for _ in range(model.n_grad_samples)])
        model.step(draws - batch.mean(axis=0))
    else:
        model.update(batch)


@pytest.mark.parametrize("name", ["OnlineEM", "OnlineSGA", "VIFA"])
def test_os_fork_child_updates_like_the_parent(name: str) -> None:
    first, second = fa_batches(D_LARGE, 0)
    model = new_streaming_model(name)  # the random initial loadings are drawn on the pool (D > 4096 rows)
    advance(model, first)  # the parent's passes run on the pool

    def in_child() -> tuple[str, str]:
        advance(model, second)  # the inherited model, continued in the child
        fresh = new_streaming_model(name)  # a new model in the child: initialisation and two updates
        advance(fresh, first)
        advance(fresh, second)
        return state_digest(model), state_digest(fresh)

    continued, fresh = run_in_fork(in_child)  # type: ignore[misc]
    advance(model, second)
    assert continued == state_digest(model)
    assert fresh == state_digest(model)


def _update_and_report(model: onlinefa.OnlineEM, batch: npt.NDArray[np.float64],
                       conn: multiprocessing.connection.Connection) -> None:
    model.update(batch)
    conn.send(state_digest(model))
    conn.close()


def test_multiprocessing_fork_context_child_updates_like_the_parent() -> None:
    first, second = fa_batches(D_LARGE, 1)
    model = onlinefa.OnlineEM(D_LARGE, K, n_warmup=2, seed=3).update(first)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    worker = context.Process(target=_update_and_report, args=(model, second, sender))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        worker.start()
    sender.close()
    ready = receiver.poll(CHILD_DEADLINE)
    worker.join(timeout=5.0)
    if worker.is_alive():
        worker.kill()
        worker.join()
    assert ready, f"the multiprocessing worker did not finish within {CHILD_DEADLINE} s (hang)"
    assert worker.exitcode == 0
    child_digest = receiver.recv()
    model.update(second)
    assert child_digest == state_digest(model)


def test_vbfa_in_forked_child_matches_the_parent() -> None:
    # D·K³ = 1100·64 >= 2^16 (column updates) and, with missing values, N·K³ = 1100·64 (latent updates):
    # both run on the pool in the parent.
    rng = np.random.default_rng(2)
    complete = rng.standard_normal((1100, 4)) @ rng.standard_normal((4, 1100)) + rng.standard_normal((1100, 1100))
    missing = complete.copy()
    missing[rng.random(missing.shape) < 0.01] = np.nan

    def fit_both() -> tuple[str, str]:
        batch = onlinefa.VBFA(4, max_iter=3, random_state=1).fit(missing)
        online = onlinefa.OnlineVBFA(4, batch_size=550, random_state=1).fit(complete)
        return (arrays_digest(batch.components_, batch.noise_variance_, batch.mean_, batch.transform(missing)),
                arrays_digest(online.components_, online.noise_variance_, online.mean_, online.transform(complete)))

    in_parent = fit_both()
    assert run_in_fork(fit_both) == in_parent


@pytest.mark.slow
def test_fork_during_an_update_in_another_thread_fails_fast_in_the_child() -> None:
    """Another thread updates a model continuously while the main thread forks. In a child forked while
    the model's lock was held, using that model raises RuntimeError at once; other models work."""
    rng = np.random.default_rng(3)
    busy = onlinefa.OnlineEM(400_000, K, n_warmup=2, seed=0)
    busy_batch = rng.standard_normal((20, 400_000))
    small_batch = rng.standard_normal((5, 400_000))
    stop, started = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def keep_updating() -> None:
        try:
            while not stop.is_set():
                busy.update(busy_batch)
                started.set()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            errors.append(err)

    def in_child() -> tuple[str, str]:
        try:
            busy.update(small_batch)
            outcome = "updated"
        except RuntimeError as err:
            outcome = f"RuntimeError: {err}"
        fresh = onlinefa.OnlineEM(D_LARGE, K, n_warmup=2, seed=7)
        for batch in fa_batches(D_LARGE, 0):
            fresh.update(batch)
        return outcome, state_digest(fresh)

    updater = threading.Thread(target=keep_updating)
    updater.start()
    outcomes = []
    try:
        assert started.wait(CHILD_DEADLINE)
        for _ in range(5):
            time.sleep(0.02)
            outcomes.append(run_in_fork(in_child))
    finally:
        stop.set()
        updater.join(timeout=CHILD_DEADLINE)
    assert not updater.is_alive() and not errors
    held = [outcome for outcome, _ in outcomes if outcome.startswith("RuntimeError")]
    assert held, f"no fork happened during an update: {outcomes}"
    assert all("forked" in message and "another thread" in message for message in held)
    assert all(outcome == "updated" or outcome in held for outcome, _ in outcomes)
    reference = onlinefa.OnlineEM(D_LARGE, K, n_warmup=2, seed=7)
    for batch in fa_batches(D_LARGE, 0):
        reference.update(batch)
    assert {digest for _, digest in outcomes} == {state_digest(reference)}
    busy.update(small_batch)  # the parent's model is intact and usable
    assert busy.n_seen % 20 == 5
