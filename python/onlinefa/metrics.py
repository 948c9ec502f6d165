"""Distances between estimated and true Gaussians (thesis §5.2 and §6.1). NumPy only.

* :func:`relative_covariance_distance` — ``‖Σ̂ − Σ‖_F / ‖Σ‖_F`` (Figure 5.1, Tables 6.1/6.2);
* :func:`relative_mean_distance` — ``‖μ̂ − μ‖₂ / ‖μ‖₂``;
* :func:`wasserstein2` — the exact 2-Wasserstein distance between two Gaussians (Figure 5.2),

  .. math:: W_2^2 = \\lVert \\mu_1 - \\mu_2 \\rVert^2 + \\operatorname{tr}\\Sigma_1 + \\operatorname{tr}\\Sigma_2
            - 2 \\operatorname{tr}\\bigl(\\Sigma_1^{1/2} \\Sigma_2 \\Sigma_1^{1/2}\\bigr)^{1/2},

  with every square root a *symmetric* positive semi-definite one computed through :func:`numpy.linalg.eigh`
  with eigenvalues clipped at 0 (never a general ``sqrtm`` of the non-symmetric product ``Σ₁Σ₂``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["relative_covariance_distance", "relative_mean_distance", "psd_sqrt", "wasserstein2"]

#: Relative tolerance (of the largest absolute entry) within which a covariance counts as symmetric.
_SYMMETRY_RTOL = 1e-8


def relative_covariance_distance(est: ArrayLike, true: ArrayLike) -> float:
    """Relative Frobenius distance ``‖est − true‖_F / ‖true‖_F`` between two matrices.

    Parameters
    ----------
    est : array_like of shape (D, D)
        The estimated covariance matrix.
    true : array_like of shape (D, D)
        The reference covariance matrix (not all zero).

    Returns
    -------
    float
        The relative distance (0 when equal).

    Raises
    ------
    ValueError
        If the inputs are not 2-D arrays of one shape, are not finite, or ``true`` is zero.

    Examples
    --------
    >>> relative_covariance_distance([[2.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [0.0, 1.0]])
    1.0
    """
    estimate = _as_finite_array("est", est, ndim=2)
    reference = _as_finite_array("true", true, ndim=2)
    return _relative_distance(estimate, reference)


def relative_mean_distance(est: ArrayLike, true: ArrayLike) -> float:
    """Relative Euclidean distance ``‖est − true‖₂ / ‖true‖₂`` between two vectors.

    Parameters
    ----------
    est : array_like of shape (D,)
        The estimated mean.
    true : array_like of shape (D,)
        The reference mean (not all zero).

    Returns
    -------
    float
        The relative distance (0 when equal).

    Raises
    ------
    ValueError
        If the inputs are not 1-D arrays of one shape, are not finite, or ``true`` is zero.

    Examples
    --------
    >>> relative_mean_distance([3.0, 4.0], [0.0, 5.0])
    0.6324555320336759
    """
    estimate = _as_finite_array("est", est, ndim=1)
    reference = _as_finite_array("true", true, ndim=1)
    return _relative_distance(estimate, reference)


def psd_sqrt(matrix: ArrayLike) -> NDArray[np.float64]:
    """Symmetric positive semi-definite square root of a symmetric matrix.

    The matrix is symmetrised, diagonalised with :func:`numpy.linalg.eigh`, its eigenvalues clipped at 0
    (rounding can make those of a PSD matrix slightly negative) and square-rooted: ``V diag(√λ₊) Vᵀ``.

    Parameters
    ----------
    matrix : array_like of shape (D, D)
        A symmetric (up to rounding) positive semi-definite matrix.

    Returns
    -------
    ndarray of shape (D, D)
        The symmetric PSD ``R`` with ``R @ R ≈ matrix`` (exact for the PSD part).

    Raises
    ------
    ValueError
        If the input is not a finite, square, symmetric matrix.

    Examples
    --------
    >>> psd_sqrt([[4.0, 0.0], [0.0, 9.0]])
    array([[2., 0.],
           [0., 3.]])
    """
    symmetric = _as_covariance("matrix", matrix)
    eigenvalues, eigenvectors = np.linalg.eigh(symmetric)
    root_eigenvalues = np.sqrt(np.clip(eigenvalues, 0.0, None))
    root = (eigenvectors * root_eigenvalues) @ eigenvectors.T
    return _symmetrised(root)


def wasserstein2(
    mean1: ArrayLike,
    cov1: ArrayLike,
    mean2: ArrayLike,
    cov2: ArrayLike,
    *,
    sqrt_cov1: ArrayLike | None = None,
) -> float:
    """Exact 2-Wasserstein distance between ``N(mean1, cov1)`` and ``N(mean2, cov2)``.

    ``W₂² = ‖m₁ − m₂‖² + tr S₁ + tr S₂ − 2 tr (S₁^{1/2} S₂ S₁^{1/2})^{1/2}``, the inner root taken through
    the (clipped) eigenvalues of the symmetrised PSD product. Rounding can make ``W₂²`` slightly negative
    for (nearly) identical inputs; it is clipped at 0 before the square root.

    Parameters
    ----------
    mean1, mean2 : array_like of shape (D,)
        The means.
    cov1, cov2 : array_like of shape (D, D)
        Symmetric positive semi-definite covariances.
    sqrt_cov1 : array_like of shape (D, D), optional
        ``psd_sqrt(cov1)`` if already known (e.g. the true covariance compared with many estimates); saves
        one eigendecomposition. Not checked against ``cov1``.

    Returns
    -------
    float
        The distance W₂ (not its square), ``>= 0``.

    Raises
    ------
    ValueError
        If shapes disagree or an input is not finite, square and symmetric.

    Notes
    -----
    Cost: two D×D symmetric eigendecompositions (one with ``sqrt_cov1``) and two D×D products, O(D³).

    Examples
    --------
    >>> wasserstein2([0.0], [[4.0]], [3.0], [[1.0]])  # sqrt(3² + (2 − 1)²)
    3.1622776601683795
    """
    first_mean = _as_finite_array("mean1", mean1, ndim=1)
    second_mean = _as_finite_array("mean2", mean2, ndim=1)
    first_cov = _as_covariance("cov1", cov1)
    second_cov = _as_covariance("cov2", cov2)
    dimension = first_mean.shape[0]
    for name, array, shape in (
        ("mean2", second_mean, (dimension,)),
        ("cov1", first_cov, (dimension, dimension)),
        ("cov2", second_cov, (dimension, dimension)),
    ):
        if array.shape != shape:
            raise ValueError(f"{name} must have shape {shape} to match mean1, got {array.shape}")
    first_root = psd_sqrt(first_cov) if sqrt_cov1 is None else _as_covariance("sqrt_cov1", sqrt_cov1)
    if first_root.shape != first_cov.shape:
        raise ValueError(f"sqrt_cov1 must have shape {first_cov.shape}, got {first_root.shape}")

    squared = (
        float(np.sum((first_mean - second_mean) ** 2))
        + float(np.trace(first_cov))
        + float(np.trace(second_cov))
        - 2.0 * _trace_of_psd_sqrt(first_root @ second_cov @ first_root)
    )
    return float(np.sqrt(max(squared, 0.0)))


def _trace_of_psd_sqrt(matrix: NDArray[np.float64]) -> float:
    """``tr(matrix^{1/2})`` for a PSD matrix: the sum of the square roots of its clipped eigenvalues."""
    eigenvalues = np.linalg.eigvalsh(_symmetrised(matrix))
    return float(np.sum(np.sqrt(np.clip(eigenvalues, 0.0, None))))


def _relative_distance(estimate: NDArray[np.float64], reference: NDArray[np.float64]) -> float:
    """``‖estimate − reference‖ / ‖reference‖`` (Frobenius/Euclidean) after checking shapes."""
    if estimate.shape != reference.shape:
        raise ValueError(f"est and true must have the same shape, got {estimate.shape} and {reference.shape}")
    reference_norm = float(np.linalg.norm(reference))
    if reference_norm == 0.0:
        raise ValueError("true must not be zero: the relative distance is undefined")
    return float(np.linalg.norm(estimate - reference)) / reference_norm


def _as_finite_array(name: str, value: ArrayLike, *, ndim: int) -> NDArray[np.float64]:
    """``value`` as a float64 array with ``ndim`` dimensions and finite entries; raise otherwise."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array, got {array.ndim}-D with shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must contain only finite values")
    return array


def _as_covariance(name: str, value: ArrayLike) -> NDArray[np.float64]:
    """``value`` as a finite, square, symmetric (up to rounding) float64 matrix, exactly symmetrised."""
    matrix = _as_finite_array(name, value, ndim=2)
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {matrix.shape}")
    scale = float(np.max(np.abs(matrix)))
    if float(np.max(np.abs(matrix - matrix.T))) > _SYMMETRY_RTOL * scale:
        raise ValueError(f"{name} must be symmetric")
    return _symmetrised(matrix)


def _symmetrised(matrix: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(matrix + matrixᵀ) / 2``."""
    return 0.5 * (matrix + matrix.T)
