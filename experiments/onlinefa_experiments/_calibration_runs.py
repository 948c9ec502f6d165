"""onlinefa's methods in the ``calibration`` experiment: one SGD run per network, its posteriors, its predictors.

Every network is the same ReLU MLP trained by plain SGD on the same mini-batch order (one order per seed);
snapshots of the last ``collect_epochs`` epochs stream into ``OnlineEM`` (its defaults) at
``snapshots_per_epoch`` per epoch. From one run: ``map`` (the last iterate), ``swa`` (the running mean),
``swa_temp`` (SWA with temperature scaling on the validation rows), ``swag_fa`` (Bayesian model average over
draws of OnlineEM's Gaussian) and ``onlinefa``, the recommended recipe: the linearised predictive of the same
Gaussian with its covariance scale and softmax temperature chosen on the held-out validation rows
(:func:`onlinefa.torch.select_scale` with ``temperature=True``). Several runs give ``deep_ensemble`` (their
last iterates) and ``multiswag_fa`` (the recipe over the mixture of their Gaussians).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import onlinefa
from onlinefa.torch import (
    LinearizedPredictions,
    MultiSWAG,
    ParameterVector,
    ScaleSelection,
    SnapshotCollector,
    bayesian_model_average,
    linearized_predictions,
    select_scale,
)

from ._swag_train import build_mlp

#: A predictor: inputs (N, P) float32 → class probabilities (N, C) float64.
Predictor = Callable[[torch.Tensor], np.ndarray]


class Budget(NamedTuple):
    """The training budget shared by every method."""

    hidden: tuple[int, ...]
    epochs: int
    collect_epochs: int
    lr: float
    batch_size: int
    snapshots_per_epoch: int
    rank: int
    n_draws: int
    #: SGD's learning rate over the collection epochs (SWAG's "SWA learning rate"); None: ``lr`` throughout.
    collect_lr: float | None = None


class Split(NamedTuple):
    """Training rows (for every method) and validation rows (for choosing, never for fitting weights)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


class Run(NamedTuple):
    """One trained network: its module (holding the last iterate), posterior and wall-clock seconds."""

    module: torch.nn.Module
    last: torch.Tensor
    posterior: Any  #: OnlineEM, or None for a run without collection
    seconds: float  #: training, collection included


def batch_orders(n_rows: int, budget: Budget, seed: int) -> list[torch.Tensor]:
    """The per-epoch permutations of the training rows, the same for every method of a seed."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(n_rows, generator=generator) for _ in range(budget.epochs)]


def snapshot_every(n_rows: int, budget: Budget) -> int:
    """Optimiser steps between snapshots."""
    return max(1, math.ceil(n_rows / budget.batch_size) // budget.snapshots_per_epoch)


def training_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy for class labels (int64), half the mean squared error for regression targets."""
    if targets.dtype == torch.int64:
        return torch.nn.functional.cross_entropy(outputs, targets)
    return 0.5 * torch.mean((outputs[:, 0] - targets) ** 2)


