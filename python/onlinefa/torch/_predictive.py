"""The regression predictive of a posterior: the mixture log-likelihood of the draws of
:func:`~onlinefa.torch.bayesian_model_average` (``task="regression"``) with a given or fitted noise variance."""

from __future__ import annotations

import math

import torch

from ._maximise import maximise_log

__all__ = ["fit_noise_variance", "regression_log_likelihood"]

#: Golden-section iterations of :func:`fit_noise_variance` (the bracket shrinks 0.618× each: 1e-15 of it left).
_REFINE_STEPS = 72
#: Geometric grid (points, decades below and above the residual scale) that brackets the maximum.
_GRID_POINTS, _DECADES_BELOW, _DECADES_ABOVE = 161, 12.0, 4.0


def _residuals(draws: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """y_n − f_s(x_n) flattened over the outputs: shape (S, N, P)."""
    if draws.ndim < 2:
        raise ValueError(f"draws must have shape (S, N, ...), got {tuple(draws.shape)}")
    targets = torch.as_tensor(targets, dtype=torch.float64, device=draws.device)
    if tuple(targets.shape) != tuple(draws.shape[1:]):
        if targets.numel() == math.prod(draws.shape[1:]):  # (N,) against (S, N, 1), as a loader's targets come
            targets = targets.reshape(draws.shape[1:])
        else:
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not match draws {tuple(draws.shape)}")
    residual = targets.unsqueeze(0) - draws.to(torch.float64)
    if not bool(torch.isfinite(residual).all()):
        raise ValueError("draws and targets must be finite")
    return residual.reshape(draws.shape[0], draws.shape[1], -1)


def _mean_log_likelihood(residual: torch.Tensor, noise_variance: float) -> float:
    return float(_log_likelihoods(residual, noise_variance).mean())


def _log_likelihoods(residual: torch.Tensor, noise_variance: float) -> torch.Tensor:
    # log (1/S) Σ_s Π_p N(r_snp; 0, σ²), per point n: a log-sum-exp over the draws.
    n_outputs = residual.shape[2]
    log_density = (-0.5 * residual.square().sum(dim=2) / noise_variance
                   - 0.5 * n_outputs * math.log(2.0 * math.pi * noise_variance))  # (S, N)
    return torch.logsumexp(log_density, dim=0) - math.log(residual.shape[0])


def regression_log_likelihood(draws: torch.Tensor, targets: torch.Tensor, noise_variance: float
                              ) -> torch.Tensor:
    """Per-point log-likelihood of the targets under the equal mixture of the draws' Gaussians.

    log p(y_n) = log (1/S) Σ_s N(y_n; f_s(x_n), σ² I), with f_s(x_n) the s-th draw's prediction (a
    Gaussian likelihood with noise variance σ² around every sampled network, averaged over the posterior).

    Parameters
    ----------
    draws : torch.Tensor of shape (S, N, ...)
        The predictions of S posterior draws, as :func:`bayesian_model_average` returns them with
        ``task="regression"``.
    targets : torch.Tensor of shape (N, ...)
        The targets (a shape of N values is also taken for draws of shape (S, N, 1)).
    noise_variance : float
        σ² (> 0), in the targets' units squared: known, or :func:`fit_noise_variance` on held-out data.

    Returns
    -------
    torch.Tensor of shape (N,)
        float64; ``.mean()`` is the usual test log-likelihood per point.

    Raises
    ------
    ValueError
        Shapes that do not match, non-finite values, or σ² not > 0.
    """
    if not (isinstance(noise_variance, (int, float)) and math.isfinite(noise_variance) and noise_variance > 0):
        raise ValueError(f"noise_variance must be a finite number > 0, got {noise_variance!r}")
    return _log_likelihoods(_residuals(draws, targets), float(noise_variance))


def fit_noise_variance(draws: torch.Tensor, targets: torch.Tensor) -> float:
    """The σ² that maximises the mean mixture log-likelihood of ``targets`` (:func:`regression_log_likelihood`).

    Fit it on held-out (validation) data, never on the test data it is then used on. The maximum is
    bracketed on a geometric grid around the mean squared residual and refined by golden-section search
    on log σ²; with one draw it is the mean squared residual per output (the closed form).

    Parameters
    ----------
    draws : torch.Tensor of shape (S, N, ...)
    targets : torch.Tensor of shape (N, ...)

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Shapes that do not match, non-finite values, or draws that fit the targets exactly (no σ² > 0 is best).
    """
    residual = _residuals(draws, targets)
    scale = float(residual.square().mean())
    if not scale > 0.0:
        raise ValueError("the draws fit the targets exactly: no noise variance > 0 maximises the likelihood")
    centre = math.log(scale)
    best = maximise_log(lambda v: _mean_log_likelihood(residual, math.exp(v)),
                        centre - _DECADES_BELOW * math.log(10.0), centre + _DECADES_ABOVE * math.log(10.0),
                        grid_points=_GRID_POINTS, refine_steps=_REFINE_STEPS)
    return math.exp(best)
