"""A PyTorch Lightning callback that fits an onlinefa posterior to the weights a training run visits.

Needs the ``lightning`` extra (``pip install ".[lightning]"``). Example::

    from onlinefa.torch.lightning import PosteriorCallback

    swag = PosteriorCallback(n_components=20, start_epoch=10, swa_lr=0.01)
    trainer = lightning.pytorch.Trainer(max_epochs=30, callbacks=[swag])
    trainer.fit(model, train_loader)
    probabilities = swag.bayesian_model_average(model, test_loader, n_samples=30)

The posterior is saved in the trainer's checkpoints (the callback's state) and restored when training resumes
from one (``trainer.fit(model, ckpt_path=...)``): a resumed run ends with the posterior of an uninterrupted
one, bit for bit, when training itself is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch

from ._trainer_core import TrainerPosterior

__all__ = ["PosteriorCallback"]


class PosteriorCallback(pl.Callback):
    """Collect snapshots of the trainable parameters into a posterior during ``Trainer.fit``.

    Parameters
    ----------
    posterior : object, optional
        Anything :class:`~onlinefa.torch.SnapshotCollector` feeds (``OnlineEM``, ``OnlineSGA``, ``SWAG``,
        ...). Default: ``onlinefa.OnlineEM(D, n_components, seed=seed, dtype=dtype)``, built when training
        starts (D = the number of trainable parameters).
    n_components : int, default=20
        K of the default posterior (SWAG's rank).
    every_n_steps : int, optional
        Collect after every ``every_n_steps``-th optimiser step (counted over the run, ``trainer.global_step``).
        Default: once at the end of each training epoch.
    start_epoch : int, default=0
        First epoch (0-based) collected.
    swa_lr : float, optional
        From ``start_epoch`` on, set every parameter group's learning rate to this constant before each
        training batch (SWAG's constant-rate phase; it overrides learning-rate schedulers there).
    dtype : {"float32", "float64"}, default="float32"
        State dtype of the default posterior and precision of the snapshots.
    seed : int, default=0
        Seed of the default posterior's initial loadings.
    asynchronous : bool, default=False
        Fit snapshots on a worker thread while training goes on (the posterior is complete whenever it is
        read, saved or used).
    """

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

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._core.start(pl_module)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._core.set_swa_lr(trainer.current_epoch, trainer.optimizers)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._core.collects_after_step(trainer.current_epoch, trainer.global_step):
            self._core.collect()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._core.collects_after_epoch(trainer.current_epoch):
            self._core.collect()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._core.close()

    def state_dict(self) -> dict[str, Any]:
        """The posterior, saved with the trainer's checkpoint (as a uint8 tensor: loads with ``weights_only``)."""
        if self._core.posterior is None:
            return {}
        data = bytearray(self._core.to_bytes())
        return {"posterior": torch.frombuffer(data, dtype=torch.uint8).clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from the posterior of a checkpoint (called by the trainer before training resumes)."""
        if "posterior" in state_dict:
            self._core.restore(state_dict["posterior"].numpy().tobytes())

    def bayesian_model_average(self, module: torch.nn.Module, loader: Iterable[object], **options: Any
                               ) -> torch.Tensor:
        """Predictions of ``module`` averaged over posterior draws (:func:`onlinefa.torch.bayesian_model_average`,
        whose keyword arguments ``options`` are passed on)."""
        return self._core.bayesian_model_average(module, loader, **options)
