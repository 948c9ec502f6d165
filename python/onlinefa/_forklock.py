"""A module-level lock that a child made by ``fork()`` never inherits in the held state.

``fork()`` copies only the calling thread. A ``threading.Lock`` that another thread held at that moment
stays held in the child forever, so the child's first call that takes it would wait for a thread that does
not exist there. :class:`ForkSafeLock` is replaced by a fresh, unheld lock in every child (through
:func:`os.register_at_fork`). Use it only for critical sections that leave no half-done state behind (a
check and one assignment, as the first-fit publication of a model): the child then sees either the state
before the section or after it.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

from .errors import ModelHeldAtForkError


class ForkSafeLock:
    """A mutual-exclusion lock (``with lock: ...``) that is unheld in every child made by ``fork()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = threading.local()
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def reset() -> None:
                lock = ref()
                if lock is not None:
                    lock._reset()

            os.register_at_fork(after_in_child=reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._held = threading.local()

    def __enter__(self) -> ForkSafeLock:
        lock = self._lock
        lock.acquire()
        self._held.lock = lock  # release the lock this thread took, even if a fork replaced ``_lock`` meanwhile
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        lock: threading.Lock = self._held.lock
        del self._held.lock
        lock.release()



#: Every live :class:`ModelLock`, so that one fork handler can visit them all (no handler per model).
_MODEL_LOCKS: weakref.WeakSet[ModelLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    me = threading.get_ident()
    for lock in list(_MODEL_LOCKS):
        lock._after_fork(me)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class ModelLock:
    """A per-model re-entrant lock held for a whole update (and for reads that must see one state).

    It gives the calls of one model a serial order, as the Rust engines' locks do for one engine call.
    In a child made by ``fork()`` it never hangs: a lock that another thread of the parent held at the
    fork is replaced by an unheld one and marked, and every later ``with lock:`` in the child raises
    :class:`ModelHeldAtForkError` at once (the model may be half-updated there), as the engines' locks do.
    A lock held by the forking thread itself stays held by it in the child and is released as usual.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self._held_at_fork = False
        _MODEL_LOCKS.add(self)

    def _after_fork(self, me: int) -> None:
        if self._lock.acquire(blocking=False):  # unheld, or held by the forking thread (re-entrant)
            self._lock.release()
            return
        # Held by a thread that does not exist in this child. With a depth of 0 it was between taking the
        # lock and starting its work, or after the work and before the release: the state is whole.
        self._held_at_fork = self._held_at_fork or (self._depth > 0 and self._owner != me)
        self._lock = threading.RLock()
        self._owner, self._depth = None, 0

    def __enter__(self) -> ModelLock:
        if self._held_at_fork:
            raise ModelHeldAtForkError(
                "this model was in use by another thread when the process was forked, so its state in this "
                "child process may be half-updated and cannot be used; fork while no update is running, or "
                "create or load the model in the child")
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()
