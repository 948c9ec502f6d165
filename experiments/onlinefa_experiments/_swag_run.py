"""One training seed of the ``swag`` experiment: train, collect the posteriors, fit VIFA, evaluate."""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray

import onlinefa
from onlinefa.torch import (
    MultiSWAG, ParameterVector, SnapshotCollector, bayesian_model_average, gaussian_parameters, vifa_step,
)  # fmt: skip
from onlinefa.torch.swag import SWAG

from ._swag_data import Task
from ._swag_eval import (
    classification_metrics, marginal_variances, mixture_variances, regression_metrics, softmax, variance_ratios,
)  # fmt: skip
from ._swag_train import TrainSettings, batches, build_mlp, mean_loss, predict, run_epochs, seed_generator, tensors
from ._swag_report import METHODS, SCALES
from .uci_linreg import RunningMean

FloatArray = NDArray[np.float64]

class VifaSettings(NamedTuple):
    """VIFA's optimiser settings (Adam)."""

    epochs: int
    lr: float  #: of the mean and the loadings
    lr_log_noise: float


class SeedResult(NamedTuple):
    """What one seed leaves behind."""

    rows: list[dict[str, Any]]  #: one CSV row per method (all but MultiSWAG)
    probabilities: dict[str, FloatArray]  #: classification: each method's test probabilities
    swag: SWAG  #: the rank-K SWAG posterior (a MultiSWAG component)
    iterate_variance: FloatArray  #: Σ_diag of the snapshots
    swa: FloatArray  #: θ_SWA


def _draw_seed(seed: np.random.SeedSequence) -> int:
    return int(seed.generate_state(1)[0])


def _collect(model: torch.nn.Module, optimizer: torch.optim.Optimizer, task: Task, settings: TrainSettings,
             rank: int, seeds: list[np.random.SeedSequence]) -> tuple[dict[str, Any], dict[str, float]]:
    """The constant-learning-rate phase; returns the posteriors and their seconds per snapshot."""
    n_features = len(ParameterVector(model))
    posteriors: dict[str, Any] = {
        "swa": RunningMean(n_features),
        "swag_diag": SWAG(n_features, diagonal=True),
        "swag": SWAG(n_features, max_rank=rank),
        "online_em": onlinefa.OnlineEM(n_features, rank, seed=_draw_seed(seeds[0])),
        "online_sga": onlinefa.OnlineSGA(n_features, rank, seed=_draw_seed(seeds[1])),
    }
    for group in optimizer.param_groups:
        group["lr"] = settings.collect_lr
    collectors = {name: SnapshotCollector(p, model, every=settings.every).attach(optimizer)
                  for name, p in posteriors.items()}
    generator = seed_generator(_draw_seed(seeds[2]))
    run_epochs(model, optimizer, task, tensors(task, "train"), settings.collect_epochs, generator,
               settings.batch_size)
    for collector in collectors.values():
        collector.detach()
    return posteriors, {name: c.seconds_per_snapshot for name, c in collectors.items()}


def regression_noise_variance(model: torch.nn.Module, theta: FloatArray, task: Task) -> float:
    """σ² of the Gaussian likelihood: the training mean squared residual at θ (standardised units)."""
    ParameterVector(model).assign(theta)
    inputs, _ = tensors(task, "train")
    residual = predict(model, inputs)[:, 0] - task.y_train
    return float(np.mean(residual**2))


