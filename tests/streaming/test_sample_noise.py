"""The counter-based noise behind ``sample``: standard normal, independent across features, draws and pairs.

Each check is a test of a fixed seed against the standard normal, with a bound a correct generator passes
with probability at least 1 − 10⁻⁴ (the p-value of a correct generator is uniform; a correlation of
independent values has standard error 1/√n, and five of them is a 3·10⁻⁷ tail). The same fixed draws are
read every run, so a pass is not luck of the day.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from onlinefa._gaussian import sample_noise

P_MIN = 1e-4


@pytest.fixture(scope="module")
def noise() -> tuple[np.ndarray, np.ndarray]:
    latent, z = sample_noise(64, 16, 2**14 + 6, seed=20261207)
    return latent, z


def test_noise_values_are_standard_normal(noise: tuple[np.ndarray, np.ndarray]) -> None:
    latent, z = noise
    assert stats.kstest(z.ravel(), "norm").pvalue > P_MIN
    assert stats.kstest(latent.ravel(), "norm").pvalue > P_MIN
    # The tails: |z| > 4 has probability 6.3e-5; its count is Poisson, within five standard deviations.
    expected = z.size * 2 * stats.norm.sf(4.0)
    assert abs(np.count_nonzero(np.abs(z) > 4.0) - expected) < 5 * np.sqrt(expected)


def test_the_two_values_of_a_pair_have_a_uniform_angle_and_a_chi_square_radius(
    noise: tuple[np.ndarray, np.ndarray],
) -> None:
    _, z = noise
    pairs = z[:, : z.shape[1] // 2 * 2].reshape(-1, 2)
    angle = np.arctan2(pairs[:, 1], pairs[:, 0])
    assert stats.kstest(angle, stats.uniform(loc=-np.pi, scale=2 * np.pi).cdf).pvalue > P_MIN
    assert stats.kstest((pairs**2).sum(axis=1), stats.chi2(df=2).cdf).pvalue > P_MIN


@pytest.mark.parametrize(
    "pick",
    [
        lambda z: (z[:, 0:-1:2], z[:, 1::2]),  # the two values of a pair
        lambda z: (z[:, 1:-1:2], z[:, 2::2]),  # neighbours across pairs
        lambda z: (z[:, :-256], z[:, 256:]),  # the same place in neighbouring noise blocks
        lambda z: (z[:-1], z[1:]),  # the same feature in neighbouring draws
    ],
    ids=["pair", "neighbours", "blocks", "draws"],
)
def test_values_are_uncorrelated(noise: tuple[np.ndarray, np.ndarray], pick) -> None:  # type: ignore[no-untyped-def]
    _, z = noise
    a, b = pick(z)
    r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
    assert abs(r) < 5 / np.sqrt(a.size)


def test_squares_of_neighbours_are_uncorrelated(noise: tuple[np.ndarray, np.ndarray]) -> None:
    # Uncorrelated is not independent: a shared radius would correlate the squares of a pair's two values.
    _, z = noise
    a, b = z[:, 0:-1:2] ** 2, z[:, 1::2] ** 2
    r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
    assert abs(r) < 5 / np.sqrt(a.size)


def test_seeds_give_different_noise_and_a_seed_the_same() -> None:
    _, a = sample_noise(2, 3, 1000, seed=1)
    _, b = sample_noise(2, 3, 1000, seed=2)
    _, c = sample_noise(2, 3, 1000, seed=1)
    np.testing.assert_array_equal(a, c)
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
