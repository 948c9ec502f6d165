"""Canonical loadings: one representative of the rotation class of a factor-analysis fit.

The FA model N(c, F Fᵀ + Ψ) with latent prior h ~ N(0, I_K) does not identify F: for every orthogonal
K×K matrix Q, F Q gives the same Gaussian (F Q Qᵀ Fᵀ = F Fᵀ) and the same latent prior. Two fits of the same
data (different initialisations, or online EM with and without the whitening step) therefore return
loadings that differ by such a Q, and cannot be compared column by column. This module picks one
representative of each class, following Luttinen & Ilin's PCA basis (their (15)–(17), App. C) with
point-estimated loadings.

Definition
----------
The canonical loadings of F (D×K) are F_c = F Q, where Q is the orthogonal K×K matrix such that

1. F_cᵀ F_c = diag(s₁, …, s_K) with s₁ ≥ s₂ ≥ … ≥ s_K ≥ 0: the columns are orthogonal and sorted by
   squared norm. Equivalently Q holds the eigenvectors of the Gram matrix Fᵀ F sorted by decreasing
   eigenvalue, and F_c = U S, with F = U S Vᵀ the thin SVD (s_k = S_kk², the eigenvalues of Fᵀ F);
2. in each column, the entry of largest magnitude is positive (the first such entry on an exact tie);
   an all-zero column is left as it is.

Because Q is orthogonal, F_c F_cᵀ = F Fᵀ: the fitted Gaussian, ψ, the log-likelihood and the posterior
of F h are unchanged.

*What "latent posterior whitened" adds.* In the whitened basis of the parameter-expanded model (the basis
that online EM's whitening step moves to, docs/design/whitening.md) the latent second moment is the identity:
H = E_x[Cov(h | x) + E(h | x) E(h | x)ᵀ] = I. For any F with prior N(0, I) this already holds under the
model's own distribution of x: with G = Fᵀ Ψ⁻¹ F, Cov(h | x) = (I + G)⁻¹ and
E_x[E(h | x) E(h | x)ᵀ] = (I + G)⁻¹ G, which sum to I. Orthogonal rotations are exactly the changes of
latent basis that keep H = I (Qᵀ I Q = I) and the prior N(0, I), so the condition fixes nothing beyond
"rotate orthogonally"; it is the diagonal, decreasing Fᵀ F and the sign rule that pick one
representative. ψ plays no part, which is why it is not an argument.

Uniqueness: F_c is unique when the eigenvalues of Fᵀ F are distinct and no column has two entries of the
same largest magnitude — the generic case for fitted loadings. Within a repeated eigenvalue the columns are
determined only up to a rotation of that eigenspace.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]


def _as_loadings(loadings: ArrayLike) -> FloatArray:
    """``loadings`` as a finite float64 (D, K) array with 1 <= K <= D, or a clear exception."""
    arr = np.asarray(loadings)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"loadings must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"loadings must be a 2-D array of shape (n_features, n_components), got shape {arr.shape}")
    n_features, n_components = arr.shape
    if n_components < 1 or n_components > n_features:
        raise ValueError(
            f"loadings must have shape (n_features, n_components) with 1 <= n_components <= n_features, "
            f"got shape {arr.shape}"
        )
    out = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(out)):
        raise ValueError("loadings must contain only finite values")
    return out


def canonical_rotation(loadings: ArrayLike) -> FloatArray:
    """The orthogonal K×K matrix Q with ``canonical_loadings(F) = F @ Q``.

    Latent vectors rotate the other way: if h are latents of the model with loadings F (for instance
    ``model.transform(X)``), then ``h @ Q`` are the latents of the same model expressed with the canonical
    loadings (F h = (F Q)(Qᵀ h)).

    Parameters
    ----------
    loadings : array-like of shape (n_features, n_components)
        Factor loadings F, finite, with n_components <= n_features.

    Returns
    -------
    ndarray of shape (n_components, n_components)
        Orthogonal Q: eigenvectors of Fᵀ F sorted by decreasing eigenvalue, each column's sign chosen so
        that the largest-magnitude entry of the matching column of F Q is positive.

    Raises
    ------
    TypeError
        If ``loadings`` is not a real numeric array.
    ValueError
        If ``loadings`` is not 2-D with 1 <= K <= D, or holds NaN/±Inf.
    """
    rotation, _ = _canonical(_as_loadings(loadings))
    return rotation


def _canonical(loadings: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(Q, F Q) for validated loadings F: sorted eigenvectors of Fᵀ F with the sign rule applied."""
    _, eigenvectors = np.linalg.eigh(loadings.T @ loadings)  # ascending eigenvalues
    rotation = np.ascontiguousarray(eigenvectors[:, ::-1])
    rotated = loadings @ rotation
    signs = _column_signs(rotated)
    return rotation * signs, rotated * signs


def _column_signs(columns: FloatArray) -> FloatArray:
    """±1 per column: the sign of its largest-magnitude entry (first one on ties; +1 for a zero column)."""
    peak_rows = np.argmax(np.abs(columns), axis=0)
    peaks = columns[peak_rows, np.arange(columns.shape[1])]
    out: FloatArray = np.where(peaks < 0.0, -1.0, 1.0)
    return out


def canonical_loadings(loadings: ArrayLike) -> FloatArray:
    """Rotate factor loadings to their canonical representative (see the module docstring).

    F_c = F Q with Q orthogonal, such that F_c F_cᵀ = F Fᵀ, F_cᵀ F_c is diagonal with decreasing entries,
    and the largest-magnitude entry of each column is positive. Fits that agree up to a rotation of the
    latent space give the same canonical loadings, so they can be compared entry by entry.

    Parameters
    ----------
    loadings : array-like of shape (n_features, n_components)
        Factor loadings F, finite, with n_components <= n_features.

    Returns
    -------
    ndarray of shape (n_features, n_components)
        The canonical loadings F_c (a new array).

    Raises
    ------
    TypeError
        If ``loadings`` is not a real numeric array.
    ValueError
        If ``loadings`` is not 2-D with 1 <= K <= D, or holds NaN/±Inf.

    Examples
    --------
    >>> import numpy as np
    >>> from onlinefa import canonical_loadings
    >>> f = np.random.default_rng(0).standard_normal((6, 2))
    >>> fc = canonical_loadings(f)
    >>> bool(np.allclose(fc @ fc.T, f @ f.T))
    True
    >>> gram = fc.T @ fc
    >>> bool(abs(gram[0, 1]) < 1e-12 and gram[0, 0] >= gram[1, 1])
    True
    """
    _, rotated = _canonical(_as_loadings(loadings))
    return rotated
