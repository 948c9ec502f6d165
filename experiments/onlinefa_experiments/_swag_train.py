"""Training part of the ``swag`` experiment: small MLPs trained with plain SGD in PyTorch.

One run: a ReLU MLP from PyTorch's default initialisation (seeded), ``pretrain_epochs`` epochs of SGD
(no momentum, weight decay ``weight_decay``, mini-batches of ``batch_size`` reshuffled each epoch, the last
partial batch kept), then ``collect_epochs`` epochs at the constant learning rate ``collect_lr`` during
which every posterior is fed a snapshot after every ``every``-th optimiser step
(:class:`onlinefa.torch.SnapshotCollector`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray

from ._swag_data import Task


class TrainSettings(NamedTuple):
    """Optimiser settings of one run."""

    hidden: tuple[int, ...]
    batch_size: int
    weight_decay: float
    pretrain_epochs: int
    pretrain_lr: float
    collect_epochs: int
    collect_lr: float
    every: int  #: optimiser steps between snapshots


def build_mlp(n_inputs: int, hidden: Sequence[int], n_outputs: int) -> torch.nn.Sequential:
    """A float32 ReLU MLP ``n_inputs → hidden… → n_outputs``."""
    layers: list[torch.nn.Module] = []
    width = n_inputs
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    layers.append(torch.nn.Linear(width, n_outputs))
    return torch.nn.Sequential(*layers)


def tensors(task: Task, part: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of the ``"train"`` or ``"test"`` part (class targets as int64)."""
    X, y = (task.X_train, task.y_train) if part == "train" else (task.X_test, task.y_test)
    inputs = torch.as_tensor(X, dtype=torch.float32)
    if task.kind == "classification":
        return inputs, torch.as_tensor(y, dtype=torch.int64)
    return inputs, torch.as_tensor(y, dtype=torch.float32)


def mean_loss(task: Task, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The training loss: mean cross-entropy, or half the mean squared error (unit-variance Gaussian NLL)."""
    if task.kind == "classification":
        return torch.nn.functional.cross_entropy(outputs, targets)
    return 0.5 * torch.mean((outputs[:, 0] - targets) ** 2)


def batches(
    data: tuple[torch.Tensor, torch.Tensor], batch_size: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled mini-batches."""
    inputs, targets = data
    order = torch.randperm(inputs.shape[0], generator=generator)
    for start in range(0, inputs.shape[0], batch_size):
        index = order[start : start + batch_size]
        yield inputs[index], targets[index]


def run_epochs(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    task: Task,
    data: tuple[torch.Tensor, torch.Tensor],
    n_epochs: int,
    generator: torch.Generator,
    batch_size: int,
) -> None:
    """``n_epochs`` epochs of SGD on the mean training loss."""
    model.train()
    for _ in range(n_epochs):
        for inputs, targets in batches(data, batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            mean_loss(task, model(inputs), targets).backward()  # type: ignore[no-untyped-call]
            optimizer.step()


def predict(model: torch.nn.Module, inputs: torch.Tensor) -> NDArray[np.float64]:
    """The model's raw outputs (logits, or regression predictions) as float64, in eval mode."""
    model.eval()
    with torch.no_grad():
        outputs: NDArray[np.float64] = model(inputs).double().numpy()
    return outputs


def seed_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return generator
