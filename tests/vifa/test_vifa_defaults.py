"""VIFA a user can run: ``VIFA.from_gaussian`` (start from a streaming fit, "auto" rates) and the learned
regression noise variance ``onlinefa.torch.GaussianNoise`` / ``vifa_regression_step``."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import onlinefa
from onlinefa.vifa import AUTO_LR_LOADINGS, AUTO_LR_LOG_NOISE, AUTO_LR_MEAN

pytest.importorskip("torch")
import torch  # noqa: E402

from onlinefa.torch import GaussianNoise, ParameterVector, SWAG, vifa_regression_step, vifa_step  # noqa: E402


def _fitted_em(d: int = 12, k: int = 3) -> onlinefa.OnlineEM:
    rng = np.random.default_rng(0)
    em = onlinefa.OnlineEM(d, k, seed=1)
    em.update(rng.normal(size=(40, d)) * np.linspace(0.1, 2.0, d) + 3.0)
    return em


# -- from_gaussian --------------------------------------------------------------------------------------
def test_from_gaussian_starts_at_the_online_em_fit_with_auto_rates() -> None:
    em = _fitted_em()
    mean, loadings, psi = em.snapshot()
    vi = onlinefa.VIFA.from_gaussian(em, prior_precision=0.5, seed=3)
    np.testing.assert_array_equal(vi.mean, mean)
    np.testing.assert_array_equal(vi.loadings, loadings)
    np.testing.assert_allclose(vi.noise_variance, psi, rtol=1e-14)
    assert vi.n_components == loadings.shape[1] and vi.optimizer == "adam" and vi.prior_precision == 0.5
    size = math.sqrt(float(np.mean(mean**2)))  # ≈ 3: the data's mean
    assert (AUTO_LR_MEAN, AUTO_LR_LOADINGS, AUTO_LR_LOG_NOISE) == (0.01, 0.001, 0.01)
    expected = (0.01 * size, 0.001 * size, 0.01)
    assert vi.learning_rates == pytest.approx(expected, rel=1e-14)
    # the same as passing everything by hand
    by_hand = onlinefa.VIFA(12, loadings.shape[1], prior_precision=0.5, lr_mean=expected[0], lr_loadings=expected[1],
                            lr_log_noise=AUTO_LR_LOG_NOISE, optimizer="adam", seed=3, init=loadings,
                            init_mean=mean, init_noise_variance=psi)
    np.testing.assert_array_equal(vi.sample(), by_hand.sample())


def test_from_gaussian_reads_swag_and_floors_zero_variances() -> None:
    rng = np.random.default_rng(2)
    swag = SWAG(6, max_rank=3)
    for _ in range(5):
        theta = rng.normal(size=6)
        theta[0] = 1.5  # a parameter SGD never moves: ψ = 0
        swag.update(theta)
    vi = onlinefa.VIFA.from_gaussian(swag, prior_precision=0.0, lr_mean=1e-3, lr_loadings=2e-3, lr_log_noise=0.0)
    np.testing.assert_allclose(vi.mean, swag.mean, rtol=1e-15)
    np.testing.assert_allclose(vi.loadings, swag.loadings, rtol=1e-15)
    psi = swag.noise_variance
    assert psi[0] == 0.0
    np.testing.assert_allclose(vi.noise_variance[1:], psi[1:], rtol=1e-14)
    assert vi.noise_variance[0] == pytest.approx(1e-8 * psi.mean(), rel=1e-12)
    assert vi.learning_rates == (1e-3, 2e-3, 0.0)


def test_from_gaussian_reads_fitted_estimator_attributes() -> None:
    rng = np.random.default_rng(4)
    model = SimpleNamespace(mean_=rng.normal(size=5), components_=rng.normal(size=(2, 5)),
                            noise_variance_=rng.uniform(0.5, 1.0, size=5))
    vi = onlinefa.VIFA.from_gaussian(model, prior_precision=1.0)
    np.testing.assert_array_equal(vi.loadings, model.components_.T)
    np.testing.assert_array_equal(vi.mean, model.mean_)


def test_from_gaussian_rejects_bad_starts() -> None:
    em = _fitted_em()
    with pytest.raises(TypeError, match="no Gaussian"):
        onlinefa.VIFA.from_gaussian(object(), prior_precision=1.0)
    diagonal = SWAG(4, diagonal=True)
    diagonal.update(np.ones(4))
    diagonal.update(np.zeros(4))
    with pytest.raises(ValueError, match="no loadings"):
        onlinefa.VIFA.from_gaussian(diagonal, prior_precision=1.0)
    with pytest.raises(ValueError, match="optimizer='adam'"):
        onlinefa.VIFA.from_gaussian(em, prior_precision=1.0, optimizer="sgd")
    with pytest.raises(ValueError, match="'auto'"):
        onlinefa.VIFA.from_gaussian(em, prior_precision=1.0, lr_mean="fast")  # type: ignore[arg-type]
    zero = SimpleNamespace(mean=np.zeros(3), loadings=np.ones((3, 1)), noise_variance=np.zeros(3))
    with pytest.raises(ValueError, match="zero everywhere"):
        onlinefa.VIFA.from_gaussian(zero, prior_precision=1.0)
    at_zero = SimpleNamespace(mean=np.zeros(3), loadings=np.ones((3, 1)), noise_variance=np.ones(3))
    with pytest.raises(ValueError, match="mean, which is zero"):
        onlinefa.VIFA.from_gaussian(at_zero, prior_precision=1.0)
    assert onlinefa.VIFA.from_gaussian(at_zero, prior_precision=1.0, lr_mean=0.1, lr_loadings=0.1).learning_rates[2] == 0.01
    bad = SimpleNamespace(mean=np.zeros(3), loadings=np.ones((4, 1)), noise_variance=np.ones(3))
    with pytest.raises(ValueError, match="inconsistent"):
        onlinefa.VIFA.from_gaussian(bad, prior_precision=1.0)
    # explicit SGD rates are fine
    vi = onlinefa.VIFA.from_gaussian(em, prior_precision=1.0, optimizer="sgd", lr_mean=1e-3, lr_loadings=1e-3,
                                     lr_log_noise=1e-3)
    assert vi.optimizer == "sgd"


# -- GaussianNoise ---------------------------------------------------------------------------------------
def test_noise_gradient_matches_autograd_of_the_expected_log_likelihood() -> None:
    rng = np.random.default_rng(5)
    n = 37
    residuals = rng.normal(size=(4, n))  # the residuals of four draws on the full data set
    noise = GaussianNoise(0.7)
    s = torch.tensor(math.log(0.7), dtype=torch.float64, requires_grad=True)
    r = torch.tensor(residuals)
    # −E_q[log p(y | θ, σ²)] estimated by the average over draws, σ² = exp s
    neg_ll = (0.5 * n * (math.log(2 * math.pi) + s) + 0.5 * (r**2).sum(dim=1) / torch.exp(s)).mean()
    (reference,) = torch.autograd.grad(neg_ll, s)
    msr = (residuals**2).mean(axis=1)
    assert noise.gradient(msr, n) == pytest.approx(float(reference), rel=1e-12)
    # nll() is this per-example loss at the current σ²
    pred, target = torch.tensor(rng.normal(size=n)), torch.tensor(rng.normal(size=n))
    expected = float((0.5 * math.log(2 * math.pi * 0.7) + 0.5 * (pred - target) ** 2 / 0.7).mean())
    assert float(noise.nll(pred, target)) == pytest.approx(expected, rel=1e-12)


def test_noise_first_adam_step_moves_log_variance_by_the_rate() -> None:
    noise = GaussianNoise(1.0, lr=0.05)
    noise.step([4.0], n_data=10)  # σ² too small: s must grow by lr (the first Adam step has |update| = lr)
    assert noise.log_variance == pytest.approx(0.05, rel=1e-6)
    with pytest.raises(ValueError):
        noise.step(n_data=10)  # nothing recorded
    with pytest.raises(ValueError):
        noise.step([float("nan")], n_data=10)
    assert noise.log_variance == pytest.approx(0.05, rel=1e-6) and noise.n_steps == 1
    with pytest.raises(ValueError):
        GaussianNoise(0.0)


def _linear_problem() -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    rng = np.random.default_rng(6)
    x = torch.tensor(rng.normal(size=(60, 3)))
    y = torch.tensor(rng.normal(size=60))
    module = torch.nn.Linear(3, 1, bias=False).double()
    return x, y, module


@pytest.mark.slow
def test_learned_variance_reaches_the_expected_mean_squared_residual() -> None:
    x, y, module = _linear_problem()
    c, f, psi = np.array([0.5, -0.2, 0.1]), np.array([[0.3], [0.1], [-0.2]]), np.full(3, 0.05)
    vi = onlinefa.VIFA(3, 1, prior_precision=0.0, lr_mean=0.0, lr_loadings=0.0, lr_log_noise=0.0,
                       optimizer="adam", seed=7, init=f, init_mean=c, init_noise_variance=psi)  # q frozen
    noise = GaussianNoise(1.0, lr=0.05)
    trace = []
    for i in range(3000):
        if i == 1000:
            noise.lr = 0.002
        vifa_regression_step(vi, module, (x, y), n_data=60, noise=noise)
        if i >= 1500:
            trace.append(noise.log_variance)
    # closed form: argmax over σ² of E_q[log p] = E_q ||y − Xθ||² / N = ||y − Xc||²/N + tr(X Σ Xᵀ)/N
    xn, yn = x.numpy(), y.numpy()
    sigma = f @ f.T + np.diag(psi)
    optimum = (np.sum((yn - xn @ c) ** 2) + np.trace(xn @ sigma @ xn.T)) / 60
    assert math.exp(np.mean(trace)) == pytest.approx(optimum, rel=0.005)  # the Σ term is 19 % of it
    assert abs(optimum - 1.0) > 0.1  # the start was not already the answer


def test_vifa_regression_step_is_vifa_step_with_the_gaussian_loss() -> None:
    x, y, module = _linear_problem()
    kwargs = dict(prior_precision=0.3, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, optimizer="adam",
                  seed=8, n_grad_samples=2)
    a, b, c = (onlinefa.VIFA(3, 2, **kwargs) for _ in range(3))  # type: ignore[arg-type]
    noise = GaussianNoise(0.4)
    vifa_regression_step(a, module, (x[:20], y[:20]), n_data=60, noise=noise)
    vifa_step(b, module, lambda m, batch: 0.5 * ((m(batch[0]).reshape(-1) - batch[1]) ** 2).mean() / 0.4,
              (x[:20], y[:20]), n_data=60)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(a.loadings, b.loadings, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(a.log_noise_variance, b.log_noise_variance, rtol=1e-12, atol=1e-15)
    assert noise.n_steps == 1 and noise.variance != 0.4
    # the default path (vifa_step, no noise model) is the NumPy gradient N·Xᵀ(Xθ − y)/(M σ²) passed to step()
    for _ in range(2):
        c.sample()
    h, z = c.pending_noise()
    thetas = np.stack([c.mean + c.loadings @ hh + np.sqrt(c.noise_variance) * zz for hh, zz in zip(h, z)])
    xb, yb = x[:20].numpy(), y[:20].numpy()
    grads = np.stack([60 * xb.T @ (xb @ t - yb) / (20 * 0.4) for t in thetas])
    c.step(grads)
    np.testing.assert_allclose(b.mean, c.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(b.loadings, c.loadings, rtol=1e-12, atol=1e-15)


def test_vifa_regression_step_failure_leaves_the_variance_unchanged() -> None:
    x, y, module = _linear_problem()
    vi = onlinefa.VIFA(3, 1, prior_precision=0.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=1)
    noise = GaussianNoise(0.4)
    with pytest.raises(ValueError):
        vifa_regression_step(vi, module, (x, y[:10]), n_data=60, noise=noise)
    assert noise.variance == pytest.approx(0.4, rel=1e-15) and noise.n_steps == 0
    with pytest.raises(TypeError):
        vifa_regression_step(vi, module, (x, y), n_data=60, noise=0.4)  # type: ignore[arg-type]
    assert ParameterVector(module).numpy().shape == (3,)


def _kl_to_isotropic_prior(mean: np.ndarray, loadings: np.ndarray, psi: np.ndarray, alpha: float) -> float:
    """KL(N(c, F Fᵀ + Ψ) ‖ N(0, α⁻¹ I)), dense (the reference for the empirical-Bayes α)."""
    cov = loadings @ loadings.T + np.diag(psi)
    d = mean.shape[0]
    _, logdet = np.linalg.slogdet(cov)
    return 0.5 * (alpha * (np.trace(cov) + mean @ mean) - d - d * math.log(alpha) - logdet)


def test_optimal_prior_precision_minimises_the_kl_term_of_the_elbo() -> None:
    # α enters the ELBO only through −KL(q ‖ prior): the empirical-Bayes α* must be the minimiser of the
    # dense KL (a parabola-like convex function of log α), checked on both sides and by finite differences.
    rng = np.random.default_rng(3)
    c, f, psi = rng.normal(size=12), 0.4 * rng.normal(size=(12, 3)), rng.uniform(0.05, 0.3, 12)
    vi = onlinefa.VIFA(12, 3, prior_precision=1.0, lr_mean=0.0, lr_loadings=0.0, lr_log_noise=0.0,
                       init=f, init_mean=c, init_noise_variance=psi, seed=0)
    best = vi.optimal_prior_precision()
    kl = [_kl_to_isotropic_prior(c, f, psi, best * s) for s in (0.99, 1.0, 1.01)]
    assert kl[1] < kl[0] and kl[1] < kl[2]
    h = 1e-6 * best
    slope = (_kl_to_isotropic_prior(c, f, psi, best + h) - _kl_to_isotropic_prior(c, f, psi, best - h)) / (2 * h)
    assert abs(slope) < 1e-6 * 12 / best
    assert vi.prior_precision == 1.0  # asking changes nothing
    vi.set_prior_precision(best)
    assert vi.prior_precision == best
    for bad, error in ((-1.0, ValueError), (float("nan"), ValueError), ("1", TypeError)):
        with pytest.raises(error):
            vi.set_prior_precision(bad)  # type: ignore[arg-type]
        assert vi.prior_precision == best


def test_learned_prior_precision_takes_effect_at_the_next_step_and_is_checkpointed(tmp_path: Path) -> None:
    # With learn_prior_precision=True each step ends with α = α*(q); the following step's prior gradient
    # uses it: the same run with α set by hand to those values gives the same bits.
    x, y, module = _linear_problem()
    kwargs = dict(lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, optimizer="adam", seed=8)
    learned = onlinefa.VIFA(3, 2, prior_precision=0.3, **kwargs)  # type: ignore[arg-type]
    by_hand = onlinefa.VIFA(3, 2, prior_precision=0.3, **kwargs)  # type: ignore[arg-type]
    noise_a, noise_b = GaussianNoise(0.4), GaussianNoise(0.4)
    alphas = []
    for _ in range(3):
        vifa_regression_step(learned, module, (x, y), n_data=60, noise=noise_a, learn_prior_precision=True)
        alphas.append(learned.prior_precision)
        vifa_regression_step(by_hand, module, (x, y), n_data=60, noise=noise_b)
        by_hand.set_prior_precision(by_hand.optimal_prior_precision())
        assert by_hand.prior_precision == alphas[-1]
    np.testing.assert_array_equal(learned.mean, by_hand.mean)
    assert alphas[0] != 0.3 and len(set(alphas)) == 3
    learned.save(tmp_path / "vi.npz")
    assert onlinefa.VIFA.load(tmp_path / "vi.npz").prior_precision == alphas[-1]
