"""The UCI regression tasks of the ``calibration`` experiment.

Each packaged UCI set is split once (seed 0, 20 % test); inputs and targets are standardised with the
training rows. Every method predicts S draws f_s(x) (one for a point estimate); the predictive is the
mixture (1/S) Σ_s N(y; f_s(x), σ²) with σ² fitted on the validation rows (:func:`fit_noise_variance`),
except laplace-torch, which learns σ with its prior precision from the marginal likelihood of the training
rows (its documented regression recipe) and predicts N(f_μ(x), f_var(x) + σ²). The ``onlinefa`` recipe
predicts with the linearised network's Gaussian N(f(x; c), s J Σ Jᵀ + σ²), s and σ² chosen together on the
validation rows (``select_scale(..., task="regression")``).
Reported in the target's own units: the test log-likelihood per point (``nll`` is its negative) and RMSE.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from onlinefa.torch import (
    MultiSWAG,
    bayesian_model_average,
    fit_noise_variance,
    linearized_predictions,
    regression_log_likelihood,
    select_scale,
)

from . import _calibration_runs as ours
from ._calibration_runs import Budget, Split

#: A regression predictor: inputs (N, P) → draws (S, N) of the standardised target.
Draws = Callable[[torch.Tensor], torch.Tensor]
#: A Gaussian predictor: inputs (N, P) → each draw's mean (S, N) and its own output variance (S, N).
Gaussians = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

#: Fraction of each UCI set held out for testing, and the seed of the split.
TEST_FRACTION, SPLIT_SEED = 0.2, 0


class RegressionSet(NamedTuple):
    """A standardised regression task."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    target_scale: float  #: s.d. of the raw training target (undoes the standardisation)


def uci_set(name: str) -> RegressionSet:
    """A packaged UCI set, split and standardised."""
    from sklearn.model_selection import train_test_split

    from onlinefa._uci import load_uci

    x, y = load_uci(name)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED)
    centre, spread = x_train.mean(axis=0), x_train.std(axis=0)
    spread = np.where(spread > 0.0, spread, 1.0)
    y_centre, y_spread = float(y_train.mean()), float(y_train.std())
    return RegressionSet(name, (x_train - centre) / spread, (y_train - y_centre) / y_spread,
                         (x_test - centre) / spread, (y_test - y_centre) / y_spread, y_spread)


def regression_split(task: RegressionSet, seed: int, fraction: float) -> Split:
    """Training and validation rows of one seed (the same permutation rule as the classification tasks)."""
    order = np.random.default_rng([seed, 7]).permutation(task.x_train.shape[0])
    n_val = max(1, int(round(fraction * order.size)))
    x = torch.as_tensor(task.x_train, dtype=torch.float32)
    y = torch.as_tensor(task.y_train, dtype=torch.float32)
    return Split(x[order[n_val:]], y[order[n_val:]], x[order[:n_val]], y[order[:n_val]])


def _outputs(module: torch.nn.Module, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    from onlinefa.torch import ParameterVector

    ParameterVector(module).assign(theta)
    module.eval()
    with torch.no_grad():
        outputs: torch.Tensor = module(x)
    return outputs[:, 0].unsqueeze(0)


def point_draws(module: torch.nn.Module, theta: torch.Tensor) -> Draws:
    """One 'draw': the network at θ."""
    return lambda x: _outputs(module, theta, x)


def bma_draws(module: torch.nn.Module, posterior: Any, n_draws: int, seed: int) -> Draws:
    """Parameter draws through the network (SWAG-style sampling)."""
    return lambda x: bayesian_model_average(module, posterior, [(x,)], n_samples=n_draws, seed=seed,
                                            task="regression")[..., 0]


def ensemble_draws(runs: list[ours.Run]) -> Draws:
    """One draw per run: its last iterate."""
    members = [point_draws(run.module, run.last) for run in runs]
    return lambda x: torch.cat([member(x) for member in members])


def linearized_gaussians(module: torch.nn.Module, posterior: Any, scale: float, n_draws: int, seed: int) -> Gaussians:
    """The linearised network's Gaussian at covariance ``scale``: each draw's centre and its component's variance."""
    def predict(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        predictions = linearized_predictions(module, posterior, [(x,)], n_samples=n_draws, seed=seed)
        return predictions.centre[..., 0], predictions.variance(scale)[..., 0]
    return predict


def recipe(module: torch.nn.Module, posterior: Any, split: Split, n_draws: int, seed: int
           ) -> tuple[Gaussians, float]:
    """The ``onlinefa`` recipe for regression: the linearised Gaussian, its covariance scale and σ² chosen
    together on the validation rows."""
    ours.assign_mean(module, posterior)
    val = linearized_predictions(module, posterior, [(split.x_val, split.y_val)], n_samples=n_draws, seed=seed + 1)
    chosen = select_scale(val, task="regression")
    assert chosen.noise_variance is not None
    return linearized_gaussians(module, posterior, chosen.scale, n_draws, seed), chosen.noise_variance


def metrics(draws: torch.Tensor, noise_variance: float, task: RegressionSet, variance: torch.Tensor | None = None
            ) -> dict[str, float]:
    """Test log-likelihood per point (as ``nll``, its negative) and RMSE, in the target's own units; each draw
    (S, N) a Gaussian of variance σ² plus its own ``variance`` (S, N) where given."""
    y = torch.as_tensor(task.y_test, dtype=torch.float64)
    own = None if variance is None else variance.double().reshape(draws.shape).unsqueeze(-1)
    log_likelihood = regression_log_likelihood(draws.double().unsqueeze(-1), y.unsqueeze(-1), noise_variance,
                                               variance=own)
    mean = draws.double().mean(dim=0)
    rmse = float(torch.sqrt(torch.mean((mean - y) ** 2))) * task.target_scale
    return {"nll": -(float(log_likelihood.mean()) - math.log(task.target_scale)), "rmse": rmse}


def laplace_regression(module: torch.nn.Module, split: Split, budget: Budget) -> tuple[Any, float]:
    """laplace-torch's regression recipe on the trained network: last-layer KFAC, prior precision and σ by
    the marginal likelihood (Adam on their logs, as its README shows); returns (la, seconds)."""
    from laplace import Laplace
    from torch.utils.data import DataLoader, TensorDataset

    start = time.perf_counter()
    la = Laplace(copy.deepcopy(module).eval(), "regression", subset_of_weights="last_layer", hessian_structure="kron")
    la.fit(DataLoader(TensorDataset(split.x_train, split.y_train.unsqueeze(-1)), batch_size=budget.batch_size))
    log_prior, log_sigma = torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)
    optimizer = torch.optim.Adam([log_prior, log_sigma], lr=1e-1)
    for _ in range(1000):
        optimizer.zero_grad()
        torch.autograd.backward(-la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp()))
        optimizer.step()
    return la, time.perf_counter() - start


