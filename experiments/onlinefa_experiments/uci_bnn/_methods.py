"""The methods of the ``uci-bnn`` experiment and one "stage" (fit on some rows, predict others).

Every method is a function of a *configuration* from its grid (see :mod:`._tuning`) and returns draws
of the network output (S, N) in standardised target units on the rows it predicts:

* ``map``, ``ensemble``: configuration (λ, f): Adam (rate ``adam_lr``, weight decay λ) for ``f · E`` epochs
  (f ∈ the early-stopping fractions); the ensemble is 5 independently initialised and shuffled networks
  (Lakshminarayanan et al., "Simple and Scalable Predictive Uncertainty Estimation using Deep
  Ensembles"), each predicting one point (S = 5 draws).
* ``swa``, ``swag_diag``, ``swag``, ``swag_fa``, ``online_sga``, ``vifa``, ``vifa_eb``, ``multiswag_fa``:
  configuration (λ, η): the E-epoch Adam network is trained on by SGD at the constant rate η (weight
  decay λ) for C epochs while every posterior gets ``snapshots_per_epoch`` snapshots per epoch
  (:class:`onlinefa.torch.SnapshotCollector`): SWA (the mean), SWAG-diagonal and SWAG (Maddox et al.,
  "A Simple Baseline for Bayesian Uncertainty in Deep Learning"; SWAG-diagonal drawn at scale ½),
  SWAG-FA = :class:`onlinefa.OnlineEM` with its defaults and :class:`onlinefa.OnlineSGA` with lr = 1e-3 (rank K).
  VIFA (:class:`onlinefa.VIFA`, Adam, the ``swag`` experiment's rates) starts from SWAG's Gaussian with
  the likelihood N(y; f(x), σ²_train) (σ²_train the training mean squared residual at θ_SWA) and the
  prior precision λ N / σ²_train. ``vifa_eb`` is the library's recipe instead: ``VIFA.from_gaussian`` of
  the SWAG-FA fit ("auto" rates), σ² (:class:`onlinefa.torch.GaussianNoise`, from σ²_train) and α (from
  λ N / σ²_train) learned with q by empirical Bayes (``vifa_regression_step(..., learn_prior_precision=True)``).
  MultiSWAG-FA mixes the SWAG-FA posteriors of 5 such runs.
* ``mc_dropout``: configuration (λ, p): the dropout network trained like MAP for E epochs, predicting
  by S stochastic passes (Gal and Ghahramani, "Dropout as a Bayesian Approximation").
* ``swag_fa_dropout``: configuration (λ, p): the same training run as ``mc_dropout`` (same seeds, so the same
  network), with :class:`onlinefa.OnlineEM` (rank K) fitted to the Adam iterates of its last C epochs
  (``snapshots_per_epoch`` per epoch); it predicts by S passes, each with its own draw θ_s of that posterior
  and its own dropout mask. ``swa_dropout`` (the ablation) predicts from the same run with the posterior's mean
  (the iterates' average, SWA) in every pass and only the masks drawn.
* ``slang``: configuration (λ, ρ): ``fit_slang`` (rank 1, rate ρ) with the noise precision 1/σ²_MAP of
  the (λ, 1) MAP network's training residuals and the prior precision λ N / σ²_MAP.
* ``slang_recipe``: configuration (ln λ, ln τ), τ in the target's original units: ``fit_slang`` with SLANG's
  published UCI recipe (:mod:`._slang_recipe`: minibatches of 10, the data set's learning rate, bias prior
  precision 1e-6) for ``slang_epochs`` epochs, prior precision λ and noise precision τ s_y² (standardised units);
  it predicts with that noise (σ² = 1 / (τ s_y²)), as the published runs did, instead of a tuned σ².

Shared work (the pre-training of a (λ, member), a collection run) is computed once per stage and its
seconds are counted in full for each method that uses it (``fit_seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from numpy.typing import NDArray

import onlinefa
from onlinefa.torch import (
    GaussianNoise, MultiSWAG, ParameterVector, SnapshotCollector, bayesian_model_average, sample_parameters,
    vifa_regression_step, vifa_step,
)
from onlinefa.torch.swag import SWAG

from ._slang_recipe import RECIPE_BATCH_SIZE, RECIPE_BIAS_PRIOR_PRECISION, recipe_for
from ._train import Data, as_tensors, batches, build_network, dropout_draws, generator, half_mse, predict, train

FloatArray = NDArray[np.float64]
Config = tuple[float, float]


#: Which grid each method is tuned on: "map" (λ, epoch fraction), "collect" (λ, η), "dropout" (λ, p),
#: "slang" (λ, SLANG's learning rate), "slang_recipe" (ln λ, ln τ in SLANG's published box).
GRID_KIND: dict[str, str] = {
    "map": "map", "ensemble": "map", "swa": "collect", "swag_diag": "collect", "swag": "collect",
    "swag_fa": "collect", "online_sga": "collect", "vifa": "collect", "vifa_eb": "collect", "multiswag_fa": "collect",
    "mc_dropout": "dropout", "swag_fa_dropout": "dropout", "swa_dropout": "dropout", "slang": "slang", "slang_recipe": "slang_recipe",
}  # fmt: skip

#: Posterior drawn from each collected model, and its sampling scale.
_POSTERIORS: dict[str, float] = {"swag_diag": 0.5, "swag": 1.0, "swag_fa": 1.0, "online_sga": 1.0}

#: Members of an ensemble / MultiSWAG-FA mixture.
N_MEMBERS = 5


class Budget(NamedTuple):
    """Training budget of one fit."""

    batch_size: int
    epochs: int  #: E, Adam epochs (MAP, ensembles, MC dropout, SWAG pre-training)
    collect_epochs: int  #: C
    snapshots_per_epoch: int
    rank: int  #: K of SWAG, OnlineEM, OnlineSGA and VIFA
    n_draws: int  #: S per posterior (MultiSWAG-FA: split over its members)
    vifa_epochs: int
    slang_epochs: int
    adam_lr: float


class Result(NamedTuple):
    """Draws (S, N) in standardised units, the fit's wall-clock seconds and, for a method that predicts with the
    noise it was trained with (``slang_recipe``), that noise variance (standardised units; None: tuned)."""

    draws: FloatArray
    seconds: float
    noise_variance: float | None = None


def load_slang() -> Callable[..., Any] | None:
    """``fit_slang`` from the experiment's SLANG baseline module, or None when it is not installed."""
    try:
        from ._slang import fit_slang
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.endswith("uci_bnn._slang"):
            return None
        raise
    out: Callable[..., Any] = fit_slang
    return out


