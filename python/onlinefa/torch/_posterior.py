"""Reading the Gaussian N(c, F Fᵀ + diag ψ) out of any onlinefa model, and :class:`MultiSWAG` mixtures."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from .._pickle_tag import ClassTaggedPickle
from ..interop import to_torch_low_rank

__all__ = ["GaussianParameters", "MultiSWAG", "gaussian_for_draws", "gaussian_parameters"]

FloatArray = NDArray[np.float64]


class GaussianParameters(NamedTuple):
    """(c, F, ψ) of N(c, F Fᵀ + diag ψ) as float64 arrays of shapes (D,), (D, K), (D,)."""

    mean: FloatArray
    loadings: FloatArray
    noise_variance: FloatArray


#: Rows per chunk of the finite-value check of the loadings (its temporary stays small at any D).
_CHECK_ROWS = 1 << 16


def _host(values: object, dtype: type[np.floating[Any]] = np.float64, copy: bool = True) -> NDArray[Any]:
    """``values`` as a NumPy array of ``dtype`` on the host: a copy, or with ``copy=False`` a NumPy array of that
    dtype as it is (a tensor is always copied: a torch model's snapshot may share memory with its live state)."""
    detach = getattr(values, "detach", None)
    if callable(detach):
        return np.array(detach().cpu().numpy(), dtype=dtype)
    return np.array(values, dtype=dtype) if copy else np.asarray(values, dtype=dtype)


def _validate(c: NDArray[Any], f: NDArray[Any], psi: NDArray[Any], source: str) -> None:
    """ValueError for inconsistent shapes, non-finite values or negative ψ (F checked in chunks of rows, so no
    D×K temporary is made)."""
    if c.ndim != 1 or f.ndim != 2 or f.shape[0] != c.shape[0] or psi.shape != c.shape:
        raise ValueError(
            f"{source}: inconsistent shapes mean {c.shape}, loadings {f.shape}, noise_variance {psi.shape}"
        )
    finite_rows = all(bool(np.isfinite(f[lo: lo + _CHECK_ROWS]).all()) for lo in range(0, f.shape[0], _CHECK_ROWS))
    if not (finite_rows and np.all(np.isfinite(c)) and np.all(np.isfinite(psi))):
        raise ValueError(f"{source}: the Gaussian has non-finite entries")
    if np.any(psi < 0.0):
        raise ValueError(f"{source}: negative noise variances")


def _checked(mean: object, loadings: object, noise_variance: object, source: str) -> GaussianParameters:
    c, f, psi = _host(mean), _host(loadings), _host(noise_variance)
    _validate(c, f, psi, source)
    return GaussianParameters(c, f, psi)


def gaussian_for_draws(model: object, loadings_dtype: type[np.floating[Any]]) -> tuple[FloatArray, NDArray[Any],
                                                                                         FloatArray]:
    """(c, F, ψ) of a model for drawing from it, read without the copies of :func:`gaussian_parameters`.

    c and ψ are float64; F is ``loadings_dtype``. A streaming model with float32 state gives its float32 F
    (``snapshot(dtype="float32")``, no float64 D×K array); the NumPy arrays of a model's ``snapshot()`` are
    used as they are (the caller must not write to them), tensors are copied to the host. Models without
    ``snapshot()`` go through :func:`gaussian_parameters`. The same checks as there (shapes, finite values,
    ψ >= 0).
    """
    snapshot = getattr(model, "snapshot", None)
    if not callable(snapshot):
        c, f, psi = gaussian_parameters(model)
        return c, f.astype(loadings_dtype, copy=False), psi
    source = type(model).__name__
    if loadings_dtype is np.float32 and getattr(model, "dtype", None) == "float32" and hasattr(model, "_core"):
        mean, loadings, noise_variance = snapshot(dtype="float32")  # the Rust streaming models' own rows
    else:
        mean, loadings, noise_variance = snapshot()
    c, f = _host(mean, copy=False), _host(loadings, loadings_dtype, copy=False)
    psi = _host(noise_variance, copy=False)
    _validate(c, f, psi, source)
    return c, f, psi


def gaussian_parameters(model: object) -> GaussianParameters:
    """The Gaussian of a fitted model, as independent float64 copies.

    Parameters
    ----------
    model : OnlineEM, OnlineSGA, VIFA (any device), VBFA, OnlineVBFA, OnlineFactorAnalysis, SWAG
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