def validation_noise(draws: Draws, split: Split) -> float:
    """σ² maximising the validation rows' mixture likelihood."""
    return fit_noise_variance(draws(split.x_val).unsqueeze(-1), split.y_val.unsqueeze(-1))


class RegressionSeed:
    """Every requested method on one (UCI set, seed): rows of calibration.csv and costs.csv."""

    def __init__(self, task: RegressionSet, seed: int, budget: Budget, methods: list[str], members: int,
                 fraction: float) -> None:
        self.task, self.seed, self.budget, self.methods, self.members = task, seed, budget, methods, members
        self.split = regression_split(task, seed, fraction)
        self.orders = ours.batch_orders(self.split.x_train.shape[0], budget, seed)
        self.rows: list[dict[str, Any]] = []
        self.costs: list[dict[str, Any]] = []

    def _record(self, method: str, draws: Draws | None, noise: float | None, train: float, posthoc: float,
                gaussians: Gaussians | None = None) -> None:
        """One method's row: ``draws`` with σ² (fitted on the validation rows where None), or ``gaussians``."""
        start = time.perf_counter()
        x_test = torch.as_tensor(self.task.x_test, dtype=torch.float32)
        if gaussians is not None:
            assert noise is not None
            means, variances = gaussians(x_test)
            values = metrics(means, noise, self.task, variances)
        else:
            assert draws is not None
            noise = validation_noise(draws, self.split) if noise is None else noise
            values = metrics(draws(x_test), noise, self.task)
        seconds = time.perf_counter() - start
        base = {"dataset": self.task.name, "seed": self.seed, "method": method}
        self.rows.append({**base, "evaluation": "clean", "accuracy": "", "ece": "", "brier": "", "auroc": "",
                          **values})
        unit = self.unit
        self.costs.append({**base, "train": train / unit, "posthoc": posthoc / unit, "predict": seconds / unit})

    def run(self) -> None:
        """Train, fit and evaluate every requested method."""
        want, draws, seed = set(self.methods), self.budget.n_draws, 1000 * self.seed + 17
        n = self.members if want & {"multiswag_fa", "deep_ensemble"} else 1
        runs = [ours.train_sgd(self.split, 1, self.budget, self.orders, 1000 * self.seed + m) for m in range(n)]
        plain = ours.train_sgd(self.split, 1, self.budget, self.orders, 1000 * self.seed, collect=False)
        first, self.unit = runs[0], plain.seconds
        mean = torch.tensor(np.array(first.posterior.snapshot()[0]), dtype=torch.float32)
        if "map" in want:
            self._record("map", point_draws(plain.module, plain.last), None, plain.seconds, 0.0)
        if "swa" in want:
            self._record("swa", point_draws(first.module, mean), None, first.seconds, 0.0)
        if "swag_fa" in want:
            self._record("swag_fa", bma_draws(first.module, first.posterior, draws, seed), None, first.seconds, 0.0)
        for method, posterior in (("onlinefa", first.posterior), ("multiswag_fa", None)):
            if method not in want:
                continue
            posterior = posterior if posterior is not None else MultiSWAG([run.posterior for run in runs])
            start = time.perf_counter()
            predict, noise = recipe(first.module, posterior, self.split, draws, seed)
            train = first.seconds if method == "onlinefa" else sum(run.seconds for run in runs)
            self._record(method, None, noise, train, time.perf_counter() - start, predict)
        if "deep_ensemble" in want:
            self._record("deep_ensemble", ensemble_draws(runs), None, sum(run.seconds for run in runs), 0.0)
        self._peers(plain)

    def _peers(self, plain: ours.Run) -> None:
        from . import _calibration_peers as peers

        if "laplace" in self.methods:
            la, seconds = laplace_regression(plain.module, self.split, self.budget)

            def gaussian(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                f_mu, f_var = la(x, pred_type="glm")
                return f_mu[:, 0].detach().unsqueeze(0), f_var.reshape(1, -1).detach()

            noise = float(la.sigma_noise.detach().reshape(-1)[0]) ** 2
            self._record("laplace", None, noise, plain.seconds, seconds, gaussian)
        for method, fit in (("ivon", peers.ivon_outputs), ("swag_peer", peers.swag_peer_outputs)):
            if method in self.methods:
                outputs, seconds = fit(self.split, 1, self.budget, self.orders, 1000 * self.seed)
                self._record(method, _first_output(outputs), None, seconds, 0.0)


def _first_output(outputs: Callable[[torch.Tensor], torch.Tensor]) -> Draws:
    """Draws (S, N) from sampled outputs (S, N, 1)."""
    return lambda x: outputs(x)[..., 0]
