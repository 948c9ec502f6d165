"""A PyTorch Lightning callback that fits an onlinefa posterior to the weights a training run visits.

Needs the ``lightning`` extra (``pip install ".[lightning]"``). Example::

    from onlinefa.torch.lightning import PosteriorCallback

    swag = PosteriorCallback(n_components=20, start_epoch=10, swa_lr=0.01)
    trainer = lightning.pytorch.Trainer(max_epochs=30, callbacks=[swag])
    trainer.fit(model, train_loader)
    probabilities = swag.bayesian_model_average(model, test_loader, n_samples=30)

The posterior is saved in the trainer's checkpoints (the callback's state, digest-checked) and restored when
training resumes from one (``trainer.fit(model, ckpt_path=...)``): a resumed run ends with the posterior of an
uninterrupted one, bit for bit, when training itself is deterministic: ``deterministic=True``, and batches in
the same order after the resume (Lightning restores no shuffling generator: the usage guide's trainer section
gives an epoch-seeded sampler; the callback warns when it resumes with a shuffling ``RandomSampler``).
Under gradient accumulation each optimiser step is collected once.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch

from ._trainer_core import CALLBACK_PARAMETERS, PosteriorCallbackBase
from ._trainer_store import posterior_from_bytes, posterior_to_bytes

__all__ = ["PosteriorCallback"]


class PosteriorCallback(PosteriorCallbackBase, pl.Callback):
    """Collect snapshots of the trainable parameters into a posterior during ``Trainer.fit``."""

    #: Log the snapshot count and a snapshot's cost in training steps (``onlinefa/n_snapshots``,
    #: ``onlinefa/snapshot_cost_in_steps``) through ``LightningModule.log_dict`` after every optimiser step.
    log_metrics = True

    #: Whether the trainer is restoring a checkpoint (``on_load_checkpoint`` was called) and whether that
    #: checkpoint held this callback's posterior (``load_state_dict``).
    _resuming = False
    _restored = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resuming and not self._restored:
            self._core.missing(f"training resumes at step {trainer.global_step} from a checkpoint that holds no "
                               "posterior of this callback")
        if self._resuming:
            warn_if_not_resumable(trainer)
        self._resuming = self._restored = False  # this fit's checkpoint is dealt with
        self._core.start(pl_module, trainer.global_step)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._core.set_swa_lr(trainer.current_epoch, trainer.optimizers)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # global_step counts optimiser steps: under gradient accumulation it stays put on the batches that
        # only accumulate, and the core collects each step once.
        stepped = trainer.global_step != self._core.last_step
        before = time.perf_counter()
        if self._core.collects_after_step(trainer.current_epoch, trainer.global_step):
            self._core.collect()
        if stepped:
            self._core.step_ended(before, time.perf_counter())
            if self.log_metrics:
                pl_module.log_dict(self._core.metrics(), on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._core.collects_after_epoch(trainer.current_epoch):
            self._core.collect()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._core.finish(pl_module, trainer.train_dataloader)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._resuming = True

    def state_dict(self) -> dict[str, Any]:
        """The posterior, saved with the trainer's checkpoint: the bytes of a digest-checked onlinefa
        checkpoint as a uint8 tensor (loads with ``weights_only``), with the step it belongs to."""
        posterior = self._core.posterior
        if posterior is None:
            return {}
        data = bytearray(posterior_to_bytes(posterior, self._core.last_step, self._core.anneal_from))
        return {"posterior": torch.frombuffer(data, dtype=torch.uint8).clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from the posterior of a checkpoint (called by the trainer before training resumes).

        Raises
        ------
        ValueError
            The posterior's bytes are damaged (they fail their digest).
        onlinefa.errors.PosteriorResumeError
            The posterior was fitted with other settings (``on_mismatch="raise"``).
        """
        self._resuming = True
        data = state_dict.get("posterior")
        if data is None:
            return
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            raise ValueError("the checkpoint's callback state holds no onlinefa posterior bytes under 'posterior'")
        saved = posterior_from_bytes(data.numpy().tobytes(), "the posterior in the Lightning checkpoint")
        self._core.restore(saved, "the Lightning checkpoint")
        self._restored = True


PosteriorCallback.__doc__ = f"{PosteriorCallback.__doc__}\n{CALLBACK_PARAMETERS}"


def warn_if_not_resumable(trainer: pl.Trainer) -> None:
    """Warn when the run resumes with a shuffling loader whose order Lightning does not restore (a
    ``RandomSampler``): the weights, and so the posterior, then differ from an uninterrupted run's."""
    loader = getattr(trainer, "train_dataloader", None)
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        warnings.warn(
            "training resumes with a shuffling DataLoader (RandomSampler) whose order Lightning does not "
            "restore: the resumed run visits other weights than an uninterrupted one, so its posterior differs; "
            "for a bit-identical resume use a sampler seeded by the epoch (see the usage guide's trainer section)",
            UserWarning, stacklevel=2)
