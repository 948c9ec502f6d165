"""Data for the experiments: synthetic factor-analysis models (thesis Algorithm 4, Equation 2.1) and UCI data.

A factor-analysis (FA) model with mean ``c`` (D,), loadings ``F`` (D, K) and noise variances ``psi`` (D,)
generates observations

.. math:: \\theta = F h + c + \\sqrt{\\psi} \\odot \\varepsilon, \\qquad h \\sim N(0, I_K),\\;
          \\varepsilon \\sim N(0, I_D),

so that :math:`\\theta \\sim N(c, F F^\\top + \\mathrm{diag}(\\psi))`. Only NumPy is needed here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._uci import load_uci

__all__ = ["make_fa_model", "sample_fa", "load_uci"]

#: Seeds accepted by the generators: ``None`` (fresh entropy), an integer, or an existing generator
#: (which is then advanced, so successive calls continue one random stream).
SeedLike = int | np.random.Generator | None

#: Upper bound on the number of random numbers drawn per block by :func:`sample_fa` (8 MiB of float64),
#: which keeps its temporaries bounded whatever ``n_samples`` is.
_BLOCK_NUMBERS = 1 << 20


def make_fa_model(
    n_features: int,
    n_components: int,
    spectrum: Sequence[float] = (1.0, 10.0),
    seed: SeedLike = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Generate a random factor-analysis model exactly as thesis Algorithm 4.

    1. ``c ~ N(0, I_D)``;
    2. ``A`` is D×D standard normal and ``M = A Aᵀ``;
    3. ``V_K`` holds the eigenvectors of ``M`` for its ``K`` largest eigenvalues (largest first);
    4. the *spectrum* ``s² ~ U(a, b)`` has one entry per **row** (length D) and ``F = V_K ⊙ sqrt(s²)``
       scales row ``d`` of ``V_K`` by ``sqrt(s²_d)``;
    5. ``psi ~ U(0, max(s²))`` elementwise.

    The random numbers are drawn in that order from one generator.

    Parameters
    ----------
    n_features : int
        Observation dimension D (≥ 1).
    n_components : int
        Latent dimension K, ``1 <= K <= D``.
    spectrum : sequence of two floats, default (1.0, 10.0)
        The range ``[a, b]`` of the spectrum, ``0 < a <= b``.
    seed : int, numpy.random.Generator or None, default None
        Seed for :func:`numpy.random.default_rng`; a generator is used (and advanced) as is.

    Returns
    -------
    c : ndarray of shape (D,)
        The mean.
    F : ndarray of shape (D, K)
        The factor loadings.
    psi : ndarray of shape (D,)
        The noise variances (the diagonal of Ψ), in ``[0, max s²)``.

    Raises
    ------
    TypeError
        If a dimension is not an integer.
    ValueError
        If a dimension is out of range or the spectrum is not a finite range ``0 < a <= b``.

    Notes
    -----
    Cost: forming ``A Aᵀ`` and its symmetric eigendecomposition take O(D³) time and three D×D float64
    matrices of memory (about 100 MB and a few seconds at D = 2000 on a laptop core); everything else
    is O(D K).

    Examples
    --------
    >>> c, F, psi = make_fa_model(100, 10, spectrum=(1.0, 100.0), seed=0)
    >>> c.shape, F.shape, psi.shape
    ((100,), (100, 10), (100,))
    """
    n_features = _check_int("n_features", n_features, minimum=1)
    n_components = _check_int("n_components", n_components, minimum=1)
    if n_components > n_features:
        raise ValueError(f"n_components must be <= n_features ({n_features}), got {n_components}")
    low, high = _check_spectrum(spectrum)
    rng = np.random.default_rng(seed)

    mean = rng.standard_normal(n_features)
    top_eigenvectors = _top_eigenvectors_of_gram(rng.standard_normal((n_features, n_features)), n_components)
    spectrum_values = rng.uniform(low, high, size=n_features)
    loadings = top_eigenvectors * np.sqrt(spectrum_values)[:, np.newaxis]
    noise_variance = rng.uniform(0.0, float(spectrum_values.max()), size=n_features)
    return mean, loadings, noise_variance


