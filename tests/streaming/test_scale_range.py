"""Scale equivariance of the streaming models at the ends of the documented range of variances.

``scaling="data"`` promises that fitting c·θ gives c² times the covariance of θ. That holds only while the
noise variances stay above the absolute floor of the state dtype and, for online SGA, the feature variances
below its ψ ceiling; the documented range (``SCALE_EQUIVARIANT_VARIANCES``) is checked here at both ends
against the fit of the same stream at unit scale, and the docstrings and the usage guide must state it.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import onlinefa
from onlinefa import streaming

D, K, T = 50, 3, 2000
TOLERANCE = 1e-3
MAX_INPUT = {"float64": 1e100, "float32": 1e18}
MODELS = {"OnlineEM": onlinefa.OnlineEM, "OnlineSGA": onlinefa.OnlineSGA}
CASES = [(name, dtype) for name in MODELS for dtype in ("float64", "float32")]
USAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "usage.md"


def _stream() -> tuple[np.ndarray, np.ndarray]:
    """T samples of a D-dimensional K-factor model (noise variances in [0.5, 1.5]) and those variances."""
    rng = np.random.default_rng(0)
    loadings = rng.standard_normal((D, K))
    psi = rng.uniform(0.5, 1.5, D)
    theta = rng.standard_normal((T, K)) @ loadings.T + rng.standard_normal((T, D)) * np.sqrt(psi) + 2.0
    return theta, psi


def _covariance(name: str, dtype: str, theta: np.ndarray, c: float) -> np.ndarray:
    """Covariance of the model fitted to c·θ, divided by c² (factor by factor, so nothing overflows)."""
    model = MODELS[name](D, K, seed=1, dtype=dtype).update(theta * c)
    loadings = model.loadings / c
    covariance: np.ndarray = loadings @ loadings.T + np.diag(model.noise_variance / c**2)
    return covariance


def _relative_error(name: str, dtype: str, c: float) -> float:
    theta, _ = _stream()
    reference = _covariance(name, dtype, theta, 1.0)
    scaled = _covariance(name, dtype, theta, c)
    return float(np.linalg.norm(scaled - reference) / np.linalg.norm(reference))


def _range(name: str, dtype: str) -> tuple[float, float | None]:
    return streaming.SCALE_EQUIVARIANT_VARIANCES[name][dtype]


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_equivariant_at_smallest_documented_noise_variance(name: str, dtype: str) -> None:
    low, _ = _range(name, dtype)
    _, psi = _stream()
    c = float(np.sqrt(low / psi.min()))  # the smallest noise variance of c·θ is exactly the documented end
    assert _relative_error(name, dtype, c) < TOLERANCE


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_equivariant_at_largest_documented_variance(name: str, dtype: str) -> None:
    _, high = _range(name, dtype)
    theta, _ = _stream()
    if high is None:  # no limit below the input limit: scale the largest |x| to half of it
        c = 0.5 * MAX_INPUT[dtype] / float(np.abs(theta).max())
    else:  # the largest feature variance of c·θ is exactly the documented end
        c = float(np.sqrt(high / theta.var(axis=0).max()))
    assert _relative_error(name, dtype, c) < TOLERANCE


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_documented_range_is_stated(name: str, dtype: str) -> None:
    low, high = _range(name, dtype)
    doc = MODELS[name].__doc__ or ""
    usage = USAGE.read_text(encoding="utf-8")
    for value in (low, high):
        if value is not None:
            assert f"{value:.0e}".replace("e+", "e").replace("e-0", "e-") in doc
            assert f"{value:.0e}".replace("e+", "e").replace("e-0", "e-") in usage
