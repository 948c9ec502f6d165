"""Feeding SGD iterates to a streaming posterior from a training loop: :class:`SnapshotCollector`."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._core import limit_update_threads
from .._validation import check_int
from ..errors import SlowCollectionWarning
from ._feeder import BackgroundFeeder
from ._torch_model import TorchStreamingModel
from ._params import ParameterVector

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SlowCollectionWarning", "SnapshotCollector"]

#: Snapshots taken before the cost of a snapshot is compared with the training step (medians need a few).
_WARN_AFTER = 3
#: Snapshots cheaper than this (seconds) never warn, whatever the step costs: nobody notices them.
_WARN_MIN_SECONDS = 0.005



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
    asynchronous : bool, default=False
        False: each snapshot is gathered and fitted before the training loop goes on. True: the training
        thread only copies θ into one of ``n_buffers`` reusable buffers, and a worker thread fits the
        snapshots in order while the next steps run (the updates release the GIL). The posterior ends
        exactly as with ``asynchronous=False`` once :meth:`flush` (or :meth:`detach`, :meth:`close`, the
        end of a ``with`` block) returns. When every buffer is waiting, the next snapshot waits for the
        worker (memory stays at ``n_buffers`` snapshots). An error of the posterior is raised on the
        training thread by the next :meth:`collect`, :meth:`flush` or :meth:`detach`; snapshots taken after
        the failing one are then not applied. Reading the posterior while the worker runs gives a
        consistent state of some prefix of the snapshots; :meth:`flush` first for all of them.
    n_buffers : int, default=2
        Snapshots in flight at most with ``asynchronous=True`` (>= 1).
    worker_threads : int or None, default=1
        Threads of the worker's ``OnlineEM`` / ``OnlineSGA`` updates with ``asynchronous=True`` (results do
        not depend on it). 1 leaves the other cores to training (on 2 cores, K = 20, a snapshot every 40
        steps: 0.97× the loop's time without collection against 1.28× with updates on both cores;
        ``benches/collector.py``, docs/performance.md). None: every core.

    Raises
    ------
    TypeError
        ``posterior`` has neither ``update`` nor ``partial_fit``; bad parameters (see
        :class:`ParameterVector`).
    ValueError
        ``every``, ``n_buffers`` or ``worker_threads`` < 1.

    Warns
    -----
    SlowCollectionWarning
        Once, when attached: after a few snapshots, if the median cost of a snapshot to the training loop
        is more than one training step (:attr:`snapshot_cost_in_steps`) and at least 5 ms, suggesting
        ``asynchronous=True`` or a larger ``every``.

    Examples
    --------
    ::

        em = onlinefa.OnlineEM(D, 20, seed=0, dtype="float32")
        with SnapshotCollector(em, net, every=10).attach(opt) as collector:
            train(net, opt)                   # every 10th opt.step() feeds em
        collector.n_snapshots, collector.seconds_per_snapshot, collector.snapshot_cost_in_steps

        with SnapshotCollector(em, net, every=10, asynchronous=True).attach(opt):
            train(net, opt)                   # em is fitted in the background; complete after the block
    """

    def __init__(
        self,
        posterior: object,
        module_or_parameters: torch.nn.Module | Iterable[torch.Tensor],
        *,
        every: int = 1,
        dtype: torch.dtype = torch.float32,
        asynchronous: bool = False,
        n_buffers: int = 2,
        worker_threads: int | None = 1,
    ) -> None:
        if not (callable(getattr(posterior, "update", None)) or callable(getattr(posterior, "partial_fit", None))):
            raise TypeError(f"the posterior must have update() or partial_fit(), got {type(posterior).__name__}")
        if not isinstance(asynchronous, bool):
            raise TypeError(f"asynchronous must be a bool, got {type(asynchronous).__name__}")
        self._every = check_int(every, "every", 1)
        self._n_buffers = check_int(n_buffers, "n_buffers", 1)
        self._worker_threads = 0 if worker_threads is None else check_int(worker_threads, "worker_threads", 1)
        self._vector = ParameterVector(module_or_parameters, dtype=dtype)
        self._posterior = posterior
        self._asynchronous = asynchronous
        self._feeder: BackgroundFeeder | None = None
        self._handle: Any = None
        self._last_step_end: float | None = None
        self._n_steps = 0
        self._seconds: list[float] = []
        self._step_seconds: list[float] = []
        self._warned = False

    #: The clock snapshots and steps are timed with (seconds; replaced on an instance to test the warning
    #: with an injected cost instead of this machine's speed).
    _clock: Callable[[], float] = staticmethod(time.perf_counter)

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
        """Snapshots taken so far (with ``asynchronous=True``: handed to the worker; all are fitted once
        :meth:`flush` returns)."""
        return len(self._seconds)

    @property
    def seconds_per_snapshot(self) -> float:
        """Median wall-clock seconds a snapshot costs the caller (gather + posterior update; with
        ``asynchronous=True`` the copy of θ and any wait for a free buffer); NaN before the first."""
        return statistics.median(self._seconds) if self._seconds else float("nan")

    @property
    def asynchronous(self) -> bool:
        """Whether snapshots are fitted by a worker thread."""
        return self._asynchronous

    @property
    def step_seconds(self) -> float:
        """Median wall-clock seconds of a training step while attached: from the end of one
        ``optimizer.step()`` (and of the snapshot taken there, if any) to the end of the next, so the
        forward and backward passes count and the snapshots do not; NaN before two steps."""
        return statistics.median(self._step_seconds) if self._step_seconds else float("nan")

    @property
    def snapshot_cost_in_steps(self) -> float:
        """:attr:`seconds_per_snapshot` / :attr:`step_seconds`: what a snapshot costs the training loop, in
        training steps (with ``asynchronous=True`` the copy of θ and any wait for a free buffer)."""
        return self.seconds_per_snapshot / self.step_seconds if self._step_seconds else float("nan")

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
        start = self._clock()
        if self._asynchronous:
            feeder = self._background()
            buffer = feeder.acquire()
            try:
                self._vector.numpy(out=buffer)
            except BaseException:
                feeder.release(buffer)
                raise
            feeder.submit(buffer)
        elif isinstance(self._posterior, TorchStreamingModel):
            self._posterior.update(self._vector.gather())  # θ stays on its device: no host copy
        else:
            self._apply(self._vector.numpy())
        self._seconds.append(self._clock() - start)

    def _apply(self, theta: np.ndarray) -> None:
        update = getattr(self._posterior, "update", None)
        if callable(update):
            update(theta)
        else:
            getattr(self._posterior, "partial_fit")(theta[np.newaxis, :])

    def _background(self) -> BackgroundFeeder:
        if self._feeder is None:
            dtype = np.float64 if self._vector.dtype == torch.float64 else np.float32
            threads = self._worker_threads
            self._feeder = BackgroundFeeder(self._apply, (len(self._vector),), dtype, self._n_buffers,
                                            on_start=lambda: limit_update_threads(threads))
        return self._feeder

    def flush(self) -> None:
        """Wait until every snapshot taken is fitted (``asynchronous=True``; otherwise nothing to do).

        Raises
        ------
        Exception
            The error a background update raised, if any (the snapshots taken after it were not applied).
        """
        if self._feeder is not None:
            self._feeder.flush()

    def close(self) -> None:
        """:meth:`detach`, then stop the worker thread (a later :meth:`collect` starts a new one)."""
        try:
            self.detach()
        finally:
            feeder, self._feeder = self._feeder, None
            if feeder is not None:
                feeder.close()

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
        self._last_step_end = None
        return self

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._last_step_end is not None:
            self._step_seconds.append(self._clock() - self._last_step_end)
        self._n_steps += 1
        if self._n_steps % self._every == 0:
            self.collect()
            self._warn_if_slow()
        self._last_step_end = self._clock()

    def _warn_if_slow(self) -> None:
        if self._warned or len(self._seconds) < _WARN_AFTER or not self.snapshot_cost_in_steps > 1.0:
            return
        if self.seconds_per_snapshot < _WARN_MIN_SECONDS:
            return
        self._warned = True
        advice = "collect less often (a larger every)" if self._asynchronous else "pass asynchronous=True"
        warnings.warn(
            f"a snapshot costs the training loop {self.snapshot_cost_in_steps:.1f} training steps "
            f"({self.seconds_per_snapshot * 1e3:.1f} ms against {self.step_seconds * 1e3:.2f} ms per step; "
            f"every={self._every}); {advice}",
            SlowCollectionWarning,
            stacklevel=2,
        )

    def detach(self) -> None:
        """Remove the optimiser hook (nothing happens when not attached), then :meth:`flush`."""
        if self._handle is not None:
            self._handle.remove()
        self._handle = self._last_step_end = None
        self.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SnapshotCollector(posterior={type(self._posterior).__name__}, n_features={len(self._vector)}, "
            f"every={self._every}, asynchronous={self._asynchronous}, n_snapshots={self.n_snapshots}, "
            f"attached={self.attached})"
        )
