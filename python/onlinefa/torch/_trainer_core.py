"""What the trainer callbacks (:mod:`onlinefa.torch.lightning`, :mod:`onlinefa.torch.huggingface`) share: the
collection schedule, the posterior built when the network is first seen, the constant SWA learning rate,
the posterior as checkpoint bytes, and Bayesian model averaging at the end."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import torch

from .._validation import check_int, check_positive_float
from ..streaming import OnlineEM
from ._bma import bayesian_model_average
from ._collect import SnapshotCollector


class TrainerPosterior:
    """The posterior a trainer callback fits, and when it collects.

    Parameters
    ----------
    posterior : object or None
        Anything :class:`~onlinefa.torch.SnapshotCollector` feeds (``OnlineEM``, ``OnlineSGA``, ``SWAG``, ...);
        None: ``OnlineEM(D, n_components, seed=seed, dtype=dtype)`` built when training starts (D is the
        number of trainable parameters then).
    n_components, seed, dtype
        Of the default posterior.
    every_n_steps : int or None
        Collect after every ``every_n_steps``-th optimiser step; None: once at the end of each epoch.
    start_epoch : int
        First epoch (0-based) whose steps or end are collected.
    swa_lr : float or None
        From ``start_epoch`` on, every parameter group's learning rate is set to this constant before each
        step (SWAG's constant-rate phase; it overrides the trainer's scheduler there). None: untouched.
    asynchronous : bool
        Fit the snapshots on a worker thread (:class:`~onlinefa.torch.SnapshotCollector`); the posterior is
        complete whenever it is saved, read through :attr:`posterior`, or used by the BMA.
    """

    def __init__(self, posterior: object | None, *, n_components: int, seed: int, dtype: str,
                 every_n_steps: int | None, start_epoch: int, swa_lr: float | None, asynchronous: bool) -> None:
        self._posterior = posterior
        self.n_components = check_int(n_components, "n_components", 1)
        self.seed = seed
        self.dtype = dtype
        self.every_n_steps = None if every_n_steps is None else check_int(every_n_steps, "every_n_steps", 1)
        self.start_epoch = check_int(start_epoch, "start_epoch", 0)
        self.swa_lr = None if swa_lr is None else check_positive_float(swa_lr, "swa_lr")
        self.asynchronous = bool(asynchronous)
        self._collector: SnapshotCollector | None = None

    @property
    def posterior(self) -> object:
        """The fitted posterior (every snapshot taken so far applied); None before training starts."""
        if self._collector is not None:
            self._collector.flush()
        return self._posterior

    @property
    def n_snapshots(self) -> int:
        """Snapshots collected in this process (a resumed run counts from the resume)."""
        return 0 if self._collector is None else self._collector.n_snapshots

    def start(self, module: torch.nn.Module) -> None:
        """Build the default posterior for ``module`` if none was given or restored, and the collector."""
        parameters = [p for p in module.parameters() if p.requires_grad]
        if self._posterior is None:
            n_features = sum(p.numel() for p in parameters)
            self._posterior = OnlineEM(n_features, self.n_components, seed=self.seed, dtype=self.dtype)
        if self._collector is None:
            dtype = torch.float64 if self.dtype == "float64" else torch.float32
            self._collector = SnapshotCollector(self._posterior, parameters, dtype=dtype,
                                                asynchronous=self.asynchronous)

    def collects_after_step(self, epoch: int, global_step: int) -> bool:
        """Whether optimiser step ``global_step`` (1-based, counted over the whole run) of ``epoch`` is collected."""
        every = self.every_n_steps
        return every is not None and epoch >= self.start_epoch and global_step % every == 0

    def collects_after_epoch(self, epoch: int) -> bool:
        """Whether the end of ``epoch`` is collected."""
        return self.every_n_steps is None and epoch >= self.start_epoch

    def collect(self) -> None:
        """Feed the current parameters to the posterior."""
        if self._collector is None:
            raise RuntimeError("training has not started: the callback has no network yet")
        self._collector.collect()

    def set_swa_lr(self, epoch: int, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Set every parameter group's learning rate to ``swa_lr`` from ``start_epoch`` on."""
        if self.swa_lr is None or epoch < self.start_epoch:
            return
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = self.swa_lr

    def to_bytes(self) -> bytes:
        """The posterior as bytes (its class-tagged pickle: restored exactly by :meth:`restore`)."""
        return pickle.dumps(self.posterior, protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, data: bytes) -> None:
        """Continue from a posterior saved by :meth:`to_bytes` (before training starts)."""
        if self._collector is not None:
            raise RuntimeError("the posterior can only be restored before training starts")
        self._posterior = pickle.loads(data)

    def close(self) -> None:
        """Apply every snapshot taken and stop the collector's worker, if any."""
        if self._collector is not None:
            self._collector.close()

    def bayesian_model_average(self, module: torch.nn.Module, loader: Iterable[object], **options: Any
                               ) -> torch.Tensor:
        """:func:`onlinefa.torch.bayesian_model_average` of ``module`` under the fitted posterior."""
        posterior = self.posterior
        if posterior is None:
            raise RuntimeError("no posterior yet: train with the callback first")
        parameters = [p for p in module.parameters() if p.requires_grad]
        return bayesian_model_average(module, posterior, loader, parameters=parameters, **options)


