"""What the trainer callbacks (:mod:`onlinefa.torch.lightning`, :mod:`onlinefa.torch.huggingface`) share: the
collection schedule, the posterior built when the network is first seen, the constant SWA learning rate,
the posterior as checkpoint bytes, and Bayesian model averaging at the end."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from .._validation import check_int, check_positive_float
from ..errors import PosteriorResumeError
from ..streaming import OnlineEM
from ._bma import bayesian_model_average, refresh_batch_norm
from ._params import ParameterVector
from ._posterior import gaussian_parameters
from ._collect import SnapshotCollector
from ._trainer_store import SavedPosterior

_DTYPES = ("float32", "float64")
_ON_MISSING = ("raise", "warn")
_ON_MISMATCH = ("raise", "reset")


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def network_dtype(parameters: Iterable[torch.Tensor]) -> str:
    """The state dtype that follows a network's: "float64" for float64 parameters, else "float32"."""
    return "float64" if any(p.dtype == torch.float64 for p in parameters) else "float32"


class TrainerPosterior:
    """The posterior a trainer callback fits, and when it collects.

    Parameters
    ----------
    posterior : object or None
        Anything :class:`~onlinefa.torch.SnapshotCollector` feeds (``OnlineEM``, ``OnlineSGA``, ``SWAG``, ...);
        None: ``OnlineEM(D, n_components, seed=seed, dtype=dtype)`` built when training starts (D is the
        number of trainable parameters then; ``dtype`` None: :func:`network_dtype` of those parameters).
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
    on_missing : {"raise", "warn"}
        A resumed run whose checkpoint holds no posterior: refuse, or warn and start an empty one.
    on_mismatch : {"raise", "reset"}
        A checkpoint's posterior fitted with other settings than the callback's: refuse, or drop it and start
        a new one.
    """

    def __init__(self, posterior: object | None, *, n_components: int, seed: int, dtype: str | None,
                 every_n_steps: int | None, start_epoch: int, swa_lr: float | None, asynchronous: bool,
                 on_missing: str = "raise", on_mismatch: str = "raise",
                 parameters: Callable[[torch.nn.Module], Iterable[torch.Tensor]] | None = None,
                 anneal_epochs: int = 0, swa_weights: bool = False) -> None:
        if parameters is not None and not callable(parameters):
            raise TypeError("parameters must be a function of the module giving its tensors to model, e.g. "
                            f"lambda module: module.head.parameters(); got {type(parameters).__name__}")
        self._select = parameters
        self.anneal_epochs = check_int(anneal_epochs, "anneal_epochs", 0)
        if self.anneal_epochs and swa_lr is None:
            raise ValueError("anneal_epochs needs swa_lr (the rate annealed to)")
        self.swa_weights = bool(swa_weights)
        self._anneal_from: list[float] | None = None
        self._posterior = posterior
        self._given_class = None if posterior is None else type(posterior)
        self.n_components = check_int(n_components, "n_components", 1)
        self.seed = seed
        self.dtype = None if dtype is None else _check_choice(dtype, "dtype", _DTYPES)
        self.on_missing = _check_choice(on_missing, "on_missing", _ON_MISSING)
        self.on_mismatch = _check_choice(on_mismatch, "on_mismatch", _ON_MISMATCH)
        self._last_step: int | None = None
        self._step_end: float | None = None
        self._step_seconds: list[float] = []
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
    def last_step(self) -> int:
        """The last optimiser step seen (0 before training)."""
        return self._last_step or 0

    @property
    def n_snapshots(self) -> int:
        """Snapshots collected in this process (a resumed run counts from the resume)."""
        return 0 if self._collector is None else self._collector.n_snapshots

    def start(self, module: torch.nn.Module, global_step: int = 0) -> None:
        """Build the default posterior for ``module`` if none was given or restored, and the collector;
        ``global_step``: the optimiser steps taken before (a resumed run's), none of which is collected."""
        self._last_step = global_step
        parameters = self.parameters_of(module)
        dtype = self.dtype or network_dtype(parameters)
        if self._posterior is not None and self._given_class is None and self.dtype is None:
            self._check_restored_dtype(dtype)
        if self._posterior is None:
            n_features = sum(p.numel() for p in parameters)
            self._posterior = OnlineEM(n_features, self.n_components, seed=self.seed, dtype=dtype)
        if self._collector is None:
            snapshot_dtype = torch.float64 if dtype == "float64" else torch.float32
            self._collector = SnapshotCollector(self._posterior, parameters, dtype=snapshot_dtype,
                                                asynchronous=self.asynchronous)

    def _check_restored_dtype(self, dtype: str) -> None:
        """A restored default posterior whose dtype is not the network's (``dtype=None``): ``on_mismatch``."""
        restored = getattr(self._posterior, "dtype", dtype)
        if restored == dtype:
            return
        if self.on_mismatch == "raise":
            raise PosteriorResumeError(
                f"the checkpoint's posterior has dtype={restored!r}, but the network's parameters ask for {dtype!r}: "
                f"pass dtype={restored!r} to resume it, or on_mismatch='reset' to start a new posterior")
        self._posterior = None

    def parameters_of(self, module: torch.nn.Module) -> list[torch.Tensor]:
        """The tensors the posterior covers: those of ``parameters(module)``, or every trainable one."""
        if self._select is None:
            return [p for p in module.parameters() if p.requires_grad]
        chosen = list(self._select(module))
        if not chosen or not all(isinstance(t, torch.Tensor) for t in chosen):
            raise ValueError("parameters(module) must give one or more tensors of the module")
        return chosen

    def collects_after_step(self, epoch: int, global_step: int) -> bool:
        """Whether optimiser step ``global_step`` (1-based, counted over the whole run) of ``epoch`` is collected.

        Called after every batch: a step already seen (a batch that only accumulated gradients, or the
        first batches before any step) is never collected, so each optimiser step counts once."""
        if global_step == self._last_step:
            return False
        self._last_step = global_step
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

    def step_ended(self, before_snapshot: float, after_snapshot: float) -> None:
        """Mark the end of an optimiser step, before and after its snapshot (the same time without one;
        seconds), for :attr:`snapshot_cost_in_steps`: a step lasts from the previous step's end (after its
        snapshot) to this one's before the snapshot."""
        if self._step_end is not None:
            self._step_seconds.append(before_snapshot - self._step_end)
        self._step_end = after_snapshot

    @property
    def snapshot_cost_in_steps(self) -> float:
        """Median seconds a snapshot costs the training loop over the median seconds of a training step
        without one (NaN before a snapshot and two steps)."""
        if self._collector is None or not self._step_seconds or not self._collector.n_snapshots:
            return float("nan")
        return self._collector.seconds_per_snapshot / statistics.median(self._step_seconds)

    def metrics(self) -> dict[str, float]:
        """What the callbacks log through the trainer: the snapshot count and a snapshot's cost in steps."""
        return {"onlinefa/n_snapshots": float(self.n_snapshots),
                "onlinefa/snapshot_cost_in_steps": self.snapshot_cost_in_steps}

    def set_swa_lr(self, epoch: int, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """From ``start_epoch`` on, set every parameter group's learning rate to ``swa_lr``, annealed over the
        first ``anneal_epochs`` epochs from the rate the group had when ``start_epoch`` began (a cosine, as
        ``torch.optim.swa_utils.SWALR``): epoch ``start_epoch + i`` trains at α·swa_lr + (1 − α)·lr₀ with
        α = (1 − cos(π (i + 1) / anneal_epochs)) / 2, so ``swa_lr`` itself from epoch
        ``start_epoch + anneal_epochs − 1`` on."""
        if self.swa_lr is None or epoch < self.start_epoch:
            return
        groups = [group for optimizer in optimizers for group in optimizer.param_groups]
        if self._anneal_from is None or len(self._anneal_from) != len(groups):
            self._anneal_from = [float(group["lr"]) for group in groups]
        step = epoch - self.start_epoch + 1
        alpha = 1.0 if step >= self.anneal_epochs else (1.0 - math.cos(math.pi * step / self.anneal_epochs)) / 2.0
        for group, start in zip(groups, self._anneal_from):
            group["lr"] = alpha * self.swa_lr + (1.0 - alpha) * start

    @property
    def anneal_from(self) -> list[float] | None:
        """The learning rates the annealing started from (saved with the posterior), or None before."""
        return self._anneal_from

    def resume_annealing(self, rates: list[float] | None) -> None:
        """Continue an annealing that started from ``rates`` (read from a checkpoint)."""
        self._anneal_from = None if rates is None else [float(r) for r in rates]

    def finish(self, module: torch.nn.Module, loader: Iterable[object] | None) -> None:
        """Apply every snapshot, stop the collector; with ``swa_weights``, leave the posterior's mean (the
        SWA weights) in the module, with the batch-norm statistics recomputed over ``loader``."""
        self.close()
        if not self.swa_weights or self._posterior is None:
            return
        vector = ParameterVector(self.parameters_of(module))
        mean = torch.as_tensor(np.array(gaussian_parameters(self._posterior).mean), dtype=vector.dtype)
        vector.assign(mean.to(vector.device))
        if loader is not None:
            refresh_batch_norm(module, loader)

    def restore(self, saved: SavedPosterior, source: str) -> None:
        """Continue from a posterior read from ``source`` (before training starts), after checking that it
        was fitted with this callback's settings (``on_mismatch``)."""
        if self._collector is not None:
            raise RuntimeError("the posterior can only be restored before training starts")
        self.resume_annealing(saved.anneal_from)
        problem = self._mismatch(saved.posterior)
        if problem is None:
            self._posterior = saved.posterior
        elif self.on_mismatch == "raise":
            raise PosteriorResumeError(
                f"{source} holds a posterior fitted with other settings than this callback's ({problem}): "
                "resume with the checkpoint's settings, or pass on_mismatch='reset' to start a new posterior")

    def _mismatch(self, restored: object) -> str | None:
        """What differs between a restored posterior and this callback's settings, or None."""
        if self._given_class is not None:
            if type(restored) is not self._given_class:
                return f"a {type(restored).__name__}, not the {self._given_class.__name__} given"
            return None
        if not isinstance(restored, OnlineEM):
            return f"a {type(restored).__name__}, not the default OnlineEM"
        if restored.n_components != self.n_components:
            return f"n_components={restored.n_components}, not {self.n_components}"
        if self.dtype is not None and restored.dtype != self.dtype:  # None: checked against the network at start
            return f"dtype={restored.dtype!r}, not {self.dtype!r}"
        return None

    def missing(self, reason: str) -> None:
        """A resumed run without its posterior: :class:`PosteriorResumeError`, or a warning (``on_missing``)."""
        if self.on_missing == "raise":
            raise PosteriorResumeError(f"{reason}; pass on_missing='warn' to go on with an empty posterior")
        warnings.warn(f"{reason}: the posterior starts empty here", UserWarning, stacklevel=2)

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
        return bayesian_model_average(module, posterior, loader, parameters=self.parameters_of(module), **options)


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
    dtype : {"float32", "float64"}, optional
        State dtype of the default posterior and precision of the snapshots. Default: the network's, i.e.
        "float64" when the covered parameters are float64 and "float32" otherwise (float32, bfloat16 and
        float16 weights); a resumed posterior of the other dtype is then a mismatch (``on_mismatch``).
    seed : int, default=0
        Seed of the default posterior's initial loadings.
    asynchronous : bool, default=False
        Fit snapshots on a worker thread while training goes on (the posterior is complete whenever it is
        read, saved or used).
    on_missing : {"raise", "warn"}, default="raise"
        A run resumed from a checkpoint that holds no posterior of this callback (written without it, or
        damaged): raise :class:`~onlinefa.errors.PosteriorResumeError`, or warn and go on with an empty one.
    on_mismatch : {"raise", "reset"}, default="raise"
        A checkpoint's posterior fitted with other settings (another ``n_components`` or ``dtype``, another
        class than the ``posterior`` given): raise :class:`~onlinefa.errors.PosteriorResumeError`, or drop
        it and start a new posterior with this callback's settings.
    parameters : callable, optional
        ``parameters(module)`` gives the tensors the posterior covers, e.g.
        ``lambda module: module.head.parameters()`` for the last layer (the others keep their trained
        values in the BMA). Default: every tensor with ``requires_grad``.
    anneal_epochs : int, default=0
        Anneal the learning rate to ``swa_lr`` over this many epochs from ``start_epoch`` (a cosine from
        each group's rate then, as ``torch.optim.swa_utils.SWALR``); 0: jump to ``swa_lr`` at once.
    swa_weights : bool, default=False
        At the end of training leave the posterior's mean (the SWA weights) in the module, with the
        batch-norm statistics recomputed over the training data (as Lightning's ``StochasticWeightAveraging``).
"""


class PosteriorCallbackBase:
    """The front both trainer callbacks share: construction, the posterior, the BMA."""

    def __init__(self, posterior: object | None = None, *, n_components: int = 20, every_n_steps: int | None = None,
                 start_epoch: int = 0, swa_lr: float | None = None, dtype: str | None = None, seed: int = 0,
                 asynchronous: bool = False, on_missing: str = "raise", on_mismatch: str = "raise",
                 parameters: Callable[[torch.nn.Module], Iterable[torch.Tensor]] | None = None,
                 anneal_epochs: int = 0, swa_weights: bool = False) -> None:
        self._core = TrainerPosterior(posterior, n_components=n_components, seed=seed, dtype=dtype,
                                      every_n_steps=every_n_steps, start_epoch=start_epoch, swa_lr=swa_lr,
                                      asynchronous=asynchronous, on_missing=on_missing, on_mismatch=on_mismatch,
                                      parameters=parameters, anneal_epochs=anneal_epochs, swa_weights=swa_weights)

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

