"""A Hugging Face ``TrainerCallback`` that fits an onlinefa posterior to the weights a training run visits.

Needs the ``transformers`` extra (``pip install ".[transformers]"``). Example::

    from onlinefa.torch.huggingface import PosteriorCallback

    swag = PosteriorCallback(n_components=20, start_epoch=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[swag])
    trainer.train()
    logits = swag.bayesian_model_average(model, test_loader, n_samples=30, task="regression")

With every checkpoint the trainer writes (``checkpoint-N/``) the callback writes its posterior
(``onlinefa_posterior.npz``, a digest-checked onlinefa checkpoint), and ``trainer.train(resume_from_checkpoint=...)``
from a checkpoint of the trainer's ``output_dir`` continues from it (``load_checkpoint(folder)`` for one
elsewhere): a resumed run ends with the posterior of an uninterrupted one, bit for bit, when training itself is
deterministic (the Trainer restores its data order and random generators itself).

The posterior of step N is written into ``output_dir`` just before the trainer writes ``checkpoint-N`` and moved
into that folder after it: a run killed in between (even with ``save_total_limit=1``, which has already removed
the older checkpoints by then) still resumes with its posterior. A checkpoint without one is refused unless
``on_missing="warn"``. Under gradient accumulation each optimiser step is collected once.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..checkpoint import fsync_directory
from ._trainer_core import CALLBACK_PARAMETERS, PosteriorCallbackBase
from ._trainer_store import read_posterior, write_posterior

__all__ = ["POSTERIOR_FILE", "PosteriorCallback"]

#: Name of the posterior's file inside each checkpoint folder of the trainer (an onlinefa checkpoint).
POSTERIOR_FILE = "onlinefa_posterior.npz"
#: Prefix of the posterior written into ``output_dir`` just before the trainer writes ``checkpoint-N/``
#: (``<prefix>N.npz``); moved into the checkpoint folder once that exists.
PENDING_PREFIX = ".onlinefa_posterior-step-"


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
        ValueError
            The posterior's file is damaged (it fails its digest); the message names it.
        onlinefa.errors.PosteriorResumeError
            The posterior was fitted with other settings (``on_mismatch="raise"``).
        RuntimeError
            Training has already started.
        """
        path = os.path.join(checkpoint_dir, POSTERIOR_FILE)
        self._core.restore(read_posterior(path), repr(path))
        self._loaded = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        if state.global_step > 0 and not self._loaded:  # resuming: the posterior saved with that checkpoint
            self._resume(args, state)
        if model is None:
            raise RuntimeError("the trainer passed no model to the callback")
        self._core.start(model, state.global_step)

    def _resume(self, args: TrainingArguments, state: TrainerState) -> None:
        folder = _checkpoint_dir(args, state)
        path, pending = os.path.join(folder, POSTERIOR_FILE), _pending_path(args, state.global_step)
        if not os.path.isfile(path) and os.path.isfile(pending) and os.path.isdir(folder):
            # Killed between the trainer's save and the callback's: the posterior is completed now (by the
            # main process; the others read it wherever it is at that moment).
            if state.is_world_process_zero:
                _move(pending, path)
        found = next((p for p in (path, pending, path) if os.path.isfile(p)), None)
        if found is None:
            self._core.missing(f"training resumes at step {state.global_step} but {path} does not exist "
                               "(call load_checkpoint(folder) before train() to continue one saved elsewhere)")
            return
        try:
            saved = read_posterior(found)
        except FileNotFoundError:  # moved into the checkpoint by the main process meanwhile
            found = path
            saved = read_posterior(path)
        if saved.global_step != state.global_step:
            self._core.missing(f"{found} holds the posterior of step {saved.global_step}, not of the "
                               f"checkpoint's step {state.global_step}")
            return
        self._core.restore(saved, repr(found))

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        if optimizer is not None:
            self._core.set_swa_lr(math.floor(state.epoch or 0.0), [optimizer])

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        # Called once per optimiser step (accumulating micro-batches call on_substep_end instead).
        before = time.perf_counter()
        if self._core.collects_after_step(_current_epoch(state), state.global_step):
            self._core.collect()
        self._core.step_ended(before, time.perf_counter())
        self._write_pending(args, state, control)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Add the snapshot count and a snapshot's cost in training steps to the Trainer's log history
        (``state.log_history``, saved in ``trainer_state.json``) and to the logs the callbacks after this one
        receive."""
        if self._core.posterior is None:
            return
        metrics = self._core.metrics()
        if logs is not None:
            logs.update(metrics)
        if state.log_history:
            state.log_history[-1].update(metrics)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._core.collects_after_epoch(_current_epoch(state)):
            self._core.collect()
        self._write_pending(args, state, control)

    def _write_pending(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """Before the trainer writes (and rotates) ``checkpoint-N``: the posterior of step N into
        ``output_dir``, so that a kill before :meth:`on_save` cannot leave the newest checkpoint without it."""
        posterior = self._core.posterior
        if control.should_save and posterior is not None and state.is_world_process_zero:
            os.makedirs(args.output_dir or ".", exist_ok=True)
            write_posterior(_pending_path(args, state.global_step), posterior, state.global_step,
                            self._core.anneal_from)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """Put the posterior into the checkpoint folder the trainer has just written (atomically)."""
        posterior = self._core.posterior
        if posterior is None or not state.is_world_process_zero:  # every rank holds the same posterior
            return
        folder = _checkpoint_dir(args, state)
        os.makedirs(folder, exist_ok=True)
        pending = _pending_path(args, state.global_step)
        if os.path.isfile(pending):
            _move(pending, os.path.join(folder, POSTERIOR_FILE))
        else:  # a save decided after this callback's on_step_end (by a later callback)
            write_posterior(os.path.join(folder, POSTERIOR_FILE), posterior, state.global_step,
                            self._core.anneal_from)
        _remove_stale_pending(args, state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        if model is None:
            self._core.close()
        else:
            self._core.finish(model, train_dataloader)


PosteriorCallback.__doc__ = f"{PosteriorCallback.__doc__}\n{CALLBACK_PARAMETERS}"


def _current_epoch(state: TrainerState) -> int:
    """The 0-based epoch a step or an epoch end belongs to (``state.epoch`` is in (e, e + 1] there)."""
    return max(math.ceil(state.epoch or 0.0) - 1, 0)


def _checkpoint_dir(args: TrainingArguments, state: TrainerState) -> str:
    """The folder of the trainer's checkpoint at the current global step."""
    return os.path.join(args.output_dir or ".", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def _pending_path(args: TrainingArguments, global_step: int) -> str:
    return os.path.join(args.output_dir or ".", f"{PENDING_PREFIX}{global_step}.npz")


def _move(source: str, destination: str) -> None:
    """Rename ``source`` over ``destination`` (atomic on one file system) and make the rename durable."""
    os.replace(source, destination)
    fsync_directory(os.path.dirname(destination) or ".")


def _remove_stale_pending(args: TrainingArguments, global_step: int) -> None:
    """Remove pending posteriors of earlier steps (their checkpoints have their own, or were never written)."""
    folder = args.output_dir or "."
    for name in os.listdir(folder):
        step = name[len(PENDING_PREFIX):-len(".npz")] if name.startswith(PENDING_PREFIX) else ""
        if step.isdigit() and int(step) < global_step and name.endswith(".npz"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
