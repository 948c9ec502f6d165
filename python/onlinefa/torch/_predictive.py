"""The regression predictive of a posterior: the mixture log-likelihood of the draws of
:func:`~onlinefa.torch.bayesian_model_average` (``task="regression"``) with a given or fitted noise variance,
or of the Gaussians of the linearised network (:meth:`LinearizedPredictions.variance`)."""

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


def _output_variance(variance: torch.Tensor | None, draws: torch.Tensor) -> torch.Tensor | None:
    """The draws' own output variances flattened as :func:`_residuals` (float64), or None; checked."""
    if variance is None:
        return None
    variance = torch.as_tensor(variance, device=draws.device)
    if tuple(variance.shape) != tuple(draws.shape):
        raise ValueError(f"variance of shape {tuple(variance.shape)} does not match draws {tuple(draws.shape)}")
    variance = variance.to(torch.float64)
    if not bool((torch.isfinite(variance) & (variance >= 0.0)).all()):
        raise ValueError("variance must be finite and >= 0")
    return variance.reshape(draws.shape[0], draws.shape[1], -1)


def _mean_log_likelihood(residual: torch.Tensor, noise_variance: float, variance: torch.Tensor | None) -> float:
    return float(_log_likelihoods(residual, noise_variance, variance).mean())


def _log_likelihoods(residual: torch.Tensor, noise_variance: float, variance: torch.Tensor | None) -> torch.Tensor:
    # log (1/S) Σ_s Π_p N(r_snp; 0, σ² + v_snp), per point n: a log-sum-exp over the draws (v = 0 without variance).
    if variance is None:
        n_outputs = residual.shape[2]
        log_density = (-0.5 * residual.square().sum(dim=2) / noise_variance
                       - 0.5 * n_outputs * math.log(2.0 * math.pi * noise_variance))  # (S, N)
    else:
        total = variance + noise_variance
        log_density = -0.5 * (residual.square() / total + torch.log(2.0 * math.pi * total)).sum(dim=2)
    return torch.logsumexp(log_density, dim=0) - math.log(residual.shape[0])


def regression_log_likelihood(draws: torch.Tensor, targets: torch.Tensor, noise_variance: float, *,
                              variance: torch.Tensor | None = None) -> torch.Tensor:
    """Per-point log-likelihood of the targets under the equal mixture of the draws' Gaussians.

    log p(y_n) = log (1/S) Σ_s N(y_n; f_s(x_n), σ² I), with f_s(x_n) the s-th draw's prediction (a
    Gaussian likelihood with noise variance σ² around every sampled network, averaged over the posterior).
    With ``variance``, draw s's Gaussian also carries its own output variance v_s(x_n):
    log (1/S) Σ_s N(y_n; f_s(x_n), σ² + v_s(x_n)), the linearised network's exact predictive when f_s and v_s
    are :class:`LinearizedPredictions`'s ``centre`` and :meth:`~LinearizedPredictions.variance`.

    Parameters
    ----------
    draws : torch.Tensor of shape (S, N, ...)
        The predictions of S posterior draws, as :func:`bayesian_model_average` returns them with
        ``task="regression"``.
    targets : torch.Tensor of shape (N, ...)
        The targets (a shape of N values is also taken for draws of shape (S, N, 1)).
    noise_variance : float
        σ² (> 0), in the targets' units squared: known, or :func:`fit_noise_variance` on held-out data.
    variance : torch.Tensor of shape (S, N, ...), optional
        Each draw's own output variance (finite, >= 0), added to σ²; default none.

    Returns
    -------
    torch.Tensor of shape (N,)
        float64; ``.mean()`` is the usual test log-likelihood per point.

    Raises
    ------
    ValueError
        Shapes that do not match, non-finite values, negative variances, or σ² not > 0.
    """
    if not (isinstance(noise_variance, (int, float)) and math.isfinite(noise_variance) and noise_variance > 0):
        raise ValueError(f"noise_variance must be a finite number > 0, got {noise_variance!r}")
    return _log_likelihoods(_residuals(draws, targets), float(noise_variance), _output_variance(variance, draws))


def fit_noise_variance(draws: torch.Tensor, targets: torch.Tensor, *, variance: torch.Tensor | None = None
                       ) -> float:
    """The σ² that maximises the mean mixture log-likelihood of ``targets`` (:func:`regression_log_likelihood`).

    Fit it on held-out (validation) data, never on the test data it is then used on. The maximum is
    bracketed on a geometric grid around the mean squared residual and refined by golden-section search
    on log σ²; with one draw it is the mean squared residual per output (the closed form). Where the
    draws' own ``variance`` already explains the residuals, the best σ² is the bracket's low end,
    10⁻¹² of the mean squared residual.

    Parameters
    ----------
    draws : torch.Tensor of shape (S, N, ...)
    targets : torch.Tensor of shape (N, ...)
    variance : torch.Tensor of shape (S, N, ...), optional
        Each draw's own output variance, as for :func:`regression_log_likelihood`.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Shapes that do not match, non-finite values, negative variances, or draws that fit the targets
        exactly (no σ² > 0 is best).
    """
    residual = _residuals(draws, targets)
    own = _output_variance(variance, draws)
    scale = float(residual.square().mean())
    if not scale > 0.0:
        raise ValueError("the draws fit the targets exactly: no noise variance > 0 maximises the likelihood")
    centre = math.log(scale)
    best = maximise_log(lambda v: _mean_log_likelihood(residual, math.exp(v), own),
                        centre - _DECADES_BELOW * math.log(10.0), centre + _DECADES_ABOVE * math.log(10.0),
                        grid_points=_GRID_POINTS, refine_steps=_REFINE_STEPS)
    return math.exp(best)