def _fit_vifa(model: torch.nn.Module, task: Task, swag: SWAG, noise: float, settings: TrainSettings,
              vifa_settings: VifaSettings, seed: int) -> tuple[onlinefa.VIFA, float]:
    """VIFA started at SWAG's Gaussian (mean θ_SWA); returns it and the median seconds per step."""
    n_data = task.X_train.shape[0]
    vifa = onlinefa.VIFA(
        swag.n_features, swag.max_rank, prior_precision=settings.weight_decay * n_data, lr_mean=vifa_settings.lr,
        lr_loadings=vifa_settings.lr, lr_log_noise=vifa_settings.lr_log_noise, optimizer="adam", seed=seed,
        init=swag.loadings, init_mean=swag.mean, init_noise_variance=np.maximum(swag.noise_variance, 1e-12),
    )

    def loss_fn(module: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        outputs = module(batch[0])
        if task.kind == "classification":
            return mean_loss(task, outputs, batch[1])
        return mean_loss(task, outputs, batch[1]) / noise

    seconds: list[float] = []
    generator = seed_generator(seed)
    model.train()
    for _ in range(vifa_settings.epochs):
        for batch in batches(tensors(task, "train"), settings.batch_size, generator):
            start = time.perf_counter()
            vifa_step(vifa, model, loss_fn, batch, n_data=n_data)
            seconds.append(time.perf_counter() - start)
    return vifa, float(np.median(seconds))


def evaluate_point(model: torch.nn.Module, theta: FloatArray, task: Task, noise: float) -> tuple[dict[str, float],
                                                                                                   FloatArray]:
    """Metrics of one parameter vector; also its test probabilities (classification) or predictions."""
    ParameterVector(model).assign(theta)
    outputs = predict(model, tensors(task, "test")[0])
    if task.kind == "classification":
        probabilities = softmax(outputs)
        return classification_metrics(probabilities, task), probabilities
    return regression_metrics(outputs[:, 0][None, :], task, noise), outputs[:, 0][None, :]


def evaluate_posterior(model: torch.nn.Module, posterior: Any, task: Task, noise: float, n_draws: int,
                       scale: float, seed: int) -> tuple[dict[str, float], FloatArray]:
    """Metrics of the Bayesian model average over ``n_draws`` draws (scale · covariance)."""
    loader = [tuple(tensors(task, "test"))]
    kind = "classification" if task.kind == "classification" else "regression"
    average = bayesian_model_average(model, posterior, loader, n_samples=n_draws, scale=scale, seed=seed,
                                     task=kind).double().numpy()
    if task.kind == "classification":
        return classification_metrics(average, task), average
    predictions = average.reshape(n_draws, -1)
    return regression_metrics(predictions, task, noise), predictions


def run_seed(task: Task, settings: TrainSettings, vifa_settings: VifaSettings, rank: int, n_draws: int,
             seed: np.random.SeedSequence) -> tuple[SeedResult, float]:
    """Train one network and evaluate every method but MultiSWAG; also returns σ² (regression; else nan)."""
    init_seed, train_seed, *other_seeds = seed.spawn(8)
    torch.manual_seed(_draw_seed(init_seed))
    model = build_mlp(task.X_train.shape[1], settings.hidden, task.n_outputs)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.pretrain_lr, weight_decay=settings.weight_decay)
    run_epochs(model, optimizer, task, tensors(task, "train"), settings.pretrain_epochs,
               seed_generator(_draw_seed(train_seed)), settings.batch_size)
    posteriors, seconds = _collect(model, optimizer, task, settings, rank, other_seeds[:3])
    final = ParameterVector(model, dtype=torch.float64).numpy()
    swag: SWAG = posteriors["swag"]
    swa = posteriors["swa"].mean
    iterate_variance = posteriors["swag_diag"].diagonal_variance
    noise = regression_noise_variance(model, swa, task) if task.kind == "regression" else math.nan
    vifa, seconds["vifa"] = _fit_vifa(model, task, swag, noise, settings, vifa_settings, _draw_seed(other_seeds[3]))
    posteriors["vifa"] = vifa
    rows: list[dict[str, Any]] = []
    outputs: dict[str, FloatArray] = {}
    for name in METHODS:
        if name == "multiswag":
            continue
        if name in ("sgd", "swa"):
            metrics, outputs[name] = evaluate_point(model, final if name == "sgd" else swa, task, noise)
            ratios = {"var_ratio": math.nan, "var_ratio_median": math.nan}
        else:
            metrics, outputs[name] = evaluate_posterior(model, posteriors[name], task, noise, n_draws,
                                                        SCALES[name], _draw_seed(other_seeds[4]))
            variance = marginal_variances(gaussian_parameters(posteriors[name]), SCALES[name])
            ratios = variance_ratios(variance, iterate_variance)
        rows.append({"method": name, **metrics, **ratios, "seconds_per_snapshot": seconds.get(name, math.nan)})
    probabilities = outputs if task.kind == "classification" else {}
    return SeedResult(rows, probabilities, swag, iterate_variance, swa), noise


def evaluate_multiswag(model: torch.nn.Module, results: list[SeedResult], task: Task, noise: float,
                       n_draws: int, seed: int) -> tuple[dict[str, Any], FloatArray]:
    """MultiSWAG over the seeds' rank-K SWAG posteriors, ``n_draws`` draws per component.

    Its variance ratio compares the mixture's marginal variances with the pooled iterates of all seeds
    (equal numbers of snapshots per seed, so both are "mean of variances + variance of means").
    """
    mixture = MultiSWAG([result.swag for result in results])
    metrics, outputs = evaluate_posterior(model, mixture, task, noise, n_draws * len(results), 1.0, seed)
    gaussians = [gaussian_parameters(result.swag) for result in results]
    posterior_variance = mixture_variances([g.mean for g in gaussians],
                                           [marginal_variances(g, 1.0) for g in gaussians])
    iterate_variance = mixture_variances([r.swa for r in results], [r.iterate_variance for r in results])
    swag_rows = [row for result in results for row in result.rows if row["method"] == "swag"]
    seconds = float(np.mean([row["seconds_per_snapshot"] for row in swag_rows]))
    row = {"method": "multiswag", **metrics, **variance_ratios(posterior_variance, iterate_variance),
           "seconds_per_snapshot": seconds}
    return row, outputs
