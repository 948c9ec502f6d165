"""The real job of ``onlinefa demo``: SGD iterates of a small NumPy network → posteriors → BMA on test data.

A one-hidden-layer tanh network f(x; θ) = w₂ᵀ tanh(W₁ᵀ x + b₁) + b₂ is trained by plain SGD on the squared
error of a packaged UCI regression data set (inputs and target standardised with the training split), with a
small L2 penalty. After a pre-training phase, SGD continues at a constant learning rate and the parameter
vector θ (D = (n_in + 2)·H + 1 numbers) is recorded once per epoch, as in SWAG (Maddox et al., "A Simple
Baseline for Bayesian Uncertainty in Deep Learning", 2019, Algorithm 1). Three Gaussians over θ are built from
these iterates and compared by Bayesian model averaging on the test split:

* SWA: the point θ̄ = mean of the iterates (Izmailov et al., "Averaging Weights Leads to Wider Optima", 2018);
* SWAG-diagonal: N(θ̄, diag(σ²)) with σ² the iterates' empirical (population) variances;
* the default :class:`onlinefa.OnlineEM` fitted to the same iterates: N(c, F Fᵀ + Ψ).

The likelihood is Gaussian with the noise variance estimated as the training mean squared residual at θ̄;
the predictive density of a test target is the average of N(y; f(x; θ_s), s²) over the draws θ_s.
Only NumPy is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .streaming import OnlineEM
from ._uci import load_uci

__all__ = [
    "RealRun", "RegressionSplit", "bma_scores", "draw_online_em", "draw_swag_diagonal", "load_split",
    "mlp_loss_and_gradient", "mlp_predict", "n_parameters", "sgd_iterates", "width_ratio",
]

FloatArray = NDArray[np.float64]

#: Fraction of the rows held out as the test split.
TEST_FRACTION = 0.1
#: L2 penalty on every parameter (added to the half mean squared error).
WEIGHT_DECAY = 1e-4


@dataclass(frozen=True)
class RegressionSplit:
    """A fixed train/test split, standardised with the training split's moments."""

    x_train: FloatArray
    y_train: FloatArray
    x_test: FloatArray
    y_test: FloatArray
    y_scale: float
    """Standard deviation of the raw training target: a standardised error times this is in target units."""


@dataclass(frozen=True)
class RealRun:
    """The demo's recorded SGD run: the split, the network width and the iterates (T × D)."""

    split: RegressionSplit
    n_hidden: int
    iterates: FloatArray


def load_split(dataset: str, seed: int) -> RegressionSplit:
    """Load a packaged UCI data set and split it at random (fixed by ``seed``) into 90% train, 10% test.

    Parameters
    ----------
    dataset : str
        A name accepted by :func:`onlinefa.datasets.load_uci`.
    seed : int
        Seed of the permutation of the rows.

    Returns
    -------
    RegressionSplit
    """
    x, y = load_uci(dataset)
    order = np.random.default_rng(seed).permutation(x.shape[0])
    n_test = max(1, int(round(TEST_FRACTION * x.shape[0])))
    test, train = order[:n_test], order[n_test:]
    x_mean, x_std = x[train].mean(axis=0), x[train].std(axis=0)
    x_std[x_std == 0.0] = 1.0
    y_mean, y_std = float(y[train].mean()), float(y[train].std())
    return RegressionSplit(
        (x[train] - x_mean) / x_std, (y[train] - y_mean) / y_std,
        (x[test] - x_mean) / x_std, (y[test] - y_mean) / y_std, y_std,
    )


def n_parameters(n_inputs: int, n_hidden: int) -> int:
    """D = n_inputs·H + H + H + 1: the length of θ."""
    return (n_inputs + 2) * n_hidden + 1


def _unpack(theta: FloatArray, n_inputs: int, n_hidden: int) -> tuple[FloatArray, FloatArray, FloatArray, float]:
    """θ = [W₁ (n_inputs × H, row-major), b₁ (H), w₂ (H), b₂]."""
    end1 = n_inputs * n_hidden
    w1 = theta[:end1].reshape(n_inputs, n_hidden)
    b1 = theta[end1:end1 + n_hidden]
    w2 = theta[end1 + n_hidden:end1 + 2 * n_hidden]
    return w1, b1, w2, float(theta[-1])


def mlp_predict(theta: FloatArray, x: FloatArray, n_hidden: int) -> FloatArray:
    """f(x; θ) = w₂ᵀ tanh(W₁ᵀ x + b₁) + b₂ for every row of ``x``; shape (n,)."""
    w1, b1, w2, b2 = _unpack(theta, x.shape[1], n_hidden)
    out: FloatArray = np.tanh(x @ w1 + b1) @ w2 + b2
    return out


