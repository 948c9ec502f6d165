"""The one collective the sharded models need: an element-wise sum of a small float64 vector over ranks."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numpy.typing import NDArray

from .._core import NumericalBreakdownError
from ..errors import ShardCommunicationError

FloatArray = NDArray[np.float64]
AllReduce = Callable[[FloatArray], Any]



#: Exception classes a rank can report to the others through a collective, by code (0 = success).
_KINDS: tuple[type[BaseException], ...] = (ValueError, TypeError, NumericalBreakdownError, MemoryError, RuntimeError)


def failure_code(failure: BaseException | None) -> int:
    """The code of ``failure`` sent to the other ranks (0 for none)."""
    if failure is None:
        return 0
    for code, kind in enumerate(_KINDS, start=1):
        if isinstance(failure, kind):
            return code
    return len(_KINDS)


class Communicator:
    """Sums small float64 vectors across the ranks of a process group.

    Parameters
    ----------
    allreduce : callable, optional
        ``allreduce(values) -> sums``: the element-wise sum of a 1-D float64 NumPy array over all ranks,
        returned as an array of the same shape. It must return identical bits on every rank (sum in a fixed
        rank order) so that every rank's model stays identical. Use it to plug in MPI or any other engine;
        ``rank`` and ``world_size`` are then required.
    group : torch.distributed.ProcessGroup, optional
        Without ``allreduce``: the torch process group (default: the world group, which must be initialised
        with :func:`torch.distributed.init_process_group`). The sum is an ``all_gather`` followed by a sum
        in rank order, so every rank gets the same bits (on an NCCL group the numbers go through the rank's
        current CUDA device). Collectives time out after the group's
        ``timeout``; pass a short one to ``init_process_group`` if a dead peer must be noticed quickly.
    rank, world_size : int, optional
        This process's index and the number of processes (required with ``allreduce``).
    """

    #: The model's tag, agreed by every rank when the model is built or loaded (0 until then); every
    #: collective of :func:`exchange` carries it, so ranks that call two models in different orders raise.
    tag: int = 0

    def __init__(
        self,
        allreduce: AllReduce | None = None,
        *,
        group: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if allreduce is not None:
            if rank is None or world_size is None:
                raise ValueError("allreduce= needs rank= and world_size=")
            if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
                raise ValueError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
            self.rank, self.world_size = rank, world_size
            self._sum: Callable[[FloatArray], FloatArray] = lambda values: _checked(allreduce(values.copy()), values)
            return
        try:
            import torch.distributed as dist
        except ImportError as err:  # pragma: no cover - the torch extra is installed in the test environment
            raise ImportError(
                "the default communicator needs PyTorch (pip install torch, or pip install \".[torch]\" in "
                "onlinefa's source tree), or pass allreduce="
            ) from err
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "torch.distributed is not initialised: call torch.distributed.init_process_group first, "
                "or pass allreduce= (with rank= and world_size=)"
            )
        self.rank = int(dist.get_rank(group))
        self.world_size = int(dist.get_world_size(group))
        self._sum = lambda values: _torch_ordered_sum(values, group, self.world_size)

    def sum(self, values: FloatArray, what: str) -> FloatArray:
        """The element-wise sum of ``values`` (1-D float64) over every rank; ``what`` names it in errors."""
        try:
            return self._sum(np.ascontiguousarray(values, dtype=np.float64))
        except ShardCommunicationError:
            raise
        except Exception as err:
            raise ShardCommunicationError(
                f"rank {self.rank}: the collective for {what} failed ({type(err).__name__}: {err}); a peer rank "
                "may have died, raised outside the collective, or the process group's timeout passed"
            ) from err


def _checked(result: Any, values: FloatArray) -> FloatArray:
    out = np.asarray(result, dtype=np.float64)
    if out.shape != values.shape:
        raise ValueError(f"allreduce returned shape {out.shape}, expected {values.shape}")
    return out


def _torch_ordered_sum(values: FloatArray, group: Any, world_size: int) -> FloatArray:
    import torch
    import torch.distributed as dist

    # NCCL gathers device tensors only: the few numbers travel through this rank's current GPU there
    on_gpu = dist.get_backend(group) == "nccl"
    local = torch.from_numpy(values)
    if on_gpu:
        local = local.to(torch.device("cuda", torch.cuda.current_device()))
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local, group=group)
    total = parts[0].cpu().numpy().copy()
    for part in parts[1:]:
        total += part.cpu().numpy()
    return total


def exchange(
    comm: Communicator, failure: BaseException | None, payload: FloatArray | None, payload_len: int, *,
    rows: int = 0, what: str,
) -> tuple[FloatArray, NDArray[np.int64]]:
    """One collective: every rank's failure code and row count, and the sum of the payloads.

    A rank whose ``failure`` is set sends zeros as its payload. If any rank failed, every rank raises:
    the failing rank its own exception (with its rank in the message), the others the same exception
    class naming the failing ranks. Every rank also sends its model's tag (``comm.tag``): when the ranks'
    tags differ (two sharded models called in different orders on different ranks, so that one model's
    collective met another's), every rank raises ``ValueError`` instead of using the mixed sums. Returns
    (summed payload, row count of every rank).
    """
    w = comm.world_size
    packet = np.zeros(3 * w + payload_len)
    packet[comm.rank] = failure_code(failure)
    packet[w + comm.rank] = rows
    packet[2 * w + comm.rank] = comm.tag
    if failure is None and payload is not None:
        packet[3 * w:] = payload
    total = comm.sum(packet, what)
    tags = total[2 * w: 3 * w]
    if np.any(tags != tags[0]):
        raise ValueError(
            f"rank {comm.rank}: {what}: this collective met another sharded model's (model tags by rank "
            f"{[int(t) for t in tags]}); every rank must call the collective methods of its sharded models in "
            "the same order. Nothing was applied by this call"
        )
    codes = total[:w].astype(np.int64)
    raise_if_failed(comm, codes, failure, what)
    return total[3 * w:], total[w:2 * w].astype(np.int64)


def new_tag() -> float:
    """A random 48-bit model tag (exact in the float64 collective; rank 0 draws it for every rank)."""
    return float(int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0]) >> 16)


def raise_if_failed(comm: Communicator, codes: NDArray[np.int64], failure: BaseException | None, what: str) -> None:
    """Raise on every rank if any rank reported a failure (see :func:`exchange`)."""
    failed = [int(r) for r in np.flatnonzero(codes)]
    if not failed:
        return
    if failure is not None:
        try:
            renamed = type(failure)(f"rank {comm.rank}: {failure}")
        except Exception:  # an exception class with other constructor arguments: raise it as it is
            raise failure from None
        raise renamed from failure
    kind = _KINDS[min(int(codes[failed[0]]), len(_KINDS)) - 1]
    raise kind(f"rank {comm.rank}: {what} failed on rank(s) {failed}; see the error raised there")
