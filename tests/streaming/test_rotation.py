"""Canonical loadings (onlinefa.rotation): defining properties, an independent SVD reference, and use.

Definition under test (python/onlinefa/rotation.py): F_c = F Q, Q orthogonal, with F_cᵀ F_c diagonal and
decreasing and the largest-magnitude entry of every column positive.

Tolerances: every check compares float64 results of O(D·K²) operations on matrices whose entries are O(1)
(or scaled by the stated factor), so rounding is a few ulps times ‖F‖²; ``RTOL = 1e-10`` relative to ‖F‖²
leaves a wide margin for that and is still orders of magnitude below any real defect (a wrong order, a
missing sign flip or a non-orthogonal Q change the checked quantities at the O(1) relative level).
Hypothesis strategies keep the Gram matrix's eigenvalues separated by at least 5 % of the largest one, so
the eigenvectors — and hence F_c — are well conditioned there.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onlinefa
from onlinefa.rotation import canonical_loadings, canonical_rotation

FloatArray = npt.NDArray[np.float64]
RTOL = 1e-10


def loadings_with_gap(seed: int, n_features: int, n_components: int, scale: float = 1.0) -> FloatArray:
    """A D×K matrix U S Vᵀ with random orthonormal U, V and singular values 1, 0.9, 0.8, … (× scale).

    Squared singular values (the eigenvalues of FᵀF) are then separated by >= 5 % of the largest one.
    """
    rng = np.random.default_rng(seed)
    left, _ = np.linalg.qr(rng.standard_normal((n_features, n_components)))
    right, _ = np.linalg.qr(rng.standard_normal((n_components, n_components)))
    singular = scale * (1.0 - 0.1 * np.arange(n_components))
    out: FloatArray = (left * singular) @ right.T
    return out


def random_orthogonal(seed: int, size: int) -> FloatArray:
    """A Haar-like random orthogonal matrix (QR of a Gaussian matrix with the signs of R's diagonal fixed)."""
    rng = np.random.default_rng(seed)
    q_factor, r_factor = np.linalg.qr(rng.standard_normal((size, size)))
    out: FloatArray = q_factor * np.sign(np.diag(r_factor))
    return out


def svd_reference(loadings: FloatArray) -> FloatArray:
    """Independent transcription of the definition: F = U S Vᵀ (LAPACK SVD), F_c = U S with the sign rule."""
    left, singular, _ = np.linalg.svd(loadings, full_matrices=False)
    columns: FloatArray = left * singular
    for k in range(columns.shape[1]):
        peak = columns[np.argmax(np.abs(columns[:, k])), k]
        if peak < 0:
            columns[:, k] = -columns[:, k]
    return columns


shapes = st.tuples(st.integers(2, 40), st.integers(1, 8)).filter(lambda dk: dk[1] <= dk[0])
seeds = st.integers(0, 2**32 - 1)
scales = st.sampled_from([1e-3, 1.0, 1e3])


@settings(max_examples=60)
@given(shape=shapes, seed=seeds, scale=scales)
def test_defining_properties(shape: tuple[int, int], seed: int, scale: float) -> None:
    n_features, n_components = shape
    loadings = loadings_with_gap(seed, n_features, n_components, scale)
    canonical = canonical_loadings(loadings)
    norm2 = scale**2  # ‖F‖₂² = largest eigenvalue of FᵀF
    # 1. Same Gaussian: F_c F_cᵀ = F Fᵀ.
    np.testing.assert_allclose(canonical @ canonical.T, loadings @ loadings.T, rtol=0, atol=RTOL * norm2)
    # 2. FᵀF diagonal with decreasing entries (equal to the eigenvalues of FᵀF).
    gram = canonical.T @ canonical
    off_diagonal = gram - np.diag(np.diag(gram))
    assert np.max(np.abs(off_diagonal)) <= RTOL * norm2
    assert np.all(np.diff(np.diag(gram)) < 0)
    np.testing.assert_allclose(
        np.diag(gram), np.linalg.eigvalsh(loadings.T @ loadings)[::-1], rtol=0, atol=RTOL * norm2
    )
    # 3. Sign rule: the largest-magnitude entry of each column is positive.
    peaks = canonical[np.argmax(np.abs(canonical), axis=0), np.arange(n_components)]
    assert np.all(peaks > 0)


@settings(max_examples=60)
@given(shape=shapes, seed=seeds)
def test_matches_independent_svd_reference(shape: tuple[int, int], seed: int) -> None:
    loadings = loadings_with_gap(seed, *shape)
    np.testing.assert_allclose(canonical_loadings(loadings), svd_reference(loadings), rtol=0, atol=RTOL)


@settings(max_examples=60)
@given(shape=shapes, seed=seeds, rotation_seed=seeds)
def test_rotated_copies_of_a_fit_have_the_same_canonical_loadings(
    shape: tuple[int, int], seed: int, rotation_seed: int
) -> None:
    # Any change of latent basis that keeps the model (F → F Q, Q orthogonal: rotations, reflections,
    # column permutations and sign flips) leaves the canonical representative unchanged.
    n_features, n_components = shape
    loadings = loadings_with_gap(seed, n_features, n_components)
    rotated = loadings @ random_orthogonal(rotation_seed, n_components)
    np.testing.assert_allclose(canonical_loadings(rotated), canonical_loadings(loadings), rtol=0, atol=RTOL)


def test_canonical_loadings_are_a_fixed_point() -> None:
    canonical = canonical_loadings(loadings_with_gap(3, 30, 5))
    np.testing.assert_allclose(canonical_loadings(canonical), canonical, rtol=0, atol=RTOL)
    np.testing.assert_allclose(canonical_rotation(canonical), np.eye(5), rtol=0, atol=RTOL)


def test_rotation_is_orthogonal_and_maps_loadings() -> None:
    loadings = loadings_with_gap(4, 25, 4) @ random_orthogonal(5, 4)
    rotation = canonical_rotation(loadings)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(4), rtol=0, atol=RTOL)
    np.testing.assert_allclose(loadings @ rotation, canonical_loadings(loadings), rtol=0, atol=RTOL)


