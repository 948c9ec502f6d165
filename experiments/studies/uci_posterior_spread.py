"""How much of the predictive variance a weight-space posterior carries on a UCI benchmark split.

Runs the ``uci-bnn`` experiment's stages (the same published splits, 80/20 validation split, seeds and
4,000-epoch Adam pre-training at rate 1e-3 as ``--epochs 4000 --adam-lr 1e-3``) at one grid point (λ, η) and
prints, for SWAG-FA (one run) and MultiSWAG-FA (five), under three ways of widening the posterior:

* ``scale``: the collected posterior drawn at s × its standard deviation;
* ``eta``: collection by SGD at the constant rate η;
* ``langevin``: collection by SGD plus Gaussian noise of variance 2 η T σ² / N per step and coordinate
  (Langevin dynamics whose stationary law is the network's posterior tempered by T, for the per-point loss
  ½ mean (y − f)² + ½ λ ‖θ‖², σ² the training mean squared residual of the pre-trained network),

the validation log-likelihood with its tuned σ², the mean variance over the test rows of the draws' network
outputs ("spread", standardised units; compare with σ²), and the test log-likelihood and RMSE.

    nice -n 10 python experiments/studies/uci_posterior_spread.py --dataset yacht --splits 7 11 13
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
import torch

import onlinefa
from onlinefa_experiments.uci_bnn import _dataset_seed
from onlinefa_experiments.uci_bnn._data import load_dataset, standardise
from onlinefa_experiments.uci_bnn._methods import Budget, Stage, _seed
from onlinefa_experiments.uci_bnn._metrics import mixture_log_likelihood, rmse, tune_noise_variance
from onlinefa_experiments.uci_bnn._splits import published_splits, validation_split
from onlinefa_experiments.uci_bnn._train import generator, train
from onlinefa.torch import MultiSWAG, ParameterVector, SnapshotCollector

BUDGET = Budget(batch_size=128, epochs=4000, collect_epochs=50, snapshots_per_epoch=4, rank=10, n_draws=30,
                vifa_epochs=50, slang_epochs=120, adam_lr=1e-3)
DRAW_SEED = 123


class LangevinSGD(torch.optim.SGD):
    """SGD followed by N(0, std²) noise on every coordinate after each step."""

    def __init__(self, params: Any, lr: float, weight_decay: float, std: float, gen: torch.Generator) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.std, self.gen = std, gen

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(torch.randn(p.shape, generator=self.gen, dtype=p.dtype) * self.std)
        return out


def langevin_posterior(stage: Stage, lam: float, eta: float, temperature: float, member: int) -> onlinefa.OnlineEM:
    theta, _ = stage.pretrained(lam, member)[stage.budget.epochs]
    model = stage._network()
    ParameterVector(model).assign(theta)
    std = math.sqrt(2.0 * eta * temperature * stage._training_mse(theta) / stage.n_fit)
    gen = torch.Generator().manual_seed(_seed(stage.seed, 77, member, int(eta * 1e9)))
    optimizer = LangevinSGD(model.parameters(), eta, lam, std, gen)
    posterior = onlinefa.OnlineEM(theta.size, stage.budget.rank, seed=_seed(stage.seed, 3, member, int(lam * 1e9)))
    collector = SnapshotCollector(posterior, model, every=1).attach(optimizer)
    train(model, optimizer, stage.data, stage.budget.collect_epochs, stage.budget.batch_size,
          generator(_seed(stage.seed, 78, member, int(eta * 1e9))))
    collector.detach()
    return posterior


def posterior(stage: Stage, members: int, lam: float, eta: float, temperature: float | None) -> Any:
    if temperature is None:
        fits = [stage.collected(lam, eta, m)[0]["swag_fa"] for m in range(members)]
    else:
        fits = [langevin_posterior(stage, lam, eta, temperature, m) for m in range(members)]
    return fits[0] if members == 1 else MultiSWAG(fits)


def stages(dataset: Any, split: int) -> tuple[Stage, Stage, np.ndarray, tuple[float, float]]:
    """The validation stage, the refit stage, the standardised validation targets and the refit's (ȳ, s_y)."""
    seeds = argparse.Namespace(seed=0)
    train_rows, test_rows = list(published_splits(dataset.y.size, dataset.n_splits))[split]
    X, y = dataset.X[train_rows], dataset.y[train_rows]
    fit, val = validation_split(len(train_rows), int(_dataset_seed(seeds, dataset.name, split, 0).generate_state(1)[0]))
    xm, xs, ym, ys = standardise(X[fit], y[fit])
    validation = Stage((X[fit] - xm) / xs, (y[fit] - ym) / ys, (X[val] - xm) / xs, dataset.n_hidden, BUDGET,
                       _dataset_seed(seeds, dataset.name, split, 1), (1.0,))
    xm2, xs2, ym2, ys2 = standardise(X, y)
    refit = Stage((X - xm2) / xs2, (y - ym2) / ys2, (dataset.X[test_rows] - xm2) / xs2, dataset.n_hidden, BUDGET,
                  _dataset_seed(seeds, dataset.name, split, 2), (1.0,))
    return validation, refit, (y[val] - ym) / ys, (ym2, ys2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="yacht")
    parser.add_argument("--splits", type=int, nargs="+", default=[7])
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--eta", type=float, default=0.005, help="η of the 'scale' and 'langevin' rows")
    parser.add_argument("--scales", type=float, nargs="+", default=[1, 4, 32])
    parser.add_argument("--etas", type=float, nargs="+", default=[0.02, 0.1])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0])
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = load_dataset(args.dataset, None)
    test_rows = {s: list(published_splits(dataset.y.size, dataset.n_splits))[s][1] for s in args.splits}
    settings = ([("scale", s, args.eta, None) for s in args.scales] + [("eta", 1.0, e, None) for e in args.etas]
                + [("langevin", 1.0, args.eta, t) for t in args.temperatures])
    print("split,members,widening,value,validation_ll,sigma2,spread,test_ll,rmse", flush=True)
    for split in args.splits:
        validation, refit, y_val, (y_mean, y_std) = stages(dataset, split)
        for members in (1, 5):
            for kind, scale, eta, temperature in settings:
                draws = [stage._average(posterior(stage, members, args.weight_decay, eta, temperature),
                                        BUDGET.n_draws, scale, DRAW_SEED) for stage in (validation, refit)]
                sigma2, score = tune_noise_variance(draws[0], y_val)
                y_test = dataset.y[test_rows[split]]
                value = {"scale": scale, "eta": eta, "langevin": temperature}[kind]
                print(f"{split},{members},{kind},{value},{score:.3f},{sigma2:.2e},"
                      f"{float(np.mean(np.var(draws[1], axis=0))):.1e},"
                      f"{mixture_log_likelihood(draws[1], y_test, sigma2, y_mean, y_std):.3f},"
                      f"{rmse(draws[1], y_test, y_mean, y_std):.3f}", flush=True)


if __name__ == "__main__":
    main()
