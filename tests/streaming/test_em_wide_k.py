"""OnlineEM with K > 16 after warm-up (the register-tiled wide pass) against the NumPy transcriptions.

K ∈ {17, 24, 50}, each past the compile-time-K kernel's limit of 16, is fed long enough after warm-up that
several updates run the wide pass (the warm-up and the first M-step run the block path, so the comparison
points are the end of warm-up, the two updates after it, mid-stream and the end).

* plain: ``OnlineEM.algorithm2`` against ``reference.ReferenceOnlineEM`` (thesis Algorithm 2);
* whitened: ``OnlineEM(whiten=True, scaling="unit")`` against ``test_whitening.WhitenedReferenceEM``;
* float32 state against the float64 reference on float32-representable data and init, within the float32
  bound documented and measured in tests/streaming/test_properties.py (``FLOAT32_RTOL``).

Tolerances are those of tests/streaming/test_online_parity.py and tests/streaming/test_whitening.py: ``PARITY_RTOL = 1e-10``
(norm-wise relative), justified per configuration by :func:`test_wide_configurations_are_well_conditioned`,
which runs each reference with two valid K×K inverses and requires agreement to ``REFERENCE_SELF_RTOL``
(measured here: ≤ 5e-14). Measured against the references: float64 ≤ 7e-14 (any state array, any point);
float32 state ≤ 1.4e-7 (mean), ≤ 7.4e-6 (loadings), ≤ 1.0e-5 (noise variances), against bounds of 1e-5, 1e-3
and 1e-3. A relative error of 1e-9 in the kernel's z/ψ fails every float64 case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from reference import ReferenceOnlineEM, cholesky_inverse
from test_properties import FLOAT32_RTOL
from test_whitening import WhitenedReferenceEM, weak_factor_stream

FloatArray = npt.NDArray[np.float64]
StreamFactory = Callable[[int, int, int, int], FloatArray]
InitFactory = Callable[[int, int, int], FloatArray]
RelErr = Callable[[npt.ArrayLike, npt.ArrayLike], float]

PARITY_RTOL = 1e-10
REFERENCE_SELF_RTOL = 1e-12
STATE_NAMES = ("mean", "loadings", "noise_variance")
COMPONENTS = [17, 24, 50]
N_AFTER_WARMUP = 30


def config(n_components: int) -> tuple[int, int, int]:
    """(D, n_warmup, T): D not a multiple of any tile size, warm-up >= K (see tests/streaming/test_online_parity.py)."""
    n_features = 3 * n_components + 7
    n_warmup = n_components + 5
    return n_features, n_warmup, n_warmup + N_AFTER_WARMUP


def points(n_warmup: int, n_samples: int) -> list[int]:
    """End of warm-up, the first M-step, the first wide pass, mid-stream and the end."""
    return sorted({n_warmup, n_warmup + 1, n_warmup + 2, (n_warmup + n_samples) // 2, n_samples})


def stream_and_init(
    n_components: int, whiten: bool, fa_stream: StreamFactory, explicit_init: InitFactory
) -> tuple[FloatArray, FloatArray]:
    """The stream (weak factors when whitening, see tests/streaming/test_whitening.py) and an orthonormal init."""
    n_features, _, n_samples = config(n_components)
    make = weak_factor_stream if whiten else fa_stream
    return make(n_features, n_components, n_samples, 7 * n_features), explicit_init(
        n_features, n_components, 1000 + n_features
    )


def reference(init: FloatArray, n_warmup: int, whiten: bool, inverse: Any = None) -> Any:
    """Thesis Algorithm 2 (plain) or its whitened transcription, with an optional K×K inverse."""
    options = {} if inverse is None else {"inverse": inverse}
    if whiten:
        return WhitenedReferenceEM(init, n_warmup, whiten=True, **options)
    return ReferenceOnlineEM(init, n_warmup, **options)


def model(init: FloatArray, n_warmup: int, whiten: bool, dtype: str = "float64") -> onlinefa.OnlineEM:
    """The library model that implements the same recursion as :func:`reference`."""
    n_features, n_components = init.shape
    if whiten:
        return onlinefa.OnlineEM(
            n_features, n_components, n_warmup=n_warmup, init=init, whiten=True, scaling="unit",
            schedule="harmonic", dtype=dtype, shrink=False,
        )
    return onlinefa.OnlineEM.algorithm2(n_features, n_components, n_warmup=n_warmup, init=init, dtype=dtype)


def feed(estimator: Any, stream: FloatArray, stops: list[int]) -> list[dict[str, FloatArray]]:
    """Feed ``stream`` in batches ending at each of ``stops``; copy mean, F and ψ after each."""
    snaps, start = [], 0
    for stop in stops:
        estimator.update(stream[start:stop])
        start = stop
        if isinstance(estimator, onlinefa.OnlineEM) and not estimator.is_fitted:
            loadings, noise_variance = estimator.initial_parameters()
        else:
            loadings, noise_variance = estimator.loadings, estimator.noise_variance
        snaps.append(
            {
                "mean": np.array(estimator.mean, dtype=np.float64),
                "loadings": np.array(loadings, dtype=np.float64),
                "noise_variance": np.array(noise_variance, dtype=np.float64),
            }
        )
    return snaps


def assert_close(
    got: list[dict[str, FloatArray]], expected: list[dict[str, FloatArray]], rtol: Callable[[str], float],
    rel_err: RelErr,
) -> None:  # fmt: skip
    for index, (got_state, expected_state) in enumerate(zip(got, expected, strict=True)):
        for name in STATE_NAMES:
            error = rel_err(got_state[name], expected_state[name])
            assert error <= rtol(name), f"{name} at snapshot {index}: relative error {error:.3e}"


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("n_components", COMPONENTS)
def test_wide_configurations_are_well_conditioned(
    n_components: int, whiten: bool, fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr
) -> None:
    """Two valid float64 transcriptions agree far below PARITY_RTOL, and ψ stays clear of the floor."""
    stream, init = stream_and_init(n_components, whiten, fa_stream, explicit_init)
    _, n_warmup, n_samples = config(n_components)
    stops = points(n_warmup, n_samples)
    plain = feed(reference(init, n_warmup, whiten), stream, stops)
    other = feed(reference(init, n_warmup, whiten, cholesky_inverse), stream, stops)
    assert_close(other, plain, lambda _: REFERENCE_SELF_RTOL, rel_err)
    assert min(float(s["noise_variance"].min()) for s in plain) > 1e-2


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("n_components", COMPONENTS)
def test_wide_k_matches_reference(
    n_components: int, whiten: bool, fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr
) -> None:
    stream, init = stream_and_init(n_components, whiten, fa_stream, explicit_init)
    _, n_warmup, n_samples = config(n_components)
    stops = points(n_warmup, n_samples)
    expected = feed(reference(init, n_warmup, whiten), stream, stops)
    got = feed(model(init, n_warmup, whiten), stream, stops)
    assert_close(got, expected, lambda _: PARITY_RTOL, rel_err)


@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("n_components", COMPONENTS)
def test_wide_k_float32_state_within_the_float32_bound(
    n_components: int, whiten: bool, fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr
) -> None:
    """float32 state against the float64 reference, both fed the same float32-representable data and init."""
    stream, init = stream_and_init(n_components, whiten, fa_stream, explicit_init)
    stream = stream.astype(np.float32).astype(np.float64)
    init = init.astype(np.float32).astype(np.float64)
    _, n_warmup, n_samples = config(n_components)
    stops = points(n_warmup, n_samples)
    expected = feed(reference(init, n_warmup, whiten), stream, stops)
    single = model(init, n_warmup, whiten, dtype="float32")
    got = feed(single, stream.astype(np.float32), stops)
    assert single.dtype == "float32"
    assert_close(got, expected, lambda name: FLOAT32_RTOL["OnlineEM", name], rel_err)
