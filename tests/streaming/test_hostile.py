"""Hostile input at every public entry point, and numerical robustness on badly scaled streams.

The contract checked for every call: it either succeeds, leaving a finite, valid model (ψ > 0) and
returning finite results of the documented shape, or raises ValueError/TypeError; a failed call leaves
the complete engine state (``get_state()``, hidden running averages included) bit-for-bit unchanged.
A successful update from an unusual memory layout or dtype must also give exactly the state reached
from a plain C-contiguous array of the same values.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import onlinefa
from onlinefa import OnlineFactorAnalysis
from engine_state import engine_state as raw_engine_state

D, K = 5, 2
CLEAR_ERRORS = (ValueError, TypeError, onlinefa.NumericalBreakdownError)  # the model is left as it was
HOSTILE_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------

SPECIAL_VALUES = [0.0, -0.0, 1.0, -1.0, 5e-324, 1e-300, 1e18, -1e18, 1e19, 1e100, -1e100, 1e101, 1e300,
                  -1e300, np.finfo(np.float64).max, np.nan, np.inf, -np.inf]
DTYPES = ["float64", "float32", ">f8", "float16", "int8", "int64", "uint8", "uint64", "bool", "complex128",
          "object-numbers", "object-junk", "str", "datetime64[s]"]
LAYOUTS = ["C", "F", "reversed", "strided"]


def shapes(n_features: int) -> st.SearchStrategy[tuple[int, ...]]:
    rows = st.integers(0, 6)
    return st.one_of(
        st.tuples(rows, st.just(n_features)),
        st.tuples(rows, st.just(n_features)),  # the valid shape, drawn more often
        st.just((n_features,)),
        st.tuples(st.integers(1, 4), st.sampled_from([0, 1, n_features - 1, n_features + 1])),
        st.sampled_from([(), (n_features - 1,), (n_features + 2,), (2, n_features, 1), (1, 1, n_features)]),
    )


def with_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """The float64 ``values`` in ``dtype`` (non-representable values replaced, warnings silenced)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        finite = np.where(np.isfinite(values), values, 0.0)
        if dtype in ("float64", "float32", ">f8", "float16"):
            return values.astype(dtype)
        if dtype in ("int8", "int64", "uint8", "uint64"):
            info = np.iinfo(dtype)
            return np.clip(np.round(finite), max(info.min, -1e15), min(info.max, 1e15)).astype(dtype)
        if dtype == "bool":
            return finite > 0
        if dtype == "complex128":
            return values + 1j * finite
        if dtype == "object-numbers":
            return values.astype(object)
        if dtype == "object-junk":
            junk = np.empty(values.shape, dtype=object)
            junk[...] = "junk"
            return junk
        if dtype == "str":
            return values.astype(str)
        return finite.astype("int64").astype(dtype)


def with_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """The same values as ``array`` in another memory layout (views; negative strides for 'reversed')."""
    if array.ndim == 0 or layout == "C":
        return array
    if layout == "F":
        return np.asfortranarray(array)
    if layout == "reversed":
        return np.flip(np.ascontiguousarray(np.flip(array)))
    return np.repeat(array, 2, axis=-1)[..., ::2]


@st.composite
def hostile_arrays(draw: st.DrawFn, n_features: int = D) -> np.ndarray:
    shape = draw(shapes(n_features))
    elements = st.one_of(st.sampled_from(SPECIAL_VALUES), st.floats(-10, 10, allow_subnormal=True))
    values = draw(hnp.arrays(np.float64, shape, elements=elements))
    if values.ndim == 2 and values.shape[0] > 1 and values.shape[1] > 0 and draw(st.booleans()):
        values[:, draw(st.integers(0, values.shape[1] - 1))] = 3.0  # a zero-variance feature
    return with_layout(with_dtype(values, draw(st.sampled_from(DTYPES))), draw(st.sampled_from(LAYOUTS)))


