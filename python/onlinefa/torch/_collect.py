"""Feeding SGD iterates to a streaming posterior from a training loop: :class:`SnapshotCollector`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._validation import check_int
from ._params import ParameterVector

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SnapshotCollector"]


class SnapshotCollector:
    """Stream the parameter vector of a module into a posterior, SWAG-style.

    Each snapshot gathers θ (a fresh copy, :meth:`ParameterVector.numpy`) and calls
    ``posterior.update(θ)`` (``posterior.partial_fit(θ[None])`` for a scikit-learn style estimator).

    Parameters
    ----------
    posterior : OnlineEM, OnlineSGA, SWAG, OnlineFactorAnalysis, ...
        Anything with ``update(vector)`` or ``partial_fit(matrix)``.
    module_or_parameters : torch.nn.Module or iterable of torch.Tensor
        Whose parameters form θ (``module.parameters()`` order).
    every : int, default=1
        With :meth:`attach`, collect after every ``every``-th optimiser step (steps every, 2·every, ...).
    dtype : torch.dtype, default=torch.float32
        Precision of the snapshots handed to the posterior: float64 gives float64 arrays, anything else
        float32.

    Raises
    ------
    TypeError
        ``posterior`` has neither ``update`` nor ``partial_fit``; bad parameters (see
        :class:`ParameterVector`).
    ValueError
        ``every`` < 1.

    Examples
    --------
    ::

        em = onlinefa.OnlineEM(D, 20, seed=0, dtype="float32")
        with SnapshotCollector(em, net, every=10).attach(opt) as collector:
            train(net, opt)                   # every 10th opt.step() feeds em
        collector.n_snapshots, collector.seconds_per_snapshot
    """

    def __init__(
        self,
        posterior: object,
        module_or_parameters: torch.nn.Module | Iterable[torch.Tensor],
        *,
        every: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not (callable(getattr(posterior, "update", None)) or callable(getattr(posterior, "partial_fit", None))):
            raise TypeError(f"the posterior must have update() or partial_fit(), got {type(posterior).__name__}")
        self._every = check_int(every, "every", 1)
        self._vector = ParameterVector(module_or_parameters, dtype=dtype)
        self._posterior = posterior
        self._handle: Any = None
        self._n_steps = 0
        self._seconds: list[float] = []

    @property
    def posterior(self) -> object:
        """The model the snapshots are fed to."""
        return self._posterior

    @property
    def parameter_vector(self) -> ParameterVector:
        """The flat view of the collected parameters."""
        return self._vector

    @property
    def every(self) -> int:
        """Optimiser steps between snapshots when attached."""
        return self._every

    @property
    def n_steps(self) -> int:
        """Optimiser steps seen through the hook since :meth:`attach` was first called."""
        return self._n_steps

    @property
    def n_snapshots(self) -> int:
        """Snapshots fed to the posterior so far."""
        return len(self._seconds)

    @property
    def seconds_per_snapshot(self) -> float:
        """Median wall-clock seconds of a snapshot (gather + posterior update); NaN before the first."""
        return statistics.median(self._seconds) if self._seconds else float("nan")

    @property
    def attached(self) -> bool:
        """Whether an optimiser hook is registered."""
        return self._handle is not None

    def collect(self) -> None:
        """Feed the current parameters to the posterior now (e.g. at the end of an epoch).

        Raises
        ------
        RuntimeError
            A layer of the module was replaced, added or removed since the collector was made (the
            posterior is not updated): make a new collector for the changed module.
        """
        start = time.perf_counter()
        theta = self._vector.numpy()
        update = getattr(self._posterior, "update", None)
        if callable(update):
            update(theta)
        else:
            getattr(self._posterior, "partial_fit")(theta[np.newaxis, :])
        self._seconds.append(time.perf_counter() - start)

    def attach(self, optimizer: torch.optim.Optimizer) -> Self:
        """Collect after every ``every``-th ``optimizer.step()`` (``Optimizer.register_step_post_hook``).

        Parameters
        ----------
        optimizer : torch.optim.Optimizer

        Returns
        -------
        self

        Raises
        ------
        TypeError
            Not an optimizer.
        RuntimeError
            Already attached (call :meth:`detach` first).
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if self._handle is not None:
            raise RuntimeError("this collector is already attached to an optimizer; detach() it first")
        self._handle = optimizer.register_step_post_hook(self._after_step)
        return self

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._n_steps += 1
        if self._n_steps % self._every == 0:
            self.collect()

    def detach(self) -> None:
        """Remove the optimiser hook (nothing happens when not attached)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.detach()

    def __repr__(self) -> str:
        return (
            f"SnapshotCollector(posterior={type(self._posterior).__name__}, n_features={len(self._vector)}, "
            f"every={self._every}, n_snapshots={self.n_snapshots}, attached={self.attached})"
        )