#: The parameters of both trainer callbacks, for their docstrings.
CALLBACK_PARAMETERS = """
    Parameters
    ----------
    posterior : object, optional
        Anything :class:`~onlinefa.torch.SnapshotCollector` feeds (``OnlineEM``, ``OnlineSGA``, ``SWAG``,
        ...). Default: ``onlinefa.OnlineEM(D, n_components, seed=seed, dtype=dtype)``, built when training
        starts (D = the number of trainable parameters).
    n_components : int, default=20
        K of the default posterior (SWAG's rank).
    every_n_steps : int, optional
        Collect after every ``every_n_steps``-th optimiser step (counted over the whole run). Default: once at
        the end of each training epoch.
    start_epoch : int, default=0
        First epoch (0-based) collected.
    swa_lr : float, optional
        From ``start_epoch`` on, set every parameter group's learning rate to this constant before each step
        (SWAG's constant-rate phase; it overrides learning-rate schedulers there).
    dtype : {"float32", "float64"}, default="float32"
        State dtype of the default posterior and precision of the snapshots.
    seed : int, default=0
        Seed of the default posterior's initial loadings.
    asynchronous : bool, default=False
        Fit snapshots on a worker thread while training goes on (the posterior is complete whenever it is
        read, saved or used).
"""


class PosteriorCallbackBase:
    """The front both trainer callbacks share: construction, the posterior, the BMA."""

    def __init__(self, posterior: object | None = None, *, n_components: int = 20, every_n_steps: int | None = None,
                 start_epoch: int = 0, swa_lr: float | None = None, dtype: str = "float32", seed: int = 0,
                 asynchronous: bool = False) -> None:
        self._core = TrainerPosterior(posterior, n_components=n_components, seed=seed, dtype=dtype,
                                      every_n_steps=every_n_steps, start_epoch=start_epoch, swa_lr=swa_lr,
                                      asynchronous=asynchronous)

    @property
    def posterior(self) -> object:
        """The fitted posterior (None before training starts)."""
        return self._core.posterior

    @property
    def n_snapshots(self) -> int:
        """Snapshots collected by this callback (a resumed run counts from the resume)."""
        return self._core.n_snapshots

    def bayesian_model_average(self, module: torch.nn.Module, loader: Iterable[object], **options: Any
                               ) -> torch.Tensor:
        """Predictions of ``module`` averaged over posterior draws (:func:`onlinefa.torch.bayesian_model_average`,
        whose keyword arguments ``options`` are passed on)."""
        return self._core.bayesian_model_average(module, loader, **options)

