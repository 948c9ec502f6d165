"""Tests of onlinefa.metrics against closed forms and independent references."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onlinefa.metrics import psd_sqrt, relative_covariance_distance, relative_mean_distance, wasserstein2

FloatArray = npt.NDArray[np.float64]


def random_spd(dimension: int, seed: int, *, rank: int | None = None, ridge: float = 0.1) -> FloatArray:
    """A random symmetric positive (semi-)definite matrix ``B Bᵀ / r + ridge I`` with B of rank ``r``."""
    rng = np.random.default_rng(seed)
    columns = dimension if rank is None else rank
    factor = rng.standard_normal((dimension, columns))
    return factor @ factor.T / columns + ridge * np.eye(dimension)


def random_rotation(dimension: int, seed: int) -> FloatArray:
    """A random orthogonal matrix (Q of a QR factorisation)."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dimension, dimension)))
    return q


positive = st.floats(0.0, 100.0)
seeds = st.integers(0, 2**32 - 1)


# ------------------------------------------------------------------------------- relative distances


def test_relative_covariance_distance_closed_form() -> None:
    true = np.array([[3.0, 1.0], [1.0, 2.0]])
    est = np.array([[3.0, 0.0], [0.0, 4.0]])
    # difference [[0, 1], [1, -2]] has Frobenius norm sqrt(6); ‖true‖_F = sqrt(9 + 1 + 1 + 4) = sqrt(15)
    assert relative_covariance_distance(est, true) == pytest.approx(math.sqrt(6.0 / 15.0), rel=1e-15)
    assert relative_covariance_distance(true, true) == 0.0


@settings(max_examples=30)
@given(seed=seeds, scale=st.floats(1e-3, 1e3))
def test_relative_covariance_distance_is_scale_invariant(seed: int, scale: float) -> None:
    true, est = random_spd(5, seed), random_spd(5, seed + 1)
    assert relative_covariance_distance(scale * est, scale * true) == pytest.approx(
        relative_covariance_distance(est, true), rel=1e-12
    )


def test_relative_mean_distance_closed_form() -> None:
    assert relative_mean_distance([1.0, 2.0, 2.0], [1.0, 0.0, 0.0]) == pytest.approx(math.sqrt(8.0), rel=1e-15)
    assert relative_mean_distance([4.0, -3.0], [4.0, -3.0]) == 0.0


