"""Maximising a smooth score of one positive number over a geometric bracket (grid, then golden section)."""

from __future__ import annotations

import math
from collections.abc import Callable

#: (√5 − 1)/2: each golden-section step keeps this fraction of the bracket.
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def maximise_log(score: Callable[[float], float], log_low: float, log_high: float, *, grid_points: int,
                 refine_steps: int) -> float:
    """The log v in [log_low, log_high] that maximises ``score(log v)``.

    The best of ``grid_points`` evenly spaced values of log v brackets the maximum with its neighbours,
    and ``refine_steps`` golden-section steps shrink that bracket (by 0.618× each) around it.

    Parameters
    ----------
    score : callable float -> float
        The score of log v (larger is better).
    log_low, log_high : float
        The bracket, log_low < log_high.
    grid_points : int
        >= 3.
    refine_steps : int
        >= 0.

    Returns
    -------
    float
        The maximising log v (the middle of the final bracket).
    """
    grid = [log_low + (log_high - log_low) * i / (grid_points - 1) for i in range(grid_points)]
    scores = [score(v) for v in grid]
    best = max(range(grid_points), key=scores.__getitem__)
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, grid_points - 1)]
    a, b = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    fa, fb = score(a), score(b)
    for _ in range(refine_steps):
        if fa >= fb:
            high, b, fb = b, a, fa
            a = high - _GOLDEN * (high - low)
            fa = score(a)
        else:
            low, a, fa = a, b, fb
            b = low + _GOLDEN * (high - low)
            fb = score(b)
    return (low + high) / 2.0
