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


@pytest.mark.parametrize("n_components", [1, 3, 10])
def test_engine_float32_state_tracks_float64(n_components: int) -> None:
    """float32 state with float32 per-row arithmetic stays within float32 rounding of the float64 model."""
    rng = np.random.default_rng(n_components)
    d = 301
    loadings = rng.standard_normal((d, n_components))
    x = rng.standard_normal((400, n_components)) @ loadings.T + 0.5 * rng.standard_normal((400, d))
    models = {
        dtype: onlinefa.OnlineEM(d, n_components, n_warmup=20, dtype=dtype, seed=0)
        for dtype in ("float32", "float64")
    }
    for model in models.values():
        model.update(x)
    cov = {
        dtype: np.asarray(m.loadings, np.float64) @ np.asarray(m.loadings, np.float64).T
        + np.diag(np.asarray(m.noise_variance, np.float64))
        for dtype, m in models.items()
    }
    drift = np.linalg.norm(cov["float32"] - cov["float64"]) / np.linalg.norm(cov["float64"])
    # float32 has eps = 6e-8; 400 steps of rounding at that level stay far below 1e-4.
    assert drift < 1e-4
