"""onlinefa.torch.SWAG against a direct NumPy transcription of Maddox et al. (2019), Algorithm 1 and Section 3."""

from __future__ import annotations

import numpy as np
import pytest

from onlinefa.torch.swag import SWAG


def paper_swag(snapshots: np.ndarray, max_rank: int) -> dict[str, np.ndarray]:
    """The paper's quantities, computed from all snapshots at once (no running updates)."""
    n_snapshots = snapshots.shape[0]
    mean = snapshots.mean(axis=0)
    second = (snapshots**2).mean(axis=0)
    sigma_diag = np.maximum(second - mean**2, 0.0)
    columns = [snapshots[i] - snapshots[: i + 1].mean(axis=0) for i in range(n_snapshots)]
    deviations = np.stack(columns[-max_rank:], axis=1)
    rank = deviations.shape[1]
    covariance = deviations @ deviations.T / (2.0 * (rank - 1)) + np.diag(sigma_diag) / 2.0
    return {"mean": mean, "second": second, "sigma_diag": sigma_diag, "deviations": deviations,
            "covariance": covariance}


def _snapshots(n_snapshots: int, n_features: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    drift = np.linspace(0.0, 1.0, n_snapshots)[:, None] * rng.standard_normal(n_features)
    return 3.0 + drift + 0.1 * rng.standard_normal((n_snapshots, n_features))


@pytest.mark.parametrize("n_snapshots", [2, 5, 7, 23])
def test_matches_the_paper_formulas(n_snapshots: int) -> None:
    snapshots = _snapshots(n_snapshots, 6, seed=n_snapshots)
    swag = SWAG(6, max_rank=5)
    for row in snapshots:
        swag.update(row)
    ref = paper_swag(snapshots, 5)
    np.testing.assert_allclose(swag.mean, ref["mean"], rtol=1e-13)
    np.testing.assert_allclose(swag.second_moment, ref["second"], rtol=1e-13)
    np.testing.assert_allclose(swag.diagonal_variance, ref["sigma_diag"], rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(swag.deviations, ref["deviations"], rtol=1e-12, atol=1e-14)
    assert swag.n_seen == n_snapshots and swag.rank == min(n_snapshots, 5)
    np.testing.assert_allclose(swag.covariance(), ref["covariance"], rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(swag.noise_variance, ref["sigma_diag"] / 2.0, rtol=1e-9, atol=1e-14)


def test_sampling_rule_is_the_papers() -> None:
    """θ̃ = θ̄ + Σ_diag^{1/2} z₁/√2 + D̂ z₂/√(2(K−1)) equals mean + F z₂ + ψ^{1/2} z₁ (same z)."""
    snapshots = _snapshots(30, 8, seed=1)
    swag = SWAG(8, max_rank=4).update(snapshots)
    ref = paper_swag(snapshots, 4)
    rng = np.random.default_rng(2)
    z1, z2 = rng.standard_normal(8), rng.standard_normal(4)
    paper_draw = ref["mean"] + np.sqrt(ref["sigma_diag"]) * z1 / np.sqrt(2.0) + ref["deviations"] @ z2 / np.sqrt(6.0)
    ours = swag.mean + swag.loadings @ z2 + np.sqrt(swag.noise_variance) * z1
    np.testing.assert_allclose(ours, paper_draw, rtol=1e-12)


def test_diagonal_variant_is_n_of_mean_and_sigma_diag() -> None:
    snapshots = _snapshots(12, 5, seed=3)
    swag = SWAG(5, diagonal=True).update(snapshots)
    ref = paper_swag(snapshots, 20)
    assert swag.loadings.shape == (5, 0) and swag.deviations.shape == (5, 0) and swag.rank == 0
    np.testing.assert_allclose(swag.noise_variance, ref["sigma_diag"], rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(swag.covariance(), np.diag(ref["sigma_diag"]), rtol=1e-9, atol=1e-14)
    draws = swag.sample(20000, seed=4)
    # Each coordinate's sample variance is within 5 standard errors (sd of s² ≈ σ²·√(2/n)) of Σ_diag.
    bound = 5.0 * ref["sigma_diag"] * np.sqrt(2.0 / 20000)
    assert np.all(np.abs(draws.var(axis=0) - ref["sigma_diag"]) < bound)


def test_batch_update_equals_one_at_a_time_and_float32_is_accumulated_in_float64() -> None:
    snapshots = _snapshots(9, 4, seed=5).astype(np.float32)
    one = SWAG(4, max_rank=3)
    for row in snapshots:
        one.update(row)
    batch = SWAG(4, max_rank=3).update(snapshots)
    np.testing.assert_array_equal(one.deviations, batch.deviations)
    np.testing.assert_allclose(batch.mean, snapshots.astype(np.float64).mean(axis=0), rtol=1e-14)


def test_fewer_than_two_columns_give_zero_width_loadings() -> None:
    swag = SWAG(3, max_rank=4).update([1.0, 2.0, 3.0])
    assert swag.loadings.shape == (3, 0) and swag.deviations.shape == (3, 1)
    np.testing.assert_array_equal(swag.deviations, 0.0)  # θ_1 − θ̄_1 = 0


@pytest.mark.parametrize(
    ("args", "error"),
    [((0,), ValueError), ((3, 1), ValueError), ((3.0,), TypeError), ((3, 4, "yes"), TypeError)],
)
def test_bad_constructor_arguments(args: tuple[object, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        SWAG(*args)  # type: ignore[arg-type]


def test_bad_snapshots_leave_the_state_unchanged() -> None:
    swag = SWAG(3, max_rank=2).update([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    before = (swag.mean, swag.second_moment, swag.deviations, swag.n_seen)
    with pytest.raises(ValueError):
        swag.update([[0.0, 0.0, 0.0], [np.nan, 0.0, 0.0]])
    with pytest.raises(ValueError):
        swag.update([1.0, 2.0])
    with pytest.raises(TypeError):
        swag.update(["a", "b", "c"])
    after = (swag.mean, swag.second_moment, swag.deviations, swag.n_seen)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
