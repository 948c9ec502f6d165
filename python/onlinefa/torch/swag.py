"""SWAG, the baseline of Maddox et al., "A Simple Baseline for Bayesian Uncertainty in Deep Learning" (2019).

NumPy only (no torch import here), so the class works without PyTorch too.

From snapshots θ_1 … θ_T of an SGD run (one :meth:`SWAG.update` each) it keeps

* the running first moment θ̄_T = (1/T) Σ θ_i (θ_SWA, the ``mean``),
* the running second moment θ²‾_T = (1/T) Σ θ_i² (elementwise),
* the last ``max_rank`` deviation columns D̂ = [θ_i − θ̄_i], where θ̄_i is the running mean *after*
  including θ_i (Algorithm 1 of the paper),

and its posterior is the Gaussian (paper, Section 3.2, the SWAG sampling rule)

    θ̃ = θ̄ + (1/√2) Σ_diag^{1/2} z₁ + (1/√(2(r − 1))) D̂ z₂,   z₁ ~ N(0, I_D), z₂ ~ N(0, I_r),

with Σ_diag = diag(max(θ²‾ − θ̄², 0)) and r the number of stored columns, i.e.

    N(θ̄, D̂ D̂ᵀ / (2(r − 1)) + Σ_diag / 2).

In this package's factor-analysis notation that Gaussian is N(c, F Fᵀ + diag ψ) with

* ``mean`` c = θ̄,
* ``loadings`` F = D̂ / √(2(r − 1))  (shape D × r; zero width while r < 2, where the paper's 1/(r − 1)
  is undefined),
* ``noise_variance`` ψ = Σ_diag / 2,

so every sampler of this package that reads ``mean``/``loadings``/``noise_variance`` (with its scale left
at 1) draws exactly SWAG's θ̃, 1/2 factors included.

``diagonal=True`` is SWAG-diagonal (paper, Section 3.1): N(θ̄, Σ_diag) — ``loadings`` of zero width,
``noise_variance`` = Σ_diag (no factor 1/2), and no deviation columns are stored. The full SWAG
covariance halves this diagonal part; draw SWAG-diagonal with a sampling scale of 1/2 to use the same
diagonal as full SWAG.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._gaussian import FactorGaussianMixin
from .._pickle_tag import ClassTaggedPickle
from .._validation import as_sample_matrix, check_finite_samples, check_int

__all__ = ["SWAG"]

FloatArray = NDArray[np.float64]


class SWAG(ClassTaggedPickle, FactorGaussianMixin):
    """Streaming SWAG posterior (Maddox et al. 2019) over D parameters.

    Parameters
    ----------
    n_features : int
        D, the length of each snapshot (>= 1).
    max_rank : int, default=20
        K of the paper: how many of the most recent deviation columns are kept (>= 2).
    diagonal : bool, default=False
        True: SWAG-diagonal, N(θ̄, Σ_diag), with no deviation columns (see the module docstring).

    Attributes
    ----------
    mean, diagonal_variance, deviations, loadings, noise_variance, n_seen, rank
        See the properties.

    Notes
    -----
    Memory: 2·D float64 numbers for the moments plus D·``max_rank`` for the deviations (none when
    ``diagonal``). Each :meth:`update` costs O(D).

    Examples
    --------
    >>> import numpy as np
    >>> swag = SWAG(3, max_rank=2)
    >>> for theta in ([0.0, 1.0, 2.0], [2.0, 1.0, 0.0], [1.0, 4.0, 1.0]):
    ...     _ = swag.update(theta)
    >>> swag.mean.tolist(), swag.rank
    ([1.0, 2.0, 1.0], 2)
    """

    def __init__(self, n_features: int, max_rank: int = 20, diagonal: bool = False) -> None:
        if not isinstance(diagonal, (bool, np.bool_)):
            raise TypeError(f"diagonal must be a bool, got {type(diagonal).__name__}")
        self._n_features = check_int(n_features, "n_features", 1)
        self._max_rank = check_int(max_rank, "max_rank", 2)
        self._diagonal = bool(diagonal)
        self._first_moment = np.zeros(self._n_features)
        self._second_moment = np.zeros(self._n_features)
        width = 0 if self._diagonal else self._max_rank
        self._ring = np.zeros((self._n_features, width))  # deviation columns, written cyclically
        self._n_seen = 0

    # -- streaming --------------------------------------------------------------------------------
    def update(self, theta: ArrayLike) -> SWAG:
        """Add snapshots: update both moments, then append the deviation θ_i − θ̄_i of each.

        Parameters
        ----------
        theta : array-like of shape (D,) or (n, D)
            One snapshot, or n snapshots in order (float32 inputs are accumulated in float64).

        Returns
        -------
        self

        Raises
        ------
        TypeError
            Non-numeric or complex input.
        ValueError
            Wrong shape, or a NaN, ±Inf or ``|x| > 1e100`` entry (the state is left unchanged).
        """
        rows = check_finite_samples(as_sample_matrix(theta, self._n_features, np.float64))
        for row in rows:
            self._update_one(row)
        return self

    def _update_one(self, row: FloatArray) -> None:
        count = self._n_seen + 1
        weight = 1.0 / count
        self._first_moment += weight * (row - self._first_moment)
        self._second_moment += weight * (row * row - self._second_moment)
        if not self._diagonal:
            self._ring[:, self._n_seen % self._max_rank] = row - self._first_moment
        self._n_seen = count

    # -- state -------------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        """D, the snapshot length."""
        return self._n_features

    @property
    def max_rank(self) -> int:
        """K, the most deviation columns kept."""
        return self._max_rank

    @property
    def diagonal(self) -> bool:
        """True for SWAG-diagonal."""
        return self._diagonal

    @property
    def n_seen(self) -> int:
        """T, the number of snapshots seen."""
        return self._n_seen

    @property
    def rank(self) -> int:
        """r, the number of stored deviation columns: min(T, K) (0 when ``diagonal``)."""
        return 0 if self._diagonal else min(self._n_seen, self._max_rank)

    @property
    def mean(self) -> FloatArray:
        """θ̄ = θ_SWA, the running mean of the snapshots, shape (D,) (zeros before the first)."""
        return self._first_moment.copy()

    @property
    def second_moment(self) -> FloatArray:
        """θ²‾, the running mean of the squared snapshots, shape (D,)."""
        return self._second_moment.copy()

    @property
    def diagonal_variance(self) -> FloatArray:
        """Σ_diag = max(θ²‾ − θ̄², 0), the snapshots' (population) variances, shape (D,)."""
        variance: FloatArray = np.maximum(self._second_moment - self._first_moment**2, 0.0)
        return variance

    @property
    def deviations(self) -> FloatArray:
        """D̂, the last r deviation columns θ_i − θ̄_i, oldest first, shape (D, r)."""
        r = self.rank
        if r < self._max_rank:
            return self._ring[:, :r].copy()
        start = self._n_seen % self._max_rank  # the oldest column is the next one to be overwritten
        order = np.r_[start : self._max_rank, 0:start]
        out: FloatArray = self._ring[:, order]
        return out

    @property
    def loadings(self) -> FloatArray:
        """F = D̂ / √(2(r − 1)), shape (D, r); shape (D, 0) when ``diagonal`` or r < 2."""
        r = self.rank
        if r < 2:
            return np.zeros((self._n_features, 0))
        out: FloatArray = self.deviations / np.sqrt(2.0 * (r - 1))
        return out

    @property
    def noise_variance(self) -> FloatArray:
        """ψ = Σ_diag / 2 for SWAG, Σ_diag for SWAG-diagonal, shape (D,)."""
        if self._diagonal:
            return self.diagonal_variance
        out: FloatArray = 0.5 * self.diagonal_variance
        return out

    @property
    def n_components(self) -> int:
        """The width of ``loadings``."""
        r = self.rank
        return r if r >= 2 else 0

    def __repr__(self) -> str:
        return (
            f"SWAG(n_features={self._n_features}, max_rank={self._max_rank}, diagonal={self._diagonal}, "
            f"n_seen={self._n_seen})"
        )
