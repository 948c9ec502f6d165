"""Queries (``log_prob``, ``transform``, ``sample``) read one consistent state and stream over it in the core.

* They equal the NumPy transcription of the Woodbury / determinant-lemma formulas (``onlinefa._gaussian``)
  on the model's snapshot, for every model family and storage dtype.
* Their peak extra memory is a small fraction of the model's state (they used to copy the loadings to
  float64 several times: 3–5 × the state).
* While another thread updates the model, every answer is that of a state the model was actually in.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import _gaussian

D, K = 40, 3
ROWS = np.random.default_rng(0).standard_normal((60, D)) @ np.diag(np.linspace(0.5, 3.0, D)) + 2.0
X = np.random.default_rng(1).standard_normal((7, D)) * 2.0


def _vifa(dtype: str = "float64", d: int = D) -> onlinefa.VIFA:
    vi = onlinefa.VIFA(d, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=0,
                       dtype=dtype)
    grad = np.linspace(-1.0, 1.0, d)
    for _ in range(5):
        vi.sample()
        vi.step(grad)
    return vi


def _models() -> dict[str, Any]:
    models: dict[str, Any] = {}
    for dtype in ("float64", "float32"):
        models[f"OnlineEM-{dtype}"] = onlinefa.OnlineEM(D, K, seed=0, dtype=dtype).update(ROWS)
        models[f"OnlineEM-unwhitened-{dtype}"] = onlinefa.OnlineEM.algorithm2(D, K, n_warmup=5, seed=0, dtype=dtype).update(ROWS)
        models[f"OnlineSGA-{dtype}"] = onlinefa.OnlineSGA(D, K, seed=0, dtype=dtype).update(ROWS)
        models[f"VIFA-{dtype}"] = _vifa(dtype)
    return models


MODELS = _models()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_queries_equal_the_numpy_formulas_on_the_snapshot(name: str) -> None:
    model = MODELS[name]
    mean, loadings, psi = model.snapshot()
    # log p = −½(D log 2π + log|Σ| + rᵀΨ⁻¹r − ‖L⁻¹FᵀΨ⁻¹r‖²): the last two terms cancel, and the second
    # goes through M = I + FᵀΨ⁻¹F, so two correct summation orders differ by up to ~ε·cond(M) relative to
    # the size of those terms (cond(M) ~ 5e9 for the float32 model whose constant-ish feature sits on the
    # noise floor, where both orders are ~1e-6 from a 50-digit evaluation).
    scale = np.sum((X - mean) ** 2 / psi, axis=1) + np.sum(np.abs(np.log(psi))) + D * np.log(2 * np.pi)
    condition = np.linalg.cond(np.eye(K) + loadings.T @ (loadings / psi[:, None]))
    difference = model.log_prob(X) - _gaussian.log_prob(X, mean, loadings, psi)
    assert np.all(np.abs(difference) <= 10 * np.finfo(np.float64).eps * condition * scale)
    expected_latents = _gaussian.latent_mean(X, mean, loadings, psi)  # M⁻¹ b: error ~ ε·cond(M)·|M⁻¹ b|
    tolerance = 10 * np.finfo(np.float64).eps * condition * np.max(np.abs(expected_latents))
    np.testing.assert_allclose(model.transform(X), expected_latents, rtol=0, atol=tolerance)
    expected = _gaussian.draw(5, mean, loadings, psi, 3)
    np.testing.assert_allclose(model.sample(5, seed=3), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["OnlineEM-float64", "VIFA-float32"])
def test_float32_samples_have_the_model_distribution(name: str) -> None:
    # 20,000 float32 draws: the sample mean is within 5 standard errors of c in every coordinate.
    model = MODELS[name]
    mean, loadings, psi = model.snapshot()
    draws = model.sample(20_000, seed=5, dtype=np.float32)
    assert draws.dtype == np.float32
    standard_error = np.sqrt((np.sum(loadings**2, axis=1) + psi) / draws.shape[0])
    assert np.all(np.abs(draws.mean(axis=0, dtype=np.float64) - mean) < 5 * standard_error)
    assert model.sample(0).shape == (0, D)


def test_queries_before_a_first_fit_raise_not_fitted() -> None:
    model = onlinefa.OnlineEM(D, K, seed=0).update(ROWS[:1])  # one sample: nothing to fit yet
    for query in (lambda: model.log_prob(X), lambda: model.transform(X), lambda: model.sample(1)):
        with pytest.raises(onlinefa.NotFittedError):
            query()


MEMORY_CHILD = Path(__file__).resolve().parents[2] / "benches" / "query_memory.py"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists() or not MEMORY_CHILD.exists(), reason="Linux /proc")
@pytest.mark.parametrize("model", ["OnlineEM", "VIFA"])
@pytest.mark.slow
def test_query_peak_memory_is_a_fraction_of_the_state(model: str) -> None:
    # D = 400,000, K = 10, float32: the state is ~22 MB; a one-row query needs its float64 input row and
    # result (3.2 MB) plus K-sized sums. The previous NumPy path needed 2.7-4.9 x the state.
    sys.path.insert(0, str(MEMORY_CHILD.parent))
    try:
        from query_memory import measure
    finally:
        sys.path.pop(0)
    for query in ("log_prob(1 row)", "transform(1 row)", "sample(1)"):
        result = measure(model, query, 400_000, 10)
        assert result["extra"] < 0.5 * result["state"], (query, result)


@pytest.mark.slow
def test_vifa_queries_read_one_consistent_state_during_steps() -> None:
    # Every answer read while another thread steps must equal the answer of one of the states the model
    # passed through; those are recorded by replaying the same deterministic steps on a twin model. A short
    # GIL switch interval makes the threads interleave within a query (the previous implementation read
    # mean, loadings and noise variances in three calls and mixed states).
    d, n_steps = 100_000, 150
    grads = np.random.default_rng(2).standard_normal((n_steps, d))
    query = np.random.default_rng(3).standard_normal((1, d))

    def fresh() -> onlinefa.VIFA:
        return onlinefa.VIFA(d, K, prior_precision=1.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2, seed=0)

    twin = fresh()
    reachable = [twin.log_prob(query)[0]]
    for grad in grads:
        twin.sample()
        twin.step(grad)
        reachable.append(twin.log_prob(query)[0])

    model = fresh()
    done = threading.Event()

    def steps() -> None:
        try:
            for grad in grads:
                model.sample()
                model.step(grad)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    answers: list[float] = []
    stepper = threading.Thread(target=steps)
    try:
        stepper.start()
        while not done.is_set():
            answers.append(float(model.log_prob(query)[0]))
    finally:
        stepper.join()
        sys.setswitchinterval(interval)
    states = np.array(reachable)
    assert answers
    for answer in answers:
        assert np.min(np.abs(states - answer)) <= 1e-9 * abs(answer), answer


def test_estimator_transform_reads_one_state_during_partial_fit() -> None:
    d = 3000
    rng = np.random.default_rng(4)
    batches = [rng.standard_normal((4, d)) * 3.0 for _ in range(25)]
    query = rng.standard_normal((1, d))
    twin = onlinefa.OnlineFactorAnalysis(n_components=K, random_state=0, n_warmup=3)
    reachable = []
    for batch in batches:
        twin.partial_fit(batch)
        reachable.append(twin.transform(query)[0])
    fa = onlinefa.OnlineFactorAnalysis(n_components=K, random_state=0, n_warmup=3).partial_fit(batches[0])
    answers: list[np.ndarray] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            answers.append(fa.transform(query)[0])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for batch in batches[1:]:
            fa.partial_fit(batch)
    finally:
        done.set()
        reader.join()
    states = np.array(reachable)
    for answer in answers:
        distance = np.min(np.max(np.abs(states - answer), axis=1))
        assert distance <= 1e-9 * np.max(np.abs(answer)), answer


@pytest.mark.parametrize("kind", ["VBFA", "GFA", "OnlineGFA", "OnlineVBFA"])
def test_dense_covariance_of_the_bayesian_models_is_guarded(kind: str) -> None:
    """Every get_covariance refuses D > 5000, as OnlineFactorAnalysis and covariance() do, before any D×D
    allocation (the guard is read from the fitted width only)."""
    from onlinefa._gaussian import MAX_DENSE_FEATURES

    n_features = MAX_DENSE_FEATURES + 1
    X = np.random.default_rng(0).standard_normal((12, n_features))
    options: dict[str, Any] = {"n_components": 2, "random_state": 0}
    if kind in ("GFA", "OnlineGFA"):
        options["groups"] = [n_features - 1, 1]
    options.update({"max_iter": 2} if kind in ("GFA", "VBFA") else {"batch_size": 12})
    model = getattr(onlinefa, kind)(**options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X)
    with pytest.raises(ValueError, match=f"dense {n_features}x{n_features} matrix; the limit is 5000"):
        model.get_covariance()
