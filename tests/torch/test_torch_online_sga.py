"""onlinefa.OnlineSGA (device=) against the Rust core: the same model in float64 (1e-10 relative over 1,000 samples, in
every configuration, the thesis's Algorithm 1 included), float32 within the Rust float32 state's own error,
checkpoints in both directions, atomic failure and the warm-up."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from onlinefa import NotFittedError, NumericalBreakdownError  # noqa: E402
from onlinefa.torch._online_sga import OnlineSGA as TorchOnlineSGA  # noqa: E402
from device_parity import (  # noqa: E402
    COLLECTED_FEATURES, assert_same_state, relative, state_map, stream, trained_by_collector,
)

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},  # the whitened steps of 1/t
    "constant rate": {"lr": 1e-3},
    "larger rate": {"lr": 1e-2},
    "power schedule": {"schedule": "power", "kappa": 0.8, "tau0": 3.0, "scaling": "unit", "n_warmup": 20,
                       "lr": 1e-3},
    "constant schedule": {"schedule": "constant", "rho": 0.02, "scaling": "unit", "n_warmup": 20, "lr": 1e-3},
    "unit scaling": {"scaling": "unit", "n_warmup": 20, "lr": 1e-2},
}




def gaussian(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance F Fᵀ + diag ψ) of either class, as NumPy arrays."""
    if isinstance(model, TorchOnlineSGA):
        mean, loadings, psi = (v.cpu().numpy() for v in model.snapshot())
    else:
        mean, loadings, psi = model.mean, model.loadings, model.noise_variance
    return np.asarray(mean), np.asarray(loadings @ loadings.T + np.diag(psi))


def fed(model: Any, X: np.ndarray) -> Any:
    for chunk in np.array_split(X, 7):  # several calls, of one row and of many
        model.update(torch.as_tensor(chunk) if isinstance(model, TorchOnlineSGA) else chunk)
    return model


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_float64_equals_the_rust_core_over_a_thousand_samples(config: str) -> None:
    d, k = 40, 4
    X = stream(1000, d, 0)
    rust = fed(onlinefa.OnlineSGA(d, k, seed=7, **CONFIGS[config]), X)
    ours = fed(TorchOnlineSGA(d, k, seed=7, **CONFIGS[config]), X)
    assert ours.n_seen == rust.n_seen == 1000 and ours.is_fitted
    (mean_r, cov_r), (mean_t, cov_t) = gaussian(rust), gaussian(ours)
    assert relative(mean_t, mean_r) < 1e-10 and relative(cov_t, cov_r) < 1e-10


def test_algorithm1_equals_the_rust_algorithm1() -> None:
    d, k = 40, 4
    X = stream(1000, d, 1, scale=1.0)
    rust = fed(onlinefa.OnlineSGA.algorithm1(d, k, seed=3), X)
    ours = fed(TorchOnlineSGA.algorithm1(d, k, seed=3), X)
    assert ours.get_state()["scaling"] == "unit" and ours.n_warmup == 100
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10


@pytest.mark.parametrize("lr", ["auto", 1e-2])
def test_more_than_sixteen_factors_equal_the_rust_wide_path(lr: Any) -> None:
    d, k = 60, 20
    X = stream(300, d, 2)
    rust = onlinefa.OnlineSGA(d, k, seed=1, lr=lr).update(X)
    ours = TorchOnlineSGA(d, k, seed=1, lr=lr).update(torch.as_tensor(X))
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10


def test_the_warm_up_refuses_queries_then_starts_from_the_data_scale() -> None:
    d, k = 30, 3
    X = stream(40, d, 3)
    ours = TorchOnlineSGA(d, k, seed=0, n_warmup=10)
    ours.update(torch.as_tensor(X[:10]))
    with pytest.raises(NotFittedError, match="warm-up"):
        ours.snapshot()
    rust = onlinefa.OnlineSGA(d, k, seed=0, n_warmup=10).update(X[:11])
    ours.update(torch.as_tensor(X[10:11]))
    # the first pass after warm-up: F₀ σ̂ and ψ = d̄² of the warm-up, as the Rust core
    scale_sq = rust.__getstate__()["state"]["scale_sq"]
    assert scale_sq > 0 and ours.get_state()["scale_sq"] == pytest.approx(scale_sq, rel=1e-12)  # sum order only
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-12


def test_float32_state_is_as_close_as_the_rust_float32_state() -> None:
    d, k = 40, 4
    X = stream(1000, d, 4)
    exact = gaussian(onlinefa.OnlineSGA(d, k, seed=2, lr=1e-2).update(X))[1]
    rust32 = gaussian(onlinefa.OnlineSGA(d, k, seed=2, lr=1e-2, dtype="float32").update(X))[1]
    ours32 = TorchOnlineSGA(d, k, seed=2, lr=1e-2, dtype=torch.float32).update(torch.as_tensor(X))
    assert ours32.dtype == torch.float32 and ours32._engine.loadings.dtype == torch.float32
    # float32 storage rounds each stored value to 6e-8: both stay within a few thousand ulps of float64
    assert relative(gaussian(ours32)[1], exact) <= max(2 * relative(rust32, exact), 1e-5)


