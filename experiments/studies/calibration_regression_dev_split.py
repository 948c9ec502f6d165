"""Width rules of the regression recipe, judged on a development split of each UCI set's training rows.

No test row is read. Per UCI set, the benchmark's training split (80 % of the rows, the same split as
``onlinefa experiment calibration``) is split again, once: fit-and-validation rows (80 %) and development
rows (20 %), standardised with the former. Per seed, a tenth of the fit-and-validation rows are validation
rows (the benchmark's rule); the same MLP, SGD budget and collection as the benchmark. Each method predicts
the development rows; printed: their log-likelihood per point and RMSE (the target's units), mean ± s.e. over
seeds, and the paired difference against SWA.

- ``swa``: the network at the posterior mean, σ² fitted on the validation rows.
- ``mixture_one_se``: the earlier recipe, the mixture of 30 linearised draws at covariance scale s with
  σ² (σ² at s = 1, s by the one-standard-error rule on the draws' mixture at that σ², σ² again at s).
- ``gaussian``: the linearised network's Gaussian N(f(x; c), s J Σ Jᵀ + σ²) (``centre`` and
  ``LinearizedPredictions.variance``) as ``select_scale(..., task="regression")`` chooses it: σ² the one the
  centre's outputs alone need on the validation rows, s the maximiser on top of it.
- ``gaussian_joint``: the same Gaussian with s and σ² chosen together (the pair maximising the validation
  score); ``gaussian_noise_se``: then σ² raised to the largest value within one standard error of that maximum,
  s re-chosen for it (both from ``uci_linearized.py``).

    python experiments/studies/calibration_regression_dev_split.py --seeds 3 --datasets concrete boston energy yacht
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from onlinefa._uci import load_uci
from onlinefa.torch import (LinearizedPredictions, fit_noise_variance, linearized_predictions,
                            regression_log_likelihood, select_scale)
from onlinefa.torch._maximise import maximise_log
from onlinefa.torch._scale import _widest_above
from onlinefa_experiments._calibration_regression import SPLIT_SEED, TEST_FRACTION, RegressionSet, regression_split
from onlinefa_experiments._calibration_runs import Budget, assign_mean, batch_orders, train_sgd
from uci_linearized import joint_choice, noise_within_standard_error

N_DRAWS, VALIDATION_FRACTION, DEVELOPMENT_FRACTION = 30, 0.1, 0.2
BUDGET = Budget(hidden=(200, 200), epochs=150, collect_epochs=50, lr=0.05, batch_size=32, snapshots_per_epoch=5,
                rank=20, n_draws=N_DRAWS)
METHODS = ("swa", "mixture_one_se", "gaussian", "gaussian_joint", "gaussian_noise_se")


def development_set(name: str) -> RegressionSet:
    """The training split's rows, cut into fit-and-validation rows and development rows (as "test")."""
    x, y = load_uci(name)
    x_train, _, y_train, _ = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED)
    x_fit, x_dev, y_fit, y_dev = train_test_split(x_train, y_train, test_size=DEVELOPMENT_FRACTION, random_state=1)
    centre, spread = x_fit.mean(axis=0), x_fit.std(axis=0)
    spread = np.where(spread > 0.0, spread, 1.0)
    y_centre, y_spread = float(y_fit.mean()), float(y_fit.std())
    return RegressionSet(name, (x_fit - centre) / spread, (y_fit - y_centre) / y_spread, (x_dev - centre) / spread,
                         (y_dev - y_centre) / y_spread, y_spread)


def mixture_scale(val: LinearizedPredictions, targets: torch.Tensor, noise: float) -> float:
    """The earlier rule: the widest s within one standard error of the best mixture score of the draws."""
    def rows(log_scale: float) -> torch.Tensor:
        return regression_log_likelihood(val.outputs(math.exp(log_scale)), targets, noise)

    low, high = math.log(1e-3), math.log(1e6)
    best = maximise_log(lambda v: float(rows(v).mean()), low, high, grid_points=73, refine_steps=40)
    at_best = rows(best)
    threshold = float(at_best.mean()) - float(at_best.std()) / math.sqrt(at_best.numel())
    return math.exp(_widest_above(lambda v: float(rows(v).mean()), threshold, best, high, (high - low) / 72))


def evaluate(task: RegressionSet, seed: int) -> dict[str, tuple[float, float]]:
    """(log-likelihood per point, RMSE) on the development rows of every method, one seed."""
    split = regression_split(task, seed, VALIDATION_FRACTION)
    run = train_sgd(split, 1, BUDGET, batch_orders(split.x_train.shape[0], BUDGET, seed), 1000 * seed)
    assign_mean(run.module, run.posterior)
    draw_seed = 1000 * seed + 17
    val = linearized_predictions(run.module, run.posterior, [(split.x_val, split.y_val)], n_samples=N_DRAWS,
                                 seed=draw_seed + 1)
    dev = linearized_predictions(run.module, run.posterior, [(torch.as_tensor(task.x_test, dtype=torch.float32),)],
                                 n_samples=N_DRAWS, seed=draw_seed)
    y = torch.as_tensor(task.y_test, dtype=torch.float64).unsqueeze(-1)
    results: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    swa_noise = fit_noise_variance(val.centre[:1], split.y_val)
    results["swa"] = (regression_log_likelihood(dev.centre[:1], y, swa_noise), dev.centre[0])
    noise = fit_noise_variance(val.outputs(1.0), split.y_val)
    scale = mixture_scale(val, split.y_val, noise)
    noise = fit_noise_variance(val.outputs(scale), split.y_val)
    draws = dev.outputs(scale)
    results["mixture_one_se"] = (regression_log_likelihood(draws, y, noise), draws.mean(dim=0))
    chosen = select_scale(val, task="regression")
    joint = joint_choice(val)
    variants = {"gaussian": (chosen.scale, chosen.noise_variance), "gaussian_joint": joint[:2],
                "gaussian_noise_se": noise_within_standard_error(val, joint)}
    for method, (scale, noise) in variants.items():
        print(f"  {task.name} seed {seed} {method}: s = {scale:.3g}, σ² = {noise:.3g}")
        results[method] = (regression_log_likelihood(dev.centre, y, noise, variance=dev.variance(scale)),
                           dev.centre[0])
    out = {}
    for method, (log_likelihood, mean) in results.items():
        rmse = float(torch.sqrt(((mean.double() - y) ** 2).mean())) * task.target_scale
        out[method] = (float(log_likelihood.mean()) - math.log(task.target_scale), rmse)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["concrete", "boston", "energy", "yacht"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.datasets:
        task = development_set(name)
        scores = [evaluate(task, seed) for seed in range(args.seeds)]
        base = np.array([seed_scores["swa"][0] for seed_scores in scores])
        print(f"| {name} | log-likelihood | Δ against swa | RMSE |")
        for method in METHODS:
            values = np.array([seed_scores[method][0] for seed_scores in scores])
            rmse = np.array([seed_scores[method][1] for seed_scores in scores])
            diff = values - base
            se = math.sqrt(len(values))
            print(f"| {method} | {values.mean():.3f} ± {values.std(ddof=1) / se:.3f} | "
                  f"{diff.mean():+.3f} ± {diff.std(ddof=1) / se:.3f} | {rmse.mean():.3f} |", flush=True)


if __name__ == "__main__":
    main()
