"""Plain NumPy transcriptions of the thesis's online factor-analysis algorithms.

These are *test references*: deliberately simple, one sample at a time, written line by line from
Brownlie (2021), "Extending the Bayesian Deep Learning Method MultiSWAG", Algorithm 1 (online SGA)
and Algorithm 2 (online EM), with these errata of the pseudo-code fixed:

* line 5 of both algorithms is the running mean ``θ̄_t = θ̄_{t-1} + (θ_t - θ̄_{t-1}) / t``;
* ``d_t = θ_t - θ̄_t`` uses the mean *after* including ``θ_t`` (so ``d_1 = 0``).

Warm-up (thesis §5.1): for ``t <= n_warmup`` the running averages are updated with the E-step
computed from the current (initial) ``F`` and ``ψ``, while ``F`` and ``ψ`` stay fixed, i.e. lines 13
and 15 of Algorithm 2 and lines 10-14 of Algorithm 1 are skipped.  From ``t = n_warmup + 1`` on,
every line runs.

Explicit inverses are used on purpose (that is what the pseudo-code writes); the ``inverse``
argument lets a test swap in a different but equally valid float64 inverse to measure how sensitive a
configuration is to rounding.  Nothing here is optimised.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating]
InverseFn = Callable[[FloatArray], FloatArray]


def explicit_inverse(matrix: FloatArray) -> FloatArray:
    """Return ``matrix⁻¹`` computed by ``numpy.linalg.inv`` (LU with partial pivoting).

    Parameters
    ----------
    matrix : ndarray of shape (K, K)
        A non-singular square matrix.

    Returns
    -------
    ndarray of shape (K, K)
        Its inverse, in the dtype of ``matrix``.
    """
    return np.linalg.inv(matrix)


def cholesky_inverse(matrix: FloatArray) -> FloatArray:
    """Return ``matrix⁻¹`` for a symmetric positive-definite matrix, via its Cholesky factor.

    ``matrix = L Lᵀ`` so ``matrix⁻¹ = L⁻ᵀ L⁻¹``.  Mathematically identical to
    :func:`explicit_inverse` on SPD input but rounds differently; comparing the two tells how much a
    stream amplifies float64 rounding.

    Parameters
    ----------
    matrix : ndarray of shape (K, K)
        Symmetric positive-definite matrix.

    Returns
    -------
    ndarray of shape (K, K)
        Its inverse.
    """
    lower = np.linalg.cholesky(matrix)
    lower_inv = np.linalg.inv(lower)
    result: FloatArray = lower_inv.T @ lower_inv
    return result


def _validated_init(init_loadings: npt.ArrayLike, dtype: npt.DTypeLike) -> FloatArray:
    """Return a private (D, K) copy of the initial loadings in ``dtype``."""
    loadings = np.array(init_loadings, dtype=dtype, copy=True)
    if loadings.ndim != 2 or loadings.shape[1] >= loadings.shape[0]:
        raise ValueError(f"init_loadings must have shape (D, K) with K < D, got {loadings.shape}")
    return loadings


class _OnlineFABase:
    """State and E-step shared by both references (Algorithms 1 and 2, lines 1-9)."""

    def __init__(
        self,
        init_loadings: npt.ArrayLike,
        n_warmup: int,
        *,
        dtype: npt.DTypeLike = np.float64,
        inverse: InverseFn = explicit_inverse,
    ) -> None:
        self.dtype = np.dtype(dtype)
        self.F = _validated_init(init_loadings, self.dtype)  # line 1
        n_features, n_components = self.F.shape
        self.psi = np.ones(n_features, dtype=self.dtype)  # line 1: ψ = 1
        self.theta_bar = np.zeros(n_features, dtype=self.dtype)  # θ̄_0 = 0
        self.n_warmup = int(n_warmup)
        self.t = 0
        self.identity = np.eye(n_components, dtype=self.dtype)
        self.inverse = inverse

    @property
    def mean(self) -> FloatArray:
        """Running mean θ̄_t, shape (D,)."""
        return self.theta_bar

    @property
    def loadings(self) -> FloatArray:
        """Factor loading matrix F, shape (D, K)."""
        return self.F

    @property
    def noise_variance(self) -> FloatArray:
        """Diagonal noise variances ψ, shape (D,)."""
        return self.psi

    @property
    def n_seen(self) -> int:
        """Number of samples consumed so far (t)."""
        return self.t

    def covariance(self) -> FloatArray:
        """Dense model covariance ``F Fᵀ + diag ψ``, shape (D, D)."""
        result: FloatArray = self.F @ self.F.T + np.diag(self.psi)
        return result

    def _mean_and_e_step(self, theta: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Lines 5-9: update θ̄ and return (d_t, Σ, m_t) for the current F and ψ."""
        self.t += 1
        t = self.t
        self.theta_bar = self.theta_bar + (theta - self.theta_bar) / t  # line 5 (erratum fixed)
        d = theta - self.theta_bar  # line 6
        C = (self.F / self.psi[:, None]).T  # line 7: (F ⊙ ψ⁻¹)ᵀ
        Sigma = self.inverse(self.identity + C @ self.F)  # line 8
        m = Sigma @ (C @ d)  # line 9
        return d, Sigma, m

    def _as_row(self, theta: npt.ArrayLike) -> FloatArray:
        row = np.asarray(theta, dtype=self.dtype)
        if row.shape != self.theta_bar.shape:
            raise ValueError(f"expected a row of shape {self.theta_bar.shape}, got {row.shape}")
        return row

    def update(self, samples: npt.ArrayLike) -> None:
        """Consume one sample of shape (D,) or the rows of an (n, D) array, in order.

        Parameters
        ----------
        samples : array_like of shape (D,) or (n, D)
            Observation(s) θ_t.
        """
        batch = np.asarray(samples, dtype=self.dtype)
        for row in np.atleast_2d(batch):
            self._update_one(self._as_row(row))

    def _update_one(self, theta: FloatArray) -> None:
        raise NotImplementedError


