"""onlinefa.OnlineEM (device=) against the Rust core: the same model in float64 (1e-10 relative over 1,000 samples, in
every configuration), float32 within the Rust float32 state's own error, checkpoints in both directions, atomic
failure and the warm-up's first fit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from onlinefa import NotFittedError, NumericalBreakdownError  # noqa: E402
from onlinefa.torch._online_em import OnlineEM as TorchOnlineEM  # noqa: E402
from device_parity import (  # noqa: E402
    COLLECTED_FEATURES, relative, stream, trained_by_collector,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no whitening": {"whiten": False},
    "power schedule": {"schedule": "power", "kappa": 0.8, "tau0": 3.0},
    "constant schedule": {"schedule": "constant", "rho": 0.02},
    "unit scaling": {"scaling": "unit", "n_warmup": 20},
    "Algorithm 2": {"whiten": False, "scaling": "unit", "n_warmup": 100},
}



def covariance(loadings: np.ndarray, psi: np.ndarray) -> np.ndarray:
    return np.asarray(loadings @ loadings.T + np.diag(psi))



def gaussian(model: Any) -> tuple[np.ndarray, np.ndarray]:
    mean, loadings, psi = model.snapshot()
    as_numpy = [np.asarray(v.cpu().numpy() if isinstance(v, torch.Tensor) else v) for v in (mean, loadings, psi)]
    return as_numpy[0], covariance(as_numpy[1], as_numpy[2])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_float64_equals_the_rust_core_over_a_thousand_samples(config: str) -> None:
    d, k = 40, 4
    X = stream(1000, d, 0)
    rust = onlinefa.OnlineEM(d, k, seed=7, **CONFIGS[config])
    ours = TorchOnlineEM(d, k, seed=7, **CONFIGS[config])
    for chunk in np.array_split(X, 7):  # several calls, of one row and of many
        rust.update(chunk)
        ours.update(torch.as_tensor(chunk))
    assert ours.n_seen == rust.n_seen == 1000 and ours.is_fitted
    (mean_r, cov_r), (mean_t, cov_t) = gaussian(rust), gaussian(ours)
    assert relative(mean_t, mean_r) < 1e-10 and relative(cov_t, cov_r) < 1e-10


def test_more_than_sixteen_factors_equal_the_rust_wide_path() -> None:
    d, k = 60, 20
    X = stream(300, d, 1)
    rust = onlinefa.OnlineEM(d, k, seed=1).update(X)
    ours = TorchOnlineEM(d, k, seed=1).update(torch.as_tensor(X))
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10


def test_the_warm_up_answers_with_the_same_first_fit() -> None:
    d, k = 30, 3
    X = stream(8, d, 2)
    rust = onlinefa.OnlineEM(d, k, seed=0, n_warmup=50)
    ours = TorchOnlineEM(d, k, seed=0, n_warmup=50)
    ours.update(torch.as_tensor(X[:1]))
    with pytest.raises(NotFittedError, match="two samples"):
        ours.snapshot()
    rust.update(X)
    ours.update(torch.as_tensor(X[1:]))
    assert not ours.is_fitted
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10


def test_after_an_extreme_row_the_two_report_the_same_gaussian() -> None:
    # One feature jumps to 1e100 (the largest accepted float64 input) and back. H̄ is then so ill-conditioned that
    # the whitening basis, and with it B̄ and Σ, hangs on the last bits of the pass's sums, which the two passes
    # round differently; the K×K step is the same code, so the Gaussian they report stays the same.
    d, k = 20, 3
    X = stream(80, d, 11)
    X[40, 3] = 1e100
    ours = TorchOnlineEM(d, k, seed=0).update(torch.as_tensor(X))
    rust = onlinefa.OnlineEM(d, k, seed=0).update(X)
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10
    np.testing.assert_array_equal(gaussian(ours)[0], gaussian(rust)[0])


def test_float32_state_is_as_close_as_the_rust_float32_state() -> None:
    d, k = 40, 4
    X = stream(1000, d, 3)
    exact = gaussian(onlinefa.OnlineEM(d, k, seed=2).update(X))[1]
    rust32 = gaussian(onlinefa.OnlineEM(d, k, seed=2, dtype="float32").update(X))[1]
    ours32 = TorchOnlineEM(d, k, seed=2, dtype=torch.float32).update(torch.as_tensor(X))
    assert ours32.dtype == torch.float32 and ours32._engine.a_bar.dtype == torch.float32
    # float32 storage rounds each stored value to 6e-8: both stay within a few thousand ulps of float64
    assert relative(gaussian(ours32)[1], exact) <= max(2 * relative(rust32, exact), 1e-5)


@pytest.mark.parametrize("direction", ["torch to rust", "rust to torch"])
def test_checkpoints_move_between_the_two_and_updates_continue_alike(direction: str, tmp_path: Any) -> None:
    d, k = 30, 3
    X = stream(400, d, 4)
    path = tmp_path / "posterior.npz"
    if direction == "torch to rust":
        source: Any = TorchOnlineEM(d, k, seed=5).update(torch.as_tensor(X[:200]))
        source.save(path)
        restored: Any = onlinefa.load(path)
        assert isinstance(restored, onlinefa.OnlineEM)
        source.update(torch.as_tensor(X[200:]))
        restored.update(X[200:])
    else:
        source = onlinefa.OnlineEM(d, k, seed=5).update(X[:200])
        source.save(path)
        restored = TorchOnlineEM.load(path)
        source.update(X[200:])
        restored.update(torch.as_tensor(X[200:]))
    assert restored.n_seen == source.n_seen == 400
    assert relative(gaussian(restored)[1], gaussian(source)[1]) < 1e-10
    # the state maps hold the same entries, so either class reads the other's
    assert set(TorchOnlineEM.from_numpy(onlinefa.OnlineEM(d, k, seed=0)).get_state()) == set(
        onlinefa.OnlineEM(d, k, seed=0).__getstate__()["state"])


class FailingStep:
    """The Rust K×K step of a model, whose ``apply`` breaks down numerically from the ``fail_at``-th call on."""

    def __init__(self, step: Any, fail_at: int) -> None:
        self.step, self.calls, self.fail_at = step, 0, fail_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self.step, name)

    def apply(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls >= self.fail_at:
            raise NumericalBreakdownError("H̄ = Σ + B̄ is not positive definite (injected)")
        self.step.apply(*args, **kwargs)

    def copy(self) -> "FailingStep":
        return FailingStep(self.step.copy(), self.fail_at - self.calls)


def test_a_numerical_breakdown_leaves_a_small_model_as_before_the_batch() -> None:
    d, k = 30, 3
    X = stream(60, d, 7)
    model = TorchOnlineEM(d, k, seed=0).update(torch.as_tensor(X[:30]))
    before = model.get_state()
    model._engine.kk_step = FailingStep(model._engine.kk_step, fail_at=5)  # the 5th sample of the batch fails
    with pytest.raises(NumericalBreakdownError, match="not positive definite"):
        model.update(torch.as_tensor(X[30:40]))
    after = model.get_state()
    assert after.keys() == before.keys() and after["n_seen"] == 30 and "pending_m" in after
    assert all(np.array_equal(np.asarray(after[key]), np.asarray(before[key])) for key in before)
    # and the model goes on as one that never saw the batch
    model._engine.kk_step = model._engine.kk_step.step
    twin = TorchOnlineEM.from_state(before)
    assert torch.equal(model.update(torch.as_tensor(X[40:])).loadings, twin.update(torch.as_tensor(X[40:])).loadings)


def test_draws_have_the_fitted_covariance() -> None:
    d, k = 12, 2
    model = TorchOnlineEM(d, k, seed=0).update(torch.as_tensor(stream(500, d, 8, scale=1.0)))
    mean, loadings, psi = model.snapshot()
    draws = model.sample(40_000, generator=torch.Generator().manual_seed(0))
    assert draws.shape == (40_000, d) and draws.device == model.device
    target = covariance(loadings.numpy(), psi.numpy())
    empirical = np.cov(draws.numpy().T)
    # 40,000 draws: each covariance entry has a standard error of at most ~sqrt(2/40000)·max var ≈ 0.007·max
    assert relative(empirical, target) < 0.05
    assert np.abs(draws.numpy().mean(axis=0) - mean.numpy()).max() < 0.05 * np.sqrt(np.diag(target)).max()


@pytest.mark.filterwarnings("ignore::onlinefa.errors.SlowCollectionWarning")  # a tiny net steps faster
def test_the_collector_and_the_sampler_take_the_device_model_as_they_are() -> None:
    from onlinefa.torch import sample_parameters

    d = COLLECTED_FEATURES
    rust = trained_by_collector(onlinefa.OnlineEM(d, 3, seed=0))
    ours = trained_by_collector(TorchOnlineEM(d, 3, seed=0))
    assert ours.n_seen == rust.n_seen == 40
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10
    # the same normals: the torch rows' F h + ψ^½ z against the Rust engine's, both in float64
    draws_ours = torch.stack(list(sample_parameters(ours, 5, seed=3, dtype=torch.float64)))
    draws_rust = torch.stack(list(sample_parameters(rust, 5, seed=3, dtype=torch.float64)))
    assert torch.allclose(draws_ours, draws_rust, rtol=1e-9, atol=1e-12)
