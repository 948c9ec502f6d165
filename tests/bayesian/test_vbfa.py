"""Tests of VB-FA (onlinefa.VBFA / OnlineVBFA) against independent references.

References: a NumPy transcription of Luttinen & Ilin §2.1's update rules and of the README's full
bound (written from the formulas, entry by entry, not from the Rust column statistics), SciPy's Gaussian
density, scikit-learn's maximum-likelihood FactorAnalysis, and the paper's requirements (10)–(17) on a
transformed solution.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.special import digamma, gammaln
from scipy.stats import multivariate_normal

import onlinefa
from onlinefa.vbfa import VBFAPosterior

FloatArray = NDArray[np.float64]

#: The hyper-parameters a_α = b_α = a_τ = b_τ = β and the broad prior's α (the library's defaults).
HYPER = 1e-5
COORDINATE_STEPS = ("latents", "bias", "loadings", "noise", "ard")


# ----------------------------------------------------------------------------- NumPy reference


def factor_data(n: int, d: int, k_true: int, seed: int, missing: float) -> FloatArray:
    """n×d data from k_true factors with heterogeneous noise; entries NaN with probability ``missing``."""
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((d, k_true)) * rng.uniform(0.5, 2.0, k_true)
    x = rng.standard_normal((n, k_true)) @ loadings.T + rng.standard_normal((n, d)) * rng.uniform(0.3, 1.0, d)
    x += rng.standard_normal(d)
    x[rng.random((n, d)) < missing] = np.nan
    return x


def second_moments(mean: FloatArray, cov: FloatArray) -> FloatArray:
    """⟨z zᵀ⟩ = z̄ z̄ᵀ + Σ for stacked rows (n×K, n×K×K)."""
    return cov + mean[:, :, None] * mean[:, None, :]


def alpha_moments(post: VBFAPosterior) -> tuple[FloatArray, FloatArray]:
    """(⟨α_k⟩, ⟨ln α_k⟩); the broad prior has α = HYPER."""
    if post.ard_shape is None or post.ard_rate is None:
        k = post.alpha_mean.shape[0]
        return np.full(k, HYPER), np.full(k, math.log(HYPER))
    return post.ard_shape / post.ard_rate, digamma(post.ard_shape) - np.log(post.ard_rate)


def gamma_bound(shape: FloatArray, rate: FloatArray) -> float:
    """Σ [E_q ln G(x | a₀, b₀) + H[q]] for q = G(shape, rate) and the prior a₀ = b₀ = HYPER (README)."""
    a0 = b0 = HYPER
    mean_log = digamma(shape) - np.log(rate)
    prior = a0 * math.log(b0) - gammaln(a0) + (a0 - 1) * mean_log - b0 * shape / rate
    entropy = shape - np.log(rate) + gammaln(shape) + (1 - shape) * digamma(shape)
    return float(np.sum(prior + entropy))


def reference_bound(x: FloatArray, post: VBFAPosterior) -> float:
    """The full VB-FA bound of the README, term by term, from every observed entry."""
    observed = ~np.isnan(x)
    n, d = x.shape
    k = post.loading_mean.shape[1]
    hh = second_moments(post.latent_mean, post.latent_covariance)
    ff = second_moments(post.loading_mean, post.loading_covariance)
    residual = np.where(observed, x - post.bias_mean, 0.0)
    cross = post.latent_mean @ post.loading_mean.T
    e = residual**2 + post.bias_variance - 2 * residual * cross + np.einsum("nij,dji->nd", hh, ff)
    tau_mean = post.noise_shape / post.noise_rate
    tau_log = digamma(post.noise_shape) - np.log(post.noise_rate)
    likelihood = np.sum(np.where(observed, -0.5 * math.log(2 * math.pi) + 0.5 * tau_log - 0.5 * tau_mean * e, 0.0))
    _, h_logdet = np.linalg.slogdet(post.latent_covariance)
    latents = -0.5 * np.sum(np.trace(post.latent_covariance, axis1=1, axis2=2)
                            + np.sum(post.latent_mean**2, axis=1) - k - h_logdet)
    bias = -0.5 * np.sum(HYPER * (post.bias_mean**2 + post.bias_variance) - 1 - np.log(HYPER * post.bias_variance))
    alpha_mean, alpha_log = alpha_moments(post)
    _, f_logdet = np.linalg.slogdet(post.loading_covariance)
    f_sq = post.loading_mean**2 + np.diagonal(post.loading_covariance, axis1=1, axis2=2)
    loadings = np.sum(0.5 * alpha_log.sum() - 0.5 * f_sq @ alpha_mean + 0.5 * f_logdet + 0.5 * k)
    ard = 0.0 if post.ard_shape is None or post.ard_rate is None else gamma_bound(post.ard_shape, post.ard_rate)
    noise = gamma_bound(post.noise_shape, post.noise_rate)
    return float(likelihood + latents + bias + loadings + ard + noise)


def reference_update(x: FloatArray, post: VBFAPosterior, step: str) -> dict[str, FloatArray]:
    """One coordinate update written from Luttinen & Ilin §2.1 with loops over the observed sets."""
    observed = ~np.isnan(x)
    n, d = x.shape
    k = post.loading_mean.shape[1]
    tau = post.noise_shape / post.noise_rate
    hh = second_moments(post.latent_mean, post.latent_covariance)
    ff = second_moments(post.loading_mean, post.loading_covariance)
    h, f, c = post.latent_mean, post.loading_mean, post.bias_mean
    if step == "latents":
        means, covs = np.empty((n, k)), np.empty((n, k, k))
        for i in range(n):
            cols = np.flatnonzero(observed[i])
            precision = np.eye(k) + np.einsum("d,dij->ij", tau[cols], ff[cols])
            covs[i] = np.linalg.inv(precision)
            means[i] = covs[i] @ (f[cols].T @ (tau[cols] * (x[i, cols] - c[cols])))
        return {"latent_mean": means, "latent_covariance": covs}
    if step == "bias":
        counts = observed.sum(axis=0)
        variance = 1 / (HYPER + counts * tau)
        sums = np.array([np.sum(x[observed[:, j], j] - h[observed[:, j]] @ f[j]) for j in range(d)])
        return {"bias_mean": variance * tau * sums, "bias_variance": variance}
    if step == "loadings":
        alpha_mean, _ = alpha_moments(post)
        means, covs = np.empty((d, k)), np.empty((d, k, k))
        for j in range(d):
            rows = np.flatnonzero(observed[:, j])
            covs[j] = np.linalg.inv(np.diag(alpha_mean) + tau[j] * hh[rows].sum(axis=0))
            means[j] = covs[j] @ (tau[j] * h[rows].T @ (x[rows, j] - c[j]))
        return {"loading_mean": means, "loading_covariance": covs}
    if step == "noise":
        residual = np.where(observed, x - c, 0.0)
        e = residual**2 + post.bias_variance - 2 * residual * (h @ f.T) + np.einsum("nij,dji->nd", hh, ff)
        return {"noise_shape": HYPER + 0.5 * observed.sum(axis=0),
                "noise_rate": HYPER + 0.5 * np.sum(np.where(observed, e, 0.0), axis=0)}
    if step == "ard":
        w = np.sum(f**2 + np.diagonal(post.loading_covariance, axis1=1, axis2=2), axis=0)
        return {"ard_shape": np.full(k, HYPER + 0.5 * d), "ard_rate": HYPER + 0.5 * w}
    raise ValueError(step)


def loading_gram(post: VBFAPosterior) -> FloatArray:
    """⟨FᵀF⟩ (K×K)."""
    return post.loading_mean.T @ post.loading_mean + post.loading_covariance.sum(axis=0)


def latent_gram(post: VBFAPosterior) -> FloatArray:
    """Σ_n ⟨h_n h_nᵀ⟩ (K×K)."""
    return second_moments(post.latent_mean, post.latent_covariance).sum(axis=0)


def relative_frobenius(a: FloatArray, b: FloatArray) -> float:
    """‖a − b‖_F / ‖b‖_F."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ------------------------------------------------------------------------------- the bound