@st.composite
def mostly_valid_batches(draw: st.DrawFn) -> np.ndarray:
    """Well-shaped float batches with hostile values: exercise the numerical paths, not the shape checks."""
    n_rows = draw(st.integers(1, 6))
    elements = st.one_of(st.sampled_from(SPECIAL_VALUES), st.floats(-1e6, 1e6))
    values = draw(hnp.arrays(np.float64, (n_rows, D), elements=elements))
    return with_layout(with_dtype(values, draw(st.sampled_from(["float64", "float32"]))), draw(st.sampled_from(LAYOUTS)))


# ---------------------------------------------------------------------------------------------------
# State helpers
# ---------------------------------------------------------------------------------------------------


def engine_state(model: Any) -> dict[str, Any] | None:
    """Complete engine state of a model or estimator (None for an unfitted estimator)."""
    if isinstance(model, OnlineFactorAnalysis):
        inner = model.__dict__.get("_model")
        return None if inner is None else engine_state(inner)
    state = raw_engine_state(model)
    return {k: (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v for k, v in state.items()}


def assert_valid_model(model: Any) -> None:
    """Finite mean and loadings, finite positive noise variances, finite covariance."""
    if isinstance(model, OnlineFactorAnalysis):
        if model.__dict__.get("_model") is None:
            return
        model = model._model
    assert np.isfinite(model.mean).all()
    if model.is_fitted:
        loadings, noise_variance = model.loadings, model.noise_variance
        assert np.isfinite(model.covariance()).all()
    else:  # warm-up: the initialisation must be valid, and so must the first fit OnlineEM answers with
        loadings, noise_variance = model.initial_parameters()
        try:
            covariance = model.covariance()
        except onlinefa.NotFittedError:  # SGA, or EM before two distinct samples
            assert not isinstance(model, onlinefa.OnlineEM) or model.n_seen < 2 or not raw_engine_state(model)[
                "dsq_bar"].any()  # every sample so far identical: no scale to fit
        else:
            assert isinstance(model, onlinefa.OnlineEM) and model.n_seen >= 2
            assert np.isfinite(covariance).all()
            _, answered_loadings, answered_psi = model.snapshot()
            assert np.isfinite(answered_loadings).all() and (answered_psi > 0).all()
    assert np.isfinite(loadings).all()
    assert np.isfinite(noise_variance).all() and (noise_variance > 0).all()
    for value in raw_engine_state(model).values():
        if isinstance(value, np.ndarray):
            assert np.isfinite(value).all()


def call_and_check(model: Any, call: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``call``; on a clear error, check the state is unchanged. Return (succeeded, result)."""
    before = engine_state(model)
    try:
        result = call()
    except CLEAR_ERRORS:
        assert engine_state(model) == before, "a failed call changed the state"
        return False, None
    assert_valid_model(model)
    return True, result


def new_model(model_class: str, dtype: str = "float64") -> Any:
    extra = {"lr": 1e-2} if model_class == "OnlineSGA" else {}
    return getattr(onlinefa, model_class)(D, K, n_warmup=3, seed=0, dtype=dtype, **extra)


def warmed_up(model_class: str, dtype: str) -> Any:
    model = new_model(model_class, dtype)
    model.update(np.random.default_rng(0).standard_normal((12, D)) * [1, 2, 3, 0.5, 0.1])
    return model


MODELS = [(c, t) for c in ("OnlineEM", "OnlineSGA") for t in ("float64", "float32")]


# ---------------------------------------------------------------------------------------------------
# Engines: update, queries, sample, covariance
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model_class", "dtype"), MODELS)
@HOSTILE_SETTINGS
@given(batch=hostile_arrays())
@example(batch=np.full((1, D), 1e18))  # EM: breakdown error after a partial update; SGA: psi -> inf
def test_update_is_all_or_nothing(model_class: str, dtype: str, batch: np.ndarray) -> None:
    model = warmed_up(model_class, dtype)
    n_before = model.n_seen
    succeeded, _ = call_and_check(model, lambda: model.update(batch))
    if succeeded:
        twin = warmed_up(model_class, dtype)
        twin.update(np.ascontiguousarray(batch))
        assert engine_state(model) == engine_state(twin), "layout changed the result"
        assert model.n_seen == n_before + (batch.shape[0] if batch.ndim == 2 else 1)


@pytest.mark.parametrize(("model_class", "dtype"), MODELS)
@HOSTILE_SETTINGS
@given(batches=st.lists(mostly_valid_batches(), min_size=1, max_size=8))
@example(batches=[np.array([[0.0, 1e18, 0.0, 0.0, 0.0]] + [[0.0] * D] * 3)])
# A divergent SGA step: ψ at the floor after a near-constant warm-up, then a sample of 1e100 (the latent
# second moment overflows); it must be refused as a breakdown with the state rolled back.
@example(batches=[np.zeros((1, D)), np.array([[4.87e-108] + [0.0] * (D - 1)] + [[0.0] * D] * 2 + [[1e100] + [0.0] * (D - 1)])])
@example(batches=[np.zeros((1, D)), np.full((3, D), 2054.0)])
@example(batches=[np.array([[0.0] + [561.0] * (D - 1)] + [[561.0] * D] * 3, dtype=np.float32)])
@pytest.mark.slow
def test_streams_of_extreme_values_keep_the_model_valid(model_class: str, dtype: str, batches: list[np.ndarray]) -> None:
    model = new_model(model_class, dtype)
    for batch in batches:
        call_and_check(model, lambda b=batch: model.update(b))


@pytest.mark.parametrize(("model_class", "dtype"), MODELS)
@HOSTILE_SETTINGS
@given(queries=hostile_arrays())
@example(queries=np.full(D, np.nan))
@example(queries=np.full(D, np.inf))
@example(queries=np.full(D, 1e300))
def test_queries_return_finite_results_or_raise(model_class: str, dtype: str, queries: np.ndarray) -> None:
    model = warmed_up(model_class, dtype)
    n_rows = queries.shape[0] if queries.ndim == 2 else 1
    ok, log_density = call_and_check(model, lambda: model.log_prob(queries))
    if ok:
        assert log_density.shape == (n_rows,)
        assert not np.isnan(log_density).any() and not (log_density == np.inf).any()
    ok, latent = call_and_check(model, lambda: model.transform(queries))
    if ok:
        assert latent.shape == (n_rows, K) and np.isfinite(latent).all()


ODD_VALUES = st.one_of(
    st.integers(-3, 40), st.sampled_from([2**63, 2**64, 2**70, -(2**63)]), st.booleans(), st.none(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.sampled_from([np.int64(4), np.float64(4.0),
    np.uint8(3), np.bool_(True), [3], (3,), np.array(3), 3 + 0j]),
)


@pytest.mark.parametrize(("model_class", "dtype"), MODELS)
@HOSTILE_SETTINGS
@given(n_samples=ODD_VALUES, seed=ODD_VALUES, force=ODD_VALUES)
@pytest.mark.slow
def test_sample_and_covariance(model_class: str, dtype: str, n_samples: Any, seed: Any, force: Any) -> None:
    model = warmed_up(model_class, dtype)
    ok, draws = call_and_check(model, lambda: model.sample(n_samples, seed=seed))
    if ok:
        assert draws.shape == (n_samples, D) and np.isfinite(draws).all()
    ok, covariance = call_and_check(model, lambda: model.covariance(force=force))
    if ok:
        assert covariance.shape == (D, D) and np.isfinite(covariance).all()


# ---------------------------------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------------------------------

# Sizes that fit in memory, plus integers that do not fit the engine's 64-bit types (they must be
# rejected before any allocation). Sizes that fit 64 bits but not in memory are tested in a subprocess.
SIZES = st.one_of(st.integers(-2, 12), st.sampled_from([2**64, 2**70, -(2**63)]), st.booleans(),
                  st.floats(0, 10), st.none(), st.text(max_size=2), st.sampled_from([np.int32(4), np.float64(3.0), [3]]))
REALS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.booleans(), st.none(),
                  st.text(max_size=2), st.sampled_from([np.float32(1e-3), 1 + 1j, "1e-3", 5e-324, 1e308, [1e-3]]))
SEEDS = st.one_of(st.none(), st.integers(-(2**65), 2**65), st.sampled_from([2**64 - 1, 2**64]), SIZES)
DTYPE_NAMES = st.one_of(st.sampled_from(["float64", "float32", "float16", "int64", "f4", "<f8", ">f8", np.float32,
                                         np.dtype("float64"), None, "x", ""]), SIZES)
WARMUPS = st.one_of(st.integers(-2, 50), st.sampled_from([2**63, 2**64 - 1, 2**64, 2**70]), SIZES)
VALID_ARGUMENTS: dict[str, Any] = {"n_features": 6, "n_components": 2, "n_warmup": 3, "seed": 0, "noise_floor": 1e-10,
                                   "dtype": "float64"}
HOSTILE_ARGUMENTS: dict[str, st.SearchStrategy[Any]] = {
    "n_features": SIZES, "n_components": SIZES, "n_warmup": WARMUPS, "seed": SEEDS, "noise_floor": REALS,
    "dtype": DTYPE_NAMES, "lr": REALS, "init": st.one_of(st.none(), hostile_arrays(n_features=2)),
}


@st.composite
def constructor_arguments(draw: st.DrawFn) -> dict[str, Any]:
    """Valid arguments with one to three of them replaced by hostile values ("lr": SGA only)."""
    kwargs = dict(VALID_ARGUMENTS)
    names = sorted(HOSTILE_ARGUMENTS)
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        kwargs[name] = draw(HOSTILE_ARGUMENTS[name])
    if isinstance(kwargs.get("init"), np.ndarray) and kwargs["init"].ndim == 2 and draw(st.booleans()):
        kwargs["init"] = np.resize(kwargs["init"], (6, 2))  # right shape, hostile values and dtype
    return kwargs


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
@HOSTILE_SETTINGS
@given(kwargs=constructor_arguments())
@example(kwargs=VALID_ARGUMENTS | {"n_features": 2**64})
@example(kwargs=VALID_ARGUMENTS | {"n_warmup": 2**64})
@example(kwargs=VALID_ARGUMENTS | {"dtype": ","})
def test_constructors_build_valid_models_or_raise(model_class: str, kwargs: dict[str, Any]) -> None:
    kwargs = dict(kwargs)
    lr = kwargs.pop("lr", 1e-2)
    if model_class == "OnlineSGA":
        kwargs["lr"] = lr
    try:
        model = getattr(onlinefa, model_class)(**kwargs)
    except CLEAR_ERRORS:
        return
    assert_valid_model(model)
    assert model.initial_parameters()[0].shape == (model.n_features, model.n_components)
    call_and_check(model, lambda: model.update(np.random.default_rng(0).standard_normal((5, model.n_features))))


HUGE_DIMENSIONS = [2**40, 2**62, 2**63, 2**64 - 1]


@pytest.mark.parametrize("n_features", HUGE_DIMENSIONS, ids=["2**40", "2**62", "2**63", "2**64-1"])
def test_impossible_dimensions_raise_instead_of_crashing(n_features: int) -> None:
    # In a subprocess: a failed allocation inside the engine would abort the interpreter.
    code = (
        "import onlinefa\n"
        f"try:\n    onlinefa.OnlineEM({n_features}, 1, seed=0)\n"
        "except (ValueError, TypeError, MemoryError) as err:\n    print('clear:', type(err).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("clear:"), result.stderr[-500:]


# ---------------------------------------------------------------------------------------------------
# Estimator
# ---------------------------------------------------------------------------------------------------


def fitted_estimator(algorithm: str, dtype: str) -> OnlineFactorAnalysis:
    fa = OnlineFactorAnalysis(K, algorithm=algorithm, n_warmup=3, lr=1e-2, dtype=dtype, random_state=0)
    return fa.fit(np.random.default_rng(1).standard_normal((12, D)))


ESTIMATORS = [(a, t) for a in ("em", "sga") for t in ("float64", "float32")]


@pytest.mark.parametrize(("algorithm", "dtype"), ESTIMATORS)
@HOSTILE_SETTINGS
@given(data=hostile_arrays(), method=st.sampled_from(["partial_fit", "fit", "fit_transform", "transform",
                                                      "score_samples", "score"]))
@example(data=np.full((1, D), 1e18), method="partial_fit")
@pytest.mark.slow
def test_estimator_methods(algorithm: str, dtype: str, data: np.ndarray, method: str) -> None:
    fa = fitted_estimator(algorithm, dtype)
    ok, result = call_and_check(fa, lambda: getattr(fa, method)(data))
    if not ok:
        return
    n_rows = data.shape[0]
    if method in ("transform", "fit_transform"):
        assert result.shape == (n_rows, K) and np.isfinite(result).all()
    elif method == "score_samples":
        assert result.shape == (n_rows,) and np.isfinite(result).all()
    elif method == "score":
        assert np.isfinite(result)
    n_features = fa.n_features_in_  # fit may have started over with another number of features
    for matrix in (fa.get_covariance(), fa.get_precision()):
        assert matrix.shape == (n_features, n_features) and np.isfinite(matrix).all()


@pytest.mark.parametrize("first", [True, False], ids=["first-partial_fit", "after-fit"])
@HOSTILE_SETTINGS
@given(data=hostile_arrays())
@example(data=np.full((1, D), 1e18))
def test_estimator_partial_fit_is_all_or_nothing(first: bool, data: np.ndarray) -> None:
    fa = OnlineFactorAnalysis(K, n_warmup=3, random_state=0)
    if not first:
        fa.fit(np.random.default_rng(2).standard_normal((12, D)))
    succeeded, _ = call_and_check(fa, lambda: fa.partial_fit(data))
    if not succeeded:
        assert hasattr(fa, "n_features_in_") == (not first)


@HOSTILE_SETTINGS
@given(params=st.fixed_dictionaries({
    "n_components": SIZES, "algorithm": st.one_of(st.sampled_from(["em", "sga", "EM", ""]), SIZES),
    "n_warmup": WARMUPS, "lr": REALS, "noise_floor": REALS, "dtype": DTYPE_NAMES,
    "random_state": st.one_of(SEEDS, st.just(np.random.RandomState(0)), st.just(np.random.default_rng(0))),
}))
def test_estimator_hyper_parameters(params: dict[str, Any]) -> None:
    fa = fitted_estimator("em", "float64")
    fa.set_params(**params)
    X = np.random.default_rng(3).standard_normal((10, D))
    call_and_check(fa, lambda: fa.fit(X))


# ---------------------------------------------------------------------------------------------------
# Numerical robustness
# ---------------------------------------------------------------------------------------------------

N_UPDATES = 100_000
BATCH = 2_000
# Feature standard deviations 1e-3 … 1e3 (variances 1e-6 … 1e6), plus one constant feature.
SCALES = np.r_[10.0 ** np.linspace(-3.0, 3.0, 8), 0.0]


def mixing_matrix(seed: int) -> np.ndarray:
    """Loadings (2 × D, before scaling) of the badly scaled stream with this seed."""
    mixing: np.ndarray = np.random.default_rng(seed).standard_normal((2, SCALES.size)) * 0.5
    return mixing


def badly_scaled_batches(seed: int) -> Any:
    """float32 batches of x = (F h + z) ⊙ scales + 7, h ~ N(0, I₂), z ~ N(0, I)."""
    mixing = mixing_matrix(seed)
    rng = np.random.default_rng(seed + 1000)
    for _ in range(N_UPDATES // BATCH):
        latent = rng.standard_normal((BATCH, 2))
        noise = rng.standard_normal((BATCH, SCALES.size))
        yield ((latent @ mixing + noise) * SCALES + 7.0).astype(np.float32)


@pytest.mark.parametrize("model_class", ["OnlineEM", "OnlineSGA"])
def test_float32_on_badly_scaled_data_stays_valid(model_class: str) -> None:
    model = getattr(onlinefa, model_class)(SCALES.size, 2, seed=0, dtype="float32")
    for batch in badly_scaled_batches(0):
        model.update(batch)
        assert (model.noise_variance > 0).all()
    assert model.n_seen == N_UPDATES
    assert_valid_model(model)
    # The constant feature: its running mean is exact, and the noise floor (1e-10) stands in for its
    # zero variance, so every density and posterior stays finite.
    assert model.mean[-1] == 7.0
    assert model.noise_variance[-1] >= 1e-10
    assert np.isfinite(model.log_prob(np.full(SCALES.size, 7.0))).all()


def test_em_constant_feature_gets_the_noise_floor_and_no_loading() -> None:
    # Online EM: d_t = 0 for a constant feature, so its rows of Ā and d̄² stay exactly 0, its loading
    # is 0 and ψ = d̄² − rowsum(F ⊙ Ā) = 0 is replaced by the floor — as documented.
    # scaling="unit" keeps the thesis' absolute floor (the data-relative floor is tested below).
    model = onlinefa.OnlineEM(SCALES.size, 2, seed=0, dtype="float32", noise_floor=1e-7, scaling="unit")
    for batch in badly_scaled_batches(1):
        model.update(batch)
    assert model.noise_variance[-1] == 1e-7
    assert (model.loadings[-1] == 0.0).all()
    # The other features' variances are recovered across twelve orders of magnitude. Each is the
    # mean of 1e5 squares, relative standard error ~ sqrt(2/1e5) = 0.45%; 5% is > 10 standard errors.
    mixing = mixing_matrix(1)
    true_variance = (np.sum(mixing**2, axis=0) + 1.0) * SCALES**2
    model_variance = np.diag(model.covariance())
    np.testing.assert_allclose(model_variance[:-1], true_variance[:-1], rtol=0.05)


def test_em_constant_feature_gets_the_data_relative_noise_floor() -> None:
    # scaling="data" (default): the floor is noise_floor·σ̂², σ̂² the mean over features of the running
    # squared deviations d̄². The stream is stationary, so σ̂² estimates the mean of the true feature
    # variances; with the power schedule (κ = 0.9) at t = 1e5 the effective window is ≳ 1e4 samples of a
    # sum dominated by the σ = 1e3 feature, relative standard error ≲ sqrt(2/1e4) = 1.4%; 5% is > 3 of them.
    noise_floor = 1e-7
    model = onlinefa.OnlineEM(SCALES.size, 2, seed=0, dtype="float32", noise_floor=noise_floor)
    for batch in badly_scaled_batches(1):
        model.update(batch)
    mixing = mixing_matrix(1)
    true_variance = (np.sum(mixing**2, axis=0) + 1.0) * SCALES**2
    expected_floor = noise_floor * float(np.mean(true_variance))
    assert (model.loadings[-1] == 0.0).all()
    np.testing.assert_allclose(model.noise_variance[-1], expected_floor, rtol=0.05)
    # Exactly max(noise_floor·mean(d̄²), tiny), rounded to the float32 state.
    dsq_bar = np.asarray(raw_engine_state(model)["dsq_bar"], dtype=np.float64)
    exact_floor = max(noise_floor * float(np.mean(dsq_bar)), float(np.finfo(np.float32).tiny))
    np.testing.assert_allclose(model.noise_variance[-1], exact_floor, rtol=1e-6)
