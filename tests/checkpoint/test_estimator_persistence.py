"""One persistence implementation for the estimators that wrap a Rust engine (``_persist.EstimatorPersistMixin``).

Every estimator family's pickle and checkpoint round trip is bit-identical (queries, the state written
again, further updates); new checkpoints store hyper-parameters as ``param.<name>`` entries (a GFA
``groups`` sequence as JSON text in ``param.groups.json``); and GFA checkpoints of the first layout (all
hyper-parameters as one JSON entry ``params``), built here by hand with ``save_state``, still load and
predict exactly as the estimator that was saved.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import onlinefa
from onlinefa.checkpoint import load_state, save_state

FloatArray = npt.NDArray[np.float64]
D = 9


def rows(n: int = 90, seed: int = 0) -> FloatArray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2)) @ rng.standard_normal((2, D)) + 0.3 * rng.standard_normal((n, D)) + 1.0


def fitted(kind: str) -> Any:
    x = rows()
    labels = ["b"] * 4 + ["a"] * 5  # labels, not sizes: group 0 is "a", the later features
    if kind == "VBFA":
        return onlinefa.VBFA(3, max_iter=20, random_state=4).fit(x)
    if kind == "OnlineVBFA":
        return onlinefa.OnlineVBFA(3, random_state=4, schedule="power").partial_fit(x[:40]).partial_fit(x[40:])
    if kind == "GFA":
        return onlinefa.GFA(3, labels, random_state=1, max_iter=25, noise="feature").fit(x)
    if kind == "GFA:sizes":
        return onlinefa.GFA(3, (4, 5), random_state=1, max_iter=25).fit(x)
    if kind == "GFA:int":
        return onlinefa.GFA(3, 2, random_state=1, max_iter=25).fit(x)
    if kind == "OnlineGFA":
        return onlinefa.OnlineGFA(3, labels, random_state=2, batch_size=30).fit(x)
    if kind == "OnlineFactorAnalysis":
        return onlinefa.OnlineFactorAnalysis(3, random_state=0).fit(x)
    raise AssertionError(kind)


KINDS = ["VBFA", "OnlineVBFA", "GFA", "GFA:sizes", "GFA:int", "OnlineGFA", "OnlineFactorAnalysis"]


def answers(model: Any) -> list[bytes]:
    x = rows(12, seed=5)
    out = [model.transform(x), model.score_samples(x), model.get_covariance(), model.components_]
    if isinstance(model, onlinefa.GFA):
        out += [model.predict_group(x, model.group_labels_[0]), model.alpha_, np.asarray(model.group_index_)]
    return [np.ascontiguousarray(a).tobytes() for a in out]


def plain(params: dict[str, Any]) -> dict[str, Any]:
    """Hyper-parameters as a checkpoint returns them: a sequence (GFA's ``groups``) as a list."""
    return {k: list(v) if isinstance(v, (tuple, np.ndarray)) else v for k, v in params.items()}


def same_state(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert sorted(left) == sorted(right)
    for key, value in left.items():
        other = right[key]
        assert type(value) is type(other), key
        if isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and value.shape == other.shape, key
            assert value.tobytes() == other.tobytes(), key
        else:
            assert value == other, key


def continue_fitting(model: Any) -> list[bytes]:
    """One more update of an online model (a batch model is only queried again)."""
    if hasattr(model, "partial_fit"):
        model.partial_fit(rows(30, seed=8))
    return answers(model)


@pytest.mark.parametrize("kind", KINDS)
def test_every_family_round_trips_exactly(kind: str, tmp_path: Path) -> None:
    model = fitted(kind)
    before = answers(model)
    path, again = tmp_path / "first.ckpt", tmp_path / "second.ckpt"
    model.save(path)
    cls = type(model)
    copies = [pickle.loads(pickle.dumps(model)), copy.deepcopy(model), cls.load(path), onlinefa.load(path)]
    expected_next = continue_fitting(copy.deepcopy(model))
    for back in copies:
        assert type(back) is cls
        assert plain(back.get_params()) == plain(model.get_params())
        assert answers(back) == before
        if isinstance(model, onlinefa.GFA):
            assert back.group_labels_ == model.group_labels_
    cls.load(path).save(again)  # the loaded estimator writes the same state, bit for bit
    same_state(load_state(again, cls.__name__), load_state(path, cls.__name__))
    assert continue_fitting(cls.load(path)) == expected_next
    assert continue_fitting(pickle.loads(pickle.dumps(model))) == expected_next


@pytest.mark.parametrize("kind", KINDS)
def test_new_checkpoints_store_hyper_parameters_as_param_entries(kind: str, tmp_path: Path) -> None:
    model = fitted(kind)
    model.save(tmp_path / "m.ckpt")
    state = load_state(tmp_path / "m.ckpt", type(model).__name__)
    assert "params" not in state
    stored = {key.removeprefix("param.") for key in state if key.startswith("param.")}
    names = set(model.get_params())
    if isinstance(model, onlinefa.GFA) and not isinstance(model.groups, int):
        assert stored == names - {"groups"} | {"groups.json"}
        assert json.loads(state["param.groups.json"]) == list(model.groups)
    else:
        assert stored == names
        for name, value in model.get_params().items():
            assert state[f"param.{name}"] == value, name


def legacy_gfa_state(model: onlinefa.GFA, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """``model``'s checkpoint in the first GFA layout: one JSON object ``params``, labels as JSON, engine."""
    params = {k: v for k, v in model.get_params().items() if k not in drop}
    state: dict[str, Any] = {"params": json.dumps(params, sort_keys=True)}
    engine = model.__dict__.get(model._engine_attribute)
    if engine is not None:
        state["group_labels"] = json.dumps(model.group_labels_)
        state.update({f"engine.{key}": value for key, value in engine.get_state().items()})
    return state


@pytest.mark.parametrize("kind", ["GFA", "GFA:sizes", "GFA:int", "OnlineGFA"])
def test_checkpoints_of_the_first_gfa_layout_still_load_exactly(kind: str, tmp_path: Path) -> None:
    model = fitted(kind)
    path = tmp_path / "old.ckpt"
    name = type(model).__name__
    save_state(path, name, legacy_gfa_state(model))
    for back in (type(model).load(path), onlinefa.load(path)):
        assert type(back) is type(model)
        assert answers(back) == answers(model)
        assert back.group_labels_ == model.group_labels_
        assert back.get_params() == plain(model.get_params())  # JSON has lists only, then as now
    assert continue_fitting(type(model).load(path)) == continue_fitting(copy.deepcopy(model))
    # Written again, it is in the current layout and holds the same engine and labels.
    type(model).load(path).save(tmp_path / "new.ckpt")
    new, old = load_state(tmp_path / "new.ckpt", name), load_state(path, name)
    assert "params" not in new
    same_state({k: v for k, v in new.items() if not k.startswith("param.")},
               {k: v for k, v in old.items() if k != "params"})  # fmt: skip


def test_a_first_layout_gfa_file_without_later_hyper_parameters_takes_their_defaults(tmp_path: Path) -> None:
    # GFA checkpoints were written before bound_pruning existed; the old loader passed the stored JSON to
    # the constructor, so the missing value was its default. That still holds.
    model = fitted("GFA")
    save_state(tmp_path / "old.ckpt", "GFA", legacy_gfa_state(model, drop=("bound_pruning",)))
    back = onlinefa.GFA.load(tmp_path / "old.ckpt")
    assert back.bound_pruning is True and answers(back) == answers(model)
    unfitted = onlinefa.GFA(2, groups=[3, 6], ard_rank=1)
    save_state(tmp_path / "unfitted.ckpt", "GFA", legacy_gfa_state(unfitted))
    back = onlinefa.load(tmp_path / "unfitted.ckpt")
    assert not back.__sklearn_is_fitted__() and back.get_params() == unfitted.get_params()


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: {**s, "params": json.dumps({"no_such_parameter": 1})},
        lambda s: {**s, "params": "[1, 2]"},
        lambda s: {**s, "params": "{not json"},
        lambda s: {**s, "param.noise": "group"},  # both layouts at once
        lambda s: {**s, "group_labels": '["a", "b", "c"]'},
    ],
)
def test_broken_first_layout_files_are_refused(edit: Any, tmp_path: Path) -> None:
    path = tmp_path / "old.ckpt"
    save_state(path, "GFA", edit(legacy_gfa_state(fitted("GFA"))))
    with pytest.raises(ValueError, match=r"old\.ckpt.* is not a valid GFA checkpoint"):
        onlinefa.load(path)


@pytest.mark.parametrize(
    "kind, edit",
    [
        ("GFA", lambda s: {**s, "param.groups": "ab"}),  # stored twice, plainly and as JSON
        ("GFA", lambda s: {**s, "param.groups.json": "[1,"}),
        ("GFA", lambda s: {**s, "param.groups.json": 3}),
        ("GFA", lambda s: {k: v for k, v in s.items() if k != "param.bound_pruning"}),  # current layout: strict
        ("VBFA", lambda s: {k: v for k, v in s.items() if k != "param.tol"}),
        ("OnlineVBFA", lambda s: {**s, "param.rho.json": "0.5"}),
    ],
)
def test_broken_param_entries_are_refused(kind: str, edit: Any, tmp_path: Path) -> None:
    model = fitted(kind)
    path = tmp_path / "m.ckpt"
    model.save(path)
    save_state(path, kind, edit(load_state(path, kind)))
    with pytest.raises(ValueError, match=rf"m\.ckpt.* is not a valid {kind} checkpoint"):
        type(model).load(path)


@pytest.mark.parametrize("kind", ["VBFA", "OnlineVBFA", "GFA", "OnlineGFA"])
def test_pickles_keep_their_layout(kind: str) -> None:
    # Pickles written before the mixin was shared: the attributes (without the engine and its derived
    # copies), the engine's state map under "_engine_state" and the class tag. They still unpickle.
    model = fitted(kind)
    payload = model.__getstate__()
    assert payload["_onlinefa_class"] == kind
    assert set(payload["_engine_state"]) == set(model.__dict__[model._engine_attribute].get_state())
    left_out = {"_core", "_online", "_lock"} | (set() if isinstance(model, onlinefa.GFA) else {"mean_", "alpha_"})
    assert not left_out & set(payload)  # the engine, its query snapshot, the lock (and VB-FA's derived copies)
    fresh = type(model).__new__(type(model))
    fresh.__setstate__(copy.deepcopy(payload))
    assert answers(fresh) == answers(model)
    other = "GFA" if kind == "VBFA" else "VBFA"
    with pytest.raises(ValueError, match=f"not a pickled {kind}: the pickled state was written by a {other}"):
        type(model).__new__(type(model)).__setstate__({**payload, "_onlinefa_class": other})
