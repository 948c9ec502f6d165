"""``_core.OnlineEMStep``, the K×K part of online EM that row stores written outside Rust drive.

A NumPy transcription of the row pass (lines 5, 6, 12, 14, 4.33, 4.35 of Algorithm 2), driving the Rust step
with its sums, must be the Rust ``OnlineEM``; bad sums must leave the step as it was.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import NumericalBreakdownError, _core
from engine_state import same_state

CONFIG: dict[str, Any] = {"n_warmup": 12, "noise_floor": 1e-6, "schedule": "harmonic", "tau0": 0.0, "kappa": 1.0,
                          "rho": 1.0, "scaling": "data", "shrink": False}


def stream(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((d, 3)) * np.linspace(0.5, 2.0, d)[:, None]
    return rng.standard_normal((n, 3)) @ factors.T + 0.3 * rng.standard_normal((n, d)) + np.arange(d)


def numpy_rows(step: Any, init: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drive ``step`` with a NumPy row store over ``X``; returns the fitted (mean, F, ψ) after the last row."""
    d, k = init.shape
    mean, a_bar, dsq, d_last = np.zeros(d), np.zeros((d, k)), np.zeros(d), np.zeros(d)

    def apply_pending(a: np.ndarray) -> np.ndarray:
        pending = step.pending()
        if pending is None:
            return a
        rho_p, m, w = pending
        a = (1.0 - rho_p) * a + rho_p * np.outer(d_last, m)
        return a if w is None else a @ w

    def loadings(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        basis, h_inv = step.basis()
        if basis == "initial":
            scale = step.warmup_scale
            return init * scale, np.full(d, scale * scale)
        f = a if h_inv is None else a @ h_inv
        return f, np.maximum(dsq - np.einsum("ij,ij->i", f, a), step.floor)

    for x in X:
        _, rho, mean_rho = step.rates()
        a_bar = apply_pending(a_bar)
        step.drop_pending()
        f, psi = loadings(a_bar)
        e = x - mean
        new_mean, d_new = mean + mean_rho * e, e - mean_rho * e
        new_dsq = dsq + rho * (d_new * d_new - dsq)
        y = f / psi[:, None]
        step.apply(y.T @ f, y.T @ d_new, float(new_dsq.sum()), d)
        mean, dsq, d_last = new_mean, new_dsq, d_new
    f, psi = loadings(apply_pending(a_bar))
    return mean, f, psi


@pytest.mark.parametrize("whiten", [True, False])
def test_a_numpy_row_store_driving_the_step_is_the_rust_model(whiten: bool) -> None:
    d, k = 25, 3
    X = stream(200, d, 1)
    init = _core.orthonormal_init(d, k, 4)
    step = _core.OnlineEMStep(d, k, dtype="float64", whiten=whiten, **CONFIG)
    mean, f, psi = numpy_rows(step, init, X)
    rust = onlinefa.OnlineEM(d, k, init=init, whiten=whiten, **CONFIG).update(X)
    assert step.n_seen == rust.n_seen == 200 and step.is_fitted
    np.testing.assert_allclose(mean, rust.mean, rtol=1e-12)
    cov, rust_cov = f @ f.T + np.diag(psi), rust.loadings @ rust.loadings.T + np.diag(rust.noise_variance)
    assert np.abs(cov - rust_cov).max() < 1e-10 * np.abs(rust_cov).max()
    # the K×K state is the Rust model's, entry for entry
    rust_state = rust.__getstate__()["state"]
    np.testing.assert_allclose(step.b_bar(), rust_state["b_bar"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(step.sigma(), rust_state["sigma"], rtol=1e-9, atol=1e-12)


def fitted_step(dtype: str = "float64") -> Any:
    d, k = 25, 3
    step = _core.OnlineEMStep(d, k, dtype=dtype, whiten=True, **CONFIG)
    numpy_rows(step, _core.orthonormal_init(d, k, 4), stream(40, d, 2))
    return step


@pytest.mark.parametrize("sums", [
    pytest.param(lambda k: (np.full((k, k), np.nan), np.zeros(k), 1.0), id="NaN S"),
    pytest.param(lambda k: (-2.0 * np.eye(k), np.zeros(k), 1.0), id="I + S not positive definite"),
    pytest.param(lambda k: (np.eye(k), np.zeros(k), np.inf), id="infinite dsq sum"),
    pytest.param(lambda k: (np.eye(k), np.full(k, 1e300), 1.0), id="latent mean beyond the dtype"),
])
def test_bad_sums_raise_and_change_nothing(sums: Any) -> None:
    step = fitted_step()
    before = step.get_state()
    s, u, dsq_sum = sums(3)
    with pytest.raises(NumericalBreakdownError):
        step.apply(s, u, dsq_sum, 25)
    assert same_state(step.get_state(), before)


@pytest.mark.parametrize("call, error", [
    (lambda s: s.apply(np.eye(2), np.zeros(3), 1.0, 25), ValueError),
    (lambda s: s.apply(np.eye(3), np.zeros(3), 1.0, 0), ValueError),
])
def test_malformed_sums_are_refused(call: Any, error: type[Exception]) -> None:
    step = fitted_step()
    before = step.get_state()
    with pytest.raises(error):
        call(step)
    assert same_state(step.get_state(), before)


def test_the_configuration_is_checked() -> None:
    with pytest.raises(ValueError, match="dtype"):
        _core.OnlineEMStep(25, 3, dtype="float16", whiten=True, **CONFIG)
    with pytest.raises(ValueError, match="n_components"):
        _core.OnlineEMStep(3, 3, dtype="float64", whiten=True, **CONFIG)
    with pytest.raises(ValueError, match="noise_floor"):
        _core.OnlineEMStep(25, 3, dtype="float32", whiten=True, **{**CONFIG, "noise_floor": 1e-40})


def test_state_round_trip_and_copies_are_independent() -> None:
    step = fitted_step("float32")
    state = step.get_state()
    again = _core.OnlineEMStep.from_state(state, 25, "float32")
    assert same_state(again.get_state(), state) and again.dtype == "float32"
    twin = step.copy()
    twin.drop_pending()
    assert step.pending() is not None and twin.pending() is None
    broken = dict(state, b_bar=np.full((3, 3), np.nan))
    with pytest.raises(ValueError, match="b_bar"):
        _core.OnlineEMStep.from_state(broken, 25, "float32")


def test_the_warm_up_can_be_ended_early_without_changing_the_step() -> None:
    d, k = 25, 3
    step = _core.OnlineEMStep(d, k, dtype="float64", whiten=True, **{**CONFIG, "n_warmup": 100})
    with pytest.raises(RuntimeError, match="two distinct samples"):
        step.ended_warmup()
    numpy_rows(step, _core.orthonormal_init(d, k, 4), stream(10, d, 3))
    before = step.get_state()
    ended = step.ended_warmup()
    assert ended.is_fitted and not step.is_fitted and ended.basis()[0] == "whitened"
    assert same_state(step.get_state(), before)
