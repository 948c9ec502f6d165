"""A Hugging Face ``TrainerCallback`` that fits an onlinefa posterior to the weights a training run visits.

Needs the ``transformers`` extra (``pip install ".[transformers]"``). Example::

    from onlinefa.torch.huggingface import PosteriorCallback

    swag = PosteriorCallback(n_components=20, start_epoch=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[swag])
    trainer.train()
    logits = swag.bayesian_model_average(model, test_loader, n_samples=30, task="regression")

With every checkpoint the trainer writes (``checkpoint-N/``) the callback writes its posterior
(``onlinefa_posterior.pkl``), and ``trainer.train(resume_from_checkpoint=...)`` from a checkpoint of the trainer's
``output_dir`` continues from it (``load_checkpoint(folder)`` for one elsewhere): a resumed run ends with the
posterior of an uninterrupted one, bit for bit, when training itself is deterministic.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ._trainer_core import CALLBACK_PARAMETERS, PosteriorCallbackBase

__all__ = ["POSTERIOR_FILE", "PosteriorCallback"]

#: Name of the posterior's file inside each checkpoint folder of the trainer.
POSTERIOR_FILE = "onlinefa_posterior.pkl"


class PosteriorCallback(PosteriorCallbackBase, TrainerCallback):
    """Collect snapshots of the trainable parameters into a posterior during ``Trainer.train``."""

    #: Whether :meth:`load_checkpoint` restored a posterior (then no checkpoint is looked up at the start).
    _loaded = False

    def load_checkpoint(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        """Continue from the posterior saved in a checkpoint folder of the trainer (before ``trainer.train``).

        Needed only when the run resumes from a checkpoint outside the trainer's ``output_dir``: from one
        inside it (``resume_from_checkpoint=True`` or a path there) the callback finds its posterior itself.

        Raises
        ------
        FileNotFoundError
            The folder holds no posterior of this callback.
        RuntimeError
            Training has already started.
        """
        with open(os.path.join(checkpoint_dir, POSTERIOR_FILE), "rb") as f:
            self._core.restore(f.read())
        self._loaded = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if state.global_step > 0 and not self._loaded:  # resuming: the posterior saved with that checkpoint
            path = os.path.join(_checkpoint_dir(args, state), POSTERIOR_FILE)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    self._core.restore(f.read())
            else:
                warnings.warn(
                    f"training resumes at step {state.global_step} but {path} does not exist: the posterior "
                    "starts empty here (call load_checkpoint(folder) before train() to continue one saved "
                    "elsewhere)", UserWarning, stacklevel=1)
        if model is None:
            raise RuntimeError("the trainer passed no model to the callback")
        self._core.start(model)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        if optimizer is not None:
            self._core.set_swa_lr(math.floor(state.epoch or 0.0), [optimizer])

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if self._core.collects_after_step(_current_epoch(state), state.global_step):
            self._core.collect()

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._core.collects_after_epoch(_current_epoch(state)):
            self._core.collect()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """Write the posterior into the checkpoint folder the trainer has just written (atomically)."""
        if self._core.posterior is None:
            return
        folder = _checkpoint_dir(args, state)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".onlinefa-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self._core.to_bytes())
            os.replace(tmp, os.path.join(folder, POSTERIOR_FILE))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._core.close()



PosteriorCallback.__doc__ = f"{PosteriorCallback.__doc__}\n{CALLBACK_PARAMETERS}"

def _current_epoch(state: TrainerState) -> int:
    """The 0-based epoch a step or an epoch end belongs to (``state.epoch`` is in (e, e + 1] there)."""
    return max(math.ceil(state.epoch or 0.0) - 1, 0)


def _checkpoint_dir(args: TrainingArguments, state: TrainerState) -> str:
    """The folder of the trainer's checkpoint at the current global step."""
    return os.path.join(args.output_dir or ".", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
