"""The rows of a device model (torch tensors) as a sharded streaming model drives them.

``onlinefa.distributed.ShardedOnlineEM(..., device=...)`` and ``ShardedOnlineSGA`` keep each rank's rows in a
device model (:class:`onlinefa.OnlineEM` with ``device=``); the sharded update loop is the same for every row
store (``onlinefa.distributed._rows``), and :class:`TensorRows` is this store's part of it.
"""

from __future__ import annotations

import copy
from typing import Any, ContextManager

import numpy as np
import torch

from ..errors import NotFittedError
from ..streaming import sharded_query_engine
from ._online_em import OnlineEM
from ._torch_model import TorchStreamingModel, factor_gram


class TensorRows:
    """A device ``OnlineEM``/``OnlineSGA``'s rows: its engine's two halves of a step, its lock, its copies."""

    #: The torch engines' first half keeps the state (the new rows wait for the second half).
    sums_keep_state = True

    def __init__(self, local: TorchStreamingModel) -> None:
        self._local = local

    def lock(self) -> ContextManager[Any]:
        lock: ContextManager[Any] = self._local._lock
        return lock

    def checked(self, X: Any) -> torch.Tensor:
        return self._local._checked_batch(X)

    def sums(self, row: torch.Tensor) -> np.ndarray:
        s, u, dsq = self._local._engine.local_sums(row)
        return np.concatenate([s.numpy().ravel(), u.numpy(), [dsq]])

    def apply(self, total: np.ndarray, n_components: int, n_total: int) -> None:
        k = n_components
        self._local._engine.apply_sums(torch.as_tensor(total[: k * k].reshape(k, k)),
                                       torch.as_tensor(total[k * k: k * k + k]), float(total[-1]), n_total)

    def backup(self) -> Any:
        return copy.deepcopy(self._local._engine), self._local._fixed_map

    def restore(self, backup: Any) -> None:
        self._local._engine, self._local._fixed_map = backup

    def _answering(self) -> Any:
        """The engine whose Gaussian is reported (during warm-up its copy ended at the last sample), or None."""
        local = self._local
        if not isinstance(local, OnlineEM) or not local._engine.settings.shrink:
            return None
        try:
            return local._answering()
        except NotFittedError:  # decided by the shared state: the same on every rank
            return None

    def reports_map(self) -> bool:
        return self._answering() is not None

    def gram(self) -> tuple[np.ndarray, int, float]:
        engine = self._answering()
        f, psi = engine.fitted_rows(engine.applied_a_bar())
        return factor_gram(f, psi).ravel(), int(engine.n_seen), float(engine.effective_samples())

    def set_map(self, n_seen: int, transform: np.ndarray) -> None:
        self._local._fixed_map = (n_seen, transform)

    def query_engine(self, rank: int) -> Any:
        """The collective queries run on a host copy of these rows (one copy per query)."""
        host = self._local.to_numpy()
        host._fixed_map = self._local._fixed_map
        return sharded_query_engine(host, rank)
