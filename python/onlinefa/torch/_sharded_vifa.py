"""The rows of a device VIFA (torch tensors) as a sharded VIFA drives them.

``onlinefa.distributed.ShardedVIFA(..., device=...)`` keeps each rank's rows in a device :class:`onlinefa.VIFA`;
the sharded step is the same for every row store (``onlinefa.distributed._vifa``), and :class:`TensorVifaRows`
is this store's part of it. Its local step changes nothing until ``finish``, so a failed step needs no copy.
"""

from __future__ import annotations

from typing import Any, ContextManager

import numpy as np
import torch

from ..errors import NumericalBreakdownError
from ._vifa_model import VIFA


class TensorVifaRows:
    """A device VIFA's rows: its engine's three phases of a step and its lock."""

    local_step_changes_state = False

    def __init__(self, local: VIFA) -> None:
        self._local = local

    def lock(self) -> ContextManager[Any]:
        lock: ContextManager[Any] = self._local._lock
        return lock

    def checked(self, grad: Any) -> torch.Tensor:
        return self._local._checked_gradients(grad)

    def norms(self, grads: torch.Tensor) -> list[float] | None:
        norms: list[float] | None = self._local._engine.local_gradient_norms(grads)
        return norms

    def local_step(self, grads: torch.Tensor, sq_norms: list[float] | None) -> tuple[Any, np.ndarray, bool]:
        state, gram = self._local._engine.local_step(grads, sq_norms)
        return state, gram.numpy().ravel(), True

    def finish(self, pending: Any, gram: np.ndarray, finite: bool) -> None:
        if not finite:
            raise NumericalBreakdownError("the VIFA step made a parameter non-finite on another rank: lower the "
                                          "learning rates or set clip_grad_norm; this rank's model is as before")
        engine = self._local._engine
        whole = torch.as_tensor(np.asarray(gram).reshape(engine.settings.n_components, -1))
        if pending is None:  # the current parameters: only their (I + B)⁻¹
            engine.refresh_m_inv(whole)
        else:
            engine.finish_step(pending, whole)

    def gram(self) -> np.ndarray:
        gram: np.ndarray = self._local._engine.gram().numpy().ravel()
        return gram

    def backup(self) -> Any:
        raise NotImplementedError("a device VIFA's local step changes nothing: no copy is needed")

    def restore(self, backup: Any) -> None:
        raise NotImplementedError("a device VIFA's local step changes nothing: no copy is needed")

    def row_offset(self) -> int:
        return int(self._local._engine.row_offset)

    def query_engine(self, gram: np.ndarray) -> Any:
        """The collective queries run on a host copy of these rows, with the whole model's (I + B)⁻¹."""
        host = self._local.to_numpy()
        host._core.finish_step(np.asarray(gram).reshape(self._local.n_components, -1), True)
        return host._core
