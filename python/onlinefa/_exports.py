"""The fitted Gaussian of a streaming model in its storage dtype, for the scikit-learn exports.

A float32 model's ``components_``, ``noise_variance_`` and ``mean_`` are float32: they are read from the
engine already rounded to float32 (one consistent state, no float64 D×K copy), and the canonical rotation
is found from Fᵀ F accumulated in float64 over blocks of rows (O(block·K) extra memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _core

#: Rows per block when Fᵀ F of a float32 F is accumulated in float64.
_GRAM_ROWS = 1 << 16

AnyFloatArray = NDArray[np.float32] | NDArray[np.float64]


def storage_snapshot(model: Any) -> tuple[AnyFloatArray, AnyFloatArray, AnyFloatArray]:
    """(mean, F, ψ) of a fitted ``OnlineEM``/``OnlineSGA`` in its storage dtype; other models' float64
    snapshot. Values are the float64 snapshot's rounded once to the storage type."""
    if getattr(model, "dtype", "float64") != "float32":
        mean, loadings, noise_variance = model.snapshot()
        return mean, loadings, noise_variance
    _, mean, loadings, noise_variance = _core.storage_snapshot(model._core)
    return mean, loadings, noise_variance


def _gram(loadings: AnyFloatArray) -> NDArray[np.float64]:
    """Fᵀ F in float64, accumulated over blocks of rows."""
    k = loadings.shape[1]
    gram = np.zeros((k, k))
    for lo in range(0, loadings.shape[0], _GRAM_ROWS):
        block = loadings[lo : lo + _GRAM_ROWS].astype(np.float64)
        gram += block.T @ block
    return gram


def canonical_components32(loadings: NDArray[np.float32]) -> NDArray[np.float32]:
    """(F Q)ᵀ in float32, shape (K, D), with Q the canonical rotation of ``onlinefa.rotation`` (eigenvectors
    of Fᵀ F by decreasing eigenvalue, each row's largest-magnitude entry made positive)."""
    _, eigenvectors = np.linalg.eigh(_gram(loadings))
    rotation = np.ascontiguousarray(eigenvectors[:, ::-1], dtype=np.float32)
    components: NDArray[np.float32] = rotation.T @ loadings.T  # (K, D), C-ordered
    for row in components:
        if _peak_is_negative(row):
            row *= np.float32(-1.0)
    return components


def _peak_is_negative(row: NDArray[np.float32]) -> bool:
    """Whether the largest-magnitude entry (the first one on ties) is negative, without a |row| copy."""
    top, bottom = int(np.argmax(row)), int(np.argmin(row))
    high, low = row[top], -row[bottom]
    return bool(low > high or (low == high and bottom < top and low > 0.0))
