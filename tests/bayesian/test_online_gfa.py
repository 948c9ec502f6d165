"""onlinefa.OnlineGFA: one full batch is one batch sweep, a stream converges to the batch GFA's activity
pattern and noise precisions, and bad input leaves the model exactly as it was."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa import _core
from test_gfa import synthetic

SIZES = [10, 15, 20]


def columns(activity: Any, threshold: float = 0.02) -> list[tuple[int, ...]]:
    """The active groups of each factor that is active somewhere, sorted (factor order is arbitrary)."""
    active = (np.asarray(activity) > threshold).astype(int).T
    return sorted(tuple(c) for c in active if c.any())


def stream(est: onlinefa.OnlineGFA, x: Any, passes: int, batch: int = 100) -> onlinefa.OnlineGFA:
    for _ in range(passes):
        for start in range(0, x.shape[0], batch):
            est.partial_fit(x[start : start + batch])
    return est


def test_one_batch_with_the_harmonic_step_is_one_batch_sweep() -> None:
    # rho_1 = 1 and N_eff = N: the global rebuild sees exactly the statistics of the batch model's first
    # q(H) update, so every global factor equals GFA's after one sweep (same seed, no dropping). Without
    # the rotation: its numerical maximiser turns 1e-16 input differences into ~1e-4 ones.
    x, _, _, _ = synthetic(0, n=200)
    online = onlinefa.OnlineGFA(5, SIZES, random_state=3, batch_size=200, rotate=False).fit(x)
    batch = onlinefa.GFA(5, SIZES, random_state=3, max_iter=1, drop_factors=False, rotate=False).fit(x)
    for name in ("components_", "mean_", "noise_precision_", "alpha_"):
        np.testing.assert_allclose(getattr(online, name), getattr(batch, name), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(online.transform(x[:7]), batch.transform(x[:7]), rtol=1e-8, atol=1e-9)
    assert online.n_samples_seen_ == 200 and online.n_batches_seen_ == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stream_converges_to_the_batch_fit(seed: int) -> None:
    # 3 passes over N = 3000 rows in batches of 100 with rho_t = t^-0.7 and N_eff = N. Measured: E[tau_m]
    # within 0.5% of the batch fit's on these seeds; the bound 2% is 4x that, and a single pass with the
    # harmonic step (statistics of the first, poorly fitted batches kept forever) is 5-14% off, so a
    # broken step or rebuild cannot pass. Sampling error of tau_m itself is ~1% (>= 30000 residuals).
    x, _, pattern, taus = synthetic(seed, n=3000)
    batch = onlinefa.GFA(6, SIZES, random_state=0).fit(x)
    online = onlinefa.OnlineGFA(6, SIZES, random_state=0, schedule="power", kappa=0.7, n_effective=3000)
    stream(online, x, passes=3)
    np.testing.assert_allclose(online.noise_precision_, batch.noise_precision_, rtol=0.02)
    np.testing.assert_allclose(online.noise_precision_, taus, rtol=0.05)
    assert columns(online.activity_) == columns(batch.activity_) == columns(pattern, 0.5)
    assert online.n_components_ == 6  # nothing dropped; the extra factors are inactive everywhere
    assert online.n_samples_seen_ == 9000 and online.n_batches_seen_ == 90


def snapshot(est: onlinefa.OnlineGFA) -> list[Any]:
    return [est.components_.copy(), est.noise_precision_.copy(), est.alpha_.copy(), est.mean_.copy(),
            est.latent_second_moment().copy(), est.n_samples_seen_, est.n_batches_seen_]  # fmt: skip


def test_bad_input_leaves_the_model_unchanged() -> None:
    x, _, _, _ = synthetic(4, n=400)
    est = onlinefa.OnlineGFA(4, SIZES, random_state=1)
    with pytest.raises(ValueError, match="at least n_components"):
        est.partial_fit(x[:3])
    assert not est.__sklearn_is_fitted__()
    est.partial_fit(x[:100])
    reference = onlinefa.OnlineGFA(4, SIZES, random_state=1).partial_fit(x[:100])
    before = snapshot(est)
    nan_rows = x[100:200].copy()
    nan_rows[5, 3] = np.nan
    bad_inputs: list[Any] = [nan_rows, x[100:200, :-1], x[100:100], np.full((3, 45), np.inf)]
    for bad in bad_inputs:
        with pytest.raises(ValueError):
            est.partial_fit(bad)
        for a, b in zip(snapshot(est), before, strict=True):
            np.testing.assert_array_equal(a, b)
    for model in (est, reference):  # the refused batches left no trace: both continue identically
        model.partial_fit(x[100:200])
    for a, b in zip(snapshot(est), snapshot(reference), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_hyper_parameters_are_refused_before_any_state() -> None:
    x, _, _, _ = synthetic(0, n=100)
    for kw in ({"schedule": "bogus"}, {"kappa": 0.2, "schedule": "power"}, {"n_effective": -1.0}, {"groups": [10, 10]}):
        est = onlinefa.OnlineGFA(4, **{"groups": SIZES, **kw})
        with pytest.raises(ValueError):
            est.partial_fit(x)
        assert not est.__sklearn_is_fitted__()


def test_no_lower_bound_for_a_stream() -> None:
    x, _, _, _ = synthetic(0, n=100)
    est = onlinefa.OnlineGFA(3, SIZES).fit(x)
    with pytest.raises(TypeError, match="lower bound"):
        est.lower_bound()


def test_pickle_save_and_load_continue_the_stream_bit_identically(tmp_path: Any) -> None:
    x, _, _, _ = synthetic(5, n=300)
    est = onlinefa.OnlineGFA(4, ["a"] * 10 + ["b"] * 15 + ["c"] * 20, random_state=2, schedule="power")
    stream(est, x[:200], passes=1)
    path = tmp_path / "online.npz"
    est.save(path)
    copies = [pickle.loads(pickle.dumps(est)), onlinefa.OnlineGFA.load(path), onlinefa.load(path)]
    for model in [est, *copies]:
        model.partial_fit(x[200:])
    for model in copies:
        assert isinstance(model, onlinefa.OnlineGFA) and model.get_params() == est.get_params()
        assert model.group_labels_ == ["a", "b", "c"]
        for a, b in zip(snapshot(model), snapshot(est), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(model.predict_group(x[:5], "b"), est.predict_group(x[:5], "b"))
    unfitted = pickle.loads(pickle.dumps(onlinefa.OnlineGFA(3, SIZES)))
    assert unfitted.get_params() == onlinefa.OnlineGFA(3, SIZES).get_params()


def test_inconsistent_stream_state_is_refused() -> None:
    x, _, _, _ = synthetic(0, n=100)
    state = onlinefa.OnlineGFA(3, SIZES).fit(x)._online.get_state()
    for key, value in (("n_batches", 0), ("schedule", "weekly"), ("n_effective", -3.0), ("avg_total_gram", np.ones((2, 2)))):
        with pytest.raises(ValueError):
            _core.OnlineGFACore.from_state({**state, key: value})
