"""Pickle, deepcopy and save/load of the VB-FA estimators, and ``onlinefa.load`` for every model kind.

The reference is always the model that was never serialised: a restored model must answer every query
with the same bits and (online) continue its stream exactly as if it had never stopped. Damaged or
edited checkpoints, and engine states holding a value no run can produce, must be refused.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import onlinefa
from onlinefa import VBFA, OnlineVBFA, _core
from onlinefa.checkpoint import load_state, save_state

HOW = ["pickle", "deepcopy", "save/load"]


def factor_rows(n: int, d: int = 7, k: int = 2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((d, k))
    return rng.standard_normal((n, k)) @ loadings.T + 0.3 * rng.standard_normal((n, d)) + 1.0


def round_trip(model: Any, how: str, tmp_path: Path) -> Any:
    if how == "pickle":
        return pickle.loads(pickle.dumps(model))
    if how == "deepcopy":
        return copy.deepcopy(model)
    model.save(tmp_path / "model.ckpt")
    return onlinefa.load(tmp_path / "model.ckpt")


def assert_same_state(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Two state maps with the same keys, types and bits."""
    assert sorted(left) == sorted(right)
    for key, value in left.items():
        other = right[key]
        if isinstance(value, np.ndarray):
            assert isinstance(other, np.ndarray) and value.dtype == other.dtype, key
            assert value.shape == other.shape and value.tobytes() == other.tobytes(), key
        else:
            assert type(value) is type(other) and np.array_equal(value, other), key


def batch_answers(model: VBFA, X: np.ndarray) -> list[bytes]:
    """Every query of a fitted VBFA as bytes (NaN-safe comparison)."""
    post = model.posterior()
    arrays = [
        model.transform(X),
        model.score_samples(X),
        np.float64(model.score(X)),
        model.get_covariance(),
        np.float64(model.lower_bound()),
        model.mean_,
        model.components_,
        model.noise_variance_,
        model.alpha_,
        model.elbo_,
        model.fit_time_,
        post.latent_mean,
        post.latent_covariance,
        post.loading_covariance,
        post.bias_variance,
        post.noise_shape,
        post.noise_rate,
    ]
    return [np.asarray(a).tobytes() for a in arrays] + [model.n_iter_, model.converged_, model.n_features_in_]


def online_answers(model: OnlineVBFA, X: np.ndarray) -> list[Any]:
    second, mean = model.latent_moments()
    arrays = [model.transform(X), model.score_samples(X), model.components_, model.mean_, model.noise_variance_,
              model.alpha_, model.loading_gram(), second, mean]
    return [a.tobytes() for a in arrays] + [model.n_samples_seen_, model.n_batches_seen_, model.n_features_in_]


# ---------------------------------------------------------------------------------------------------
# Exact round trips
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("params", "missing"),
    [({}, False), ({}, True), ({"prior": "broad", "translation": "exact"}, True)],
    ids=["complete", "missing", "broad-exact-missing"],
)
def test_batch_round_trip_answers_and_continues_identically(
    params: dict[str, Any], missing: bool, how: str, tmp_path: Path
) -> None:
    X = factor_rows(50)
    if missing:
        X[np.random.default_rng(1).random(X.shape) < 0.1] = np.nan
        X[0, :] = np.nan  # a row with nothing observed
    model = VBFA(3, max_iter=15, transformations_start=2, random_state=4, **params).fit(X)
    restored = round_trip(model, how, tmp_path)
    assert type(restored) is VBFA and restored.get_params() == model.get_params()
    assert batch_answers(restored, X) == batch_answers(model, X)
    # Step-by-step updates continue from the restored posterior exactly as from the original one.
    for step in ("latents", "bias", "loadings", "noise", "ard", "translate", "rotate"):
        model.apply(step)
        restored.apply(step)
    assert batch_answers(restored, X) == batch_answers(model, X)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    "params",
    [{}, {"schedule": "power", "tau0": 2.0, "kappa": 0.7, "n_effective": 500.0}, {"schedule": "constant", "rho": 0.2,
     "translation": "exact", "prior": "broad", "transformations_start": 3}],
    ids=["harmonic", "power-neff", "constant-exact-broad"],
)
def test_online_resume_is_identical_to_never_stopping(params: dict[str, Any], how: str, tmp_path: Path) -> None:
    X = factor_rows(200, seed=2)
    uninterrupted = OnlineVBFA(3, random_state=7, **params)
    stopped = OnlineVBFA(3, random_state=7, **params)
    for batch in np.array_split(X[:80], 4):
        uninterrupted.partial_fit(batch)
        stopped.partial_fit(batch)
    resumed = round_trip(stopped, how, tmp_path)
    assert type(resumed) is OnlineVBFA and resumed.get_params() == stopped.get_params()
    assert online_answers(resumed, X) == online_answers(stopped, X)
    for batch in np.array_split(X[80:], 5):
        uninterrupted.partial_fit(batch)
        resumed.partial_fit(batch)
    assert online_answers(resumed, X) == online_answers(uninterrupted, X)
    assert_same_state(resumed._core.get_state(), uninterrupted._core.get_state())


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("cls", [VBFA, OnlineVBFA])
def test_unfitted_estimators_round_trip_unfitted(cls: Any, how: str, tmp_path: Path) -> None:
    model = cls(3, prior="broad", transformations=False, random_state=5)
    restored = round_trip(model, how, tmp_path)
    assert type(restored) is cls and restored.get_params() == model.get_params()
    assert not restored.__sklearn_is_fitted__()
    X = factor_rows(60)
    fitted = cls(3, prior="broad", transformations=False, random_state=5).fit(X)
    assert restored.fit(X).components_.tobytes() == fitted.components_.tobytes()


