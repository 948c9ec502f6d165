"""Tests of onlinefa.datasets: the FA model generator (thesis Algorithm 4) and the sampler (Equation 2.1)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import onlinefa.datasets as datasets
from onlinefa.datasets import make_fa_model, sample_fa

FloatArray = npt.NDArray[np.float64]


def algorithm4_reference(
    n_features: int, n_components: int, low: float, high: float, seed: int
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Thesis Algorithm 4 line by line, drawing from one generator in the order of the pseudo-code.

    The top-K eigenvectors come from SciPy's subset eigensolver (a different LAPACK driver from the
    full ``numpy.linalg.eigh`` the implementation uses). Returns ``(c, V_K, s², ψ)``.
    """
    rng = np.random.default_rng(seed)
    c = rng.standard_normal(n_features)  # line 1
    a = rng.standard_normal((n_features, n_features))  # line 2
    m = a @ a.T  # line 3
    _, v = scipy.linalg.eigh(m, subset_by_index=[n_features - n_components, n_features - 1])  # lines 4-5
    s2 = rng.uniform(low, high, size=n_features)  # line 6
    psi = rng.uniform(0.0, s2.max(), size=n_features)  # lines 9-10
    return c, v, s2, psi


def test_model_shapes_and_dtype() -> None:
    c, loadings, psi = make_fa_model(30, 4, spectrum=(1.0, 100.0), seed=3)
    assert c.shape == (30,) and loadings.shape == (30, 4) and psi.shape == (30,)
    assert c.dtype == loadings.dtype == psi.dtype == np.float64


@pytest.mark.parametrize(("n_features", "n_components", "low", "high"), [(40, 5, 1.0, 10.0), (25, 3, 1.0, 1000.0)])
def test_model_matches_algorithm4_transcription(n_features: int, n_components: int, low: float, high: float) -> None:
    c, loadings, psi = make_fa_model(n_features, n_components, spectrum=(low, high), seed=11)
    ref_c, ref_v, ref_s2, ref_psi = algorithm4_reference(n_features, n_components, low, high, seed=11)
    np.testing.assert_array_equal(c, ref_c)
    np.testing.assert_array_equal(psi, ref_psi)
    # Eigenvectors are defined up to sign: compare F Fᵀ = diag(s) V Vᵀ diag(s), which is sign-free.
    ref_loadings = ref_v * np.sqrt(ref_s2)[:, None]
    np.testing.assert_allclose(loadings @ loadings.T, ref_loadings @ ref_loadings.T, rtol=0, atol=1e-10 * high)
    # Columns are eigenvectors scaled row-wise by s: dividing the rows by s gives orthonormal columns.
    unscaled = loadings / np.sqrt(ref_s2)[:, None]
    np.testing.assert_allclose(unscaled.T @ unscaled, np.eye(n_components), atol=1e-12)


