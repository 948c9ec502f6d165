"""``onlinefa.distributed.ShardedVIFA`` with ``device=``: the device VIFA with its D rows split across processes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from .. import distributed
from ..distributed._comm import AllReduce, Communicator, exchange
from ..distributed._layout import ShardLayout
from ..distributed._vifa import build_local_vifa
from ._vifa_engine import VIFAEngine, precision_inverse
from ._vifa_model import VIFA


class ShardedVIFA:
    """:class:`onlinefa.VIFA` (``device=``) with its D rows split across processes, each shard on its own device.

    The parameters are those of :class:`onlinefa.distributed.ShardedVIFA` (``n_features`` is this rank's number
    of rows; the initial loadings are the single-process model's rows), plus ``device``, which may differ between
    ranks. A training draw needs no communication (h is keyed by the shared seed and draw index, z by the draw
    and the shard's first global row); :meth:`step` takes two small collectives, the clipping norms (3 numbers)
    and B = Fᵀ Ψ⁻¹ F of the new parameters (K²). Invalid gradients or a diverging step on any rank raise on
    every rank and change nothing anywhere (a rank's new state is adopted only after both collectives).
    """

    def __init__(self, n_features: int, n_components: int, *, group: Any = None, allreduce: AllReduce | None = None,
                 rank: int | None = None, world_size: int | None = None, init: ArrayLike | None = None,
                 seed: int | None = None, init_mean: ArrayLike | None = None,
                 init_noise_variance: ArrayLike | None = None, device: str | torch.device = "cpu",
                 **options: Any) -> None:
        self._comm = Communicator(allreduce, group=group, rank=rank, world_size=world_size)
        # the start (options agreed, the single-process model's rows) from the host model, then on the device
        self._layout, start = build_local_vifa(self._comm, n_features, n_components, init, seed, init_mean,
                                               init_noise_variance, options)
        self._local = VIFA.from_numpy(start, device=device)
        engine: VIFAEngine = self._local._engine
        self._k = engine.settings.n_components
        gram = self._comm.sum(engine.gram().numpy().ravel(), "B = Fᵀ Ψ⁻¹ F")
        engine.m_inv = precision_inverse(torch.as_tensor(gram.reshape(self._k, self._k)))

    @property
    def layout(self) -> ShardLayout:
        """Row ranges of every rank."""
        return self._layout

    @property
    def local_model(self) -> VIFA:
        """This rank's rows as a device :class:`onlinefa.VIFA` (its (I + B)⁻¹ is the whole model's)."""
        return self._local

    @property
    def n_steps(self) -> int:
        """Optimiser steps applied so far (the same on every rank)."""
        return self._local.n_steps

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's rows of (c, F, ψ) on its device."""
        return self._local.snapshot()

    def sample(self) -> torch.Tensor:
        """The training draw of this rank's rows (local), remembered for :meth:`step`."""
        return self._local.sample()

    def step(self, grad: Any) -> "ShardedVIFA":
        """One optimiser step from this rank's slice of the gradients at the pending draws (collective).

        Raises
        ------
        ValueError, RuntimeError
            Invalid gradients or call order on any rank: every rank raises, none changes.
        onlinefa.NumericalBreakdownError
            The step would make a parameter non-finite on some rank: every rank raises, none changes.
        """
        with self._local._lock:
            return self._step_locked(grad)

    def _step_locked(self, grad: Any) -> "ShardedVIFA":
        engine: VIFAEngine = self._local._engine
        failure: BaseException | None = None
        g, norms = None, None
        try:
            g = self._local._checked_gradients(grad)
            norms = engine.local_gradient_norms(g)
        except Exception as err:
            failure = err
        clip = engine.settings.clip_grad_norm is not None
        total, _ = exchange(self._comm, failure, None if norms is None else np.asarray(norms), 3, what="step")
        failure, payload, state = None, np.zeros(self._k * self._k), None
        try:
            assert g is not None  # every rank's gradients passed the check above
            state, gram = engine.local_step(g, [float(v) for v in total] if clip else None)
            payload = gram.numpy().ravel()
        except Exception as err:
            failure = err
        summed, _ = exchange(self._comm, failure, payload, self._k * self._k, what="step (B = Fᵀ Ψ⁻¹ F)")
        assert state is not None
        engine.finish_step(state, torch.as_tensor(summed.reshape(self._k, self._k)))
        return self


# ``onlinefa.distributed.ShardedVIFA(..., device=...)`` builds this class; it is that class to ``isinstance``.
distributed.ShardedVIFA.register(ShardedVIFA)
