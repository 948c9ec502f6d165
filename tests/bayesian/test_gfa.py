"""Group factor analysis (onlinefa.GFA) against independent references: a NumPy transcription of the
coordinate updates and of the lower bound, VB-FA with one group, the probabilistic-PCA closed form, the
Gaussian conditional for predictions, and synthetic data with a known group × factor pattern."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy.special import digamma, gammaln

import onlinefa
from onlinefa import _core
from onlinefa.gfa import resolve_groups

FloatArray = npt.NDArray[np.float64]
HYPER = 1e-5


def synthetic(
    seed: int, n: int = 300, sizes: tuple[int, ...] = (10, 15, 20), missing: float = 0.0
) -> tuple[FloatArray, npt.NDArray[np.int64], FloatArray, FloatArray]:
    """Data from 4 factors with a known group × factor activity pattern and per-group noise precisions."""
    rng = np.random.default_rng(seed)
    pattern = np.array([[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=float)[: len(sizes)]
    taus = np.array([4.0, 1.0, 9.0])[: len(sizes)]
    z = rng.standard_normal((n, 4))
    blocks = []
    for m, d in enumerate(sizes):
        w = rng.standard_normal((4, d)) * pattern[m][:, None]
        blocks.append(z @ w + 0.5 + rng.standard_normal((n, d)) / np.sqrt(taus[m]))
    x = np.hstack(blocks)
    if missing:
        x[rng.random(x.shape) < missing] = np.nan
    return x, np.repeat(np.arange(len(sizes)), sizes), pattern, taus


def engine(x: FloatArray, labels: Any, k: int, **kw: Any) -> _core.GFACore:
    args: dict[str, Any] = dict(
        noise="group", rotate=False, rotate_start=1, drop_factors=False, drop_tol=1e-3, init_noise_ratio=1e-2, seed=3
    )
    args.update(kw)
    return _core.GFACore(np.ascontiguousarray(x), [int(v) for v in labels], k, **args)


def state(e: _core.GFACore) -> dict[str, FloatArray]:
    a_shape, a_rate = e.ard()
    t_shape, t_rate = e.noise()
    return dict(
        h=e.latent_mean(), hc=e.latent_cov(), c=e.bias_mean(), cv=e.bias_var(), f=e.loading_mean(),
        fc=e.loading_cov(), a_shape=a_shape, a_rate=a_rate, t_shape=t_shape, t_rate=t_rate,
    )  # fmt: skip


def tau_index(labels: npt.NDArray[np.int64], noise: str) -> npt.NDArray[np.int64]:
    return labels if noise == "group" else np.arange(labels.size)


def sq_errors(x: FloatArray, s: dict[str, FloatArray]) -> FloatArray:
    """E_d = Σ_{n∈O_d} ⟨(x_nd − f_dᵀh_n − c_d)²⟩, entry by entry (no shared statistics)."""
    obs = ~np.isnan(x)
    xz = np.where(obs, x, 0.0)
    hh = s["h"][:, :, None] * s["h"][:, None, :] + s["hc"]  # N×K×K
    ff = s["f"][:, :, None] * s["f"][:, None, :] + s["fc"]  # D×K×K
    pred = s["h"] @ s["f"].T
    e = (xz - s["c"]) ** 2 + s["cv"] - 2 * (xz - s["c"]) * pred + np.einsum("nab,dab->nd", hh, ff)
    return (e * obs).sum(axis=0)


def gamma_kl_terms(shape: FloatArray, rate: FloatArray) -> float:
    """Σ E_q ln G(x | a₀, b₀) + H[q] for Gamma factors with prior a₀ = b₀ = 1e-5."""
    a0 = b0 = HYPER
    mean_log = digamma(shape) - np.log(rate)
    prior = a0 * np.log(b0) - gammaln(a0) + (a0 - 1) * mean_log - b0 * shape / rate
    entropy = shape - np.log(rate) + gammaln(shape) + (1 - shape) * digamma(shape)
    return float((prior + entropy).sum())


def reference_bound(x: FloatArray, labels: npt.NDArray[np.int64], noise: str, s: dict[str, FloatArray]) -> float:
    """The GFA lower bound, term by term from the posterior factors (docs/design/gfa.md)."""
    obs = ~np.isnan(x)
    ti = tau_index(labels, noise)
    t_mean, t_log = s["t_shape"] / s["t_rate"], digamma(s["t_shape"]) - np.log(s["t_rate"])
    e = sq_errors(x, s)
    lik = float((obs.sum(0) * (-0.5 * np.log(2 * np.pi) + 0.5 * t_log[ti]) - 0.5 * t_mean[ti] * e).sum())
    k = s["h"].shape[1]
    logdet_h = np.linalg.slogdet(s["hc"])[1]
    lat = -0.5 * float((s["h"] ** 2).sum() + np.trace(s["hc"], axis1=1, axis2=2).sum() - s["h"].shape[0] * k - logdet_h.sum())
    bias = -0.5 * float((HYPER * (s["c"] ** 2 + s["cv"]) - 1 - np.log(HYPER * s["cv"])).sum())
    a_mean, a_log = s["a_shape"] / s["a_rate"], digamma(s["a_shape"]) - np.log(s["a_rate"])
    fsq = s["f"] ** 2 + np.diagonal(s["fc"], axis1=1, axis2=2)
    load = float(
        (0.5 * a_log[labels].sum(1) - 0.5 * (a_mean[labels] * fsq).sum(1) + 0.5 * np.linalg.slogdet(s["fc"])[1] + 0.5 * k).sum()
    )
    return lik + lat + bias + load + gamma_kl_terms(s["a_shape"], s["a_rate"]) + gamma_kl_terms(s["t_shape"], s["t_rate"])


def reference_update(x: FloatArray, labels: npt.NDArray[np.int64], noise: str, s: dict[str, FloatArray], step: str) -> dict[str, FloatArray]:
    """The closed-form maximiser of the bound over one factor, transcribed from the GFA notes (with the
    errata: a sum over groups in q(h_n), ½ in the rate of q(τ))."""
    obs = ~np.isnan(x)
    xz = np.where(obs, x, 0.0)
    ti = tau_index(labels, noise)
    tau = (s["t_shape"] / s["t_rate"])[ti]
    alpha = s["a_shape"] / s["a_rate"]
    k = s["h"].shape[1]
    if step == "latents":
        ff = s["f"][:, :, None] * s["f"][:, None, :] + s["fc"]
        means, covs = [], []
        for i in range(x.shape[0]):
            o = obs[i]
            prec = np.eye(k) + np.einsum("d,dab->ab", tau[o], ff[o])
            cov = np.linalg.inv(prec)
            means.append(cov @ (s["f"][o].T @ (tau[o] * (xz[i, o] - s["c"][o]))))
            covs.append(cov)
        return dict(h=np.array(means), hc=np.array(covs))
    hh = s["h"][:, :, None] * s["h"][:, None, :] + s["hc"]
    if step == "loadings":
        means, covs = [], []
        for d in range(x.shape[1]):
            o = obs[:, d]
            prec = np.diag(alpha[labels[d]]) + tau[d] * hh[o].sum(0)
            cov = np.linalg.inv(prec)
            means.append(cov @ (tau[d] * (s["h"][o].T @ (xz[o, d] - s["c"][d]))))
            covs.append(cov)
        return dict(f=np.array(means), fc=np.array(covs))
    if step == "noise":
        e = sq_errors(x, s)
        n_tau = ti.max() + 1
        shape = HYPER + 0.5 * np.bincount(ti, obs.sum(0), n_tau)
        rate = HYPER + 0.5 * np.bincount(ti, e, n_tau)
        return dict(t_shape=shape, t_rate=rate)
    if step == "ard":
        fsq = s["f"] ** 2 + np.diagonal(s["fc"], axis1=1, axis2=2)
        m = labels.max() + 1
        shape = HYPER + 0.5 * np.bincount(labels, minlength=m)[:, None] * np.ones(k)
        rate = HYPER + 0.5 * np.array([fsq[labels == g].sum(0) for g in range(m)])
        return dict(a_shape=shape, a_rate=rate)
    raise AssertionError(step)


@pytest.mark.parametrize(("noise", "missing"), [("group", 0.0), ("group", 0.15), ("feature", 0.15)])
def test_bound_and_every_update_match_the_numpy_transcription(noise: str, missing: float) -> None:
    x, labels, _, _ = synthetic(1, n=60, sizes=(4, 6, 5), missing=missing)
    e = engine(x, labels, 5, noise=noise)
    for _ in range(3):
        e.sweep()
    for step in ["latents", "loadings", "noise", "ard"]:
        before = state(e)
        assert e.elbo() == pytest.approx(reference_bound(x, labels, noise, before), rel=1e-10)
        expected = reference_update(x, labels, noise, before, step)
        e.apply(step)
        after = state(e)
        for name, value in expected.items():
            np.testing.assert_allclose(after[name], value, rtol=1e-8, atol=1e-10, err_msg=f"{step}: {name}")


@pytest.mark.parametrize("noise", ["group", "feature"])
def test_bound_is_monotone_under_every_update_and_transformation(noise: str) -> None:
    x, labels, _, _ = synthetic(2, n=80, sizes=(5, 7, 6), missing=0.1)
    e = engine(x, labels, 6, noise=noise)
    last = e.elbo()
    for _ in range(10):
        for step in ["latents", "bias", "loadings", "noise", "ard", "translate", "rotate"]:
            e.apply(step)
            now = e.elbo()
            assert now >= last - 1e-10 * abs(last), (step, last, now)
            last = now


def test_one_group_with_per_feature_noise_is_vbfa() -> None:
    x, _, _, _ = synthetic(3, n=50, missing=0.1)
    gfa = onlinefa.GFA(4, 1, noise="feature", rotate=False, drop_factors=False, max_iter=30, tol=0.0, random_state=7).fit(x)
    vbfa = onlinefa.VBFA(4, transformations=False, max_iter=30, tol=0.0, random_state=7).fit(x)
    np.testing.assert_allclose(gfa.elbo_, vbfa.elbo_, rtol=1e-10)
    np.testing.assert_allclose(gfa.components_, vbfa.components_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(gfa.noise_variance_, vbfa.noise_variance_, rtol=1e-8)
    np.testing.assert_allclose(gfa.transform(x[:5]), vbfa.transform(x[:5]), rtol=1e-7, atol=1e-9)


def test_one_isotropic_group_approaches_the_ppca_closed_form() -> None:
    # Tipping & Bishop: σ² = mean of the D − K smallest eigenvalues of the sample covariance, F Fᵀ =
    # U_K (Λ_K − σ² I) U_Kᵀ. VB with broad priors differs from this maximum-likelihood solution by O(K/N)
    # relative terms (posterior variances of F, the ARD shrinkage): with N = 4000, K = 2, ~0.1%.
    rng = np.random.default_rng(4)
    n, d, k = 4000, 12, 2
    x = rng.standard_normal((n, k)) @ (rng.standard_normal((k, d)) * 2) + 0.7 * rng.standard_normal((n, d)) + 3
    g = onlinefa.GFA(k, 1, drop_factors=False, tol=1e-10, max_iter=2000, random_state=0).fit(x)
    evals, evecs = np.linalg.eigh(np.cov(x.T, bias=True))
    sigma2 = evals[:-k].mean()
    assert g.noise_variance_ == pytest.approx(np.full(d, sigma2), rel=2e-3)
    ml = evecs[:, -k:] @ np.diag(evals[-k:] - sigma2) @ evecs[:, -k:].T
    low_rank = g.components_.T @ g.components_
    assert np.linalg.norm(low_rank - ml) / np.linalg.norm(ml) < 5e-3
    np.testing.assert_allclose(g.mean_, x.mean(0), atol=1e-3 * np.abs(x).max())


def pattern_matches(activity: FloatArray, pattern: FloatArray, threshold: float = 0.02) -> bool:
    """Whether the active cells (share > threshold) equal the true pattern up to a column permutation."""
    found = activity > threshold
    return any(np.array_equal(found[:, list(p)], pattern.astype(bool)) for p in itertools.permutations(range(pattern.shape[1])))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_pattern_factor_count_and_noise_are_recovered(seed: int) -> None:
    x, labels, pattern, taus = synthetic(seed)
    g = onlinefa.GFA(8, labels, max_iter=2000, tol=1e-8, random_state=seed).fit(x)
    assert g.n_components_ == 4
    assert pattern_matches(g.activity_, pattern), np.round(g.activity_, 3)
    # E[τ_m] within 5%: each group has N·D_m ≥ 3000 residuals, so the sampling error of τ_m is ~2.5%.
    np.testing.assert_allclose(g.noise_precision_, taus, rtol=0.05)
    assert np.all(np.diff(g.elbo_)[np.diff(g.n_components_history_) == 0] >= -1e-9 * abs(g.elbo_[-1]))


def test_rotation_cuts_the_sweeps_to_convergence() -> None:
    x, labels, _, _ = synthetic(0)
    fast = onlinefa.GFA(8, labels, max_iter=5000, tol=1e-6, random_state=0).fit(x)
    slow = onlinefa.GFA(8, labels, rotate=False, max_iter=5000, tol=1e-6, random_state=0).fit(x)
    assert fast.converged_ and slow.converged_
    assert 5 * fast.n_iter_ <= slow.n_iter_, (fast.n_iter_, slow.n_iter_)
    assert fast.elbo_[-1] >= slow.elbo_[-1] - 1e-4 * abs(slow.elbo_[-1])


def test_predict_group_is_the_posterior_predictive() -> None:
    x, labels, _, _ = synthetic(5, n=400)
    train, test = x[:300], x[300:]
    g = onlinefa.GFA(6, labels, random_state=0).fit(train)
    mean, var = g.predict_group(test, 1, return_var=True)
    # Transcription: q(h) from groups 0 and 2 only, then the predictive moments.
    e = g._core
    assert e is not None
    f, fc, c, cv = e.loading_mean(), e.loading_cov(), e.bias_mean(), e.bias_var()
    psi = g.noise_variance_
    obs, tgt = labels != 1, labels == 1
    ff = f[:, :, None] * f[:, None, :] + fc
    prec = np.eye(f.shape[1]) + np.einsum("d,dab->ab", 1 / psi[obs], ff[obs])
    cov = np.linalg.inv(prec)
    h = (test[:, obs] - c[obs]) / psi[obs] @ f[obs] @ cov
    np.testing.assert_allclose(mean, c[tgt] + h @ f[tgt].T, rtol=1e-8, atol=1e-10)
    hh = h[:, :, None] * h[:, None, :] + cov
    ref_var = cv[tgt] + np.einsum("da,ab,db->d", f[tgt], cov, f[tgt]) + np.einsum("dab,nab->nd", fc[tgt], hh) + psi[tgt]
    np.testing.assert_allclose(var, ref_var, rtol=1e-8)
    # The reduced input (only the other groups' columns) gives the same answer.
    np.testing.assert_allclose(g.predict_group(test[:, obs], 1), mean, rtol=1e-12)
    # Calibration on held-out rows: standardised squared errors average ~1 (1500 values; ±10%).
    assert np.mean((test[:, tgt] - mean) ** 2 / var) == pytest.approx(1.0, abs=0.1)


def test_observed_mask_equals_nan() -> None:
    x, labels, _, _ = synthetic(6, n=60)
    mask = np.random.default_rng(0).random(x.shape) > 0.2
    a = onlinefa.GFA(4, labels, max_iter=50, random_state=1).fit(x, observed=mask)
    b = onlinefa.GFA(4, labels, max_iter=50, random_state=1).fit(np.where(mask, x, np.nan))
    np.testing.assert_array_equal(a.elbo_, b.elbo_)


def test_groups_specifications() -> None:
    idx, lab = resolve_groups([2, 3], 5)
    assert idx.tolist() == [0, 0, 1, 1, 1] and lab == [0, 1]
    idx, lab = resolve_groups(["b", "a", "b"], 3)
    assert idx.tolist() == [1, 0, 1] and lab == ["a", "b"]
    idx, _ = resolve_groups(2, 5)
    assert idx.tolist() == [0, 0, 0, 1, 1]


@pytest.mark.parametrize(
    ("groups", "message"),
    [([3, 4], "do not cover"), ([2, 0, 4], "group 1 is empty"), (["a", "b", "b"], "has 3 labels"), (7, "between 1 and")],
)
def test_bad_groups_are_rejected_and_the_previous_fit_kept(groups: Any, message: str) -> None:
    x, labels, _, _ = synthetic(7, n=40, sizes=(2, 4))
    g = onlinefa.GFA(3, [2, 4], max_iter=20, random_state=0).fit(x)
    before = g.components_.copy()
    with pytest.raises(ValueError, match=message):
        g.set_params(groups=groups).fit(x)
    np.testing.assert_array_equal(g.components_, before)


def test_bad_data_is_rejected_with_clear_errors() -> None:
    x, labels, _, _ = synthetic(8, n=30, sizes=(4, 6))
    y = x.copy()
    y[:, :4] = np.nan
    with pytest.raises(ValueError, match="group 0 has no observed"):
        onlinefa.GFA(2, [4, 6]).fit(y)
    with pytest.raises(ValueError, match="exceed what 30 samples of 10 features support"):
        onlinefa.GFA(11, [4, 6]).fit(x)
    z = x.copy()
    z[3, 3] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        onlinefa.GFA(2, [4, 6]).fit(z)
    with pytest.raises(ValueError, match="noise"):
        onlinefa.GFA(2, [4, 6], noise="diag").fit(x)  # type: ignore[arg-type]
    g = onlinefa.GFA(2, [4, 6], max_iter=10).fit(x)
    with pytest.raises(ValueError, match="group must be one of"):
        g.predict_group(x, 5)
    with pytest.raises(ValueError, match="expecting 10 features"):
        g.transform(x[:, :7])


@pytest.mark.parametrize("rank", [1, 2])
def test_low_rank_ard_recovers_the_pattern_and_the_noise(rank: int) -> None:
    x, labels, pattern, taus = synthetic(0)
    g = onlinefa.GFA(8, labels, ard_rank=rank, max_iter=2000, tol=1e-8, random_state=0).fit(x)
    assert g.n_components_ == 4
    assert pattern_matches(g.activity_, pattern), np.round(g.activity_, 3)
    np.testing.assert_allclose(g.noise_precision_, taus, rtol=0.05)
    assert np.all(np.diff(g.elbo_)[np.diff(g.n_components_history_) == 0] >= -1e-9 * abs(g.elbo_[-1]))
    # α of the active cells is far below α of the inactive ones.
    active = g.activity_ > 0.02
    assert g.alpha_[active].max() < g.alpha_[~active].min()


def test_low_rank_ard_is_monotone_under_every_step() -> None:
    x, labels, _, _ = synthetic(9, n=80, sizes=(5, 7, 6), missing=0.1)
    e = engine(x, labels, 6, ard_rank=2)
    last = e.elbo()
    for _ in range(6):
        for step in ["latents", "bias", "loadings", "noise", "ard", "translate", "rotate"]:
            e.apply(step)
            now = e.elbo()
            assert now >= last - 1e-10 * abs(last), (step, last, now)
            last = now