def test_latents_rotate_consistently_with_the_loadings() -> None:
    # The documented use of Q: h @ Q are the latent means of the same model with loadings F Q.
    rng = np.random.default_rng(6)
    n_features, n_components = 20, 3
    loadings = loadings_with_gap(7, n_features, n_components, 3.0)
    noise_variance = rng.uniform(0.5, 1.5, n_features)
    x = rng.standard_normal((50, n_features))
    rotation = canonical_rotation(loadings)

    def posterior_means(f: FloatArray) -> FloatArray:
        scaled = f / noise_variance[:, None]
        solved = np.linalg.solve(np.eye(n_components) + f.T @ scaled, (x @ scaled).T)
        return np.asarray(solved.T, dtype=np.float64)

    np.testing.assert_allclose(
        posterior_means(loadings) @ rotation, posterior_means(loadings @ rotation), rtol=0, atol=RTOL
    )


def test_latent_second_moment_stays_whitened() -> None:
    # "Latent posterior whitened": under the model's own x, E[Cov(h|x) + E(h|x)E(h|x)ᵀ] = I. Closed form:
    # with G = Fᵀ Ψ⁻¹ F, Cov(h|x) = (I + G)⁻¹ and E[E(h|x)E(h|x)ᵀ] = (I + G)⁻¹ G. Checked in the canonical
    # basis both in closed form and by Monte Carlo over 200,000 draws, whose average of E(h|x)E(h|x)ᵀ has
    # standard error <= sqrt(2/200,000) ≈ 0.003 per entry here (entries of a Wishart average with
    # variances <= 1); the 0.02 bound is > 6 standard errors, while an unwhitened basis (e.g. F scaled by 2,
    # which changes the model) misses I by O(1).
    rng = np.random.default_rng(8)
    n_features, n_components = 15, 3
    canonical = canonical_loadings(loadings_with_gap(9, n_features, n_components, 2.0))
    noise_variance = rng.uniform(0.5, 1.5, n_features)
    precision_g = canonical.T @ (canonical / noise_variance[:, None])
    posterior_cov = np.linalg.inv(np.eye(n_components) + precision_g)
    np.testing.assert_allclose(posterior_cov + posterior_cov @ precision_g, np.eye(n_components), atol=1e-12)
    x = rng.standard_normal((200_000, n_components)) @ canonical.T + rng.standard_normal(
        (200_000, n_features)
    ) * np.sqrt(noise_variance)
    means = x @ (canonical / noise_variance[:, None]) @ posterior_cov
    second_moment = posterior_cov + means.T @ means / x.shape[0]
    assert np.max(np.abs(second_moment - np.eye(n_components))) < 0.02


def test_model_method_delegates() -> None:
    x = np.random.default_rng(10).standard_normal((300, 12))
    model = onlinefa.OnlineEM(12, 3, seed=0, n_warmup=20).update(x)
    np.testing.assert_array_equal(model.canonical_loadings(), canonical_loadings(model.loadings))
    np.testing.assert_array_equal(onlinefa.canonical_loadings(model.loadings), canonical_loadings(model.loadings))


