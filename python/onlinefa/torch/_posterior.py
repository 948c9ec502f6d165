"""Reading the Gaussian N(c, F Fᵀ + diag ψ) out of any onlinefa model, and :class:`MultiSWAG` mixtures."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from .._pickle_tag import ClassTaggedPickle
from ..interop import to_torch_low_rank

__all__ = ["GaussianParameters", "MultiSWAG", "gaussian_parameters"]

FloatArray = NDArray[np.float64]


class GaussianParameters(NamedTuple):
    """(c, F, ψ) of N(c, F Fᵀ + diag ψ) as float64 arrays of shapes (D,), (D, K), (D,)."""

    mean: FloatArray
    loadings: FloatArray
    noise_variance: FloatArray


def _host(values: object) -> FloatArray:
    """A float64 NumPy copy of an array or of a tensor on any device."""
    detach = getattr(values, "detach", None)
    if callable(detach):
        values = detach().cpu().numpy()
    return np.array(values, dtype=np.float64)


def _checked(mean: object, loadings: object, noise_variance: object, source: str) -> GaussianParameters:
    c, f, psi = _host(mean), _host(loadings), _host(noise_variance)
    if c.ndim != 1 or f.ndim != 2 or f.shape[0] != c.shape[0] or psi.shape != c.shape:
        raise ValueError(
            f"{source}: inconsistent shapes mean {c.shape}, loadings {f.shape}, noise_variance {psi.shape}"
        )
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(f)) and np.all(np.isfinite(psi))):
        raise ValueError(f"{source}: the Gaussian has non-finite entries")
    if np.any(psi < 0.0):
        raise ValueError(f"{source}: negative noise variances")
    return GaussianParameters(c, f, psi)


def gaussian_parameters(model: object) -> GaussianParameters:
    """The Gaussian of a fitted model, as independent float64 copies.

    Parameters
    ----------
    model : OnlineEM, OnlineSGA, VIFA, VBFA, OnlineVBFA, OnlineFactorAnalysis, SWAG, onlinefa.torch.OnlineEM, onlinefa.torch.OnlineSGA
        A model with ``snapshot()`` returning (mean, loadings, noise_variance) consistently, or the
        properties ``mean``, ``loadings`` (D×K), ``noise_variance``, or the fitted estimator attributes
        ``mean_``, ``components_`` (K×D), ``noise_variance_``.

    Returns
    -------
    GaussianParameters

    Raises
    ------
    TypeError
        ``model`` has no Gaussian (or is an unfitted VB-FA estimator).
    ValueError
        Inconsistent shapes or non-finite values; an unfitted ``OnlineFactorAnalysis``.
    """
    source = type(model).__name__
    snapshot = getattr(model, "snapshot", None)
    if callable(snapshot):
        mean, loadings, noise_variance = snapshot()
        return _checked(mean, loadings, noise_variance, source)
    if not hasattr(type(model), "components_") and hasattr(model, "components_"):
        # VB-FA estimators keep their fitted attributes on the instance.
        components = np.asarray(getattr(model, "components_"))
        return _checked(getattr(model, "mean_"), components.T, getattr(model, "noise_variance_"), source)
    loc, cov_factor, cov_diag = to_torch_low_rank(model)
    return _checked(loc, cov_factor, cov_diag, source)


class MultiSWAG(ClassTaggedPickle):
    """An equally weighted mixture of Gaussian posteriors from independent runs (MultiSWAG).

    Wilson and Izmailov, "Bayesian Deep Learning and a Probabilistic Perspective of Generalization",
    average the predictions of SWAG posteriors fitted along independent SGD runs. Here each component is
    any onlinefa model with a Gaussian (or a ``SWAG``); :func:`onlinefa.torch.sample_parameters` and
    :func:`onlinefa.torch.bayesian_model_average` accept the mixture and split the draws evenly across
    components (component m gets ``n // M`` draws, one more when ``m < n % M``), component 0's draws
    first.

    Parameters
    ----------
    posteriors : iterable of models
        At least one fitted model; all with the same number of features D.

    Raises
    ------
    ValueError
        No component, or components of different dimensions.
    TypeError
        A component without a Gaussian.
    """

    def __init__(self, posteriors: Iterable[object]) -> None:
        components = tuple(posteriors)
        if not components:
            raise ValueError("MultiSWAG needs at least one posterior")
        sizes = {int(gaussian_parameters(p).mean.shape[0]) for p in components}
        if len(sizes) != 1:
            raise ValueError(f"the posteriors have different numbers of features: {sorted(sizes)}")
        self._components = components
        self._n_features = sizes.pop()

    @property
    def components(self) -> tuple[object, ...]:
        """The component posteriors, in order."""
        return self._components

    @property
    def n_features(self) -> int:
        """D, the dimension shared by every component."""
        return self._n_features

    def __len__(self) -> int:
        return len(self._components)

    def __repr__(self) -> str:
        return f"MultiSWAG(n_components={len(self)}, n_features={self._n_features})"

    def split(self, n_samples: int) -> list[int]:
        """Draws per component for ``n_samples`` draws: ``n // M``, plus one for the first ``n % M``.

        Parameters
        ----------
        n_samples : int

        Returns
        -------
        list of int
            Length M, summing to ``n_samples``.
        """
        base, extra = divmod(n_samples, len(self._components))
        return [base + (1 if m < extra else 0) for m in range(len(self._components))]
