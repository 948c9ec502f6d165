"""The streaming engine's online-EM pass against the NumPy transcription of Algorithm 2, for K on both sides
of the fused row-SIMD kernel's limit (K ≤ 16 uses Ā-space sums; larger K the block path with explicit F).

Tolerances as in test_online_parity.py: the two float64 transcriptions of the reference (explicit inverse and
Cholesky) must agree to ``REFERENCE_SELF_RTOL`` for a configuration to be a fair test, and the library must
match the reference to ``PARITY_RTOL`` (norm-wise relative) at every checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest

import onlinefa
from onlinefa.datasets import make_fa_model, sample_fa
from test_online_parity import (
    PARITY_RTOL,
    REFERENCE_SELF_RTOL,
    RelErr,
    StreamFactory,
    InitFactory,
    assert_states_close,
    checkpoints,
    em_init,
    feed_in_segments,
    reference_em,
)
from reference import cholesky_inverse
from engine_state import engine_state

# (D, K, n_warmup, T): K = 10 and 16 run the fused kernel, K = 17 and 24 the block path.
LARGE_K_CONFIGS = [(80, 10, 20, 160), (90, 16, 30, 160), (90, 17, 30, 160), (120, 24, 40, 180)]


@pytest.mark.parametrize(("n_features", "n_components", "n_warmup", "n_samples"), LARGE_K_CONFIGS)
def test_engine_em_matches_reference_for_large_k(
    n_features: int, n_components: int, n_warmup: int, n_samples: int,
    fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr,
) -> None:
    stream = fa_stream(n_features, n_components, n_samples, 7 * n_features)
    init = em_init(explicit_init, n_features, n_components)
    points = checkpoints(n_warmup, n_samples)
    expected = feed_in_segments(reference_em(init, n_warmup), stream, points)
    via_cholesky = feed_in_segments(reference_em(init, n_warmup, cholesky_inverse), stream, points)
    assert_states_close(via_cholesky, expected, points, REFERENCE_SELF_RTOL, rel_err)
    model = onlinefa.OnlineEM.algorithm2(n_features, n_components, n_warmup=n_warmup, init=init)
    got = feed_in_segments(model, stream, points)
    assert_states_close(got, expected, points, PARITY_RTOL, rel_err)


def test_engine_float32_arithmetic_tracks_float64_at_k10() -> None:
    """float32 state (float32 per-row arithmetic in the fused kernel) stays within rounding of float64 state.

    Measured drift of the covariance after 2·10⁴ samples: 4.5e-6 relative (1.8e-6 when float32 state used
    float64 arithmetic); the bound leaves >20× margin and sits far below the fit's statistical error.
    """
    drift, estimation_error = _float32_drift(schedule="power", kappa=0.9)
    assert drift < 1e-4
    assert drift < estimation_error / 100


def test_float32_state_with_equal_weights_stays_far_below_the_statistical_error() -> None:
    """The default 1/t steps shrink towards float32's resolution: the drift grows with T, but stays small.

    Measured after 2·10⁴ samples: 1.7e-4 relative (the increments (d mᵀ − Ā)/t of 5e-5 relative size are
    rounded to ~1e-7 each, a random walk of 2·10⁴ steps); the estimation error is ~0.04, so the drift is
    more than 100× below it, and the 1e-3 bound leaves a margin of 5× for other CPUs' rounding.
    """
    drift, estimation_error = _float32_drift()
    assert drift < 1e-3
    assert drift < estimation_error / 100


def _float32_drift(**options: object) -> tuple[float, float]:
    """(‖Σ₃₂ − Σ₆₄‖/‖Σ₆₄‖, ‖Σ₆₄ − Σ‖/‖Σ‖) after 2·10⁴ samples of a K = 10 FA model, D = 50."""
    c, loadings, psi = make_fa_model(50, 10, spectrum=(1.0, 10.0), seed=0)
    x = sample_fa(c, loadings, psi, 20_000, seed=1)
    m64 = onlinefa.OnlineEM(50, 10, seed=0, **options).update(x)  # type: ignore[arg-type]
    m32 = onlinefa.OnlineEM(50, 10, seed=0, dtype="float32", **options).update(x.astype(np.float32))  # type: ignore[arg-type]
    cov64, cov32 = m64.covariance(), m32.covariance()
    drift = float(np.linalg.norm(cov32 - cov64) / np.linalg.norm(cov64))
    true_cov = loadings @ loadings.T + np.diag(psi)
    return drift, float(np.linalg.norm(cov64 - true_cov) / np.linalg.norm(true_cov))


def test_float32_state_survives_a_sample_near_its_input_limit() -> None:
    """After a sample of 1e15 the noise variances sit at the float32 state ceiling while d̄² ~ 1e30: ψ = d̄² − |z|²
    cancels by 12 orders of magnitude, so |z|² must not be formed in float32 (it broke down two rows later)."""
    rng = np.random.default_rng(3)
    d = 2000
    x = rng.standard_normal((12, d)) + np.linspace(0.0, 2.0, d)
    model = onlinefa.OnlineEM(d, 4, n_warmup=6, seed=1, whiten=True, dtype="float32", schedule="power")
    model.update(x[:9])
    model.update(np.full((1, d), 1e15))
    model.update(x[9:])
    assert np.all(np.isfinite(model.loadings)) and np.all(np.isfinite(model.noise_variance))


def test_float32_default_after_a_sample_near_its_input_limit_is_finite_or_refuses_atomically() -> None:
    """With equal weights the outlier keeps a weight 1/t for good, and the later rows may meet a K×K matrix
    that is no longer positive definite: then the batch is refused and the state is the one before it."""
    rng = np.random.default_rng(3)
    d = 2000
    x = rng.standard_normal((12, d)) + np.linspace(0.0, 2.0, d)
    model = onlinefa.OnlineEM(d, 4, n_warmup=6, seed=1, dtype="float32")
    model.update(x[:9])
    model.update(np.full((1, d), 1e15))
    before = engine_state(model)
    try:
        model.update(x[9:])
    except onlinefa.NumericalBreakdownError:
        after = engine_state(model)
        assert all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)
    else:
        assert np.all(np.isfinite(model.loadings)) and np.all(np.isfinite(model.noise_variance))
