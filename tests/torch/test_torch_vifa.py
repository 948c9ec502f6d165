"""onlinefa.VIFA (device=) against the Rust core: given the same draws' noise and gradients, the same model in float64
(1e-10 relative over 1,000 steps: SGD, Adam, several draws per step with clipping, K > 16), float32 within the Rust
float32 state's own error; checkpoints in both directions; refused input and a diverging step change nothing; its
own draws have the right distribution and it learns a known posterior; vifa_step drives it on a module."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from onlinefa import NumericalBreakdownError  # noqa: E402
from onlinefa.torch._vifa_model import VIFA as TorchVIFA  # noqa: E402

BASE: dict[str, Any] = {"prior_precision": 0.1, "lr_mean": 1e-3, "lr_loadings": 1e-3, "lr_log_noise": 1e-3}
CONFIGS: dict[str, dict[str, Any]] = {
    "sgd": {},
    "adam": {"optimizer": "adam"},
    "adam, two draws, clipped": {"optimizer": "adam", "n_grad_samples": 2, "clip_grad_norm": 5.0},
    "sgd, three draws, clipped": {"n_grad_samples": 3, "clip_grad_norm": 2.0},
}


def quadratic(d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The NLL ½ (θ − μ)ᵀ P (θ − μ) of a correlated Gaussian: gradient P (θ − μ)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((d, d)) / np.sqrt(d)
    return rng.standard_normal(d), 10.0 * (a @ a.T + 0.5 * np.eye(d))


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def gaussian(model: Any) -> tuple[np.ndarray, np.ndarray]:
    mean, loadings, psi = (np.asarray(v.cpu().numpy() if isinstance(v, torch.Tensor) else v)
                           for v in model.snapshot())
    return mean, loadings @ loadings.T + np.diag(psi)


def run_both(rust: Any, ours: TorchVIFA, steps: int, seed: int = 0) -> None:
    """``steps`` steps of both models on the same draws: ours takes the Rust draws' noise."""
    mu, precision = quadratic(rust.n_features, seed)
    for _ in range(steps):
        gradients = np.stack([precision @ (rust.sample() - mu) for _ in range(rust.n_grad_samples)])
        h, z = rust.pending_noise()
        for h_l, z_l in zip(h, z):
            ours._engine.draw(torch.as_tensor(h_l), torch.as_tensor(z_l))
        rust.step(gradients)
        ours.step(torch.as_tensor(gradients))


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_float64_equals_the_rust_core_over_a_thousand_steps(config: str) -> None:
    rust = onlinefa.VIFA(30, 3, seed=3, **BASE, **CONFIGS[config])
    ours = TorchVIFA(30, 3, seed=3, **BASE, **CONFIGS[config])
    run_both(rust, ours, 1000)
    assert ours.n_steps == rust.n_steps == 1000
    (mean_r, cov_r), (mean_t, cov_t) = gaussian(rust), gaussian(ours)
    assert relative(mean_t, mean_r) < 1e-10 and relative(cov_t, cov_r) < 1e-10


def test_more_than_sixteen_factors_equal_the_rust_blocked_path() -> None:
    rust = onlinefa.VIFA(40, 20, seed=1, optimizer="adam", **BASE)
    ours = TorchVIFA(40, 20, seed=1, optimizer="adam", **BASE)
    run_both(rust, ours, 300)
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10


def test_float32_state_is_as_close_as_the_rust_float32_state() -> None:
    exact = onlinefa.VIFA(30, 3, seed=2, optimizer="adam", **BASE)
    rust32 = onlinefa.VIFA(30, 3, seed=2, optimizer="adam", dtype="float32", **BASE)
    ours32 = TorchVIFA(30, 3, seed=2, optimizer="adam", dtype=torch.float32, **BASE)
    assert ours32.dtype == torch.float32 and ours32._engine.params["loadings"].dtype == torch.float32
    mu, precision = quadratic(30)
    for _ in range(500):  # one noise for all three (the Rust streams depend on the seed, not the dtype)
        theta64, theta32 = exact.sample(), rust32.sample()
        h, z = exact.pending_noise()
        theta_ours = ours32._engine.draw(torch.as_tensor(h[0]), torch.as_tensor(z[0])).numpy()
        exact.step(precision @ (theta64 - mu))
        rust32.step(precision @ (theta32 - mu))
        ours32.step(torch.as_tensor(precision @ (theta_ours - mu)))
    cov = gaussian(exact)[1]
    # float32 storage rounds each stored value to 6e-8: both stay within a few thousand ulps of float64
    assert relative(gaussian(ours32)[1], cov) <= max(2 * relative(gaussian(rust32)[1], cov), 1e-5)


def test_checkpoint_round_trip_continues_alike(tmp_path: Any) -> None:
    rust = onlinefa.VIFA(30, 3, seed=4, optimizer="adam", **BASE)
    ours = TorchVIFA(30, 3, seed=4, optimizer="adam", **BASE)
    run_both(rust, ours, 100)
    path = tmp_path / "vifa.npz"
    ours.save(path)
    restored: Any = onlinefa.load(path)
    assert isinstance(restored, onlinefa.VIFA) and restored.n_steps == 100
    back = TorchVIFA.from_numpy(restored)
    run_both(restored, back, 100, seed=1)
    run_both(rust, ours, 100, seed=1)
    assert relative(gaussian(back)[1], gaussian(ours)[1]) < 1e-10
    assert relative(gaussian(restored)[1], gaussian(rust)[1]) < 1e-10
    ours.sample()
    with pytest.raises(ValueError, match="pending"):
        ours.save(path)  # the pending draw's noise lives only here
    rust.sample()
    with pytest.raises(ValueError, match="pending"):
        TorchVIFA.from_numpy(rust)