@pytest.mark.parametrize("prior", ["ard", "broad"])
def test_bound_matches_the_reference_formula(prior: Any) -> None:
    x = factor_data(40, 8, 2, seed=1, missing=0.2)
    model = onlinefa.VBFA(3, prior=prior, random_state=2).initialize(x)
    for _ in range(4):
        expected = reference_bound(x, model.posterior())
        assert model.lower_bound() == pytest.approx(expected, rel=1e-11)
        assert sum(model.bound_terms().values()) == pytest.approx(expected, rel=1e-11)
        for step in (*COORDINATE_STEPS, "translate", "rotate"):
            model.apply(step)  # type: ignore[arg-type]


@pytest.mark.parametrize("step", COORDINATE_STEPS)
def test_each_update_matches_the_papers_formula(step: str) -> None:
    x = factor_data(30, 7, 2, seed=3, missing=0.25)
    model = onlinefa.VBFA(3, random_state=4).initialize(x)
    for _ in range(2):
        for s in (*COORDINATE_STEPS, "translate", "rotate"):
            model.apply(s)  # type: ignore[arg-type]
    before = model.posterior()
    expected = reference_update(x, before, step)
    after = model.posterior()
    model.apply(step)  # type: ignore[arg-type]
    after = model.posterior()
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(after, name), value, rtol=1e-9, atol=1e-12, err_msg=name)


