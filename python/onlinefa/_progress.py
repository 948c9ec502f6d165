"""Progress of a long command: a tqdm bar on a terminal, plain timestamped lines otherwise."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

#: Seconds between two plain progress lines (logs stay short when stderr is not a terminal).
PLAIN_INTERVAL = 10.0


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Context manager counting processed items; ``advance(n)`` after each chunk.

    On a terminal (and with tqdm installed) a tqdm bar with rate and ETA; otherwise one plain line
    ``desc: done/total (percent), rate/s, ETA h:mm:ss`` at most every ``PLAIN_INTERVAL`` seconds and at the
    end, so logs hold no escape sequences or carriage returns.

    Parameters
    ----------
    total : int
        Number of items expected.
    desc : str
        Label shown before the counter.
    stream : text file, optional
        Where to write (default ``sys.stderr``).
    """

    def __init__(self, total: int, desc: str, stream: TextIO | None = None) -> None:
        self.total = total
        self.desc = desc
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._started = time.monotonic()
        self._last_print = self._started
        self._bar: Any = None
        if self._stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, desc=desc, unit="samples", dynamic_ncols=True, file=self._stream)

    def advance(self, n: int) -> None:
        """Record ``n`` more processed items."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_print >= PLAIN_INTERVAL or self.done >= self.total:
            self._last_print = now
            print(self.line(now), file=self._stream, flush=True)

    def line(self, now: float) -> str:
        """The plain progress line at time ``now`` (``time.monotonic()``)."""
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        percent = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = _duration(eta) if eta != float("inf") else "?"
        return f"{self.desc}: {self.done}/{self.total} ({percent:.0f}%), {rate:,.0f}/s, ETA {eta_text}"

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
