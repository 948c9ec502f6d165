"""Export to ``torch.distributions``: :func:`to_torch`."""

from __future__ import annotations

import torch
from torch.distributions import LowRankMultivariateNormal

from ._params import check_float_dtype
from ._posterior import gaussian_parameters

__all__ = ["to_torch"]


def to_torch(
    model: object, *, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"
) -> LowRankMultivariateNormal:
    """The Gaussian of a fitted model as ``torch.distributions.LowRankMultivariateNormal``.

    Parameters
    ----------
    model : OnlineEM, OnlineSGA, VIFA, VBFA, OnlineVBFA, OnlineFactorAnalysis or SWAG
        A fitted model.
    dtype : torch.dtype, default=torch.float64
    device : str or torch.device, default="cpu"

    Returns
    -------
    torch.distributions.LowRankMultivariateNormal
        N(loc = c, cov_factor = F, cov_diag = ψ): covariance F Fᵀ + diag ψ, ``log_prob`` equal to the
        model's, tensors independent of the model's state. A model without loadings (K = 0, e.g.
        SWAG-diagonal) gets one zero column, which leaves the covariance unchanged.

    Raises
    ------
    TypeError
        ``model`` has no Gaussian.
    ValueError
        Unfitted estimator, non-finite values, or a noise variance that is not > 0 (the distribution
        needs a positive diagonal).

    Examples
    --------
    >>> import numpy as np, onlinefa
    >>> em = onlinefa.OnlineEM(4, 2, seed=0).update(np.random.default_rng(0).standard_normal((100, 4)))
    >>> q = to_torch(em)
    >>> bool(np.isclose(q.log_prob(torch.zeros(4)).item(), em.log_prob(np.zeros(4))[0]))
    True
    """
    dtype = check_float_dtype(dtype)
    mean, loadings, noise_variance = gaussian_parameters(model)
    if not (noise_variance > 0.0).all():
        raise ValueError(f"{type(model).__name__}: LowRankMultivariateNormal needs noise variances > 0")
    cov_factor = torch.as_tensor(loadings, dtype=dtype, device=device)
    if cov_factor.shape[1] == 0:
        cov_factor = torch.zeros((cov_factor.shape[0], 1), dtype=dtype, device=device)
    return LowRankMultivariateNormal(
        loc=torch.as_tensor(mean, dtype=dtype, device=device),
        cov_factor=cov_factor,
        cov_diag=torch.as_tensor(noise_variance, dtype=dtype, device=device),
    )