def test_random_state_objects_pickle_but_are_not_saved(tmp_path: Path) -> None:
    model = VBFA(2, max_iter=5, random_state=np.random.RandomState(0)).fit(factor_rows(30))
    restored = pickle.loads(pickle.dumps(model))
    assert restored.components_.tobytes() == model.components_.tobytes()
    with pytest.raises(TypeError, match="random_state"):
        model.save(tmp_path / "m.ckpt")
    assert not (tmp_path / "m.ckpt").exists()


def every_model_kind(X: np.ndarray) -> list[Any]:
    d = X.shape[1]
    complete = X[~np.isnan(X).any(axis=1)]
    return [
        onlinefa.OnlineEM(d, 2, seed=0).update(complete),
        onlinefa.OnlineSGA(d, 2, seed=0).update(complete),
        onlinefa.VIFA(d, 2, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3, seed=0),
        onlinefa.MiniBatchEM(d, 2, seed=0).update(complete),
        onlinefa.OnlineFactorAnalysis(2, random_state=0).fit(complete),
        VBFA(2, max_iter=10, random_state=0).fit(X),
        OnlineVBFA(2, random_state=0).fit(complete),
    ]


def test_onlinefa_load_reads_every_model_kind_back_exactly(tmp_path: Path) -> None:
    X = factor_rows(60)
    X[5, 1] = np.nan
    for model in every_model_kind(X):
        kind = type(model).__name__
        first, second = tmp_path / f"{kind}.ckpt", tmp_path / f"{kind}.again"
        model.save(first)
        loaded = onlinefa.load(first)
        assert type(loaded) is type(model), kind
        loaded.save(second)  # what the loaded model holds, written again: the same state, bit for bit
        assert_same_state(load_state(second, kind), load_state(first, kind))


# ---------------------------------------------------------------------------------------------------
# Rejection of damaged, edited and invalid states
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [VBFA, OnlineVBFA])
def test_corrupted_file_is_rejected_naming_it(cls: Any, tmp_path: Path) -> None:
    path = tmp_path / "model.ckpt"
    cls(2, random_state=0).fit(factor_rows(40)).save(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    for load in (onlinefa.load, cls.load):
        with pytest.raises(ValueError, match="model.ckpt"):
            load(path)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ValueError, match="model.ckpt"):
        onlinefa.load(path)