# ------------------------------------------------------------------------- transformations


def test_transformation_centres_whitens_and_orders() -> None:
    """After translate + rotate: (14) mean latent mean 0, (15)/(10) (1/N)⟨HHᵀ⟩ = I, (16)–(17) ⟨FᵀF⟩ diagonal, decreasing.

    With a_α = b_α = 1e-5 > 0 the optimal rotation's whitening carries a hyper-parameter correction:
    (1/N)⟨HHᵀ⟩ is diagonal with entries 1 + [2a − (2a + D)·2b/(2b + w_k)]/N, w_k = ⟨FᵀF⟩_kk (exact
    stationarity condition; → 1 as a, b → 0). It is at most ~1e-8 away from 1 for active components and
    ~D/N·(2b/w_k) for nearly pruned ones, so the identity is checked against that closed form.
    """
    x = factor_data(120, 15, 3, seed=7, missing=0.2)
    model = onlinefa.VBFA(6, random_state=8).initialize(x)
    for _ in range(6):
        for step in COORDINATE_STEPS:
            model.apply(step)  # type: ignore[arg-type]
    model.apply("translate").apply("rotate")
    post = model.posterior()
    n, d = x.shape
    np.testing.assert_allclose(post.latent_mean.mean(axis=0), 0.0, atol=1e-12)
    w = loading_gram(post)
    w_diag = np.diag(w)
    assert np.all(np.abs(w - np.diag(w_diag)) <= 1e-9 * w_diag.max())
    assert np.all(np.diff(w_diag) <= 0)
    whitened = latent_gram(post) / n
    expected = 1 + (2 * HYPER - (2 * HYPER + d) * 2 * HYPER / (2 * HYPER + w_diag)) / n
    np.testing.assert_allclose(whitened, np.diag(expected), atol=1e-9)
    strong = w_diag >= d  # loading energy ≥ 1 per dimension: the correction is ≤ 2b(2a + D)/(N D) < 2e-7
    assert strong.sum() >= 2
    np.testing.assert_allclose(np.diag(whitened)[strong], 1.0, atol=2e-7)


def test_broad_prior_rotation_whitens_with_n_minus_d() -> None:
    """Paper §5: with a fixed broad prior the optimal rotation gives (1/(N − D))⟨HHᵀ⟩ = I (α → 0).

    Exactly, ⟨HHᵀ⟩_kk = N − D + α w_k (α = 1e-5 here).
    """
    x = factor_data(150, 10, 3, seed=9, missing=0.1)
    model = onlinefa.VBFA(4, prior="broad", random_state=10).initialize(x)
    for step in (*COORDINATE_STEPS, *COORDINATE_STEPS, "rotate"):
        model.apply(step)  # type: ignore[arg-type]
    post = model.posterior()
    w_diag = np.diag(loading_gram(post))
    np.testing.assert_allclose(latent_gram(post), np.diag(150 - 10 + HYPER * w_diag), rtol=1e-9, atol=1e-8)


# ------------------------------------------------------------------------------------ online


