"""Operations on a factor-analysis Gaussian N(mean, F Fᵀ + diag ψ) that never form a D×D matrix.

One implementation serves every model class (OnlineEM, OnlineSGA, VIFA) through
:class:`FactorGaussianMixin`. With M = I + Fᵀ Ψ⁻¹ F (K×K):

* Woodbury: (F Fᵀ + Ψ)⁻¹ = Ψ⁻¹ − Ψ⁻¹ F M⁻¹ Fᵀ Ψ⁻¹ (thesis 4.54),
* matrix determinant lemma: log|F Fᵀ + Ψ| = log|M| + Σ_d log ψ_d,
* latent posterior: E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − mean) (4.23).

Every cost here is O(n·D·K + K³).
"""

from __future__ import annotations

import numpy as np
from typing import Any

from numpy.typing import ArrayLike, DTypeLike, NDArray

from . import _core
from ._validation import SeedLike, as_sample_matrix, check_finite_samples, check_int, check_seed

#: Largest D for which :meth:`FactorGaussianMixin.covariance` builds the dense D×D matrix without
#: ``force=True`` (5000² float64 numbers are 200 MB).
MAX_DENSE_FEATURES = 5000

FloatArray = NDArray[np.float64]


def _f64(a: Any) -> FloatArray:
    """``a`` as a C-contiguous, aligned float64 array (a copy only when it is not one already)."""
    return np.require(a, dtype=np.float64, requirements=["C", "A"])


def precision_factor(loadings: FloatArray, noise_variance: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Return (Ψ⁻¹ F, lower Cholesky factor of M = I + Fᵀ Ψ⁻¹ F); the factor comes from the core's one
    implementation (with the smallest jitter that makes M factorise when rounding alone breaks it)."""
    chol: FloatArray = _core.gaussian_precision_cholesky(_f64(loadings), _f64(noise_variance))
    return loadings / noise_variance[:, None], chol


def log_prob(x: FloatArray, mean: FloatArray, loadings: FloatArray, noise_variance: FloatArray) -> FloatArray:
    """Log density of each row of ``x`` (n×D) under N(mean, F Fᵀ + diag ψ); shape (n,). Computed by the
    core's streaming query (Woodbury and the determinant lemma), as for the models with an engine."""
    out: FloatArray = _core.gaussian_log_prob(_f64(mean), _f64(loadings), _f64(noise_variance), _f64(x))
    return out


def latent_mean(x: FloatArray, mean: FloatArray, loadings: FloatArray, noise_variance: FloatArray) -> FloatArray:
    """E[h | x] = M⁻¹ Fᵀ Ψ⁻¹ (x − mean) for each row of ``x``; shape (n, K) (the core's query)."""
    out: FloatArray = _core.gaussian_latent_mean(_f64(mean), _f64(loadings), _f64(noise_variance), _f64(x))
    return out


def sample_seed(seed: object) -> int:
    """``seed`` as an int in [0, 2**64) (None: fresh entropy from the operating system)."""
    checked = check_seed(seed)
    if checked is None:
        return int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0])
    return checked


def sample_noise(
    n_samples: int, n_components: int, n_features: int, seed: int, *, row0: int = 0, dtype: Any = np.float64
) -> tuple[FloatArray, NDArray[Any]]:
    """The noise of :meth:`FactorGaussianMixin.sample`: h (n×K) and z for features row0 … row0 + D − 1 (n×D).

    Counter-based (draw j, feature d ↦ a fixed value for the seed), so the features of a vector split
    across processes get the values the whole vector would get.
    """
    latent = np.empty((n_samples, n_components), dtype=np.float64)
    noise = np.empty((n_samples, n_features), dtype=dtype)
    _core.fill_sample_noise(seed, row0, latent, noise)
    return latent, noise