def planted_stream(seed: int, n_samples: int) -> tuple[FloatArray, FloatArray]:
    """D = 30 samples of an FA model with orthogonal factors of norms 3, 2, 1.2, ψ ~ U[0.5, 1.5].

    Returns the samples and the canonical loadings of the true model.
    """
    rng = np.random.default_rng(seed)
    n_features = 30
    basis, _ = np.linalg.qr(rng.standard_normal((n_features, 3)))
    true_loadings = basis * np.array([3.0, 2.0, 1.2])
    noise_variance = rng.uniform(0.5, 1.5, n_features)
    x = rng.standard_normal((n_samples, 3)) @ true_loadings.T + rng.standard_normal(
        (n_samples, n_features)
    ) * np.sqrt(noise_variance)
    return x, canonical_loadings(true_loadings)


@pytest.mark.parametrize(
    ("options", "n_samples"),
    [({"whiten": False}, 20_000), ({}, 100_000), ({"whiten": True, "schedule": "power", "kappa": 0.9}, 20_000)],
    ids=["thesis", "default", "whiten-kappa"],
)
def test_two_fits_become_comparable(options: dict[str, object], n_samples: int) -> None:
    # Same data, two initialisation seeds: the raw loadings differ by a latent rotation (relative
    # difference O(1)); the canonical loadings agree with each other and with the truth's. Bound: with
    # T = 20,000 the maximum-likelihood loadings have entry-wise standard errors ≈ sqrt(ψ/T) <= 0.009, i.e.
    # a Frobenius error ≈ 0.009·sqrt(90) ≈ 0.08 against ‖F‖ ≈ 3.8, about 0.02 relative; the smallest
    # eigenvalue gap of FᵀF (4 − 1.44) keeps the rotation well determined. 0.1 leaves room for the online
    # fits' remaining optimisation error; a missing or wrong rotation gives > 0.5. The default's equal
    # weights keep the early, poorly started steps for good: seed 1 is still 0.14 from the truth after
    # 20,000 samples of this stream (κ = 0.9 forgets them: 0.03), 0.016 after 100,000.
    x, true_canonical = planted_stream(11, n_samples)
    fits = [
        onlinefa.OnlineEM(30, 3, seed=seed, n_warmup=50, **options).update(x)  # type: ignore[arg-type]
        for seed in (1, 2)
    ]
    raw_gap = np.linalg.norm(fits[0].loadings - fits[1].loadings) / np.linalg.norm(fits[1].loadings)
    canonical = [fit.canonical_loadings() for fit in fits]
    canonical_gap = np.linalg.norm(canonical[0] - canonical[1]) / np.linalg.norm(canonical[1])
    assert raw_gap > 0.5
    assert canonical_gap < 0.1
    for fitted in canonical:
        assert np.linalg.norm(fitted - true_canonical) / np.linalg.norm(true_canonical) < 0.1


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (np.ones(5), ValueError),
        (np.ones((2, 3, 1)), ValueError),
        (np.ones((3, 4)), ValueError),
        (np.ones((4, 0)), ValueError),
        (np.array([[1.0, np.nan], [0.0, 1.0], [1.0, 1.0]]), ValueError),
        (np.array([[1.0, np.inf], [0.0, 1.0], [1.0, 1.0]]), ValueError),
        (np.ones((3, 2), dtype=complex), TypeError),
        (np.array([["a", "b"], ["c", "d"], ["e", "f"]]), TypeError),
    ],
)
def test_bad_input_is_rejected(bad: npt.ArrayLike, error: type[Exception]) -> None:
    with pytest.raises(error, match="loadings"):
        canonical_loadings(bad)
    with pytest.raises(error, match="loadings"):
        canonical_rotation(bad)


def test_integer_and_zero_columns() -> None:
    # Integers are accepted (converted to float64); a zero column (rank-deficient F) stays zero and last.
    loadings = np.array([[2, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(canonical_loadings(loadings), np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    np.testing.assert_array_equal(canonical_loadings(-loadings), np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def test_estimator_components_are_canonical_and_comparable() -> None:
    # OnlineFactorAnalysis.components_ are the canonical loadings, so two random_states agree (bound as in
    # test_two_fits_become_comparable), and transform() is expressed in the same basis: the latents
    # reconstruct the same mean prediction mean_ + components_ᵀ h as the engine's own F and E[h | x].
    from onlinefa import OnlineFactorAnalysis

    x, true_canonical = planted_stream(11, 100_000)  # the default's equal weights: see above
    fits = [OnlineFactorAnalysis(3, n_warmup=50, random_state=seed).fit(x) for seed in (1, 2)]
    gap = np.linalg.norm(fits[0].components_ - fits[1].components_) / np.linalg.norm(fits[1].components_)
    assert gap < 0.1
    assert np.linalg.norm(fits[0].components_.T - true_canonical) / np.linalg.norm(true_canonical) < 0.1
    engine = fits[0]._model
    queries = x[:20]
    np.testing.assert_allclose(
        fits[0].transform(queries) @ fits[0].components_,
        engine.transform(queries) @ engine.loadings.T,
        rtol=0,
        atol=RTOL * float(np.abs(x).max()) * 10,
    )