@pytest.mark.parametrize(
    ("function", "est", "true", "message"),
    [
        (relative_covariance_distance, np.eye(2), np.eye(3), "same shape"),
        (relative_covariance_distance, np.eye(2), np.zeros((2, 2)), "must not be zero"),
        (relative_covariance_distance, np.ones(2), np.eye(2), "2-D"),
        (relative_covariance_distance, np.full((2, 2), np.nan), np.eye(2), "finite"),
        (relative_mean_distance, np.ones(2), np.ones(3), "same shape"),
        (relative_mean_distance, np.ones(2), np.zeros(2), "must not be zero"),
        (relative_mean_distance, np.eye(2), np.ones(2), "1-D"),
        (relative_mean_distance, np.ones(0), np.ones(0), "empty"),
    ],
)
def test_relative_distances_reject_bad_input(function: object, est: FloatArray, true: FloatArray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        function(est, true)  # type: ignore[operator]


# --------------------------------------------------------------------------------------- psd_sqrt


@settings(max_examples=30)
@given(dimension=st.integers(1, 8), seed=seeds)
def test_psd_sqrt_matches_scipy_sqrtm(dimension: int, seed: int) -> None:
    spd = random_spd(dimension, seed)
    root = psd_sqrt(spd)
    np.testing.assert_array_equal(root, root.T)
    assert np.min(np.linalg.eigvalsh(root)) > 0.0
    np.testing.assert_allclose(root, np.real(scipy.linalg.sqrtm(spd)), atol=1e-10)
    np.testing.assert_allclose(root @ root, spd, atol=1e-10)


def test_psd_sqrt_clips_rounding_negatives() -> None:
    # Rank-1 matrix vvᵀ: its root is vvᵀ/‖v‖; its zero eigenvalues may come out of eigh as ≈ -1e-16.
    v = np.array([1.0, 2.0, -3.0])
    root = psd_sqrt(np.outer(v, v))
    assert np.all(np.isfinite(root))
    np.testing.assert_allclose(root, np.outer(v, v) / np.linalg.norm(v), atol=1e-14)


def test_psd_sqrt_rejects_non_symmetric_and_non_square() -> None:
    with pytest.raises(ValueError, match="symmetric"):
        psd_sqrt(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="square"):
        psd_sqrt(np.ones((2, 3)))


# ------------------------------------------------------------------------------------ wasserstein2


@settings(max_examples=40)
@given(
    mean1=st.floats(-10.0, 10.0), mean2=st.floats(-10.0, 10.0), var1=positive, var2=positive,
)  # fmt: skip
def test_w2_one_dimensional_closed_form(mean1: float, mean2: float, var1: float, var2: float) -> None:
    # 1-D: W2² = (m1 − m2)² + (σ1 − σ2)².
    expected = math.hypot(mean1 - mean2, math.sqrt(var1) - math.sqrt(var2))
    actual = wasserstein2([mean1], [[var1]], [mean2], [[var2]])
    assert actual == pytest.approx(expected, rel=1e-9, abs=1e-6)


@settings(max_examples=40)
@given(
    variances=hnp.arrays(np.float64, (2, 6), elements=positive),
    means=hnp.arrays(np.float64, (2, 6), elements=st.floats(-10.0, 10.0)),
    seed=seeds,
)
def test_w2_commuting_covariances_closed_form(variances: FloatArray, means: FloatArray, seed: int) -> None:
    # S1 = Q diag(a) Qᵀ, S2 = Q diag(b) Qᵀ commute: W2² = ‖m1 − m2‖² + Σ (√a_i − √b_i)²
    # (Q = I is the diagonal case, tested first).
    expected = math.sqrt(
        float(np.sum((means[0] - means[1]) ** 2) + np.sum((np.sqrt(variances[0]) - np.sqrt(variances[1])) ** 2))
    )
    diagonal = wasserstein2(means[0], np.diag(variances[0]), means[1], np.diag(variances[1]))
    assert diagonal == pytest.approx(expected, rel=1e-9, abs=1e-6)
    # Rotated, the matrix square roots see rounding of order δ = 1e-14·max variance in every entry. W2² is a
    # difference of traces of that size, so it carries an absolute error of a few δ: up to ~1e-11, i.e. ~3e-6 on
    # W2 near zero (bound 1e-5). Worse, an eigenvalue λ moves √λ by about δ / (2√λ), unbounded as λ → 0 (√δ ≈ 1e-6
    # at λ = 0, enough to move a W2 near zero by 1e-4): eigenvalues of at least 1e-2 keep that below 1e-11.
    conditioned = np.maximum(variances, 1e-2)
    expected = math.sqrt(
        float(np.sum((means[0] - means[1]) ** 2) + np.sum((np.sqrt(conditioned[0]) - np.sqrt(conditioned[1])) ** 2))
    )
    q = random_rotation(6, seed)
    rotated = wasserstein2(
        means[0], q @ np.diag(conditioned[0]) @ q.T, means[1], q @ np.diag(conditioned[1]) @ q.T
    )
    assert rotated == pytest.approx(expected, rel=1e-7, abs=1e-5)


@settings(max_examples=50)
@given(seed=seeds, shift=hnp.arrays(np.float64, 2, elements=st.floats(-5.0, 5.0)))
def test_w2_two_dimensional_closed_form(seed: int, shift: FloatArray) -> None:
    # For 2×2 PSD M, tr √M = sqrt(tr M + 2 sqrt(det M)); with M = S1^½ S2 S1^½,
    # tr M = tr(S1 S2) and det M = det S1 det S2, which involves no matrix square root at all.
    s1, s2 = random_spd(2, seed, ridge=0.05), random_spd(2, seed + 7, ridge=0.05)
    cross = math.sqrt(np.trace(s1 @ s2) + 2.0 * math.sqrt(np.linalg.det(s1) * np.linalg.det(s2)))
    expected_squared = float(shift @ shift) + np.trace(s1) + np.trace(s2) - 2.0 * cross
    expected = math.sqrt(max(expected_squared, 0.0))
    assert wasserstein2(np.zeros(2), s1, shift, s2) == pytest.approx(expected, rel=1e-8, abs=1e-7)


def test_w2_known_two_dimensional_case() -> None:
    # S1 = I, S2 = [[2, 1], [1, 2]] (eigenvalues 3 and 1, eigenvectors (1, ±1)/√2): S1 and S2 commute,
    # √S2 has eigenvalues √3 and 1, so W2² = (√3 − 1)² + (1 − 1)² + ‖(1, 1)‖² = (√3 − 1)² + 2.
    expected = math.sqrt((math.sqrt(3.0) - 1.0) ** 2 + 2.0)
    assert wasserstein2([0.0, 0.0], np.eye(2), [1.0, 1.0], [[2.0, 1.0], [1.0, 2.0]]) == pytest.approx(
        expected, rel=1e-12
    )
    # Non-commuting: S1 = diag(4, 1), S2 = [[1, 1], [1, 4]]: tr(S1 S2) = 8, det S1 det S2 = 4·3 = 12,
    # so tr √M = sqrt(8 + 2√12) and W2² = 5 + 5 − 2 sqrt(8 + 4√3).
    expected = math.sqrt(10.0 - 2.0 * math.sqrt(8.0 + 4.0 * math.sqrt(3.0)))
    actual = wasserstein2([0.0, 0.0], np.diag([4.0, 1.0]), [0.0, 0.0], [[1.0, 1.0], [1.0, 4.0]])
    assert actual == pytest.approx(expected, rel=1e-12)


@settings(max_examples=30)
@given(dimension=st.integers(1, 7), seed=seeds)
def test_w2_matches_eigenvalues_of_the_nonsymmetric_product(dimension: int, seed: int) -> None:
    # Independent route: tr (S1^½ S2 S1^½)^½ = Σ sqrt(λ_i(S1 S2)) (S1 S2 is similar to that PSD matrix).
    rng = np.random.default_rng(seed)
    s1, s2 = random_spd(dimension, seed), random_spd(dimension, seed + 1)
    m1, m2 = rng.standard_normal(dimension), rng.standard_normal(dimension)
    cross = float(np.sum(np.sqrt(np.abs(np.linalg.eigvals(s1 @ s2)))))
    expected = math.sqrt(max(float(np.sum((m1 - m2) ** 2)) + np.trace(s1) + np.trace(s2) - 2.0 * cross, 0.0))
    assert wasserstein2(m1, s1, m2, s2) == pytest.approx(expected, rel=1e-8, abs=1e-7)
    assert wasserstein2(m1, s1, m2, s2, sqrt_cov1=psd_sqrt(s1)) == pytest.approx(expected, rel=1e-8, abs=1e-7)


@settings(max_examples=30)
@given(dimension=st.integers(1, 20), seed=seeds)
def test_w2_identical_is_zero(dimension: int, seed: int) -> None:
    cov = random_spd(dimension, seed, rank=max(1, dimension // 2))
    mean = np.random.default_rng(seed).standard_normal(dimension)
    # W2² is a difference of traces of size tr S, so rounding leaves |W2²| ≲ 1e-13·tr S and W2 ≲ 3e-7·√tr S.
    assert wasserstein2(mean, cov, mean, cov) <= 1e-6 * math.sqrt(np.trace(cov))


@settings(max_examples=30)
@given(seed=seeds)
def test_w2_is_symmetric_and_satisfies_the_triangle_inequality(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gaussians = [(rng.standard_normal(4), random_spd(4, seed + i, rank=2, ridge=0.01)) for i in range(3)]
    (ma, sa), (mb, sb), (mc, sc) = gaussians
    ab, ba = wasserstein2(ma, sa, mb, sb), wasserstein2(mb, sb, ma, sa)
    assert ab == pytest.approx(ba, rel=1e-8, abs=1e-8)
    assert wasserstein2(ma, sa, mc, sc) <= ab + wasserstein2(mb, sb, mc, sc) + 1e-8


def test_w2_equal_covariances_is_mean_distance_and_singular_inputs_work() -> None:
    cov = random_spd(5, 3, rank=2, ridge=0.0)  # singular
    m1, m2 = np.arange(5.0), np.arange(5.0)[::-1]
    assert wasserstein2(m1, cov, m2, cov) == pytest.approx(np.linalg.norm(m1 - m2), rel=1e-7)
    # Orthogonal rank-1 covariances diag(1, 0) and diag(0, 1): W2² = (1 − 0)² + (0 − 1)² = 2.
    assert wasserstein2(np.zeros(2), np.diag([1.0, 0.0]), np.zeros(2), np.diag([0.0, 1.0])) == pytest.approx(
        math.sqrt(2.0), rel=1e-12
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros(2), np.eye(2), np.zeros(3), np.eye(2)), "mean2 must have shape"),
        ((np.zeros(2), np.eye(3), np.zeros(2), np.eye(2)), "cov1 must have shape"),
        ((np.zeros(2), np.eye(2), np.zeros(2), np.eye(3)), "cov2 must have shape"),
        ((np.zeros(2), np.array([[1.0, 0.3], [0.0, 1.0]]), np.zeros(2), np.eye(2)), "cov1 must be symmetric"),
        ((np.zeros(2), np.eye(2), np.full(2, np.inf), np.eye(2)), "finite"),
        ((np.zeros(2), np.ones((2, 3)), np.zeros(2), np.eye(2)), "square"),
    ],
)
def test_w2_rejects_bad_input(args: tuple[FloatArray, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wasserstein2(*args)


def test_w2_rejects_a_wrongly_shaped_precomputed_root() -> None:
    with pytest.raises(ValueError, match="sqrt_cov1"):
        wasserstein2(np.zeros(2), np.eye(2), np.zeros(2), np.eye(2), sqrt_cov1=np.eye(3))