def draw(
    n_samples: int, mean: FloatArray, loadings: FloatArray, noise_variance: FloatArray, seed: int | None
) -> FloatArray:
    """``n_samples`` draws θ = mean + F h + ψ^{1/2} ⊙ z (4.50), h ~ N(0, I_K), z ~ N(0, I_D)."""
    n_features, n_components = loadings.shape
    h, z = sample_noise(n_samples, n_components, n_features, sample_seed(seed))
    out: FloatArray = mean + h @ loadings.T + z * np.sqrt(noise_variance)
    return out


#: (n_seen, mean, loadings, noise_variance) as an engine's ``snapshot()`` returns them.
CachedSnapshot = tuple[int, FloatArray, FloatArray, FloatArray]


def refreshed_snapshot(engine: Any, cached: CachedSnapshot | None) -> CachedSnapshot:
    """``cached`` if it still describes ``engine`` (same sample count), else a new read-only snapshot.

    The engine computes the three arrays under one lock, so a concurrent update cannot mix two states;
    the cache spares repeated accessors from recomputing the D×K loadings.
    """
    if cached is not None and cached[0] == engine.n_seen:
        return cached
    n_seen, mean, loadings, psi = engine.snapshot()
    for arr in (mean, loadings, psi):
        arr.setflags(write=False)
    return (n_seen, mean, loadings, psi)


def check_dense_size(n_features: int, query: str, force: bool = False) -> None:
    """ValueError when ``query`` would build a D×D matrix with D > ``MAX_DENSE_FEATURES`` (unless ``force``)."""
    if n_features > MAX_DENSE_FEATURES and not force:
        hint = " unless force=True" if query == "covariance()" else ""
        raise ValueError(
            f"{query} would build a dense {n_features}x{n_features} matrix; "
            f"the limit is {MAX_DENSE_FEATURES} features{hint}"
        )


def dense_covariance(loadings: FloatArray, noise_variance: FloatArray, query: str, force: bool = False
                     ) -> FloatArray:
    """F Fᵀ + diag ψ as a dense (D, D) array, behind :func:`check_dense_size`."""
    n_features = loadings.shape[0]
    check_dense_size(n_features, query, force)
    cov: FloatArray = loadings @ loadings.T
    cov[np.diag_indices(n_features)] += noise_variance
    return cov