def n_parameters(model: torch.nn.Module) -> int:
    """Number of scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def _seed(root: np.random.SeedSequence, *key: int) -> int:
    """A seed for ``key`` under ``root``; negative keys (SLANG's log-scale settings) wrap modulo 2⁶⁴."""
    wrapped = tuple(k % 2**64 for k in key)
    return int(np.random.SeedSequence(entropy=root.entropy, spawn_key=(*root.spawn_key, *wrapped))
               .generate_state(1)[0])


class Stage:
    """Fit on ``(X_fit, y_fit)`` (standardised) and predict ``X_eval``, caching shared training runs.

    Parameters
    ----------
    X_fit, y_fit, X_eval : ndarray
        Standardised rows to fit on and inputs to predict.
    n_hidden : int
    budget : Budget
    seed : numpy.random.SeedSequence
        Root of every random choice of the stage; a method's result depends only on it and on the
        configuration, not on which other methods run.
    fractions : tuple of float
        The early-stopping fractions of E at which every pre-training run keeps a checkpoint.
    dataset : str
        Short name of the data set (selects SLANG's published settings).
    y_scale : float
        s_y, the standard deviation the targets were divided by (converts SLANG's noise precision).
    """

    def __init__(self, X_fit: FloatArray, y_fit: FloatArray, X_eval: FloatArray, n_hidden: int, budget: Budget,
                 seed: np.random.SeedSequence, fractions: tuple[float, ...], dataset: str = "",
                 y_scale: float = 1.0) -> None:
        self.data: Data = as_tensors(X_fit, y_fit)
        self.inputs = torch.as_tensor(X_eval, dtype=torch.float32)
        self.n_hidden = n_hidden
        self.budget = budget
        self.seed = seed
        self.fractions = fractions
        self.dataset = dataset
        self.y_scale = y_scale
        self.n_fit = X_fit.shape[0]
        self._pretrained: dict[tuple[float, int], tuple[dict[int, tuple[FloatArray, float]], float]] = {}
        self._collected: dict[tuple[float, float, int], tuple[dict[str, Any], float, FloatArray]] = {}
        self._dropout_runs: dict[tuple[float, float], tuple[torch.nn.Sequential, onlinefa.OnlineEM, float]] = {}

    # -- shared runs ----------------------------------------------------------------------------------
    def _network(self, dropout: float = 0.0) -> torch.nn.Sequential:
        return build_network(self.data[0].shape[1], self.n_hidden, dropout)

    def _fractions_epochs(self, fractions: tuple[float, ...]) -> list[int]:
        return sorted({max(1, int(round(f * self.budget.epochs))) for f in fractions})

    def pretrained(self, lam: float, member: int) -> dict[int, tuple[FloatArray, float]]:
        """Checkpoints {epochs: (θ, seconds)} of Adam with weight decay λ (member ``member``)."""
        key = (lam, member)
        if key not in self._pretrained:
            torch.manual_seed(_seed(self.seed, 1, member, int(lam * 1e9)))
            model = self._network()
            optimizer = torch.optim.Adam(model.parameters(), lr=self.budget.adam_lr, weight_decay=lam)
            wanted = set(self._fractions_epochs(self.fractions)) | {self.budget.epochs}
            saved = train(model, optimizer, self.data, self.budget.epochs, self.budget.batch_size,
                          generator(_seed(self.seed, 2, member, int(lam * 1e9))), sorted(wanted))
            self._pretrained[key] = (saved, saved[self.budget.epochs][1])
        return self._pretrained[key][0]

    def collected(self, lam: float, eta: float, member: int) -> tuple[dict[str, Any], float, FloatArray]:
        """The posteriors of one SGD collection run, its seconds (pre-training included), and θ_SWA."""
        key = (lam, eta, member)
        if key not in self._collected:
            theta, pre_seconds = self.pretrained(lam, member)[self.budget.epochs]
            model = self._network()
            ParameterVector(model).assign(theta)
            n_features = theta.size
            rank = self.budget.rank
            posteriors: dict[str, Any] = {
                "swag_diag": SWAG(n_features, diagonal=True),
                "swag": SWAG(n_features, max_rank=rank),
                "swag_fa": onlinefa.OnlineEM(n_features, rank, seed=_seed(self.seed, 3, member, int(lam * 1e9))),
                # the constant step, the default when the published rows were run
                "online_sga": onlinefa.OnlineSGA(n_features, rank, lr=1e-3,
                                                 seed=_seed(self.seed, 4, member, int(lam * 1e9))),
            }
            optimizer = torch.optim.SGD(model.parameters(), lr=eta, weight_decay=lam)
            steps = -(-self.n_fit // self.budget.batch_size)
            every = max(1, steps // self.budget.snapshots_per_epoch)
            # at least K + 3 snapshots (past OnlineEM's K + 2 warm-up), also with fewer steps per epoch than asked
            epochs = max(self.budget.collect_epochs, -(-(rank + 3) * every // steps))
            collectors = [SnapshotCollector(p, model, every=every).attach(optimizer) for p in posteriors.values()]
            start = time.perf_counter()
            train(model, optimizer, self.data, epochs, self.budget.batch_size,
                  generator(_seed(self.seed, 5, member, int(lam * 1e9), int(eta * 1e9))))
            for collector in collectors:
                collector.detach()
            seconds = pre_seconds + time.perf_counter() - start
            self._collected[key] = (posteriors, seconds, posteriors["swag"].mean)
        return self._collected[key]

    # -- prediction -------------------------------------------------------------------------------------
    def _point(self, theta: FloatArray) -> FloatArray:
        model = self._network()
        ParameterVector(model).assign(theta)
        return predict(model, self.inputs)[None, :]

    def _average(self, posterior: object, n_draws: int, scale: float, seed: int) -> FloatArray:
        model = self._network()
        draws = bayesian_model_average(model, posterior, [(self.inputs,)], n_samples=n_draws, scale=scale,
                                       seed=seed, task="regression")
        out: FloatArray = draws.double().numpy().reshape(n_draws, -1)
        return out

    def _training_mse(self, theta: FloatArray) -> float:
        model = self._network()
        ParameterVector(model).assign(theta)
        residual = predict(model, self.data[0]) - self.data[1].double().numpy()
        return float(np.mean(residual**2))

    # -- methods ----------------------------------------------------------------------------------------
    def run(self, method: str, config: Config) -> Result:
        """Fit ``method`` at ``config`` and predict the evaluation inputs."""
        lam, second = config
        draw_seed = _seed(self.seed, 9, int(lam * 1e9), int(second * 1e9))
        if method in ("map", "ensemble"):
            epochs = max(1, int(round(second * self.budget.epochs)))
            members = range(1 if method == "map" else N_MEMBERS)
            runs = [self.pretrained(lam, m)[epochs] for m in members]
            return Result(np.concatenate([self._point(theta) for theta, _ in runs]), sum(s for _, s in runs))
        if method == "mc_dropout":
            start = time.perf_counter()
            model = self._dropout_network(lam, second, None)
            seconds = time.perf_counter() - start
            return Result(dropout_draws(model, self.inputs, self.budget.n_draws, draw_seed), seconds)
        if method in ("swag_fa_dropout", "swa_dropout"):
            model, posterior, seconds = self._dropout_collected(lam, second)
            scale = 1.0 if method == "swag_fa_dropout" else 0.0
            return Result(self._posterior_dropout_draws(model, posterior, scale, draw_seed), seconds)
        if method == "slang":
            return self._slang(lam, second, draw_seed)
        if method == "slang_recipe":
            return self._slang_recipe(lam, second, draw_seed)
        if method == "multiswag_fa":
            collections = [self.collected(lam, second, m) for m in range(N_MEMBERS)]
            mixture = MultiSWAG([posteriors["swag_fa"] for posteriors, _, _ in collections])
            return Result(self._average(mixture, self.budget.n_draws, 1.0, draw_seed),
                          sum(s for _, s, _ in collections))
        posteriors, seconds, swa = self.collected(lam, second, 0)
        if method == "swa":
            return Result(self._point(swa), seconds)
        if method == "vifa":
            return self._vifa(lam, second, posteriors["swag"], swa, seconds, draw_seed)
        if method == "vifa_eb":
            return self._vifa_eb(lam, second, posteriors["swag_fa"], swa, seconds, draw_seed)
        return Result(self._average(posteriors[method], self.budget.n_draws, _POSTERIORS[method], draw_seed), seconds)

    def _dropout_network(self, lam: float, rate: float, posterior: onlinefa.OnlineEM | None) -> torch.nn.Sequential:
        """MC dropout's network trained for E epochs; with ``posterior``, fitted to the iterates of the last C
        epochs. The snapshots draw no random numbers, so the network is the same either way."""
        torch.manual_seed(_seed(self.seed, 6, int(lam * 1e9), int(rate * 1e9)))
        model = self._network(rate)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.budget.adam_lr, weight_decay=lam)
        rng = generator(_seed(self.seed, 7, int(lam * 1e9), int(rate * 1e9)))
        collect = 0 if posterior is None else min(self.budget.collect_epochs, self.budget.epochs)
        train(model, optimizer, self.data, self.budget.epochs - collect, self.budget.batch_size, rng)
        if posterior is not None:
            steps = -(-self.n_fit // self.budget.batch_size)
            collector = SnapshotCollector(posterior, model, every=max(1, steps // self.budget.snapshots_per_epoch))
            collector.attach(optimizer)
            train(model, optimizer, self.data, collect, self.budget.batch_size, rng)
            collector.detach()
        return model

    def _dropout_collected(self, lam: float, rate: float) -> tuple[torch.nn.Sequential, onlinefa.OnlineEM, float]:
        """MC dropout's run at (λ, p) with OnlineEM on its last C epochs (cached per stage), and its seconds."""
        key = (lam, rate)
        if key not in self._dropout_runs:
            start = time.perf_counter()
            posterior = onlinefa.OnlineEM(n_parameters(self._network(rate)), self.budget.rank,
                                          seed=_seed(self.seed, 13, int(lam * 1e9), int(rate * 1e9)))
            model = self._dropout_network(lam, rate, posterior)
            self._dropout_runs[key] = (model, posterior, time.perf_counter() - start)
        return self._dropout_runs[key]

    def _posterior_dropout_draws(self, model: torch.nn.Module, posterior: object, scale: float,
                                 seed: int) -> FloatArray:
        """S passes (S, N), pass s with the draw θ_s of ``posterior`` (covariance × ``scale``; 0: its mean) and
        its own dropout mask."""
        vector = ParameterVector(model)
        torch.manual_seed(seed)
        model.train()
        outputs = []
        with torch.no_grad():
            for chunk in sample_parameters(posterior, self.budget.n_draws, scale=scale, seed=seed):
                for theta in chunk:
                    vector.assign(theta)
                    outputs.append(model(self.inputs)[:, 0].double().numpy())
        model.eval()
        return np.stack(outputs)

    def _vifa(self, lam: float, eta: float, swag: SWAG, swa: FloatArray, seconds: float, draw_seed: int) -> Result:
        start = time.perf_counter()
        noise = self._training_mse(swa)
        vifa = onlinefa.VIFA(
            swag.n_features, swag.max_rank, prior_precision=lam * self.n_fit / noise, lr_mean=1e-4,
            lr_loadings=1e-4, lr_log_noise=1e-2, optimizer="adam", seed=_seed(self.seed, 8, int(lam * 1e9)),
            init=swag.loadings, init_mean=swag.mean, init_noise_variance=np.maximum(swag.noise_variance, 1e-12),
        )
        model = self._network()

        def loss_fn(module: torch.nn.Module, batch: Data) -> torch.Tensor:
            return half_mse(module, batch) / noise

        rng = generator(_seed(self.seed, 10, int(lam * 1e9), int(eta * 1e9)))
        for _ in range(self.budget.vifa_epochs):
            for batch in batches(self.data, self.budget.batch_size, rng):
                vifa_step(vifa, model, loss_fn, batch, n_data=self.n_fit)
        seconds += time.perf_counter() - start
        return Result(self._average(vifa, self.budget.n_draws, 1.0, draw_seed), seconds)

    def _vifa_eb(self, lam: float, eta: float, start_model: object, swa: FloatArray, seconds: float,
                 draw_seed: int) -> Result:
        """VIFA as the library's recipe runs it: started from the SWAG-FA fit (``VIFA.from_gaussian``, "auto"
        rates), σ² and α learned with q by empirical Bayes (α starts at λN/σ²_train)."""
        start = time.perf_counter()
        variance = self._training_mse(swa)
        vifa = onlinefa.VIFA.from_gaussian(start_model, prior_precision=lam * self.n_fit / variance,
                                           seed=_seed(self.seed, 8, int(lam * 1e9)))
        noise = GaussianNoise(variance)
        model = self._network()
        rng = generator(_seed(self.seed, 10, int(lam * 1e9), int(eta * 1e9)))
        for _ in range(self.budget.vifa_epochs):
            for batch in batches(self.data, self.budget.batch_size, rng):
                vifa_regression_step(vifa, model, batch, n_data=self.n_fit, noise=noise,
                                     predict=lambda module, x: module(x)[:, 0], learn_prior_precision=True)
        seconds += time.perf_counter() - start
        return Result(self._average(vifa, self.budget.n_draws, 1.0, draw_seed), seconds)

    def _slang(self, lam: float, rate: float, draw_seed: int) -> Result:
        fit_slang = load_slang()
        if fit_slang is None:
            raise RuntimeError("SLANG is not available")
        theta, _ = self.pretrained(lam, 0)[self.budget.epochs]
        noise = self._training_mse(theta)
        start = time.perf_counter()
        posterior = fit_slang(self.data[0].double().numpy(), self.data[1].double().numpy(), n_hidden=self.n_hidden,
                              prior_precision=lam * self.n_fit / noise, noise_precision=1.0 / noise, rank=1,
                              n_epochs=self.budget.slang_epochs, batch_size=self.budget.batch_size,
                              learning_rate=rate, seed=_seed(self.seed, 11, int(lam * 1e9), int(rate * 1e9)))
        seconds = time.perf_counter() - start
        draws = np.asarray(posterior.predict_draws(self.inputs.double().numpy(), self.budget.n_draws, draw_seed),
                           dtype=np.float64)
        return Result(draws, seconds)

    def _slang_recipe(self, log_prior: float, log_noise: float, draw_seed: int) -> Result:
        fit_slang = load_slang()
        if fit_slang is None:
            raise RuntimeError("SLANG is not available")
        recipe = recipe_for(self.dataset)
        noise_precision = float(np.exp(log_noise)) * self.y_scale**2  # τ in standardised units, τ s_y²
        start = time.perf_counter()
        posterior = fit_slang(self.data[0].double().numpy(), self.data[1].double().numpy(), n_hidden=self.n_hidden,
                              prior_precision=float(np.exp(log_prior)),
                              noise_precision=noise_precision, rank=1,
                              n_epochs=self.budget.slang_epochs, batch_size=RECIPE_BATCH_SIZE,
                              learning_rate=recipe.learning_rate, n_mc_samples=recipe.n_mc_samples,
                              bias_prior_precision=RECIPE_BIAS_PRIOR_PRECISION,
                              seed=_seed(self.seed, 12, int(log_prior * 1e9), int(log_noise * 1e9)))
        seconds = time.perf_counter() - start
        draws = np.asarray(posterior.predict_draws(self.inputs.double().numpy(), self.budget.n_draws, draw_seed),
                           dtype=np.float64)
        # the published predictive: the mixture with the trained noise precision, σ² = 1 / (τ s_y²)
        return Result(draws, seconds, 1.0 / noise_precision)
