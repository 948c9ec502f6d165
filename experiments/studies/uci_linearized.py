"""SWAG-FA through the linearised network on the 20-split UCI benchmark, beside SWA and SWAG-FA's draws.

The ``uci-bnn`` experiment's protocol and code (its published splits, validation split, seeds, stages, grids
and budget, ``--seed 0``), for three methods on the same training runs:

- ``swa`` and ``swag_fa`` exactly as the benchmark runs them (σ² tuned on its fixed grid for the draws);
- ``swag_fa_lin``: the same SWAG-FA posterior predicting with the linearised network's Gaussian
  N(f(x; c), s J Σ Jᵀ + σ²) (:meth:`onlinefa.torch.LinearizedPredictions.variance`, 30 draws), (s, σ²) chosen
  on the validation rows by ``select_scale(..., task="regression")`` (σ² the centre's own, s the maximiser on
  top of it) at every grid point; the grid point with the best validation log-likelihood is refitted on all
  training rows with its (s, σ²);
- ``swag_fa_lin_joint``: the same Gaussian with s and σ² chosen together (the pair that maximises the
  validation score, for each s its best σ²); ``swag_fa_lin_noise_se``: then σ² raised to the largest value
  whose score, s re-chosen for it, is within one standard error of that maximum.

``--development`` reads no test row: it scores the benchmark's validation rows of each split instead, tuning on
a further 80/20 split of the split's fit rows.

Rows (``dataset, split, method, test_ll, rmse, scale, noise_variance``) are appended to ``--out`` as each
split finishes; a rerun skips the splits present.

    python experiments/studies/uci_linearized.py --datasets boston yacht --out results/uci_linearized
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from onlinefa.torch import fit_noise_variance, linearized_predictions, regression_log_likelihood, select_scale
from onlinefa.torch._maximise import maximise_log
from onlinefa.torch._scale import _widest_above
from onlinefa_experiments.uci_bnn import _dataset_seed
from onlinefa_experiments.uci_bnn._data import load_dataset, standardise
from onlinefa_experiments.uci_bnn._methods import Budget, Stage
from onlinefa_experiments.uci_bnn._metrics import mixture_log_likelihood, rmse, tune_noise_variance
from onlinefa_experiments.uci_bnn._splits import published_splits, validation_split

FIELDS = ["dataset", "split", "method", "test_ll", "rmse", "scale", "noise_variance"]
WEIGHT_DECAYS, COLLECT_LRS = (1e-4, 1e-3, 1e-2), (0.005, 0.02)
N_DRAWS = 30


def budget(n_epochs: int) -> Budget:
    """The benchmark's default budget (E = 10 × the set's n_epochs Adam epochs at 1e-2, C = 50, K = 10)."""
    return Budget(batch_size=128, epochs=10 * n_epochs, collect_epochs=50, snapshots_per_epoch=4, rank=10,
                  n_draws=N_DRAWS, vifa_epochs=50, slang_epochs=120, adam_lr=1e-2)


def linearized(stage: Stage, config: tuple[float, float], targets: np.ndarray | None) -> Any:
    """The linearised predictions of the stage's SWAG-FA posterior on its evaluation inputs."""
    posteriors, _, _ = stage.collected(*config, 0)
    batch = (stage.inputs,) if targets is None else (stage.inputs, torch.as_tensor(targets))
    seed = int(stage.seed.generate_state(1)[0]) % 2**31
    return linearized_predictions(stage._network(), posteriors["swag_fa"], [batch], n_samples=N_DRAWS, seed=seed)


def tune(stage: Stage, y_val: np.ndarray) -> dict[str, tuple[float, Any, float]]:
    """Per method: (validation log-likelihood, grid point, its σ² or (s, σ²)) of the best grid point."""
    best: dict[str, tuple[float, Any, float]] = {}

    def keep(method: str, score: float, config: Any, choice: Any) -> None:
        if method not in best or score > best[method][0]:
            best[method] = (score, config, choice)

    for config in [(lam, eta) for lam in WEIGHT_DECAYS for eta in COLLECT_LRS]:
        for method in ("swa", "swag_fa"):
            noise, score = tune_noise_variance(stage.run(method, config).draws, y_val)
            keep(method, score, config, noise)
        predictions = linearized(stage, config, y_val)
        chosen = select_scale(predictions, task="regression")
        keep("swag_fa_lin", chosen.score, config, (chosen.scale, chosen.noise_variance))
        joint = joint_choice(predictions)
        keep("swag_fa_lin_joint", joint[2], config, joint[:2])
        scale, noise = noise_within_standard_error(predictions, joint)
        keep("swag_fa_lin_noise_se", joint[2], config, (scale, noise))
    return best


def _score(predictions: Any, scale: float, noise: float) -> torch.Tensor:
    """log p(y_n) of every validation row under the linearised Gaussian at (s, σ²)."""
    return regression_log_likelihood(predictions.centre, predictions.targets, noise,
                                     variance=scale * predictions.variance())


def _best_noise(predictions: Any, scale: float) -> float:
    return fit_noise_variance(predictions.centre, predictions.targets, variance=scale * predictions.variance())


