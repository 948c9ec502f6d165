"""Factor-analysis models whose D features are split across processes (needs PyTorch for the default communicator).

A network trained sharded (FSDP2, ZeRO-3, or any layout where each process owns a contiguous slice of the
flattened parameters) can fit its posterior without ever gathering the parameters: the rows of F, ψ and c
are independent except for the K×K matrix Fᵀ Ψ⁻¹ F, the K-vector Fᵀ Ψ⁻¹ d and a few scalars, so each
rank updates its own rows and one small collective per sample sums those across ranks. The result equals
the single-process model's to rounding in the order of the sums over rows.

Each class takes this rank's number of rows and the single-process class's keyword arguments, and talks
to the others through :class:`Communicator`: ``torch.distributed`` by default (any backend; the sum is an
``all_gather`` summed in rank order, so every rank holds the same bits), or any ``allreduce`` callable
(e.g. MPI). Importing this module does not import torch; constructing a model with the default
communicator does.
"""

from ._comm import Communicator
from ..errors import ShardCommunicationError
from ._layout import ShardLayout
from ._streaming import ShardedOnlineEM, ShardedOnlineSGA
from ._torch import local_parameter_vector, shard_range
from ._vifa import ShardedVIFA

__all__ = [
    "Communicator",
    "ShardCommunicationError",
    "ShardLayout",
    "ShardedOnlineEM",
    "ShardedOnlineSGA",
    "ShardedVIFA",
    "local_parameter_vector",
    "shard_range",
]
