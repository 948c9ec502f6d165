"""A background worker that feeds snapshots to a posterior in order: :class:`BackgroundFeeder`.

The training thread copies each snapshot into one of a fixed set of reusable buffers and hands it over; one
worker thread applies the snapshots to the posterior in the order they were handed over and returns each
buffer to the pool. When every buffer is waiting to be applied, the training thread blocks until the
worker frees one (back-pressure: memory stays at ``n_buffers`` snapshots however far behind the worker is).
The posteriors release the GIL during their updates, so training and fitting overlap.

An exception raised by the posterior stops the worker from applying anything after it: the snapshots
handed over behind the failing one are dropped, and the exception is raised on the training thread by the
next :meth:`BackgroundFeeder.submit`, :meth:`BackgroundFeeder.flush` or :meth:`BackgroundFeeder.close`.

At interpreter exit (the script ended, or died of an exception, with snapshots in flight) every live worker
finishes the update it is in, drops the snapshots still queued and stops before the interpreter tears down:
a daemon thread still inside PyTorch while its C++ runtime is destroyed would abort the process (SIGABRT).
Call :meth:`BackgroundFeeder.close` (``SnapshotCollector.close``) to have them applied instead.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["BackgroundFeeder"]

#: Seconds a waiting call sleeps between checks that the worker is still alive (never a busy wait).
_POLL_SECONDS = 0.5

#: The feeders whose worker may still run, stopped by :func:`_stop_at_exit`.
_LIVE: weakref.WeakSet[BackgroundFeeder] = weakref.WeakSet()


def _stop_at_exit() -> None:
    """Stop every live worker before the interpreter finalises (queued snapshots are dropped)."""
    for feeder in list(_LIVE):
        feeder._stop(discard=True)


atexit.register(_stop_at_exit)


class BackgroundFeeder:
    """Apply ``apply(buffer)`` to snapshots in a worker thread, in order, with ``n_buffers`` reusable buffers.

    Parameters
    ----------
    apply : callable
        Called by the worker with each filled buffer; the buffer is reused once it returns, so ``apply``
        must not keep a reference to it (the posteriors copy what they keep).
    shape, dtype
        Of every buffer.
    n_buffers : int
        Snapshots that can be in flight (filled and waiting, or being applied) at once (>= 1).
    on_start : callable, optional
        Called first by the worker thread (e.g. to limit the threads of its updates).
    """

    def __init__(self, apply: Callable[[NDArray[Any]], None], shape: tuple[int, ...], dtype: Any, n_buffers: int,
                 on_start: Callable[[], None] | None = None) -> None:
        self._apply = apply
        self._on_start = on_start
        self._free: queue.Queue[NDArray[Any]] = queue.Queue()
        for _ in range(n_buffers):
            self._free.put(np.empty(shape, dtype=dtype))
        self._work: queue.Queue[NDArray[Any] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._n_dropped = 0
        self._discard = False  #: set at interpreter exit: drop what is queued instead of applying it
        self._worker = threading.Thread(target=self._run, name="onlinefa-snapshot-feeder", daemon=True)
        self._worker.start()
        _LIVE.add(self)

    # -- training thread ----------------------------------------------------------------------------------
    def acquire(self) -> NDArray[Any]:
        """A free buffer to fill (blocks while every buffer is in flight). Raises a pending worker error."""
        self._raise_pending()
        while True:
            try:
                return self._free.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._raise_pending()
                self._check_alive()

    def submit(self, buffer: NDArray[Any]) -> None:
        """Hand a filled buffer (from :meth:`acquire`) to the worker."""
        self._work.put(buffer)

    def release(self, buffer: NDArray[Any]) -> None:
        """Give back a buffer from :meth:`acquire` that was not submitted (e.g. its filling failed)."""
        self._free.put(buffer)

    def flush(self) -> None:
        """Wait until every submitted snapshot is applied; then raise the worker's error, if any."""
        self._wait_idle()
        self._raise_pending()

    def close(self) -> None:
        """Flush, then stop the worker (also when the flush raises)."""
        try:
            self.flush()
        finally:
            self._stop(discard=False)

    def _stop(self, discard: bool) -> None:
        """Stop the worker after what is queued (applied, or dropped with ``discard``); wait for it."""
        if discard:
            self._discard = True
        if self._worker.is_alive():
            self._work.put(None)
            self._worker.join()
        _LIVE.discard(self)

    # -- worker -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except BaseException as err:  # reported like a failed update
                self._error = err
        while True:
            buffer = self._work.get()
            if buffer is None:
                self._work.task_done()
                return
            try:
                if self._error is None and not self._discard:
                    self._apply(buffer)
                else:
                    self._n_dropped += 1
            except BaseException as err:  # handed to the training thread, never lost
                self._error = err
            finally:
                self._free.put(buffer)
                self._work.task_done()

    def _wait_idle(self) -> None:
        """Block until the worker has taken and finished every submitted buffer (checking that it lives)."""
        while self._work.unfinished_tasks:
            time.sleep(0.001)
            self._check_alive()

    def _raise_pending(self) -> None:
        error = self._error
        if error is None:
            return
        self._wait_idle()  # let the worker drop what is queued behind the failure, to report the count
        dropped, self._error, self._n_dropped = self._n_dropped, None, 0
        if dropped and hasattr(error, "add_note"):
            error.add_note(f"(raised by a snapshot applied in the background; the {dropped} snapshot(s) handed "
                           "over after it were not applied)")
        raise error

    def _check_alive(self) -> None:
        if not self._worker.is_alive():
            raise RuntimeError("the snapshot worker thread is no longer running (was the process forked?)")