def joint_choice(predictions: Any) -> tuple[float, float, float]:
    """(s, σ², score): the pair that maximises the held-out score, for each s its best σ²."""
    def profile(log_scale: float) -> float:
        scale = math.exp(log_scale)
        return float(_score(predictions, scale, _best_noise(predictions, scale)).mean())

    log_scale = maximise_log(profile, math.log(1e-3), math.log(1e6), grid_points=73, refine_steps=40)
    scale = math.exp(log_scale)
    return scale, _best_noise(predictions, scale), profile(log_scale)


def noise_within_standard_error(predictions: Any, joint: tuple[float, float, float]) -> tuple[float, float]:
    """The largest σ² whose score, with s re-chosen for it, is within one standard error of the joint maximum."""
    def best_scale(noise: float) -> float:
        return select_scale(predictions, task="regression", noise_variance=noise).scale

    def profile(log_noise: float) -> float:
        noise = math.exp(log_noise)
        return float(_score(predictions, best_scale(noise), noise).mean())

    rows = _score(predictions, joint[0], joint[1])
    threshold = float(rows.mean()) - float(rows.std()) / math.sqrt(rows.numel())
    residual = predictions.centre[..., 0].double() - predictions.targets.double()
    top = math.log(float(residual.square().mean())) + 4.0 * math.log(10.0)
    log_noise = _widest_above(profile, threshold, math.log(joint[1]), top, math.log(10.0) / 8)
    return best_scale(math.exp(log_noise)), math.exp(log_noise)


def run_split(dataset: Any, split: int, train: np.ndarray, test: np.ndarray, args: argparse.Namespace
              ) -> list[dict[str, Any]]:
    """Tune on the training rows of one split, refit, and score the test rows."""
    shared = argparse.Namespace(seed=0)
    plan = budget(dataset.n_epochs)
    X_train, y_train = dataset.X[train], dataset.y[train]
    fit, val = validation_split(len(train), int(_dataset_seed(shared, dataset.name, split, 0).generate_state(1)[0]))
    x_mean, x_std, y_mean, y_std = standardise(X_train[fit], y_train[fit])
    stage = Stage((X_train[fit] - x_mean) / x_std, (y_train[fit] - y_mean) / y_std, (X_train[val] - x_mean) / x_std,
                  dataset.n_hidden, plan, _dataset_seed(shared, dataset.name, split, 1), (0.5, 1.0), dataset.name,
                  float(y_std))
    chosen = tune(stage, (y_train[val] - y_mean) / y_std)
    x_mean, x_std, y_mean, y_std = standardise(X_train, y_train)
    final = Stage((X_train - x_mean) / x_std, (y_train - y_mean) / y_std, (dataset.X[test] - x_mean) / x_std,
                  dataset.n_hidden, plan, _dataset_seed(shared, dataset.name, split, 2), (0.5, 1.0), dataset.name,
                  float(y_std))
    rows = []
    for method, (_, config, choice) in chosen.items():
        if method.startswith("swag_fa_lin"):
            scale, noise = choice
            predictions = linearized(final, config, None)
            z = torch.as_tensor((dataset.y[test] - y_mean) / y_std, dtype=torch.float64)
            log_likelihood = regression_log_likelihood(predictions.centre[..., 0], z, noise,
                                                       variance=predictions.variance(scale)[..., 0])
            test_ll = float(log_likelihood.mean()) - math.log(y_std)
            draws = predictions.centre[..., 0].double().numpy()
        else:
            scale, noise = math.nan, choice
            draws = final.run(method, config).draws
            test_ll = mixture_log_likelihood(draws, dataset.y[test], noise, y_mean, y_std)
        rows.append({"dataset": dataset.name, "split": split, "method": method, "test_ll": test_ll,
                     "rmse": rmse(draws, dataset.y[test], y_mean, y_std), "scale": scale, "noise_variance": noise})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["boston", "concrete", "energy", "yacht"])
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results") / "uci_linearized")
    parser.add_argument("--development", action="store_true",
                        help="read no test row: score the benchmark's validation rows of each split instead, "
                             "tuning on a further 80/20 split of its fit rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "uci_linearized.csv"
    done = set()
    if path.exists():
        with path.open() as handle:
            done = {(row["dataset"], int(row["split"])) for row in csv.DictReader(handle)}
    for name in args.datasets:
        dataset = load_dataset(name, None)
        for split, (train, test) in enumerate(published_splits(len(dataset.y), args.splits)):
            if (dataset.name, split) in done:
                continue
            if args.development:
                fit, val = validation_split(len(train), int(_dataset_seed(argparse.Namespace(seed=0), dataset.name,
                                                                          split, 0).generate_state(1)[0]))
                train, test = train[fit], train[val]
            rows = run_split(dataset, split, train, test, args)
            new = not path.exists()
            with path.open("a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=FIELDS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
            print(name, split, {row["method"]: round(row["test_ll"], 3) for row in rows}, flush=True)


if __name__ == "__main__":
    main()
