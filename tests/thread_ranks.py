"""Ranks simulated by threads in one process, for the sharded models' ``allreduce=`` hook.

Each thread is one rank; ``allreduce`` stores the rank's vector, waits for every rank, and returns the
sum in rank order (the same bits on every rank, as the torch communicator guarantees). A barrier timeout
turns a rank that never arrives into an error instead of a hang.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np


class ThreadRanks:
    def __init__(self, world_size: int, timeout: float = 30.0) -> None:
        self.world_size = world_size
        self._values: list[Any] = [None] * world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout)
        self.calls = 0

    def allreduce(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        def reduce(values: np.ndarray) -> np.ndarray:
            self._values[rank] = values.copy()
            self._barrier.wait()
            total = self._values[0].copy()
            for other in self._values[1:]:
                total += other
            if rank == 0:
                self.calls += 1
            self._barrier.wait()
            return total

        return reduce

    def kwargs(self, rank: int) -> dict[str, Any]:
        return {"allreduce": self.allreduce(rank), "rank": rank, "world_size": self.world_size}


def run_ranks(bounds: list[int], body: Callable[[int, dict[str, Any], slice], Any], timeout: float = 30.0
              ) -> tuple[list[Any], list[BaseException | None]]:
    """Run ``body(rank, communicator kwargs, row slice)`` on one thread per rank; (results, exceptions)."""
    world = len(bounds) - 1
    ranks = ThreadRanks(world, timeout)
    results: list[Any] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def target(rank: int) -> None:
        try:
            results[rank] = body(rank, ranks.kwargs(rank), slice(bounds[rank], bounds[rank + 1]))
        except BaseException as err:  # noqa: BLE001 - reported to the test
            errors[rank] = err

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 4)
    return results, errors
