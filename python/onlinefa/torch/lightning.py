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

from typing import Any

import lightning.pytorch as pl
import torch

from ._trainer_core import CALLBACK_PARAMETERS, PosteriorCallbackBase

__all__ = ["PosteriorCallback"]


class PosteriorCallback(PosteriorCallbackBase, pl.Callback):
    """Collect snapshots of the trainable parameters into a posterior during ``Trainer.fit``."""

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


PosteriorCallback.__doc__ = f"{PosteriorCallback.__doc__}\n{CALLBACK_PARAMETERS}"