class FactorGaussianMixin:
    """Gaussian helpers for any class exposing ``mean``, ``loadings`` and ``noise_variance``."""

    @property
    def mean(self) -> FloatArray:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @property
    def loadings(self) -> FloatArray:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @property
    def noise_variance(self) -> FloatArray:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def _params(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        return self.mean, self.loadings, self.noise_variance

    def _query_engine(self) -> Any:
        """The Rust engine answering queries by streaming over its state under one lock (``log_prob``,
        ``latent_mean``, ``draw_into``), or None to compute from :meth:`_params` in NumPy."""
        return None

    def covariance(self, force: bool = False) -> FloatArray:
        """Dense covariance F Fᵀ + diag ψ, shape (D, D).

        Parameters
        ----------
        force : bool, default=False
            Build the matrix even when D exceeds ``MAX_DENSE_FEATURES`` (5000).

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Raises
        ------
        ValueError
            If D > ``MAX_DENSE_FEATURES`` and ``force`` is false.
        """
        _, loadings, noise_variance = self._params()
        return dense_covariance(loadings, noise_variance, "covariance()", force=force)

    def log_prob(self, X: ArrayLike) -> FloatArray:
        """Log density of each sample under N(mean, F Fᵀ + diag ψ).

        Uses the Woodbury identity and the matrix determinant lemma: O(n·D·K), no D×D matrix.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_features,)

        Returns
        -------
        ndarray of shape (n_samples,)

        Raises
        ------
        ValueError
            Wrong shape, or NaN, ±Inf or ``|x| > 1e100`` in a row (named in the message).
        """
        engine = self._query_engine()
        if engine is not None:
            out: FloatArray = engine.log_prob(self._query_rows(X))
            return out
        mean, loadings, noise_variance = self._params()
        x = check_finite_samples(as_sample_matrix(X, loadings.shape[0], np.float64))
        return log_prob(x, mean, loadings, noise_variance)

    def transform(self, X: ArrayLike) -> FloatArray:
        """Posterior means of the latent factors, E[h | x] = (I + Fᵀ Ψ⁻¹ F)⁻¹ Fᵀ Ψ⁻¹ (x − mean).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features) or (n_features,)

        Returns
        -------
        ndarray of shape (n_samples, n_components)

        Raises
        ------
        ValueError
            Wrong shape, or NaN, ±Inf or ``|x| > 1e100`` in a row (named in the message).
        """
        engine = self._query_engine()
        if engine is not None:
            out: FloatArray = engine.latent_mean(self._query_rows(X))
            return out
        mean, loadings, noise_variance = self._params()
        x = check_finite_samples(as_sample_matrix(X, loadings.shape[0], np.float64))
        return latent_mean(x, mean, loadings, noise_variance)

    def sample(
        self, n_samples: int = 1, seed: SeedLike = None, *, dtype: DTypeLike = np.float64
    ) -> NDArray[Any]:
        """Draw samples from N(mean, F Fᵀ + diag ψ) without forming the D×D covariance.

        Parameters
        ----------
        n_samples : int, default=1
            Number of draws (>= 0).
        seed : int, numpy.random.Generator, numpy.random.SeedSequence or None, default=None
            Seed in [0, 2**64) (None: fresh entropy; a ``Generator`` gives one draw
            ``int(seed.integers(0, 2**63 - 1))``, a ``SeedSequence`` its first 64-bit word). The same seed
            gives the same draws; the noise is counter-based (draw j and feature d give a fixed value for
            the seed), so a model whose features are split across processes draws exactly the same vectors
            (:mod:`onlinefa.distributed`).
        dtype : {float64, float32}, default=float64
            dtype of the result. float32 halves its memory; the draws are the float64 draws rounded.

        Returns
        -------
        ndarray of shape (n_samples, n_features)
            θ = mean + F h + ψ^{1/2} ⊙ z (4.50), h ~ N(0, I_K), z ~ N(0, I_D). The models with a Rust engine
            write the draws in place over z, reading their state once under one lock, so the only memory
            besides the result is O(n_samples·K + block·K).
        """
        n = check_int(n_samples, "n_samples", 0)
        out_dtype = np.dtype(dtype)
        if out_dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
        seed_int = sample_seed(seed)
        engine = self._query_engine()
        if engine is None:
            mean, loadings, noise_variance = self._params()
            return draw(n, mean, loadings, noise_variance, seed_int).astype(out_dtype, copy=False)
        n_features, n_components = self._query_dims()
        latent, out = sample_noise(n, n_components, n_features, seed_int, dtype=out_dtype)
        engine.draw_into(latent, out)
        return out

    def _query_dims(self) -> tuple[int, int]:
        """(D, K) of a model with a query engine."""
        return int(getattr(self, "n_features")), int(getattr(self, "n_components"))

    def _query_rows(self, X: ArrayLike) -> FloatArray:
        """Query input as a checked C-contiguous float64 (n, D) array."""
        x: FloatArray = check_finite_samples(as_sample_matrix(X, self._query_dims()[0], np.float64))
        return x

    def canonical_loadings(self) -> FloatArray:
        """The loadings rotated to their canonical representative (:func:`onlinefa.canonical_loadings`).

        F_c = F Q with Q orthogonal: F_c F_cᵀ = F Fᵀ (same Gaussian), F_cᵀ F_c diagonal with decreasing
        entries, the largest-magnitude entry of each column positive. Use it to compare the loadings of two
        fits, which are otherwise determined only up to a rotation of the latent space.

        Returns
        -------
        ndarray of shape (n_features, n_components)
        """
        from .rotation import canonical_loadings

        return canonical_loadings(self.loadings)