@pytest.mark.parametrize("lr", ["auto", 1e-2])
@pytest.mark.parametrize("direction", ["torch to rust", "rust to torch"])
def test_checkpoints_move_between_the_two_and_updates_continue_alike(direction: str, lr: Any, tmp_path: Any) -> None:
    d, k = 30, 3
    X = stream(400, d, 5)
    path = tmp_path / "posterior.npz"
    if direction == "torch to rust":
        source: Any = TorchOnlineSGA(d, k, seed=5, lr=lr).update(torch.as_tensor(X[:200]))
        source.save(path)
        restored: Any = onlinefa.load(path)
        assert isinstance(restored, onlinefa.OnlineSGA)
        source.update(torch.as_tensor(X[200:]))
        restored.update(X[200:])
    else:
        source = onlinefa.OnlineSGA(d, k, seed=5, lr=lr).update(X[:200])
        source.save(path)
        restored = TorchOnlineSGA.load(path)
        source.update(X[200:])
        restored.update(torch.as_tensor(X[200:]))
    assert restored.n_seen == source.n_seen == 400
    assert relative(gaussian(restored)[1], gaussian(source)[1]) < 1e-10
    assert (repr(restored).count("lr='auto'") == 1) == (lr == "auto")
    assert set(TorchOnlineSGA.from_numpy(onlinefa.OnlineSGA(d, k, seed=0)).get_state()) == set(
        onlinefa.OnlineSGA(d, k, seed=0).__getstate__()["state"])
    with pytest.raises(TypeError, match="OnlineSGA"):
        TorchOnlineSGA.from_numpy(onlinefa.OnlineEM(d, k, seed=0))


@pytest.mark.parametrize("elements", ["small", "large"])
def test_a_diverged_step_leaves_the_model_as_before(elements: str, monkeypatch: Any) -> None:
    """Algorithm 1 with a large rate on badly scaled data: the Rust core refuses the same sample; ours leaves a
    small model as before the batch and a large one (no backup kept) as before the failing row."""
    if elements == "large":
        monkeypatch.setattr("onlinefa.torch._torch_model.SNAPSHOT_MAX_ELEMENTS", 0)
    d, k = 20, 2
    rng = np.random.default_rng(7)
    X = rng.standard_normal((60, d)) * np.r_[np.full(d - 1, 1e-3), 1e3]
    rust = onlinefa.OnlineSGA.algorithm1(d, k, seed=0, n_warmup=5, lr=0.5)
    ours = TorchOnlineSGA.algorithm1(d, k, seed=0, n_warmup=5, lr=0.5)
    rust.update(X[:6])
    ours.update(torch.as_tensor(X[:6]))
    before = state_map(ours)
    with pytest.raises(NumericalBreakdownError):
        rust.update(X[6:])
    with pytest.raises(NumericalBreakdownError, match="diverged"):
        ours.update(torch.as_tensor(X[6:]))
    failed_at = ours.n_seen  # the rows before the failing one stay applied when no backup was kept
    assert failed_at == (6 if elements == "small" else rust.n_seen)
    if elements == "small":
        assert_same_state(state_map(ours), before)


def test_draws_have_the_fitted_covariance() -> None:
    d, k = 12, 2
    model = TorchOnlineSGA(d, k, seed=0, lr=1e-2).update(torch.as_tensor(stream(500, d, 8, scale=1.0)))
    mean, loadings, psi = model.snapshot()
    draws = model.sample(40_000, generator=torch.Generator().manual_seed(0))
    assert draws.shape == (40_000, d) and draws.device == model.device
    target = np.asarray(loadings.numpy() @ loadings.numpy().T + np.diag(psi.numpy()))
    # 40,000 draws: each covariance entry has a standard error of at most ~sqrt(2/40000)·max var ≈ 0.007·max
    assert relative(np.cov(draws.numpy().T), target) < 0.05


@pytest.mark.filterwarnings("ignore::onlinefa.errors.SlowCollectionWarning")  # a tiny net steps faster
def test_the_collector_feeds_the_device_model_as_the_rust_one() -> None:
    from onlinefa.torch import sample_parameters

    d = COLLECTED_FEATURES
    rust = trained_by_collector(onlinefa.OnlineSGA(d, 3, seed=0))
    ours = trained_by_collector(TorchOnlineSGA(d, 3, seed=0))
    assert ours.n_seen == rust.n_seen == 40
    assert relative(gaussian(ours)[1], gaussian(rust)[1]) < 1e-10
    # the same normals: the torch rows' F h + ψ^½ z against the Rust engine's, both in float64
    draws_ours = torch.stack(list(sample_parameters(ours, 5, seed=3, dtype=torch.float64)))
    draws_rust = torch.stack(list(sample_parameters(rust, 5, seed=3, dtype=torch.float64)))
    assert torch.allclose(draws_ours, draws_rust, rtol=1e-9, atol=1e-12)