@pytest.fixture(scope="module")
def five_factor_stream() -> FloatArray:
    """N = 5000, D = 50, 5 true factors (a stream large enough for online VB-FA to converge)."""
    return factor_data(5000, 50, 5, seed=11, missing=0.0)


@pytest.fixture(scope="module")
def batch_on_stream(five_factor_stream: FloatArray) -> onlinefa.VBFA:
    """Batch VB-FA with K = 10 on the whole stream."""
    return onlinefa.VBFA(10, tol=1e-8, max_iter=2000, random_state=12).fit(five_factor_stream)


def test_online_one_pass_matches_batch(five_factor_stream: FloatArray, batch_on_stream: onlinefa.VBFA) -> None:
    """One pass, mini-batches of 50, ρ_t = 1/t, with the rotation: relative covariance difference < 0.01.

    (Measured 0.002–0.004 over seeds; without the transformations the same pass is off by 0.9–3.4.)
    """
    online = onlinefa.OnlineVBFA(10, schedule="harmonic", batch_size=50, random_state=13)
    for start in range(0, 5000, 50):
        online.partial_fit(five_factor_stream[start : start + 50])
    assert online.n_samples_seen_ == 5000 and online.n_batches_seen_ == 100
    assert relative_frobenius(online.get_covariance(), batch_on_stream.get_covariance()) < 0.01
    without = onlinefa.OnlineVBFA(10, transformations=False, random_state=13).fit(five_factor_stream)
    assert relative_frobenius(without.get_covariance(), batch_on_stream.get_covariance()) > 0.1


def test_online_state_is_whitened_after_each_transformation(five_factor_stream: FloatArray) -> None:
    online = onlinefa.OnlineVBFA(6, random_state=14).fit(five_factor_stream[:1000])
    second, mean = online.latent_moments()
    np.testing.assert_allclose(mean, 0.0, atol=1e-12)
    w = online.loading_gram()
    assert np.all(np.abs(w - np.diag(np.diag(w))) <= 1e-9 * np.diag(w).max())
    assert np.all(np.diff(np.diag(w)) <= 0)
    active = np.diag(w) > 1e-3 * np.diag(w).max()
    np.testing.assert_allclose(np.diag(second)[active], 1.0, atol=1e-6)
    np.testing.assert_allclose(second - np.diag(np.diag(second)), 0.0, atol=1e-10)


def test_batch_matches_maximum_likelihood_fa_on_a_large_sample(
    five_factor_stream: FloatArray, batch_on_stream: onlinefa.VBFA
) -> None:
    """With N = 5000 ≫ D the posterior means approach the ML solution (scikit-learn FactorAnalysis).

    Both estimate the same covariance; their difference is O(1/N) shrinkage plus optimisation tolerance
    (measured ≈ 1e-3), far below the sampling error of either (≈ 0.03 relative to the truth).
    """
    from sklearn.decomposition import FactorAnalysis
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # a multi-threaded BLAS only oversubscribes the 2 shared cores here
        ml = FactorAnalysis(n_components=5, tol=1e-4, svd_method="lapack").fit(five_factor_stream)
    assert relative_frobenius(batch_on_stream.get_covariance(), ml.get_covariance()) < 0.01
    np.testing.assert_allclose(batch_on_stream.mean_, ml.mean_, atol=0.02)
    assert int(np.sum(batch_on_stream.alpha_ < 100)) == 5  # ARD keeps exactly the 5 true factors


# -------------------------------------------------------------------------------- estimator


def test_score_samples_is_the_observed_marginal_density() -> None:
    x = factor_data(60, 6, 2, seed=15, missing=0.3)
    model = onlinefa.VBFA(2, random_state=16, max_iter=200).fit(x)
    got = model.score_samples(x)
    f = model.components_.T
    cov = f @ f.T + np.diag(model.noise_variance_)
    for i, row in enumerate(x):
        seen = ~np.isnan(row)
        expected = multivariate_normal(model.mean_[seen], cov[np.ix_(seen, seen)]).logpdf(row[seen]) if seen.any() else 0.0
        assert got[i] == pytest.approx(expected, rel=1e-10)
    np.testing.assert_allclose(model.get_covariance(), cov)
    assert model.score(x) == pytest.approx(float(np.mean(got)))