def sample_fa(
    c: ArrayLike,
    F: ArrayLike,
    psi: ArrayLike,
    n_samples: int,
    seed: SeedLike = None,
) -> NDArray[np.float64]:
    """Draw observations from a factor-analysis model by Equation 2.1.

    Row ``t`` is ``F h_t + c + sqrt(psi) ⊙ eps_t`` with ``h_t ~ N(0, I_K)`` and ``eps_t ~ N(0, I_D)``.
    The K + D standard normals of a row are consecutive in the random stream (``h_t`` first), so the
    first ``m`` rows of ``sample_fa(..., n, seed)`` and ``sample_fa(..., m, seed)`` use the same draws,
    as do ``n1`` then ``n2`` rows from one generator and ``n1 + n2`` rows at once (the values agree up
    to the last-bit rounding of the matrix product, which depends on the block shape).
    Rows are generated in blocks, so apart from the (n, D) result only O(D + K) numbers per row of a
    block of at most about one million numbers are held.

    Parameters
    ----------
    c : array_like of shape (D,)
        The mean.
    F : array_like of shape (D, K)
        The factor loadings.
    psi : array_like of shape (D,)
        The noise variances, finite and ``>= 0``.
    n_samples : int
        Number of rows to draw (``>= 0``).
    seed : int, numpy.random.Generator or None, default None
        Seed for :func:`numpy.random.default_rng`; a generator is used (and advanced) as is.

    Returns
    -------
    ndarray of shape (n_samples, D)
        The observations, float64.

    Raises
    ------
    TypeError
        If ``n_samples`` is not an integer.
    ValueError
        If the shapes do not agree, a value is not finite, or ``psi`` has a negative entry.

    Examples
    --------
    >>> c, F, psi = make_fa_model(20, 3, seed=1)
    >>> sample_fa(c, F, psi, 5, seed=2).shape
    (5, 20)
    """
    mean, loadings, noise_sd = _check_fa_parameters(c, F, psi)
    n_samples = _check_int("n_samples", n_samples, minimum=0)
    rng = np.random.default_rng(seed)
    n_features, n_components = loadings.shape
    rows_per_block = max(1, _BLOCK_NUMBERS // (n_features + n_components))

    samples = np.empty((n_samples, n_features))
    for start in range(0, n_samples, rows_per_block):
        stop = min(start + rows_per_block, n_samples)
        normals = rng.standard_normal((stop - start, n_components + n_features))
        latents, unit_noise = normals[:, :n_components], normals[:, n_components:]
        block = samples[start:stop]
        np.matmul(latents, loadings.T, out=block)
        block += mean
        block += unit_noise * noise_sd
    return samples


def _top_eigenvectors_of_gram(matrix: NDArray[np.float64], n_vectors: int) -> NDArray[np.float64]:
    """Eigenvectors of ``matrix @ matrix.T`` for its ``n_vectors`` largest eigenvalues, largest first."""
    gram = matrix @ matrix.T
    _, eigenvectors = np.linalg.eigh(gram)  # ascending eigenvalues
    return np.ascontiguousarray(eigenvectors[:, ::-1][:, :n_vectors])


def _check_int(name: str, value: object, *, minimum: int) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def _check_spectrum(spectrum: Sequence[float]) -> tuple[float, float]:
    """Validate a spectrum range ``(a, b)`` with ``0 < a <= b`` finite and return it as floats."""
    try:
        low, high = (float(bound) for bound in spectrum)
    except (TypeError, ValueError) as err:
        raise ValueError(f"spectrum must be a pair of numbers (a, b), got {spectrum!r}") from err
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high):
        raise ValueError(f"spectrum must satisfy 0 < a <= b (finite), got ({low}, {high})")
    return low, high


def _check_fa_parameters(
    c: ArrayLike, F: ArrayLike, psi: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Validate ``(c, F, psi)`` and return ``(c, F, sqrt(psi))`` as float64 arrays."""
    mean = np.asarray(c, dtype=np.float64)
    loadings = np.asarray(F, dtype=np.float64)
    noise_variance = np.asarray(psi, dtype=np.float64)
    if loadings.ndim != 2 or loadings.shape[0] < 1 or loadings.shape[1] < 1:
        raise ValueError(f"F must be a non-empty 2-D array of shape (D, K), got shape {loadings.shape}")
    n_features = loadings.shape[0]
    for name, vector in (("c", mean), ("psi", noise_variance)):
        if vector.shape != (n_features,):
            raise ValueError(f"{name} must have shape ({n_features},) to match F, got {vector.shape}")
    for name, array in (("c", mean), ("F", loadings), ("psi", noise_variance)):
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must contain only finite values")
    if np.any(noise_variance < 0):
        raise ValueError("psi must be >= 0 (it holds noise variances)")
    return mean, loadings, np.sqrt(noise_variance)
