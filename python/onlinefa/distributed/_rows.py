"""What a sharded streaming model needs of its rank's rows, whichever holds them.

The sharded wrapper (``_streaming.py``) runs one loop for every row store: check the batch, and per sample take
this rank's share of the E-step sums (K² + K + 1 numbers), sum them over the ranks, apply the K×K step to every
rank's rows; keep a copy to put back when a call fails; sum the Gram Fᵀ Ψ⁻¹ F for the reported Gaussian. A
:class:`RowStore` says how for one store: :class:`CoreRows` for the Rust core's rows (this module), ``TensorRows``
for torch tensors on a device (``onlinefa.torch._sharded``, imported only for a model that has such rows).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from ..streaming import sharded_query_engine
from ._shared import local_matrix

FloatArray = NDArray[np.float64]


class RowStore(Protocol):
    """One rank's rows of a sharded streaming model, as the sharded update loop drives them."""

    #: Whether :meth:`sums` leaves the rows unchanged (else a batch first agrees that every rank's input is valid).
    sums_keep_state: bool

    def lock(self) -> ContextManager[Any]:
        """Held for a whole call: readers on other threads see the state before or after it."""

    def checked(self, X: Any) -> Any:
        """The batch as an (n, D_local) array or tensor the rows read; ValueError/TypeError for bad input."""

    def sums(self, row: Any) -> FloatArray:
        """This rank's share of the E-step sums of one sample, flat (S (K×K), u (K), Σ d̄²)."""

    def apply(self, total: FloatArray, n_components: int, n_total: int) -> None:
        """The K×K step from the sums over every rank's rows (``n_total`` of them); the sample is then applied."""

    def backup(self) -> Any:
        """A copy of the state to put back with :meth:`restore`."""

    def restore(self, backup: Any) -> None:
        """Put back the state of :meth:`backup` (the reporting map included)."""

    def reports_map(self) -> bool:
        """Whether the reported Gaussian needs the K×K map of the spiked-model shrinkage now (decided by the
        state every rank shares, so every rank answers alike)."""

    def gram(self) -> tuple[FloatArray, int, float]:
        """(Fᵀ Ψ⁻¹ F of these rows, flat; the sample count it belongs to; the effective number of samples)."""

    def set_map(self, n_seen: int, transform: FloatArray) -> None:
        """Keep the map computed over every rank's rows for the queries at ``n_seen`` samples."""

    def query_engine(self, rank: int) -> Any:
        """The Rust engine that answers the collective queries (``query_sums``, ``draw_into``) for these rows."""


class CoreRows:
    """The rows of a Rust-core ``OnlineEM``/``OnlineSGA`` (host memory)."""

    def __init__(self, local: Any) -> None:
        self._local = local
        self.sums_keep_state = isinstance(local._core, _core.OnlineEMCore)  # SGA's pass moves the mean in place

    def lock(self) -> ContextManager[Any]:
        return contextlib.nullcontext()  # each core call holds the core's own lock

    def checked(self, X: ArrayLike) -> NDArray[Any]:
        x = local_matrix(X, self._local.n_features)
        self._local._core.check_batch(x)
        return x

    def sums(self, row: NDArray[Any]) -> FloatArray:
        s, u, dsq = self._local._core.local_sums(row)
        return np.concatenate([s.ravel(), u, [dsq]])

    def apply(self, total: FloatArray, n_components: int, n_total: int) -> None:
        k, local = n_components, self._local
        local._cache = local._provisional = None
        local._core.apply_sums(total[: k * k].reshape(k, k), total[k * k: k * k + k], float(total[-1]), n_total)

    def backup(self) -> Any:
        return self._local._core.get_state(), self._local._fixed_map

    def restore(self, backup: Any) -> None:
        state, fixed_map = backup
        self._local._restore(state)
        self._local._fixed_map = fixed_map

    def reports_map(self) -> bool:
        core = self._local._core
        return isinstance(core, _core.OnlineEMCore) and bool(core.shrink) and bool(core.is_fitted)

    def gram(self) -> tuple[FloatArray, int, float]:
        core = self._local._core
        return np.ascontiguousarray(core.gram(), dtype=np.float64).ravel(), int(core.n_seen), core.effective_samples

    def set_map(self, n_seen: int, transform: FloatArray) -> None:
        self._local._fixed_map = (n_seen, transform)

    def query_engine(self, rank: int) -> Any:
        return sharded_query_engine(self._local, rank)


def shard_rows(local: Any) -> RowStore:
    """The row store of a rank's local model: the Rust core's rows, or torch tensors on a device."""
    if hasattr(local, "_core"):
        return CoreRows(local)
    from ..torch._sharded import TensorRows  # a device model exists, so torch is importable

    return TensorRows(local)