class ReferenceOnlineEM(_OnlineFABase):
    """Thesis Algorithm 2 (online EM for factor analysis), one sample at a time.

    Parameters
    ----------
    init_loadings : array_like of shape (D, K)
        Initial F (line 1), used as given.
    n_warmup : int
        Number of leading samples during which F and ψ stay fixed (lines 13 and 15 skipped).
    noise_floor : float or None, default None
        If given, ψ is clipped from below at this value after line 15 (the thesis has no floor).
    dtype : dtype, default float64
        Precision of every array of the state.
    inverse : callable, default :func:`explicit_inverse`
        How the K×K inverses of lines 8 and 13 are computed.
    """

    def __init__(
        self,
        init_loadings: npt.ArrayLike,
        n_warmup: int,
        *,
        noise_floor: float | None = None,
        dtype: npt.DTypeLike = np.float64,
        inverse: InverseFn = explicit_inverse,
    ) -> None:
        super().__init__(init_loadings, n_warmup, dtype=dtype, inverse=inverse)
        n_features, n_components = self.F.shape
        self.A_bar = np.zeros((n_features, n_components), dtype=self.dtype)  # line 2
        self.B_bar = np.zeros((n_components, n_components), dtype=self.dtype)
        self.d2_bar = np.zeros(n_features, dtype=self.dtype)
        self.noise_floor = noise_floor

    def _update_one(self, theta: FloatArray) -> None:
        d, Sigma, m = self._mean_and_e_step(theta)
        t = self.t
        self.B_bar = self.B_bar + (np.outer(m, m) - self.B_bar) / t  # line 10
        H_bar = Sigma + self.B_bar  # line 11
        self.A_bar = self.A_bar + (np.outer(d, m) - self.A_bar) / t  # line 12
        self.d2_bar = self.d2_bar + (d * d - self.d2_bar) / t  # line 14
        if t <= self.n_warmup:
            return  # warm-up: F and ψ stay fixed
        self.F = self.A_bar @ self.inverse(H_bar)  # line 13
        F = self.F
        self.psi = self.d2_bar + np.sum((F @ H_bar) * F - 2 * F * self.A_bar, axis=1)  # line 15
        if self.noise_floor is not None:
            self.psi = np.maximum(self.psi, np.array(self.noise_floor, dtype=self.dtype))


class ReferenceOnlineSGA(_OnlineFABase):
    """Thesis Algorithm 1 (online stochastic gradient ascent for FA), plain SGD on F and β = log ψ.

    Parameters
    ----------
    init_loadings : array_like of shape (D, K)
        Initial F (line 1), used as given.
    lr : float
        Learning rate α (> 0).
    n_warmup : int
        Number of leading samples during which only θ̄ is updated (lines 10-14 skipped).
    dtype : dtype, default float64
        Precision of every array of the state.
    inverse : callable, default :func:`explicit_inverse`
        How the K×K inverse of line 8 is computed.
    """

    def __init__(
        self,
        init_loadings: npt.ArrayLike,
        lr: float,
        n_warmup: int,
        *,
        dtype: npt.DTypeLike = np.float64,
        inverse: InverseFn = explicit_inverse,
    ) -> None:
        super().__init__(init_loadings, n_warmup, dtype=dtype, inverse=inverse)
        self.lr = np.array(lr, dtype=self.dtype)  # 0-d, so float32 state stays float32
        self.beta = np.log(self.psi)  # line 2

    def _update_one(self, theta: FloatArray) -> None:
        d, Sigma, m = self._mean_and_e_step(theta)
        if self.t <= self.n_warmup:
            return  # warm-up: F and ψ stay fixed
        F, psi = self.F, self.psi
        second_moment = Sigma + np.outer(m, m)  # E[h hᵀ] = Σ + m mᵀ
        grad_F = (np.outer(d, m) - F @ second_moment) / psi[:, None]  # line 10, eq. (4.24)
        grad_psi = 0.5 / psi**2 * (  # eq. (4.25)
            d * d - 2 * d * (F @ m) + np.sum((F @ second_moment) * F, axis=1)
        ) - 0.5 / psi
        grad_beta = grad_psi * psi  # line 11, eq. (4.26)
        self.F = F + self.lr * grad_F  # line 12
        self.beta = self.beta + self.lr * grad_beta  # line 13
        self.psi = np.exp(self.beta)  # line 14