def nan_first(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.flat[0] = np.nan
    return out


def negative_first(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.flat[0] = -abs(out.flat[0])
    return out


def indefinite_first(stack: np.ndarray) -> np.ndarray:
    out = stack.copy()
    out[0] = -out[0]
    return out


EDITS: list[tuple[str, str, Callable[[np.ndarray], np.ndarray], str]] = [
    ("VBFA", "engine.noise_rate", negative_first, "noise_rate"),
    ("VBFA", "engine.ard_shape", negative_first, "ard_shape"),
    ("VBFA", "engine.bias_var", negative_first, "bias_var"),
    ("VBFA", "engine.loading_mean", nan_first, "loading_mean"),
    ("VBFA", "engine.bias_mean", lambda a: a[:-1], "bias_mean"),
    ("VBFA", "engine.loading_cov", indefinite_first, "loading_cov"),
    ("VBFA", "engine.latent_mean", lambda a: a[:, :1], "latent_mean"),
    ("VBFA", "engine.data", lambda a: a + 1e200, "data"),
    ("OnlineVBFA", "engine.noise_shape", negative_first, "noise_shape"),
    ("OnlineVBFA", "engine.ard_rate", negative_first, "ard_rate"),
    ("OnlineVBFA", "engine.sum_gram", nan_first, "sum_gram"),
    ("OnlineVBFA", "engine.stats_total_gram", lambda a: a + np.triu(np.full_like(a, 10.0), 1), "stats_total_gram"),
    ("OnlineVBFA", "engine.loading_mean", lambda a: a[:, :1], "loading_mean"),
]


@pytest.mark.parametrize(("kind", "key", "edit", "named"), EDITS, ids=[f"{kind}-{key}" for kind, key, *_ in EDITS])
def test_edited_file_with_an_invalid_value_is_rejected(
    kind: str, key: str, edit: Callable[[np.ndarray], np.ndarray], named: str, tmp_path: Path
) -> None:
    cls = {"VBFA": VBFA, "OnlineVBFA": OnlineVBFA}[kind]
    X = factor_rows(60)
    model = cls(3, random_state=0, **({"transformations_start": 1} if cls is VBFA else {})).fit(X)
    path = tmp_path / "edited.ckpt"
    model.save(path)
    state = load_state(path, kind)
    state[key] = edit(state[key])
    save_state(path, kind, state)  # a deliberate edit: the digest is recomputed, so only the checks catch it
    for load in (onlinefa.load, cls.load):
        with pytest.raises(ValueError, match=f"edited.ckpt.*{named}"):
            load(path)
    engine_state = {k[len("engine."):]: v for k, v in state.items() if k.startswith("engine.")}
    engine_class = _core.VBFACore if cls is VBFA else _core.OnlineVBFACore
    with pytest.raises(ValueError, match=named):
        engine_class.from_state(engine_state)
    # The same invalid state smuggled into a pickle is refused as well.
    payload = model.__getstate__()
    payload["_engine_state"] = engine_state
    with pytest.raises(ValueError, match=named):
        cls.__new__(cls).__setstate__(payload)


@pytest.mark.parametrize(
    ("cls", "param", "value"),
    [(VBFA, "prior", "broad"), (VBFA, "n_components", 2), (VBFA, "translation", "exact"),
     (OnlineVBFA, "schedule", "constant"), (OnlineVBFA, "n_effective", 10.0), (OnlineVBFA, "prior", "unknown")],
)
def test_stored_hyper_parameters_must_describe_the_stored_model(
    cls: Any, param: str, value: object, tmp_path: Path
) -> None:
    path = tmp_path / "m.ckpt"
    cls(3, random_state=0).fit(factor_rows(40)).save(path)
    state = load_state(path, cls.__name__)
    state[f"param.{param}"] = value
    save_state(path, cls.__name__, state)
    with pytest.raises(ValueError, match="m.ckpt"):
        onlinefa.load(path)


def test_engine_states_are_not_interchangeable() -> None:
    X = factor_rows(40)
    batch_state = VBFA(2, max_iter=3, random_state=0).fit(X)._core.get_state()
    online_state = OnlineVBFA(2, random_state=0).fit(X)._core.get_state()
    with pytest.raises(ValueError, match="VBFA"):
        _core.OnlineVBFACore.from_state(batch_state)
    with pytest.raises(ValueError, match="OnlineVBFA"):
        _core.VBFACore.from_state(online_state)
    with pytest.raises(ValueError, match="observed"):
        _core.VBFACore.from_state({**batch_state, "observed": np.full_like(batch_state["observed"], 0.5)})
    with pytest.raises(ValueError, match="n_seen|n_batches"):
        _core.OnlineVBFACore.from_state({**online_state, "n_batches": online_state["n_seen"] + 1})


def test_cli_info_describes_vb_fa_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onlinefa.cli import main

    X = factor_rows(40)
    for model in (VBFA(2, max_iter=3, random_state=0).fit(X), OnlineVBFA(2, random_state=0).fit(X)):
        path = tmp_path / f"{type(model).__name__}.ckpt"
        model.save(path)
        assert main(["info", str(path)]) == 0
        out = capsys.readouterr().out
        assert f"{type(model).__name__}\n" in out and "param.n_components" in out and "engine.noise_rate" in out