def test_transform_is_the_latent_update() -> None:
    x = factor_data(50, 6, 2, seed=17, missing=0.2)
    model = onlinefa.VBFA(3, random_state=18, max_iter=50).fit(x)
    model.apply("latents")
    np.testing.assert_allclose(model.transform(x), model.posterior().latent_mean, rtol=1e-12, atol=1e-12)


def test_fitted_attributes_and_history() -> None:
    x = factor_data(80, 9, 2, seed=19, missing=0.1)
    model = onlinefa.VBFA(4, random_state=20, max_iter=300, tol=1e-7).fit(x)
    assert model.components_.shape == (4, 9) and model.mean_.shape == (9,)
    assert model.noise_variance_.shape == (9,) and model.alpha_.shape == (4,)
    assert model.elbo_.shape == model.fit_time_.shape == (model.n_iter_,)
    assert model.converged_ and model.n_iter_ < 300
    assert np.all(np.diff(model.fit_time_) >= 0)
    assert abs(model.elbo_[-1] - model.elbo_[-2]) <= 1e-7 * abs(model.elbo_[-1])
    post = model.posterior()
    np.testing.assert_allclose(model.noise_variance_, post.noise_rate / post.noise_shape)
    again = onlinefa.VBFA(4, random_state=20, max_iter=300, tol=1e-7).fit(x)
    np.testing.assert_array_equal(again.elbo_, model.elbo_)  # deterministic for a seed


def test_bad_input_gives_clear_errors() -> None:
    x = factor_data(20, 5, 1, seed=21, missing=0.0)
    # Hyper-parameters are checked by fit (scikit-learn's convention: the constructor only stores them).
    with pytest.raises(ValueError, match="prior"):
        onlinefa.VBFA(2, prior="flat").fit(x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_components"):
        onlinefa.VBFA(0).fit(x)
    with pytest.raises(ValueError, match="transformations_start"):
        onlinefa.VBFA(2, transformations_start=0).fit(x)
    with pytest.raises(ValueError, match="tol"):
        onlinefa.VBFA(2, tol=-1.0).fit(x)
    with pytest.raises(TypeError, match="transformations"):
        onlinefa.VBFA(2, transformations="yes").fit(x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not fitted"):
        onlinefa.VBFA(2).transform(x)
    with pytest.raises(ValueError, match="step"):
        onlinefa.VBFA(2).initialize(x).apply("everything")  # type: ignore[arg-type]
    bad = x.copy()
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="row 3"):
        onlinefa.VBFA(2).fit(bad)
    empty_column = x.copy()
    empty_column[:, 2] = np.nan
    with pytest.raises(ValueError, match="column 2"):
        onlinefa.VBFA(2).fit(empty_column)
    with pytest.raises(TypeError):
        onlinefa.VBFA(2).fit(np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="X has 3 features, but VBFA is expecting 5"):
        onlinefa.VBFA(2, max_iter=5).fit(x).transform(x[:, :3])
    online = onlinefa.OnlineVBFA(2)
    with pytest.raises(ValueError, match="not fitted"):
        online.transform(x)
    missing = x.copy()
    missing[4, 0] = np.nan
    with pytest.raises(ValueError, match="row 4"):
        online.partial_fit(missing)
    with pytest.raises(ValueError, match="kappa"):
        onlinefa.OnlineVBFA(2, schedule="power", kappa=0.3).partial_fit(x)
    with pytest.raises(ValueError, match="schedule"):
        onlinefa.OnlineVBFA(2, schedule="sometimes").fit(x)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [onlinefa.VBFA, onlinefa.OnlineVBFA])
def test_params_follow_scikit_learn_conventions(cls: Any) -> None:
    from sklearn.base import clone

    model = cls(4, prior="broad", transformations=False, random_state=3)
    params = model.get_params()
    assert params["transformations"] is False and params["prior"] == "broad" and params["n_components"] == 4
    twin = clone(model)
    assert twin is not model and twin.get_params() == params
    assert model.set_params(transformations=True, n_components=5) is model
    assert model.transformations is True and model.n_components == 5
    with pytest.raises(ValueError, match="Invalid parameter"):
        model.set_params(n_component=3)
