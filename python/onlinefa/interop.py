"""Interoperability: zero-copy input from other array libraries, export to SciPy and PyTorch.

Input
-----
:func:`as_numpy` turns what other libraries hand you into a NumPy array *without copying* whenever
NumPy can view the memory: NumPy arrays (any strides, memory-mapped ones included), objects exposing
``__array_interface__``, ``__array_struct__``, ``__array__`` or the buffer protocol (memoryviews), and
DLPack producers (objects with ``__dlpack__``, read through :func:`numpy.from_dlpack`) such as PyTorch
CPU tensors and JAX CPU arrays. Lists and other sequences are converted (a copy, necessarily).

Output
------
:func:`to_scipy` gives a frozen :func:`scipy.stats.multivariate_normal` (dense, for small D) and
:func:`to_torch_low_rank` the ``(loc, cov_factor, cov_diag)`` triple that
``torch.distributions.LowRankMultivariateNormal`` takes, as NumPy arrays (this module never imports
torch). Both accept any fitted model: ``OnlineEM``, ``OnlineSGA``, ``VIFA`` (``mean``, ``loadings``,
``noise_variance``) or the scikit-learn style ``OnlineFactorAnalysis`` (``mean_``, ``components_``,
``noise_variance_``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ._gaussian import MAX_DENSE_FEATURES
from ._validation import as_numpy

if TYPE_CHECKING:
    from scipy.stats._multivariate import multivariate_normal_frozen

FloatArray = NDArray[np.float64]

__all__ = ["LowRankParameters", "as_numpy", "to_scipy", "to_torch_low_rank"]



def _gaussian_parameters(model: object) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(mean, loadings F of shape (D, K), noise variances ψ) of a streaming model or estimator."""
    if hasattr(type(model), "components_"):  # estimator: an unfitted one raises NotFittedError here
        mean = np.asarray(getattr(model, "mean_"), dtype=np.float64)
        loadings = np.asarray(getattr(model, "components_"), dtype=np.float64).T
        noise_variance = np.asarray(getattr(model, "noise_variance_"), dtype=np.float64)
    elif all(hasattr(model, name) for name in ("mean", "loadings", "noise_variance")):
        mean = np.asarray(getattr(model, "mean"), dtype=np.float64)
        loadings = np.asarray(getattr(model, "loadings"), dtype=np.float64)
        noise_variance = np.asarray(getattr(model, "noise_variance"), dtype=np.float64)
    else:
        raise TypeError(
            "expected a fitted onlinefa model (mean, loadings, noise_variance) or OnlineFactorAnalysis "
            f"(mean_, components_, noise_variance_), got {type(model).__name__}"
        )
    return np.array(mean), np.ascontiguousarray(loadings), np.array(noise_variance)


class LowRankParameters(NamedTuple):
    """Arguments of ``torch.distributions.LowRankMultivariateNormal``, as NumPy float64 arrays.

    The distribution is N(loc, cov_factor cov_factorᵀ + diag(cov_diag)).

    Attributes
    ----------
    loc : ndarray of shape (D,)
        Mean c.
    cov_factor : ndarray of shape (D, K)
        Loading matrix F.
    cov_diag : ndarray of shape (D,)
        Noise variances ψ (all > 0).
    """

    loc: FloatArray
    cov_factor: FloatArray
    cov_diag: FloatArray


def to_torch_low_rank(model: object) -> LowRankParameters:
    """Export a fitted model as the arguments of ``torch.distributions.LowRankMultivariateNormal``.

    Parameters
    ----------
    model : OnlineEM, OnlineSGA, VIFA or OnlineFactorAnalysis
        A fitted model.

    Returns
    -------
    LowRankParameters
        Named tuple ``(loc, cov_factor, cov_diag)`` of float64 NumPy arrays with shapes (D,), (D, K)
        and (D,), independent copies of the model's state. ``._asdict()`` gives a dict.

    Examples
    --------
    >>> import numpy as np, onlinefa
    >>> from onlinefa.interop import to_torch_low_rank
    >>> em = onlinefa.OnlineEM(6, 2, seed=0).update(np.random.default_rng(0).standard_normal((300, 6)))
    >>> loc, cov_factor, cov_diag = to_torch_low_rank(em)
    >>> loc.shape, cov_factor.shape, cov_diag.shape
    ((6,), (6, 2), (6,))

    With PyTorch installed (``torch.from_numpy`` shares the memory)::

        import torch
        params = {k: torch.from_numpy(v) for k, v in to_torch_low_rank(em)._asdict().items()}
        q = torch.distributions.LowRankMultivariateNormal(**params)
        q.log_prob(torch.zeros(6))  # equals em.log_prob(np.zeros(6))
    """
    mean, loadings, noise_variance = _gaussian_parameters(model)
    return LowRankParameters(loc=mean, cov_factor=loadings, cov_diag=noise_variance)


def to_scipy(model: object, *, max_features: int = MAX_DENSE_FEATURES) -> multivariate_normal_frozen:
    """Export a fitted model as a frozen ``scipy.stats.multivariate_normal`` (dense; small D only).

    Parameters
    ----------
    model : OnlineEM, OnlineSGA, VIFA or OnlineFactorAnalysis
        A fitted model.
    max_features : int, default=5000
        Largest D accepted: the dense D×D covariance and its factorisation cost O(D²) memory and O(D³)
        time.

    Returns
    -------
    scipy.stats._multivariate.multivariate_normal_frozen
        N(mean, F Fᵀ + diag ψ), with ``logpdf``, ``rvs``, ``cov``, ``entropy``, ...

    Raises
    ------
    ValueError
        If D > ``max_features``.
    ImportError
        If SciPy is not installed.

    Examples
    --------
    >>> import numpy as np, onlinefa
    >>> from onlinefa.interop import to_scipy
    >>> em = onlinefa.OnlineEM(6, 2, seed=0).update(np.random.default_rng(0).standard_normal((300, 6)))
    >>> dist = to_scipy(em)
    >>> bool(np.isclose(dist.logpdf(np.zeros(6)), em.log_prob(np.zeros(6))[0]))
    True
    """
    from scipy.stats import multivariate_normal

    mean, loadings, noise_variance = _gaussian_parameters(model)
    n_features = mean.shape[0]
    if n_features > max_features:
        raise ValueError(
            f"to_scipy builds a dense {n_features}x{n_features} covariance; the limit is "
            f"max_features={max_features}. Use log_prob/sample/to_torch_low_rank for large D"
        )
    covariance = loadings @ loadings.T
    covariance[np.diag_indices(n_features)] += noise_variance
    frozen: multivariate_normal_frozen = multivariate_normal(mean=mean, cov=covariance)
    return frozen