@settings(max_examples=25)
@given(
    n_features=st.integers(1, 12),
    low=st.floats(0.01, 50.0),
    width=st.floats(0.0, 500.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_spectrum_and_psi_ranges(n_features: int, low: float, width: float, seed: int) -> None:
    high = low + width
    # With K = D the eigenvector matrix is orthogonal, so its rows have unit norm and the squared row
    # norms of F are exactly the spectrum s², which must lie in [a, b]; ψ must lie in [0, max s²).
    _, loadings, psi = make_fa_model(n_features, n_features, spectrum=(low, high), seed=seed)
    s2 = np.sum(loadings**2, axis=1)
    tolerance = 1e-12 * high
    assert np.all(s2 >= low - tolerance) and np.all(s2 <= high + tolerance)
    assert np.all(psi >= 0.0) and np.all(psi < s2.max() + tolerance)


def test_model_is_deterministic_in_seed() -> None:
    first = make_fa_model(20, 3, seed=5)
    second = make_fa_model(20, 3, seed=5)
    other = make_fa_model(20, 3, seed=6)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_model_accepts_a_generator_and_advances_it() -> None:
    rng = np.random.default_rng(9)
    from_generator = make_fa_model(15, 2, seed=rng)
    np.testing.assert_array_equal(from_generator[1], make_fa_model(15, 2, seed=9)[1])
    assert not np.array_equal(make_fa_model(15, 2, seed=rng)[0], from_generator[0])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((5, 6), {}, ValueError, "n_components"),
        ((5, 0), {}, ValueError, "n_components"),
        ((0, 1), {}, ValueError, "n_features"),
        ((5.0, 2), {}, TypeError, "n_features"),
        ((5, True), {}, TypeError, "n_components"),
        ((5, 2), {"spectrum": (0.0, 1.0)}, ValueError, "spectrum"),
        ((5, 2), {"spectrum": (2.0, 1.0)}, ValueError, "spectrum"),
        ((5, 2), {"spectrum": (1.0, float("inf"))}, ValueError, "spectrum"),
        ((5, 2), {"spectrum": (1.0,)}, ValueError, "spectrum"),
    ],
)
def test_model_rejects_bad_arguments(args: tuple[object, ...], kwargs: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make_fa_model(*args, **kwargs)  # type: ignore[arg-type]


def test_samples_shape_and_zero_rows() -> None:
    c, loadings, psi = make_fa_model(8, 2, seed=0)
    assert sample_fa(c, loadings, psi, 7, seed=1).shape == (7, 8)
    assert sample_fa(c, loadings, psi, 0, seed=1).shape == (0, 8)


def test_samples_follow_equation_2_1_with_the_documented_stream_layout() -> None:
    c, loadings, psi = make_fa_model(6, 2, seed=0)
    rng = np.random.default_rng(4)
    normals = rng.standard_normal((5, 2 + 6))  # each row: h_t (K numbers) then eps_t (D numbers)
    expected = normals[:, :2] @ loadings.T + c + np.sqrt(psi) * normals[:, 2:]
    np.testing.assert_allclose(sample_fa(c, loadings, psi, 5, seed=4), expected, rtol=1e-14, atol=1e-14)


def test_samples_are_prefix_consistent_across_blocks() -> None:
    # D + K = 1010 numbers a row, so blocks hold 1038 rows and 2500 rows span three blocks. The draws
    # are the same; only the BLAS product F h may round differently for another block shape (a few
    # ulps of the O(10) entries, far below the 1e-12 tolerance, while a shifted draw changes O(1)).
    c, loadings, psi = make_fa_model(1000, 10, seed=2)
    everything = sample_fa(c, loadings, psi, 2500, seed=7)
    np.testing.assert_allclose(sample_fa(c, loadings, psi, 1500, seed=7), everything[:1500], rtol=0, atol=1e-12)
    rng = np.random.default_rng(7)
    pieces = [sample_fa(c, loadings, psi, n, seed=rng) for n in (100, 1100, 1300)]
    np.testing.assert_allclose(np.concatenate(pieces), everything, rtol=0, atol=1e-12)


def test_many_samples_have_the_model_mean_and_covariance() -> None:
    n_samples = 200_000
    c, loadings, psi = make_fa_model(10, 3, spectrum=(1.0, 100.0), seed=21)
    covariance = loadings @ loadings.T + np.diag(psi)
    samples = sample_fa(c, loadings, psi, n_samples, seed=22)

    # Gaussian theory: Var(mean_i) = Σ_ii / n and Var(S_ij) ≈ (Σ_ij² + Σ_ii Σ_jj) / n for the sample
    # covariance S. The 10 + 55 standardised errors are ≈ N(0, 1); a bound of 4.5 is exceeded by any of
    # them with probability < 65 · 6.8e-6 ≈ 5e-4, while a missing noise term or a wrong scale of F
    # (errors of ≳ 1% of Σ, i.e. dozens of standard errors here) would fail it.
    mean_z = (samples.mean(axis=0) - c) / np.sqrt(np.diag(covariance) / n_samples)
    sample_cov = np.cov(samples, rowvar=False)
    sd = np.sqrt((covariance**2 + np.outer(np.diag(covariance), np.diag(covariance))) / n_samples)
    cov_z = ((sample_cov - covariance) / sd)[np.triu_indices(10)]
    assert np.max(np.abs(mean_z)) < 4.5
    assert np.max(np.abs(cov_z)) < 4.5


def test_noise_alone_has_variance_psi() -> None:
    # With F = 0 the rows are c + sqrt(ψ) ⊙ ε: per-coordinate variance ψ. The sample variance of n
    # Gaussian draws has relative s.d. sqrt(2/(n-1)) ≈ 0.0045 for n = 100,000; 5 s.d. is 0.023.
    psi = np.array([0.0, 0.5, 2.0, 9.0])
    samples = sample_fa(np.ones(4), np.zeros((4, 1)), psi, 100_000, seed=3)
    np.testing.assert_array_equal(samples[:, 0], 1.0)
    np.testing.assert_allclose(samples[:, 1:].var(axis=0, ddof=1), psi[1:], rtol=0.023)


@pytest.mark.parametrize(
    ("c", "loadings", "psi", "n", "error", "message"),
    [
        (np.zeros(3), np.zeros((3, 1)), -np.ones(3), 2, ValueError, "psi"),
        (np.zeros(4), np.zeros((3, 1)), np.ones(3), 2, ValueError, "c must have shape"),
        (np.zeros(3), np.zeros((3, 1)), np.ones(2), 2, ValueError, "psi must have shape"),
        (np.zeros(3), np.zeros(3), np.ones(3), 2, ValueError, "F must be"),
        (np.full(3, np.nan), np.zeros((3, 1)), np.ones(3), 2, ValueError, "finite"),
        (np.zeros(3), np.zeros((3, 1)), np.ones(3), -1, ValueError, "n_samples"),
        (np.zeros(3), np.zeros((3, 1)), np.ones(3), 2.5, TypeError, "n_samples"),
    ],
)
def test_sampler_rejects_bad_arguments(
    c: FloatArray, loadings: FloatArray, psi: FloatArray, n: object, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        sample_fa(c, loadings, psi, n, seed=0)  # type: ignore[arg-type]


def test_module_exports() -> None:
    assert set(datasets.__all__) == {"make_fa_model", "sample_fa", "load_uci"}
    assert callable(datasets.load_uci)
