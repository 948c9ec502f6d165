"""``_core.OnlineSGAStep``, the K×K part of online SGA that row stores written outside Rust drive.

A NumPy transcription of the row pass of Algorithm 1 (lines 5, 6, 10–14; the data-scaled start and the whitened
rule of the library's default), driving the Rust step with its sums, must be the Rust ``OnlineSGA``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import NumericalBreakdownError, _core
from engine_state import same_state

RULES: dict[str, dict[str, Any]] = {
    "Algorithm 1": {"lr": 1e-3, "rule": "gradient", "scaling": "unit"},
    "default (whitened, data-scaled)": {"lr": 1.0, "rule": "whitened", "scaling": "data"},
}
COMMON: dict[str, Any] = {"n_warmup": 15, "noise_floor": 1e-6, "schedule": "harmonic", "tau0": 0.0, "kappa": 1.0,
                          "rho": 1.0}


def stream(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((d, 3)) * np.linspace(0.5, 2.0, d)[:, None]
    return rng.standard_normal((n, 3)) @ factors.T + 0.3 * rng.standard_normal((n, d))


def numpy_rows(step: Any, init: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drive ``step`` with a NumPy row store over ``X``; returns (F, ψ) with the last pending step applied."""
    d, k = init.shape
    data = step.scaling == "data"
    mean, f, psi, d_last = np.zeros(d), init.copy(), np.ones(d), np.zeros(d)

    def gradient_step(f: np.ndarray, psi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pending = step.pending()
        if pending is None:
            return f, psi
        m, p, lower = pending
        _, _, _, _, lr, psi_rate = step.plan()
        g = f @ p
        q = d_last**2 - 2.0 * d_last * (f @ m) + np.einsum("ij,ij->i", g, f)
        grad = np.outer(d_last, m) - g
        new_f = f + lr * (grad if data else grad / psi[:, None])
        if lower is not None:
            new_f = new_f @ lower
        if psi_rate is not None:
            return new_f, np.maximum(psi + psi_rate * (q - psi), step.floor)
        log_step = lr * (0.5 * q / psi - 0.5)
        return new_f, np.maximum(psi * np.exp(np.clip(log_step, -1.0, 1.0) if data else log_step), step.floor)

    for x in X:
        _, rho, active, start, _, _ = step.plan()
        new_mean = mean + rho * (x - mean)
        d_new = x - new_mean
        s, u, dsq_sum = np.zeros((k, k)), np.zeros(k), 0.0
        if not active:
            if data:
                psi = psi + rho * (d_new**2 - psi)  # ψ's storage holds the running d̄² during warm-up
                dsq_sum = float(psi.sum())
        else:
            if start:
                f, psi = f * np.sqrt(step.scale_sq), np.maximum(psi, step.floor)
            f, psi = gradient_step(f, psi)
            y = f / psi[:, None]
            s, u = y.T @ f, y.T @ d_new
        step.apply(s, u, dsq_sum, d)
        mean, d_last = new_mean, d_new
    return gradient_step(f, psi)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_numpy_row_store_driving_the_step_is_the_rust_model(rule: str) -> None:
    d, k = 25, 3
    X = stream(150, d, 1)
    init = _core.orthonormal_init(d, k, 4)
    step = _core.OnlineSGAStep(d, k, dtype="float64", **RULES[rule], **COMMON)
    f, psi = numpy_rows(step, init, X)
    lr = "auto" if RULES[rule]["rule"] == "whitened" else RULES[rule]["lr"]
    rust = onlinefa.OnlineSGA(d, k, init=init, lr=lr, scaling=RULES[rule]["scaling"], **COMMON).update(X)
    assert step.n_seen == rust.n_seen == 150 and step.is_fitted
    cov, rust_cov = f @ f.T + np.diag(psi), rust.loadings @ rust.loadings.T + np.diag(rust.noise_variance)
    assert np.abs(cov - rust_cov).max() < 1e-10 * np.abs(rust_cov).max()
    rust_state = rust.__getstate__()["state"]
    np.testing.assert_allclose(step.pending()[1], rust_state["pending_p"], rtol=1e-9, atol=1e-12)


def fitted_step() -> Any:
    d, k = 25, 3
    step = _core.OnlineSGAStep(d, k, dtype="float32", **RULES["Algorithm 1"], **COMMON)
    numpy_rows(step, _core.orthonormal_init(d, k, 4), stream(30, d, 2))
    return step


@pytest.mark.parametrize("sums", [
    pytest.param(lambda k: (np.full((k, k), np.nan), np.zeros(k), 0.0), id="NaN S"),
    pytest.param(lambda k: (-2.0 * np.eye(k), np.zeros(k), 0.0), id="I + S not positive definite"),
    pytest.param(lambda k: (np.eye(k), np.zeros(k), 1.0), id="a row's psi step diverged"),
    pytest.param(lambda k: (np.eye(k), np.full(k, 1e160), 0.0), id="latent moment beyond the bound"),
])
def test_bad_sums_raise_and_change_nothing(sums: Any) -> None:
    step = fitted_step()
    before = step.get_state()
    s, u, count = sums(3)
    with pytest.raises(NumericalBreakdownError):
        step.apply(s, u, count, 25)
    assert same_state(step.get_state(), before)
    with pytest.raises(ValueError):
        step.apply(np.eye(2), np.zeros(2), 0.0, 25)
    assert same_state(step.get_state(), before)


def test_the_configuration_and_restored_states_are_checked() -> None:
    with pytest.raises(ValueError, match="rule"):
        _core.OnlineSGAStep(25, 3, dtype="float64", **{**RULES["Algorithm 1"], "rule": "whitened"}, **COMMON)
    with pytest.raises(ValueError, match="lr"):
        _core.OnlineSGAStep(25, 3, dtype="float64", **{**RULES["Algorithm 1"], "lr": -1.0}, **COMMON)
    step = fitted_step()
    state = step.get_state()
    again = _core.OnlineSGAStep.from_state(state, 25, "float32")
    assert same_state(again.get_state(), state)
    twin = step.copy()
    twin.drop_pending()
    assert step.pending() is not None and twin.pending() is None
    with pytest.raises(ValueError, match="pending_p"):
        _core.OnlineSGAStep.from_state(dict(state, pending_p=-np.eye(3)), 25, "float32")