def train_sgd(split: Split, n_classes: int, budget: Budget, orders: list[torch.Tensor], init_seed: int,
              collect: bool = True) -> Run:
    """Plain SGD over ``orders`` (``n_classes`` outputs; 1 for regression targets); with ``collect``, snapshots of the last ``collect_epochs`` epochs stream into
    OnlineEM through an asynchronous :class:`~onlinefa.torch.SnapshotCollector` (a worker thread fits them
    while training goes on), as a user would collect them."""
    torch.manual_seed(init_seed)
    module = build_mlp(split.x_train.shape[1], budget.hidden, n_classes)
    optimizer = torch.optim.SGD(module.parameters(), lr=budget.lr)
    posterior = onlinefa.OnlineEM(len(ParameterVector(module)), budget.rank, seed=init_seed) if collect else None
    collector = SnapshotCollector(posterior, module, every=snapshot_every(split.x_train.shape[0], budget),
                                  asynchronous=True) if posterior is not None else None
    start = time.perf_counter()
    module.train()
    for epoch, order in enumerate(orders):
        if collector is not None and epoch == budget.epochs - budget.collect_epochs:
            collector.attach(optimizer)
            if budget.collect_lr is not None:
                for group in optimizer.param_groups:
                    group["lr"] = budget.collect_lr
        for begin in range(0, order.numel(), budget.batch_size):
            index = order[begin : begin + budget.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = training_loss(module(split.x_train[index]), split.y_train[index])
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    if collector is not None:
        collector.close()  # waits for the worker: the posterior holds every snapshot
    seconds = time.perf_counter() - start
    return Run(module, ParameterVector(module).gather().clone(), posterior, seconds)


def _logits(module: torch.nn.Module, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The network's outputs at parameters θ."""
    ParameterVector(module).assign(theta)
    module.eval()
    with torch.no_grad():
        outputs: torch.Tensor = module(x)
    return outputs


def _point(module: torch.nn.Module, theta: torch.Tensor) -> Predictor:
    def predict(x: torch.Tensor) -> np.ndarray:
        return torch.softmax(_logits(module, theta, x), dim=-1).double().numpy()

    return predict


def assign_mean(module: torch.nn.Module, posterior: Any) -> None:
    """Put the posterior's mean (a mixture's first component's) into ``module``."""
    first: Any = posterior.components[0] if isinstance(posterior, MultiSWAG) else posterior
    ParameterVector(module).assign(torch.tensor(np.array(first.snapshot()[0]), dtype=torch.float32))


def map_predictor(run: Run) -> Predictor:
    """The last SGD iterate."""
    return _point(run.module, run.last)


def swa_predictor(run: Run) -> Predictor:
    """The running mean of the snapshots (OnlineEM's c)."""
    return _point(run.module, torch.tensor(np.array(run.posterior.snapshot()[0]), dtype=torch.float32))


def scaling_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The T ≥ 1 that maximises the likelihood of ``labels`` under softmax(logits / T): temperature scaling,
    by :func:`select_scale`'s temperature search on outputs with no deviation."""
    centre = logits.expand(1, *logits.shape)
    no_width = LinearizedPredictions(centre, torch.zeros_like(centre), labels)
    return select_scale(no_width, temperature=True, within_standard_error=False).temperature


def tempered_swa_predictor(run: Run, split: Split) -> Predictor:
    """SWA's logits divided by the temperature that maximises the validation rows' likelihood (temperature
    scaling: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017): calibration without a
    posterior, the baseline the recipe's width is measured against."""
    mean = torch.tensor(np.array(run.posterior.snapshot()[0]), dtype=torch.float32)
    temperature = scaling_temperature(_logits(run.module, mean, split.x_val), split.y_val)

    def predict(x: torch.Tensor) -> np.ndarray:
        return torch.softmax(_logits(run.module, mean, x).double() / temperature, dim=-1).numpy()

    return predict


def bma_predictor(module: torch.nn.Module, posterior: Any, n_draws: int, seed: int) -> Predictor:
    """Bayesian model average over ``n_draws`` parameter draws (SWAG-style sampling)."""
    def predict(x: torch.Tensor) -> np.ndarray:
        return bayesian_model_average(module, posterior, [(x,)], n_samples=n_draws, seed=seed).double().numpy()

    return predict


def recipe_scale(module: torch.nn.Module, posterior: Any, split: Split, n_draws: int, seed: int) -> ScaleSelection:
    """The recommended recipe's covariance scale and softmax temperature, chosen together by the held-out
    likelihood of the linearised predictive."""
    assign_mean(module, posterior)
    predictions = linearized_predictions(module, posterior, [(split.x_val, split.y_val)], n_samples=n_draws,
                                         seed=seed)
    return select_scale(predictions, temperature=True)


def linearized_predictor(module: torch.nn.Module, posterior: Any, chosen: ScaleSelection, n_draws: int, seed: int
                         ) -> Predictor:
    """The linearised predictive at the chosen covariance scale and temperature."""
    def predict(x: torch.Tensor) -> np.ndarray:
        predictions = linearized_predictions(module, posterior, [(x,)], n_samples=n_draws, seed=seed)
        outputs = predictions.outputs(chosen.scale, chosen.temperature)
        return torch.softmax(outputs.double(), dim=-1).mean(dim=0).numpy()

    return predict


def ensemble_predictor(runs: Sequence[Run]) -> Predictor:
    """The equal mixture of the runs' last iterates."""
    members = [map_predictor(run) for run in runs]

    def predict(x: torch.Tensor) -> np.ndarray:
        mixture: np.ndarray = np.mean([member(x) for member in members], axis=0)
        return mixture

    return predict
