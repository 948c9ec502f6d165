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
