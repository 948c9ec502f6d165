"""Pickles and checkpoints of onlinefa.GFA: bit-exact predictions after a round trip, continued sweeps equal
to an uninterrupted engine, and refusal of damaged or inconsistent files."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from onlinefa import _core
from onlinefa.checkpoint import load_state, save_state
from onlinefa.gfa import GFA

FloatArray = npt.NDArray[np.float64]


def data(seed: int = 0, missing: float = 0.1) -> FloatArray:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((80, 3))
    x = z @ rng.standard_normal((3, 12)) + 0.3 * rng.standard_normal((80, 12))
    x[rng.random(x.shape) < missing] = np.nan
    return x


def fitted(**kw: Any) -> GFA:
    params: dict[str, Any] = dict(groups=["a"] * 5 + ["b"] * 7, random_state=1, max_iter=30)
    params.update(kw)
    return GFA(4, **params).fit(data())


def queries(est: GFA) -> list[Any]:
    x = data(seed=9, missing=0.2)
    return [
        est.transform(x), est.predict_group(x, "b", return_var=True), est.score_samples(x), est.lower_bound(),
        est.components_, est.noise_variance_, est.alpha_, est.activity_, est.elbo_, est.kept_components_,
    ]  # fmt: skip


def assert_identical(a: list[Any], b: list[Any]) -> None:
    for u, v in zip(a, b, strict=True):
        if isinstance(u, tuple):
            assert_identical(list(u), list(v))
        else:
            np.testing.assert_array_equal(u, v)  # bit-exact, no tolerance


@pytest.mark.parametrize("kw", [{}, {"noise": "feature", "ard_rank": 1}, {"rotate": False, "drop_factors": False}])
def test_pickle_and_deepcopy_predict_bit_identically(kw: dict[str, Any]) -> None:
    est = fitted(**kw)
    before = queries(est)
    for back in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert back.get_params() == est.get_params()
        assert back.group_labels_ == ["a", "b"]
        assert_identical(queries(back), before)
    assert_identical(queries(est), before)  # pickling does not disturb the original


def test_save_load_round_trip(tmp_path: Path) -> None:
    est = fitted(noise="feature")
    path = tmp_path / "gfa.npz"
    est.save(path)
    for back in (GFA.load(path), onlinefa.load(path)):
        assert isinstance(back, GFA)
        assert back.get_params() == est.get_params()
        assert_identical(queries(back), queries(est))
    GFA(3, groups=2).save(path)  # an unfitted estimator keeps only its hyper-parameters
    assert not onlinefa.load(path).__sklearn_is_fitted__()


def test_restored_engine_continues_like_the_original() -> None:
    est = fitted(max_iter=5)
    engine = est._core
    restored = _core.GFACore.from_state(engine.get_state())
    for e in (engine, restored):
        for _ in range(3):
            e.sweep()
    np.testing.assert_array_equal(restored.loading_mean(), engine.loading_mean())
    assert restored.elbo() == engine.elbo()


def test_save_refuses_a_random_state_object(tmp_path: Path) -> None:
    est = fitted(random_state=np.random.RandomState(0))
    with pytest.raises(TypeError, match="random_state"):
        est.save(tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()
    assert_identical(queries(pickle.loads(pickle.dumps(est))), queries(est))  # pickling still works


@pytest.mark.parametrize(
    "key, value",
    [
        ("engine.tau_rate", lambda v: -v),
        ("engine.f_cov", lambda v: v + np.arange(v.size).reshape(v.shape)),  # no longer symmetric
        ("engine.kept", lambda v: v + 50.0),
        ("engine.groups", lambda v: v * 0.5),
        ("engine.x", lambda v: v[:-1]),
        ("group_labels", lambda v: '["a"]'),
    ],
)
def test_inconsistent_checkpoints_are_refused(tmp_path: Path, key: str, value: Any) -> None:
    path = tmp_path / "gfa.npz"
    fitted().save(path)
    state = load_state(path, "GFA")
    state[key] = value(state[key])
    save_state(path, "GFA", state)  # a valid file (fresh digest) holding an impossible model
    with pytest.raises(ValueError, match="not a valid GFA checkpoint"):
        GFA.load(path)


def test_bad_engine_state_leaves_nothing_half_built() -> None:
    state = fitted()._core.get_state()
    del state["c_mean"]
    with pytest.raises(ValueError, match="c_mean"):
        _core.GFACore.from_state(state)
    est = fitted()
    payload = est.__getstate__()
    payload["_engine_state"] = state
    fresh = GFA.__new__(GFA)
    with pytest.raises(ValueError):
        fresh.__setstate__(payload)
    assert fresh.__dict__ == {}
