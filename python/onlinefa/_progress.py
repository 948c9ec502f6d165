"""A progress bar that uses tqdm when it is installed and a plain stderr counter otherwise."""

from __future__ import annotations

import sys
import time
from types import TracebackType


class Progress:
    """Context manager counting processed items; ``advance(n)`` after each chunk.

    Parameters
    ----------
    total : int
        Number of items expected.
    desc : str
        Label shown before the counter.
    """

    def __init__(self, total: int, desc: str) -> None:
        self.total = total
        self.desc = desc
        self.done = 0
        self._last_print = 0.0
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, desc=desc, unit="samples", dynamic_ncols=True)

    def advance(self, n: int) -> None:
        """Record ``n`` more processed items."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_print >= 1.0 or self.done >= self.total:
            self._last_print = now
            print(f"\r{self.desc}: {self.done}/{self.total}", end="", file=sys.stderr, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            print(file=sys.stderr)
