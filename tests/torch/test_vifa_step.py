"""VIFA's K×K step written once: ``_core.VIFAStep`` (the Rust ``VifaKkStep``) drives the torch rows of
``onlinefa.VIFA(..., device=...)``. Its counters, (I + B)⁻¹, rule and state keys are those of the Rust model; a
failed call changes nothing; a pickled device model keeps (I + B)⁻¹ bit for bit."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
from onlinefa import NumericalBreakdownError, _core  # noqa: E402

D, K = 9, 3
OPTIONS: dict[str, Any] = {"prior_precision": 0.5, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2,
                           "optimizer": "adam", "n_grad_samples": 2, "clip_grad_norm": 5.0, "seed": 3}
K_BY_K_KEYS = {"n_components", "prior_precision", "lr_mean", "lr_loadings", "lr_log_noise", "optimizer",
               "n_grad_samples", "clip_grad_norm", "seed", "n_draws", "n_pending", "n_steps", "diverged"}


def trained(device: Any, steps: int = 4) -> Any:
    model = onlinefa.VIFA(D, K, device=device, **OPTIONS)
    target = np.linspace(-1.0, 1.0, D)
    for _ in range(steps):
        draws = [model.sample() for _ in range(2)]
        grads = [d - (torch.as_tensor(target) if device is not None else target) for d in draws]
        model.step(torch.stack(grads) if device is not None else np.stack(grads))
    return model


def test_the_device_model_writes_the_rust_models_k_by_k_keys() -> None:
    on_device, on_core = trained("cpu"), trained(None)
    device_state, core_state = on_device.get_state(), on_core.__getstate__()["state"]
    assert K_BY_K_KEYS <= set(device_state)
    for key in K_BY_K_KEYS:
        assert device_state[key] == core_state[key], key
    assert set(device_state) == set(core_state)


def test_m_inv_is_that_of_the_rust_model_of_the_same_rows() -> None:
    on_device = trained("cpu")
    host = on_device.to(None)  # the Rust model rebuilds (I + B)⁻¹ from the same rows
    m_inv = on_device._engine.kk_step.m_inv()
    rebuilt = _core.VIFAStep.from_state(host.__getstate__()["state"], D)
    _, f, psi = host.snapshot()
    rebuilt.refresh(np.ascontiguousarray((f / psi[:, None]).T @ f))
    np.testing.assert_allclose(m_inv, rebuilt.m_inv(), rtol=1e-12)


def test_a_failed_call_changes_nothing() -> None:
    step = _core.VIFAStep.from_state(trained(None).__getstate__()["state"], D)
    before = step.get_state()
    with pytest.raises(RuntimeError, match="pending"):
        step.check_ready()
    with pytest.raises(ValueError, match="gradient norms"):
        step.rule(None)  # clipping is on: the rule needs the norms
    with pytest.raises(NumericalBreakdownError):
        step.apply(-4.0 * np.eye(K))  # I + B not positive definite
    with pytest.raises(ValueError):
        step.apply(np.eye(K + 1))
    assert step.get_state() == before
    with pytest.raises(NumericalBreakdownError):
        step.m_inv()  # never refreshed: no (I + B)⁻¹ yet
    step.refresh(np.eye(K))
    np.testing.assert_allclose(step.m_inv(), 0.5 * np.eye(K))
    for _ in range(2):
        step.begin_draw()
    with pytest.raises(RuntimeError, match="already waiting"):
        step.begin_draw()
    assert (step.n_draws, step.n_pending) == (before["n_draws"] + 2, 2)


def test_the_rule_is_adams_with_the_bias_corrections_of_the_next_step() -> None:
    step = _core.VIFAStep.from_state(trained(None).__getstate__()["state"], D)
    lr, scale, adam_lr, inv_sqrt_bias2, (beta1, beta2, eps) = step.rule([100.0, 1.0, 400.0])
    t = step.n_steps + 1
    assert lr == [1e-2, 1e-2, 1e-2] and (beta1, beta2, eps) == (0.9, 0.999, 1e-8)
    np.testing.assert_allclose(scale, [0.5, 1.0, 0.25])  # min(1, 5 / ‖g‖)
    np.testing.assert_allclose(adam_lr, [1e-2 / (1 - 0.9**t)] * 3, rtol=1e-15)
    assert inv_sqrt_bias2 == pytest.approx(1 / np.sqrt(1 - 0.999**t), rel=1e-15)


def test_a_pickled_device_model_keeps_its_precision_bit_for_bit() -> None:
    model = trained("cpu")
    copy = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(copy._engine.kk_step.m_inv(), model._engine.kk_step.m_inv())
    assert copy.n_steps == model.n_steps
    theta = copy.sample()
    assert theta.shape == (D,)
    # the copy's step is its own: drawing on it leaves the original's counters alone
    assert model._engine.kk_step.n_pending == 0


def test_learning_rates_and_prior_go_through_the_step() -> None:
    model = trained("cpu", steps=1)
    model.set_learning_rates(lr_mean=0.5)
    model.set_prior_precision(2.0)
    assert model._engine.kk_step.lr == (0.5, 1e-2, 1e-2) and model._engine.kk_step.prior_precision == 2.0
    with pytest.raises(ValueError):
        model.set_learning_rates(lr_loadings=-1.0)
    assert model._engine.kk_step.lr == (0.5, 1e-2, 1e-2)