def mlp_loss_and_gradient(theta: FloatArray, x: FloatArray, y: FloatArray, n_hidden: int) -> tuple[float, FloatArray]:
    """Loss ½ mean (f(x; θ) − y)² + ½ λ ‖θ‖² (λ = ``WEIGHT_DECAY``) and its gradient (backpropagation)."""
    w1, b1, w2, b2 = _unpack(theta, x.shape[1], n_hidden)
    hidden = np.tanh(x @ w1 + b1)
    residual = hidden @ w2 + b2 - y
    n = x.shape[0]
    loss = 0.5 * float(residual @ residual) / n + 0.5 * WEIGHT_DECAY * float(theta @ theta)
    g_out = residual / n
    g_hidden = np.outer(g_out, w2) * (1.0 - hidden**2)
    grad = np.concatenate([(x.T @ g_hidden).ravel(), g_hidden.sum(axis=0), hidden.T @ g_out, [g_out.sum()]])
    return loss, grad + WEIGHT_DECAY * theta


def sgd_iterates(split: RegressionSplit, *, n_hidden: int, pretrain_epochs: int, n_snapshots: int,
                 learning_rate: float, batch_size: int, seed: int) -> FloatArray:
    """Train by mini-batch SGD at a constant learning rate and record θ after each of the last epochs.

    Parameters
    ----------
    split : RegressionSplit
    n_hidden : int
        H, the hidden units.
    pretrain_epochs : int
        Epochs before the first snapshot.
    n_snapshots : int
        T, snapshots recorded, one at the end of each further epoch.
    learning_rate : float
        Constant SGD step size.
    batch_size : int
        Rows per SGD step (each epoch visits the training rows once in a new random order).
    seed : int
        Seed of the initialisation and of the row orders.

    Returns
    -------
    ndarray of shape (n_snapshots, D)
    """
    rng = np.random.default_rng(seed)
    n, n_inputs = split.x_train.shape
    theta = np.concatenate([
        rng.standard_normal(n_inputs * n_hidden) / np.sqrt(n_inputs), np.zeros(n_hidden),
        rng.standard_normal(n_hidden) / np.sqrt(n_hidden), np.zeros(1),
    ])
    iterates = np.empty((n_snapshots, theta.size))
    for epoch in range(pretrain_epochs + n_snapshots):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            rows = order[start:start + batch_size]
            theta -= learning_rate * mlp_loss_and_gradient(theta, split.x_train[rows], split.y_train[rows], n_hidden)[1]
        if epoch >= pretrain_epochs:
            iterates[epoch - pretrain_epochs] = theta
    return iterates


def draw_swag_diagonal(iterates: FloatArray, noise: FloatArray) -> FloatArray:
    """θ_s = θ̄ + σ ⊙ z_s for each row z_s of ``noise`` (S × D), σ² the iterates' population variances."""
    draws: FloatArray = iterates.mean(axis=0) + np.sqrt(iterates.var(axis=0)) * noise
    return draws


def draw_online_em(model: OnlineEM, noise: FloatArray, latent: FloatArray) -> FloatArray:
    """θ_s = c + F h_s + ψ^½ ⊙ z_s for the rows z_s of ``noise`` (S × D) and h_s of ``latent`` (S × K)."""
    mean, loadings, psi = model.snapshot()
    draws: FloatArray = mean + latent @ loadings.T + np.sqrt(psi) * noise
    return draws


def width_ratio(marginal_variance: FloatArray, iterates: FloatArray) -> float:
    """Mean over parameters of a posterior's marginal variance divided by the iterates' empirical variance."""
    return float(np.mean(marginal_variance / iterates.var(axis=0)))


def bma_scores(thetas: FloatArray, run: RealRun, noise_variance: float) -> tuple[float, float]:
    """Test NLL (nats per row) and RMSE, both in the target's units, of the average over the rows of ``thetas``.

    Parameters
    ----------
    thetas : ndarray of shape (S, D)
        Parameter draws (one row for a point estimate).
    run : RealRun
    noise_variance : float
        s², the likelihood's noise variance in standardised units.

    Returns
    -------
    nll : float
        −mean over test rows of log (1/S Σ_s N(y; f(x; θ_s), s²)), in the units of the raw target.
    rmse : float
        Root mean squared error of the BMA mean (1/S) Σ_s f(x; θ_s), in the units of the raw target.
    """
    split = run.split
    preds = np.stack([mlp_predict(theta, split.x_test, run.n_hidden) for theta in thetas])
    log_dens = -0.5 * (np.log(2.0 * np.pi * noise_variance) + (split.y_test - preds) ** 2 / noise_variance)
    top = log_dens.max(axis=0)
    log_mix = top + np.log(np.mean(np.exp(log_dens - top), axis=0))
    nll = float(-np.mean(log_mix)) + float(np.log(split.y_scale))
    rmse = float(np.sqrt(np.mean((preds.mean(axis=0) - split.y_test) ** 2))) * split.y_scale
    return nll, rmse
