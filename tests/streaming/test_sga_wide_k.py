"""OnlineSGA on both engine kernels against the NumPy transcription of thesis Algorithm 1.

After warm-up an OnlineSGA pass runs the row-SIMD kernel for K ≤ 16 and the register-tiled wide kernel for
K > 16. The parity tests of tests/streaming/test_online_parity.py use K ≤ 5 and D ≤ 40 (one partial block); here:

* K ∈ {17, 24, 50} (the wide kernel), D = 3K + 7 (not a multiple of any tile or sub-block size);
* K ∈ {10, 16} on D = 600 (the row kernel over several blocks of 256 rows and a partial group of 4 rows);
* float32 state (both kernels) against the float64 reference on float32-representable data and init,
  within the float32 bounds of tests/streaming/test_properties.py (``FLOAT32_RTOL``).

``OnlineSGA.algorithm1`` against ``reference.ReferenceOnlineSGA`` with ``PARITY_RTOL = 1e-10`` (norm-wise
relative) as in tests/streaming/test_online_parity.py, justified per configuration by
:func:`test_configurations_are_well_conditioned` (two valid K×K inverses in the reference agree to
``REFERENCE_SELF_RTOL``; measured ≤ 4.4e-16). Measured against the reference: float64 ≤ 6.9e-16 (any state
array, any point); float32 state ≤ 1.4e-7 (mean, loadings and noise variances alike).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from reference import ReferenceOnlineSGA, cholesky_inverse, explicit_inverse
from test_properties import FLOAT32_RTOL

FloatArray = npt.NDArray[np.float64]
StreamFactory = Callable[[int, int, int, int], FloatArray]
RelErr = Callable[[npt.ArrayLike, npt.ArrayLike], float]

PARITY_RTOL = 1e-10
REFERENCE_SELF_RTOL = 1e-12
STATE_NAMES = ("mean", "loadings", "noise_variance")
# (D, K): the wide kernel, then the row kernel over several blocks.
CONFIGS = [(3 * 17 + 7, 17), (3 * 24 + 7, 24), (3 * 50 + 7, 50), (600, 10), (600, 16)]
N_WARMUP = 5
N_AFTER_WARMUP = 25
LR = 1e-2


def points() -> list[int]:
    """End of warm-up, the first step, the first pass that applies a pending step, mid-stream and the end."""
    end = N_WARMUP + N_AFTER_WARMUP
    return [N_WARMUP, N_WARMUP + 1, N_WARMUP + 2, (N_WARMUP + end) // 2, end]


def inputs(n_features: int, n_components: int, fa_stream: StreamFactory) -> tuple[FloatArray, FloatArray]:
    """The stream and a non-orthonormal initial F (both float32-representable)."""
    stream = fa_stream(n_features, n_components, N_WARMUP + N_AFTER_WARMUP, 13 * n_features)
    init = 0.7 * np.random.default_rng(3000 + n_features).standard_normal((n_features, n_components))
    return stream.astype(np.float32).astype(np.float64), init.astype(np.float32).astype(np.float64)


def states(model: onlinefa.OnlineSGA | ReferenceOnlineSGA, stream: FloatArray) -> list[dict[str, FloatArray]]:
    """Feed ``stream`` in batches ending at each of :func:`points`; mean, F and ψ after each."""
    out = []
    start = 0
    for stop in points():
        model.update(stream[start:stop])
        start = stop
        parameters: tuple[npt.ArrayLike, npt.ArrayLike]
        if isinstance(model, onlinefa.OnlineSGA) and not model.is_fitted:
            parameters = model.initial_parameters()
        else:
            parameters = (model.loadings, model.noise_variance)
        loadings, noise_variance = parameters
        out.append({"mean": np.asarray(model.mean, np.float64), "loadings": np.asarray(loadings, np.float64),
                    "noise_variance": np.asarray(noise_variance, np.float64)})
    return out


def assert_close(got: list[dict[str, FloatArray]], expected: list[dict[str, FloatArray]],
                 rtol: Callable[[str], float], rel_err: RelErr) -> None:
    for t, got_state, expected_state in zip(points(), got, expected, strict=True):
        for name in STATE_NAMES:
            error = rel_err(got_state[name], expected_state[name])
            assert error <= rtol(name), f"{name} at t={t}: relative error {error:.3e} > {rtol(name):.0e}"


@pytest.mark.parametrize(("n_features", "n_components"), CONFIGS)
def test_configurations_are_well_conditioned(
    n_features: int, n_components: int, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    stream, init = inputs(n_features, n_components, fa_stream)
    plain = states(ReferenceOnlineSGA(init, LR, N_WARMUP, inverse=explicit_inverse), stream)
    via_cholesky = states(ReferenceOnlineSGA(init, LR, N_WARMUP, inverse=cholesky_inverse), stream)
    assert_close(via_cholesky, plain, lambda _: REFERENCE_SELF_RTOL, rel_err)


@pytest.mark.parametrize(("n_features", "n_components"), CONFIGS)
def test_sga_matches_reference(
    n_features: int, n_components: int, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    stream, init = inputs(n_features, n_components, fa_stream)
    expected = states(ReferenceOnlineSGA(init, LR, N_WARMUP, inverse=explicit_inverse), stream)
    # The floor must not be active, or parity would not be expected.
    assert min(float(s["noise_variance"].min()) for s in expected) > 1e-3
    model = onlinefa.OnlineSGA.algorithm1(n_features, n_components, lr=LR, n_warmup=N_WARMUP, init=init)
    assert_close(states(model, stream), expected, lambda _: PARITY_RTOL, rel_err)


@pytest.mark.parametrize(("n_features", "n_components"), CONFIGS)
def test_float32_state_matches_reference(
    n_features: int, n_components: int, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    stream, init = inputs(n_features, n_components, fa_stream)
    expected = states(ReferenceOnlineSGA(init, LR, N_WARMUP, inverse=explicit_inverse), stream)
    model = onlinefa.OnlineSGA.algorithm1(
        n_features, n_components, lr=LR, n_warmup=N_WARMUP, init=init, dtype="float32"
    )
    assert_close(states(model, stream), expected, lambda name: FLOAT32_RTOL["OnlineSGA", name], rel_err)