def state(model: TorchVIFA) -> dict[str, Any]:
    engine = model._engine
    return {"params": {k: v.clone() for k, v in engine.params.items()}, "n_steps": engine.n_steps,
            "n_draws": engine.n_draws, "n_pending": engine.n_pending, "m_inv": engine.m_inv.clone()}


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert torch.equal(a["m_inv"], b["m_inv"])
    assert (a["n_steps"], a["n_draws"], a["n_pending"]) == (b["n_steps"], b["n_draws"], b["n_pending"])


@pytest.mark.parametrize("bad", ["nan", "inf", "huge", "shape"])
def test_bad_gradients_are_refused_and_change_nothing(bad: str) -> None:
    ours = TorchVIFA(10, 2, seed=0, **BASE)
    ours.sample()
    before = state(ours)
    grad = torch.ones(10, dtype=torch.float64)
    if bad == "shape":
        grad = grad[:-1]
    else:
        grad[3] = {"nan": float("nan"), "inf": float("inf"), "huge": 1e120}[bad]
    with pytest.raises(ValueError, match="grad"):
        ours.step(grad)
    assert_same(state(ours), before)


def test_call_order_is_checked() -> None:
    ours = TorchVIFA(10, 2, seed=0, **BASE)
    with pytest.raises(RuntimeError, match="sample"):
        ours.step(torch.ones(10, dtype=torch.float64))
    ours.sample()
    with pytest.raises(RuntimeError, match="step"):
        ours.sample()


def test_a_diverging_step_changes_nothing() -> None:
    ours = TorchVIFA(10, 2, seed=0, prior_precision=0.0, lr_mean=1e300, lr_loadings=1e300, lr_log_noise=1e300)
    ours.sample()
    before = state(ours)
    with pytest.raises(NumericalBreakdownError, match="non-finite"):
        ours.step(torch.full((10,), 1e90, dtype=torch.float64))
    assert_same(state(ours), before)


@pytest.mark.slow
def test_its_own_draws_have_the_distribution_of_q() -> None:
    options = {**BASE, "n_grad_samples": 20_000}  # every draw stays pending: no step between them
    ours = TorchVIFA(6, 2, seed=5, init_mean=np.arange(6.0), init_noise_variance=np.full(6, 0.3), **options)
    mean, loadings, psi = (v.numpy() for v in ours.snapshot())
    draws = []
    for _ in range(20_000):
        draws.append(ours.sample().numpy())
    draws_arr = np.stack(draws)
    target = loadings @ loadings.T + np.diag(psi)
    # 20,000 draws: standard error of each covariance entry ≈ sqrt(2/20000)·max var ≈ 0.01·max
    assert relative(np.cov(draws_arr.T), target) < 0.05
    assert np.abs(draws_arr.mean(axis=0) - mean).max() < 0.05 * np.sqrt(np.diag(target)).max()


@pytest.mark.slow
def test_it_learns_a_gaussian_posterior() -> None:
    mu = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    precision = torch.diag(torch.tensor([4.0, 1.0, 0.25], dtype=torch.float64))
    vi = TorchVIFA(3, 2, prior_precision=0.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, optimizer="adam",
                   seed=0)
    vi.fit(lambda theta: precision @ (theta - mu), 4000)
    mean, loadings, psi = vi.snapshot()
    cov = loadings @ loadings.T + torch.diag(psi)
    # q's optimum is N(μ, P⁻¹) exactly (a Gaussian target, flat prior); SGD noise leaves ~10% in the variances
    assert torch.allclose(mean, mu, atol=0.2)
    assert torch.allclose(torch.diag(cov), 1.0 / torch.diag(precision), rtol=0.3)


def test_vifa_step_drives_it_on_a_module() -> None:
    """vifa_step on the device model: the step it makes is the step by hand at the same (seeded) draw, with
    the gradient N × ∇θ of the mini-batch mean loss."""
    import copy

    from onlinefa.torch import ParameterVector, vifa_step

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    vector = ParameterVector(net, dtype=torch.float64)
    x, y = torch.randn(32, 3, dtype=torch.float64), torch.randn(32, 1, dtype=torch.float64)

    def loss_fn(module: torch.nn.Module, batch: tuple[Any, Any]) -> Any:
        return torch.mean((module(batch[0]) - batch[1]) ** 2)

    ours = TorchVIFA(len(vector), 2, seed=0, **BASE)
    by_hand = copy.deepcopy(ours)
    for _ in range(5):
        vifa_step(ours, net, loss_fn, (x, y), n_data=100)
        vector.assign(by_hand.sample())  # the draw vifa_step made: the noise is keyed by (seed, draw index)
        grads = torch.autograd.grad(loss_fn(net, (x, y)), list(net.parameters()))
        by_hand.step(100 * torch.cat([g.reshape(-1) for g in grads]))
    assert ours.n_steps == 5 and ours.n_pending == 0
    for got, want in zip(ours.snapshot(), by_hand.snapshot()):
        assert torch.equal(got, want)
