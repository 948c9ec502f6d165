"""OnlineEM / OnlineSGA against the NumPy transcription of thesis Algorithms 1 and 2.

Tolerance for parity (``PARITY_RTOL = 1e-10``, norm-wise relative error ‖a − b‖_F / ‖b‖_F): the
implementation and the reference compute the same float64 recursions in different orders (Cholesky
solves vs explicit inverses, blocked vs plain sums), so they may differ by accumulated rounding
only.  :func:`test_parity_configurations_are_well_conditioned` measures that accumulated rounding
directly, by running the reference twice with two different but equally valid K×K inverses: on every
configuration used here the two agree to ``REFERENCE_SELF_RTOL = 1e-12`` (measured: ≤ 3e-14).  The
parity tolerance leaves a further factor 100 for the implementation's own summation order, and is
still ~10⁹ times smaller than the effect of any single-line mistake in the algorithm (a wrong 1/t,
a stale mean, a missing Σ term each change the state at the 1e-3 to 1e0 level).

Online EM with a warm-up shorter than K is *not* used for parity: after fewer than K+1 samples the
averaged statistics have rank < K and the following M-steps amplify float64 rounding to O(1)
(two valid float64 transcriptions disagree by 40% in F for D = 40, K = 5, n_warmup = 1), so no
implementation can match another there.  Without warm-up, online EM hits the noise floor (d_1 = 0);
that case has its own test.

The library's defaults (data scaling, whitening, a forgetting schedule) are not the thesis algorithms;
parity is checked on ``OnlineEM.algorithm2`` and ``OnlineSGA.algorithm1``, which are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from reference import (
    ReferenceOnlineEM,
    ReferenceOnlineSGA,
    cholesky_inverse,
    explicit_inverse,
)

PARITY_RTOL = 1e-10
REFERENCE_SELF_RTOL = 1e-12
# Batch vs row-by-row: identical arithmetic is expected; allow only last-bits differences.
BATCH_RTOL = 1e-12

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]
InitFactory = Callable[[int, int, int], npt.NDArray[np.float64]]
RelErr = Callable[[npt.ArrayLike, npt.ArrayLike], float]

# (D, K, n_warmup, T) for online EM: warm-up >= K (see module docstring), one at the thesis's 100.
EM_CONFIGS = [
    (5, 1, 1, 300),
    (8, 2, 2, 300),
    (20, 3, 5, 400),
    (40, 5, 10, 300),
    (12, 4, 100, 300),
]
# (D, K, n_warmup, lr, T) for online SGA, including no warm-up at all.
SGA_CONFIGS = [
    (5, 1, 0, 1e-2, 300),
    (8, 2, 0, 1e-3, 300),
    (20, 3, 5, 3e-2, 400),
    (40, 5, 0, 1e-2, 300),
    (12, 4, 100, 1e-2, 300),
]
STATE_NAMES = ("mean", "loadings", "noise_variance")


def checkpoints(n_warmup: int, n_samples: int) -> list[int]:
    """Stream positions t at which states are compared: end of warm-up, first step after, mid, end."""
    points = {n_warmup, n_warmup + 1, (n_warmup + 1 + n_samples) // 2, n_samples}
    return sorted(p for p in points if 1 <= p <= n_samples)


def read_state(model: Any) -> dict[str, Any]:
    """Mean, F, ψ and n_seen of ``model``; during an OnlineEM/OnlineSGA warm-up F and ψ are the start values.

    While ``not model.is_fitted`` the library refuses ``loadings``/``noise_variance``; the F and ψ its next
    E-step uses (``initial_parameters()``) are then what the reference holds at the same t.
    """
    if isinstance(model, (onlinefa.OnlineEM, onlinefa.OnlineSGA)) and not model.is_fitted:
        loadings, noise_variance = model.initial_parameters()
    else:
        loadings, noise_variance = model.loadings, model.noise_variance
    return {
        "mean": np.array(model.mean, dtype=np.float64),
        "loadings": np.array(loadings, dtype=np.float64),
        "noise_variance": np.array(noise_variance, dtype=np.float64),
        "n_seen": int(model.n_seen),
    }


def feed_in_segments(
    model: Any, stream: npt.NDArray[np.float64], points: list[int]
) -> list[dict[str, Any]]:
    """Feed ``stream`` to ``model`` in batches ending at each checkpoint; snapshot after each."""
    snaps = []
    start = 0
    for stop in points:
        model.update(stream[start:stop])
        snaps.append(read_state(model))
        start = stop
    return snaps


def reference_em(init: npt.NDArray[np.float64], n_warmup: int, inverse: Any = explicit_inverse) -> Any:
    """Algorithm 2 reference with the given initial F, warm-up and K×K inverse."""
    return ReferenceOnlineEM(init, n_warmup, inverse=inverse)


def reference_sga(
    init: npt.NDArray[np.float64], n_warmup: int, lr: float, inverse: Any = explicit_inverse
) -> Any:
    """Algorithm 1 reference with the given initial F, warm-up, learning rate and K×K inverse."""
    return ReferenceOnlineSGA(init, lr, n_warmup, inverse=inverse)


def assert_states_close(
    got: list[dict[str, Any]], expected: list[dict[str, Any]], points: list[int], rtol: float, rel_err: RelErr
) -> None:
    """Every state array at every checkpoint within norm-wise relative ``rtol``; n_seen exact."""
    for t, got_state, expected_state in zip(points, got, expected, strict=True):
        assert got_state["n_seen"] == expected_state["n_seen"] == t
        for name in STATE_NAMES:
            error = rel_err(got_state[name], expected_state[name])
            assert error <= rtol, f"{name} at t={t}: relative error {error:.3e} > {rtol:.0e}"


def em_init(explicit_init: InitFactory, n_features: int, n_components: int) -> npt.NDArray[np.float64]:
    """The orthonormal explicit initial F used for the EM parity runs."""
    return explicit_init(n_features, n_components, 1000 + n_features)


def sga_init(explicit_init: InitFactory, n_features: int, n_components: int) -> npt.NDArray[np.float64]:
    """A non-orthonormal explicit initial F for the SGA runs (checks that init is used as given)."""
    rng = np.random.default_rng(2000 + n_features)
    return 0.7 * rng.standard_normal((n_features, n_components))


@pytest.mark.parametrize(("n_features", "n_components", "n_warmup", "n_samples"), EM_CONFIGS)
def test_parity_configurations_are_well_conditioned_em(
    n_features: int, n_components: int, n_warmup: int, n_samples: int,
    fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr,
) -> None:
    """Two valid float64 transcriptions agree far below PARITY_RTOL (justifies the tolerance)."""
    stream = fa_stream(n_features, n_components, n_samples, 7 * n_features)
    init = em_init(explicit_init, n_features, n_components)
    points = checkpoints(n_warmup, n_samples)
    plain = feed_in_segments(reference_em(init, n_warmup), stream, points)
    via_cholesky = feed_in_segments(reference_em(init, n_warmup, cholesky_inverse), stream, points)
    assert_states_close(via_cholesky, plain, points, REFERENCE_SELF_RTOL, rel_err)


@pytest.mark.parametrize(("n_features", "n_components", "n_warmup", "lr", "n_samples"), SGA_CONFIGS)
def test_parity_configurations_are_well_conditioned_sga(
    n_features: int, n_components: int, n_warmup: int, lr: float, n_samples: int,
    fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr,
) -> None:
    """Same self-check as for EM, for the SGA configurations."""
    stream = fa_stream(n_features, n_components, n_samples, 11 * n_features)
    init = sga_init(explicit_init, n_features, n_components)
    points = checkpoints(n_warmup, n_samples)
    plain = feed_in_segments(reference_sga(init, n_warmup, lr), stream, points)
    via_cholesky = feed_in_segments(reference_sga(init, n_warmup, lr, cholesky_inverse), stream, points)
    assert_states_close(via_cholesky, plain, points, REFERENCE_SELF_RTOL, rel_err)


@pytest.mark.parametrize(("n_features", "n_components", "n_warmup", "n_samples"), EM_CONFIGS)
def test_online_em_matches_reference(
    n_features: int, n_components: int, n_warmup: int, n_samples: int,
    fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr,
) -> None:
    stream = fa_stream(n_features, n_components, n_samples, 7 * n_features)
    init = em_init(explicit_init, n_features, n_components)
    points = checkpoints(n_warmup, n_samples)
    model = onlinefa.OnlineEM.algorithm2(n_features, n_components, n_warmup=n_warmup, init=init)
    got = feed_in_segments(model, stream, points)
    expected = feed_in_segments(reference_em(init, n_warmup), stream, points)
    # The floor must not be active anywhere in these streams, or parity would not be expected.
    assert min(float(s["noise_variance"].min()) for s in expected) > 1e-3
    assert_states_close(got, expected, points, PARITY_RTOL, rel_err)


@pytest.mark.parametrize(("n_features", "n_components", "n_warmup", "lr", "n_samples"), SGA_CONFIGS)
def test_online_sga_matches_reference(
    n_features: int, n_components: int, n_warmup: int, lr: float, n_samples: int,
    fa_stream: StreamFactory, explicit_init: InitFactory, rel_err: RelErr,
) -> None:
    stream = fa_stream(n_features, n_components, n_samples, 11 * n_features)
    init = sga_init(explicit_init, n_features, n_components)
    points = checkpoints(n_warmup, n_samples)
    model = onlinefa.OnlineSGA.algorithm1(n_features, n_components, lr=lr, n_warmup=n_warmup, init=init)
    got = feed_in_segments(model, stream, points)
    expected = feed_in_segments(reference_sga(init, n_warmup, lr), stream, points)
    assert min(float(s["noise_variance"].min()) for s in expected) > 1e-3
    assert_states_close(got, expected, points, PARITY_RTOL, rel_err)


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_warmup_keeps_loadings_and_noise_fixed(
    model_class: str, fa_stream: StreamFactory, explicit_init: InitFactory
) -> None:
    """Thesis algorithms: during warm-up F is exactly the init and ψ exactly 1 (the start the updates use);
    SGA refuses the fitted parameters, EM answers with the first fit from the samples so far once it has
    two (tests/streaming/test_short_streams.py); the first step after the warm-up moves both."""
    n_features, n_components, n_warmup = 9, 3, 12
    stream = fa_stream(n_features, n_components, n_warmup + 1, 3)
    init = explicit_init(n_features, n_components, 4)
    model: onlinefa.OnlineEM | onlinefa.OnlineSGA
    if model_class == "OnlineEM":
        model = onlinefa.OnlineEM.algorithm2(n_features, n_components, n_warmup=n_warmup, init=init)
    else:
        model = onlinefa.OnlineSGA.algorithm1(n_features, n_components, n_warmup=n_warmup, init=init)
    for row in stream[:n_warmup]:
        model.update(row)
        assert not model.is_fitted
        if model_class == "OnlineSGA" or model.n_seen < 2:
            with pytest.raises(onlinefa.NotFittedError):
                _ = model.loadings
            with pytest.raises(onlinefa.NotFittedError):
                _ = model.noise_variance
        else:
            assert not np.array_equal(model.loadings, init)
        loadings, noise_variance = model.initial_parameters()
        np.testing.assert_array_equal(loadings, init)
        np.testing.assert_array_equal(noise_variance, np.ones(n_features))
    model.update(stream[n_warmup])
    assert model.is_fitted
    assert not np.array_equal(model.loadings, init)
    assert not np.array_equal(model.noise_variance, np.ones(n_features))


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_mean_is_the_sample_mean(
    model_class: str, fa_stream: StreamFactory, rel_err: RelErr
) -> None:
    """θ̄_t equals the arithmetic mean of the first t rows (closed form, independent of Alg. 1/2)."""
    stream = fa_stream(15, 3, 250, 5)
    model = getattr(onlinefa, model_class)(15, 3, n_warmup=10, seed=0)
    for stop in (1, 2, 10, 11, 100, 250):
        model.update(stream[model.n_seen : stop])
        assert model.n_seen == stop
        # Running-mean rounding grows like t·eps at worst: 250 · 2.2e-16 ≈ 6e-14 < 1e-12.
        assert rel_err(model.mean, stream[:stop].mean(axis=0)) <= 1e-12


def test_online_em_without_warmup_sits_on_noise_floor(fa_stream: StreamFactory) -> None:
    """n_warmup = 0: d_1 = 0 makes Ā_1 = 0, so F = 0 forever and ψ_1 = 0 is floored.

    From t = 2 on, with F = 0, line 15 of Algorithm 2 reduces to ψ = d̄²_t = (1/t) Σ_{i≤t} d_i²
    (computed here in closed form), which is far above the floor for this stream.
    """
    n_features, n_components, noise_floor = 6, 2, 1e-6
    stream = fa_stream(n_features, n_components, 40, 9)
    model = onlinefa.OnlineEM.algorithm2(n_features, n_components, n_warmup=0, seed=1, noise_floor=noise_floor)
    squared_deviations = []
    for t, row in enumerate(stream, start=1):
        model.update(row)
        deviation = row - stream[:t].mean(axis=0)
        squared_deviations.append(deviation**2)
        np.testing.assert_array_equal(model.loadings, np.zeros((n_features, n_components)))
        assert np.all(model.noise_variance >= noise_floor)
        if t >= 2:
            expected = np.mean(squared_deviations, axis=0)
            np.testing.assert_allclose(model.noise_variance, expected, rtol=PARITY_RTOL)


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
@pytest.mark.parametrize("n_warmup", [0, 3])
def test_batch_update_equals_row_by_row(
    model_class: str, n_warmup: int, fa_stream: StreamFactory, explicit_init: InitFactory,
    rel_err: RelErr,
) -> None:
    n_features, n_components, n_samples = 10, 3, 120
    stream = fa_stream(n_features, n_components, n_samples, 21)
    init = explicit_init(n_features, n_components, 22)
    kwargs: dict[str, Any] = {"n_warmup": n_warmup, "init": init}
    if model_class == "OnlineSGA":
        kwargs["lr"] = 1e-2
    in_batches = getattr(onlinefa, model_class)(n_features, n_components, **kwargs)
    row_by_row = getattr(onlinefa, model_class)(n_features, n_components, **kwargs)
    for start, stop in [(0, 1), (1, 7), (7, 8), (8, 64), (64, n_samples)]:
        in_batches.update(stream[start:stop])
        for row in stream[start:stop]:
            row_by_row.update(row)
        assert in_batches.n_seen == row_by_row.n_seen == stop
        batched_state, row_state = read_state(in_batches), read_state(row_by_row)
        for name in STATE_NAMES:
            error = rel_err(batched_state[name], row_state[name])
            assert error <= BATCH_RTOL, f"{name} after {stop} rows: {error:.3e}"


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_single_row_as_1d_equals_2d(model_class: str, fa_stream: StreamFactory) -> None:
    stream = fa_stream(7, 2, 30, 4)
    as_rows = getattr(onlinefa, model_class)(7, 2, n_warmup=2, seed=3)
    as_2d = getattr(onlinefa, model_class)(7, 2, n_warmup=2, seed=3)
    for row in stream:
        as_rows.update(row)
        as_2d.update(row[None, :])
    for name in STATE_NAMES:
        np.testing.assert_array_equal(getattr(as_rows, name), getattr(as_2d, name))


# ---------------------------------------------------------------------------------------------
# Initialisation (§4.4) and n_seen
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_default_init_is_orthonormal_and_seeded(model_class: str) -> None:
    n_features, n_components = 30, 4
    cls = getattr(onlinefa, model_class)
    first = cls(n_features, n_components, seed=123)
    again = cls(n_features, n_components, seed=123)
    other = cls(n_features, n_components, seed=124)
    loadings, noise_variance = first.initial_parameters()
    assert loadings.shape == (n_features, n_components)
    # Q of a Householder QR has orthonormal columns to a few ulps.
    np.testing.assert_allclose(loadings.T @ loadings, np.eye(n_components), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(loadings, again.initial_parameters()[0])
    assert np.abs(loadings - other.initial_parameters()[0]).max() > 1e-3
    np.testing.assert_array_equal(noise_variance, np.ones(n_features))
    np.testing.assert_array_equal(first.mean, np.zeros(n_features))
    assert first.n_seen == 0


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_default_init_columns_are_uniform_on_the_sphere(model_class: str) -> None:
    """Q of a Gaussian matrix is Haar-distributed up to column signs, so E[F_ij²] = 1/D.

    (Only squares: LAPACK's Householder QR fixes the signs of R's diagonal, which biases the signs
    of Q's entries, so their plain mean over seeds is not 0.)  Over 200 seeds with D = 5, K = 2 the
    average of F_ij² has standard deviation sqrt(Var(F_ij²)/200) with Var(F_ij²) =
    2(D−1)/(D²(D+2)) ≈ 0.0457 → sd ≈ 0.0151; the bound 0.08 (5.3 sd, each of 10 entries) fails with
    probability < 1e-6 for a correct init, while an init that is not rotation-invariant (e.g. the
    first K unit vectors) puts 1 or 0 there.
    """
    n_features, n_components, n_seeds = 5, 2, 200
    cls = getattr(onlinefa, model_class)
    draws = np.stack(
        [cls(n_features, n_components, seed=s).initial_parameters()[0] for s in range(n_seeds)]
    )
    np.testing.assert_allclose((draws**2).mean(axis=0), 1 / n_features, atol=0.08)


def test_explicit_init_is_used_as_given() -> None:
    rng = np.random.default_rng(5)
    init = 3.0 * rng.standard_normal((6, 2))
    for model in (onlinefa.OnlineEM(6, 2, init=init), onlinefa.OnlineSGA(6, 2, init=init)):
        loadings, noise_variance = model.initial_parameters()
        np.testing.assert_array_equal(loadings, init)
        np.testing.assert_array_equal(noise_variance, np.ones(6))
        np.testing.assert_array_equal(model.mean, np.zeros(6))


def test_init_array_is_copied() -> None:
    """Mutating the caller's init array afterwards must not change the model."""
    init = np.random.default_rng(6).standard_normal((6, 2))
    kept = init.copy()
    model = onlinefa.OnlineEM(6, 2, init=init)
    init[:] = 0.0
    np.testing.assert_array_equal(model.initial_parameters()[0], kept)


def test_returned_state_is_not_a_live_view(fa_stream: StreamFactory) -> None:
    """Writing into an array the model returned must not change the model's state."""
    model = onlinefa.OnlineEM(6, 2, n_warmup=1, seed=0)
    model.update(fa_stream(6, 2, 5, 0))
    before = np.array(model.loadings, copy=True)
    returned = np.asarray(model.loadings)
    if returned.flags.writeable:
        returned[...] = 123.0
    np.testing.assert_array_equal(model.loadings, before)


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_n_seen_counts_rows(model_class: str, fa_stream: StreamFactory) -> None:
    stream = fa_stream(5, 1, 20, 8)
    model = getattr(onlinefa, model_class)(5, 1, seed=0)
    model.update(stream[0])
    assert model.n_seen == 1
    model.update(stream[1:13])
    assert model.n_seen == 13
    model.update(stream[13:])
    assert model.n_seen == 20
    assert isinstance(model.n_seen, int)
