"""Shared fixtures for the onlinefa test suite: synthetic FA streams and state snapshots.

The helpers are exposed as session-scoped fixtures returning plain functions, so that Hypothesis
tests can use them too (Hypothesis refuses function-scoped fixtures).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import os

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import settings

# Hypothesis profiles: "ci" (the default) is reproducible (derandomised) and has no deadline (machines are
# shared and noisy); "dev" explores new examples on each run. Choose with HYPOTHESIS_PROFILE=dev.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# ONLINEFA_REQUIRE_EXTRAS=torch,lightning,...: those optional packages must import, or the run stops here with
# their ImportError (CI sets it: an installed but broken extra must fail the suite, not skip its tests).
for _name in filter(None, os.environ.get("ONLINEFA_REQUIRE_EXTRAS", "").split(",")):
    importlib.import_module(_name.strip())

# `reference.py` lives beside this file; make it importable whatever pytest's import mode is.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

FloatArray = npt.NDArray[np.float64]


class FAModelLike(Protocol):
    """The read-only state every online FA model exposes (implementation and reference alike)."""

    @property
    def mean(self) -> Any: ...

    @property
    def loadings(self) -> Any: ...

    @property
    def noise_variance(self) -> Any: ...

    @property
    def n_seen(self) -> int: ...


def synthetic_fa_stream(
    n_features: int, n_components: int, n_samples: int, seed: int
) -> FloatArray:
    """Draw ``n_samples`` rows from a random factor-analysis model N(c, F Fᵀ + diag ψ).

    The model is generated in the spirit of thesis Algorithm 4: F with standard-normal entries,
    ψ uniform on [0.2, 1.2] (well away from 0, so the online algorithms' noise floor is never
    active), and a mean c with standard-normal entries (so the running mean matters).

    Parameters
    ----------
    n_features : int
        Observation dimension D.
    n_components : int
        Latent dimension K of the generating model.
    n_samples : int
        Number of rows T.
    seed : int
        Seed of the NumPy generator (the stream is a pure function of the arguments).

    Returns
    -------
    ndarray of shape (n_samples, n_features), float64, C-contiguous
        θ_t = c + F h_t + ψ^{1/2} ⊙ z_t with h_t, z_t standard normal.
    """
    rng = np.random.default_rng(seed)
    true_loadings = rng.standard_normal((n_features, n_components))
    true_noise = rng.uniform(0.2, 1.2, size=n_features)
    true_mean = rng.standard_normal(n_features)
    latents = rng.standard_normal((n_samples, n_components))
    noise = rng.standard_normal((n_samples, n_features)) * np.sqrt(true_noise)
    stream: FloatArray = np.ascontiguousarray(true_mean + latents @ true_loadings.T + noise)
    return stream


def orthonormal_init(n_features: int, n_components: int, seed: int) -> FloatArray:
    """Return an explicit initial F: the Q of the reduced QR of a standard-normal D×K matrix (§4.4).

    Parameters
    ----------
    n_features : int
        D.
    n_components : int
        K.
    seed : int
        Seed of the NumPy generator.

    Returns
    -------
    ndarray of shape (n_features, n_components)
        A matrix with orthonormal columns.
    """
    rng = np.random.default_rng(seed)
    q_factor, _ = np.linalg.qr(rng.standard_normal((n_features, n_components)))
    result: FloatArray = np.ascontiguousarray(q_factor)
    return result


def state_snapshot(model: FAModelLike) -> dict[str, Any]:
    """Return independent copies of every observable state array of ``model`` plus ``n_seen``.

    Parameters
    ----------
    model : object
        Anything with ``mean``, ``loadings``, ``noise_variance`` and ``n_seen``.

    Returns
    -------
    dict
        ``{"mean": ..., "loadings": ..., "noise_variance": ..., "n_seen": int}``.
    """
    return {
        "mean": np.array(model.mean, copy=True),
        "loadings": np.array(model.loadings, copy=True),
        "noise_variance": np.array(model.noise_variance, copy=True),
        "n_seen": int(model.n_seen),
    }


def relative_error(actual: npt.ArrayLike, expected: npt.ArrayLike) -> float:
    """Norm-wise relative error ``‖actual − expected‖_F / ‖expected‖_F`` (in float64).

    Parameters
    ----------
    actual, expected : array_like
        Arrays of the same shape.

    Returns
    -------
    float
        The relative error; if ``expected`` is all zeros, 0.0 when ``actual`` is too, else inf.
    """
    actual_arr = np.asarray(actual, dtype=np.float64)
    expected_arr = np.asarray(expected, dtype=np.float64)
    assert actual_arr.shape == expected_arr.shape, (actual_arr.shape, expected_arr.shape)
    difference = float(np.linalg.norm(actual_arr - expected_arr))
    scale = float(np.linalg.norm(expected_arr))
    if scale == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return difference / scale


@pytest.fixture(scope="session")
def fa_stream() -> Callable[[int, int, int, int], FloatArray]:
    """Factory ``fa_stream(D, K, T, seed)`` for synthetic FA streams (see :func:`synthetic_fa_stream`)."""
    return synthetic_fa_stream


@pytest.fixture(scope="session")
def explicit_init() -> Callable[[int, int, int], FloatArray]:
    """Factory ``explicit_init(D, K, seed)`` for orthonormal initial loadings."""
    return orthonormal_init


@pytest.fixture(scope="session")
def snapshot() -> Callable[[FAModelLike], dict[str, Any]]:
    """The :func:`state_snapshot` helper."""
    return state_snapshot


@pytest.fixture(scope="session")
def rel_err() -> Callable[[npt.ArrayLike, npt.ArrayLike], float]:
    """The :func:`relative_error` helper."""
    return relative_error
