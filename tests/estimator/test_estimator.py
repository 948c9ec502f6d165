"""OnlineFactorAnalysis: scikit-learn's estimator contract, and agreement with the engines and with
scikit-learn's own FactorAnalysis for the same parameters."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.decomposition import FactorAnalysis
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import onlinefa
from onlinefa import OnlineFactorAnalysis
from engine_state import engine_state

StreamFactory = Callable[[int, int, int, int], npt.NDArray[np.float64]]

# Every check of scikit-learn's suite applies to a streaming model: fit() resets and streams the rows,
# so fit is idempotent, order-invariant queries hold, and partial_fit exists. Nothing is listed as an
# expected failure. The defaults are checked, and K = 1 and K = 2 (several checks fit 2-feature data,
# where K = 2 is fitted with K = 1, see n_components_) with a short warm-up so that the loadings are
# actually learnt on the checks' 20-100 row data sets.
CHECKED_ESTIMATORS = [
    OnlineFactorAnalysis(),
    OnlineFactorAnalysis(1, n_warmup=5, random_state=0),
    OnlineFactorAnalysis(2, n_warmup=5, random_state=0),
    OnlineFactorAnalysis(2, algorithm="sga", lr=1e-2, n_warmup=5, random_state=0),
    OnlineFactorAnalysis(1, algorithm="sga", lr=1e-2, n_warmup=5, random_state=0),
    OnlineFactorAnalysis(1, n_warmup=5, dtype="float32", random_state=0),
    # tol=0: exactly max_iter passes, without the ConvergenceWarning that 2-3 passes over the checks' tiny
    # random data sets would raise (tests/estimator/test_default_fit.py tests the warning).
    OnlineFactorAnalysis(2, batch_size=8, max_iter=3, tol=0, random_state=0),
    OnlineFactorAnalysis(1, max_iter=2, tol=0, n_warmup=5, random_state=0),
]


def no_expected_failures(estimator: Any) -> dict[str, str]:
    """No check is exempted (see the comment above CHECKED_ESTIMATORS)."""
    return {}


@parametrize_with_checks(CHECKED_ESTIMATORS, expected_failed_checks=no_expected_failures)
def test_scikit_learn_estimator_checks(estimator: Any, check: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The array-API check runs (with NumPy inputs, as for every estimator without array-API support)
    # only when SCIPY_ARRAY_API is set; it only reads the variable, so set it for this check.
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)


def test_is_a_real_scikit_learn_transformer() -> None:
    assert issubclass(OnlineFactorAnalysis, BaseEstimator)
    assert issubclass(OnlineFactorAnalysis, TransformerMixin)
    assert onlinefa.OnlineFactorAnalysis is OnlineFactorAnalysis


# ---------------------------------------------------------------------------------------------------
# Agreement with the streaming engines (exact)
# ---------------------------------------------------------------------------------------------------

D, K = 10, 3


def assert_same_state(left: dict[str, Any], right: dict[str, Any]) -> None:
    """Bit-for-bit equality of two engine states (arrays: dtype, shape and bytes; scalars: value)."""
    assert left.keys() == right.keys()
    for key, value in left.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == right[key].dtype and value.shape == right[key].shape, key
            assert value.tobytes() == right[key].tobytes(), key
        else:
            assert type(value) is type(right[key]) and value == right[key], key


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("algorithm", "engine", "options", "engine_options"), [
    # Defaults: EM with whitening and equal weights (1/t), reported as fitted (no shrinkage); SGA with the thesis's 1/t.
    ("em", onlinefa.OnlineEM, {}, {"whiten": True, "schedule": "harmonic", "shrink": False}),
    ("em", onlinefa.OnlineEM, {"schedule": "power"},
     {"whiten": True, "schedule": "power", "kappa": 0.9, "shrink": False}),
    ("em", onlinefa.OnlineEM, {"whiten": False, "schedule": "harmonic"},
     {"whiten": False, "schedule": "harmonic", "shrink": False}),
    ("em", onlinefa.OnlineEM, {"schedule": "constant", "rho": 0.05},
     {"whiten": True, "schedule": "constant", "rho": 0.05, "shrink": False}),
    ("sga", onlinefa.OnlineSGA, {"lr": 5e-3}, {"lr": 5e-3}),
    ("sga", onlinefa.OnlineSGA, {"schedule": "power", "kappa": 0.8, "tau0": 3.0},
     {"schedule": "power", "kappa": 0.8, "tau0": 3.0}),
])
def test_partial_fit_streams_exactly_like_the_engine(
    fa_stream: StreamFactory, algorithm: str, engine: Any, options: dict[str, Any],
    engine_options: dict[str, Any], dtype: str,
) -> None:
    X = fa_stream(D, K, 400, 0)
    fa = OnlineFactorAnalysis(K, algorithm=algorithm, n_warmup=20, dtype=dtype, random_state=7, **options)
    reference = engine(D, K, n_warmup=20, seed=7, dtype=dtype, **engine_options)
    for batch in np.array_split(X, 9):
        fa.partial_fit(batch)
    reference.update(X)
    assert_same_state(engine_state(fa._model), engine_state(reference))
    # The exports are in the model's dtype: the float64 values rounded once (components_ also goes
    # through a float32 product F Q, so it agrees to float32 precision).
    expected_components = reference.canonical_loadings().T
    assert fa.components_.dtype == fa.noise_variance_.dtype == fa.mean_.dtype == np.dtype(dtype)
    if dtype == "float64":
        np.testing.assert_array_equal(fa.components_, expected_components)
    else:
        scale = np.abs(expected_components).max()
        np.testing.assert_allclose(fa.components_, expected_components, rtol=0, atol=1e-6 * K * scale)
    np.testing.assert_array_equal(fa.noise_variance_, reference.noise_variance.astype(dtype))
    np.testing.assert_array_equal(fa.mean_, reference.mean.astype(dtype))
    assert fa.n_samples_seen_ == 400 and fa.n_features_in_ == D
    assert fa.components_.shape == (K, D) and fa.components_.flags.c_contiguous


def test_fit_resets_then_streams(fa_stream: StreamFactory) -> None:
    first, second = fa_stream(D, K, 300, 1), fa_stream(D, K, 250, 2)
    refit = OnlineFactorAnalysis(K, n_warmup=20, random_state=3).fit(first).fit(second)
    fresh = OnlineFactorAnalysis(K, n_warmup=20, random_state=3).fit(second)
    chunked = OnlineFactorAnalysis(K, n_warmup=20, random_state=3)
    for batch in np.array_split(second, 7):
        chunked.partial_fit(batch)
    assert_same_state(engine_state(refit._model), engine_state(fresh._model))
    assert_same_state(engine_state(chunked._model), engine_state(fresh._model))
    assert refit.n_samples_seen_ == 250


def test_fit_transform_equals_fit_then_transform(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 300, 4)
    fa = OnlineFactorAnalysis(K, n_warmup=20, random_state=0)
    np.testing.assert_array_equal(fa.fit_transform(X), clone(fa).fit(X).transform(X))


@pytest.mark.parametrize(("n_components", "fitted"), [(None, D - 1), (2, 2), (D - 1, D - 1), (D, D - 1), (50, D - 1)])
def test_n_components_resolves_to_at_most_n_features_minus_one(
    fa_stream: StreamFactory, n_components: int | None, fitted: int,
) -> None:
    # K >= D is fitted with K = D - 1 (which represents every covariance); the fit is then exactly the
    # one requested with D - 1. None is min(10, D - 1).
    X = fa_stream(D, K, 200, 6)
    fa = OnlineFactorAnalysis(n_components, n_warmup=20, random_state=1).fit(X)
    explicit = OnlineFactorAnalysis(fitted, n_warmup=20, random_state=1).fit(X)
    assert fa.n_components_ == fitted and fa.components_.shape == (fitted, D)
    assert fa.get_params()["n_components"] == n_components  # the parameter itself is left as given
    assert_same_state(engine_state(fa._model), engine_state(explicit._model))
    assert fa.transform(X[:4]).shape == (4, fitted)


def test_default_n_components_is_capped_at_ten(fa_stream: StreamFactory) -> None:
    X = fa_stream(30, K, 100, 6)
    assert OnlineFactorAnalysis(n_warmup=20).fit(X).n_components_ == 10


def test_partial_fit_continues_through_the_warm_up(fa_stream: StreamFactory) -> None:
    # Batches smaller than the warm-up: the estimator is not fitted in between, yet partial_fit goes on.
    X = fa_stream(D, K, 60, 9)
    fa = OnlineFactorAnalysis(K, n_warmup=20, random_state=2)
    for row in range(25):
        fa.partial_fit(X[row : row + 1])
        assert fa.__sklearn_is_fitted__() == (row + 1 > 20)
    reference = OnlineFactorAnalysis(K, n_warmup=20, random_state=2).fit(X[:25])
    assert_same_state(engine_state(fa._model), engine_state(reference._model))


def test_sample_draws_from_the_fitted_gaussian(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 300, 11)
    fa = OnlineFactorAnalysis(K, n_warmup=20, random_state=0).fit(X)
    np.testing.assert_array_equal(fa.sample(7, random_state=5), fa._model.sample(7, seed=5))
    assert fa.sample(random_state=1).shape == (1, D) and fa.sample(0).shape == (0, D)
    # Seeded statistical check: the mean of 20000 draws is within 5 standard errors of mean_.
    draws = fa.sample(20000, random_state=2)
    standard_error = np.sqrt(np.diag(fa.get_covariance()) / 20000)
    assert np.all(np.abs(draws.mean(axis=0) - fa.mean_) < 5 * standard_error)
    with pytest.raises(NotFittedError):
        OnlineFactorAnalysis(K).sample(3)


def test_random_state_objects_follow_scikit_learn_conventions(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 200, 5)
    for random_state in (np.random.RandomState(0), np.random.default_rng(0)):
        fa = OnlineFactorAnalysis(K, n_warmup=20, random_state=random_state).fit(X)
        assert np.isfinite(fa.components_).all()
    with pytest.raises(TypeError, match="random_state"):
        OnlineFactorAnalysis(K, random_state="seed").fit(X)


# ---------------------------------------------------------------------------------------------------
# Agreement with scikit-learn's FactorAnalysis for the same parameters
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted_pair() -> tuple[OnlineFactorAnalysis, FactorAnalysis, npt.NDArray[np.float64]]:
    """Our fitted estimator, and a scikit-learn FactorAnalysis given exactly our parameters."""
    rng = np.random.default_rng(11)
    loadings = rng.standard_normal((D, K))
    X = 2.0 + rng.standard_normal((600, K)) @ loadings.T + rng.standard_normal((600, D)) * 0.7
    ours = OnlineFactorAnalysis(K, n_warmup=50, random_state=0).fit(X)
    theirs = FactorAnalysis(K, random_state=0).fit(X)
    theirs.components_ = ours.components_.copy()
    theirs.noise_variance_ = ours.noise_variance_.copy()
    theirs.mean_ = ours.mean_.copy()
    queries = rng.standard_normal((40, D)) * 3.0
    return ours, theirs, queries


# Both sides evaluate the same closed form in float64 (ours by Woodbury + the determinant lemma,
# scikit-learn through the dense D×D precision); 1e-10 relative allows only rounding differences.
SAME_FORMULA_RTOL = 1e-10


def test_score_samples_matches_scikit_learn_factor_analysis(fitted_pair: Any) -> None:
    ours, theirs, queries = fitted_pair
    np.testing.assert_allclose(ours.score_samples(queries), theirs.score_samples(queries), rtol=SAME_FORMULA_RTOL)
    assert ours.score(queries) == pytest.approx(theirs.score(queries), rel=SAME_FORMULA_RTOL)


def test_transform_covariance_precision_match_scikit_learn(fitted_pair: Any) -> None:
    ours, theirs, queries = fitted_pair
    np.testing.assert_allclose(ours.transform(queries), theirs.transform(queries), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.get_covariance(), theirs.get_covariance(), rtol=SAME_FORMULA_RTOL)
    np.testing.assert_allclose(ours.get_precision(), theirs.get_precision(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.get_precision() @ ours.get_covariance(), np.eye(D), atol=1e-10)


def test_score_samples_equals_dense_gaussian_log_density(fitted_pair: Any) -> None:
    ours, _, queries = fitted_pair
    covariance = ours.components_.T @ ours.components_ + np.diag(ours.noise_variance_)
    resid = queries - ours.mean_
    _, log_det = np.linalg.slogdet(covariance)
    expected = -0.5 * (D * np.log(2 * np.pi) + log_det + np.einsum("nd,nd->n", resid, np.linalg.solve(covariance, resid.T).T))
    np.testing.assert_allclose(ours.score_samples(queries), expected, rtol=1e-10)


def test_get_feature_names_out(fitted_pair: Any) -> None:
    ours, _, _ = fitted_pair
    names = ours.get_feature_names_out()
    assert names.dtype == object and list(names) == [f"onlinefactoranalysis{i}" for i in range(K)]


def test_works_inside_a_pipeline(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 300, 6)
    pipe = make_pipeline(StandardScaler(), OnlineFactorAnalysis(K, n_warmup=20, random_state=0)).fit(X)
    assert pipe.transform(X).shape == (300, K)
    assert np.isfinite(pipe.score(X))


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


def test_feature_count_is_fixed_by_the_first_partial_fit(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 50, 7)
    fa = OnlineFactorAnalysis(K, n_warmup=5, random_state=0).partial_fit(X)
    before = engine_state(fa._model)
    for method in (fa.partial_fit, fa.transform, fa.score_samples, fa.score):
        with pytest.raises(ValueError, match=f"X has {D - 1} features, but OnlineFactorAnalysis is expecting {D}"):
            method(X[:, :-1])
    assert_same_state(engine_state(fa._model), before)


def test_not_fitted_error_is_both_the_librarys_and_scikit_learns() -> None:
    with pytest.raises(onlinefa.NotFittedError) as caught:
        OnlineFactorAnalysis(2).transform(np.zeros((3, 5)))
    assert isinstance(caught.value, NotFittedError)  # scikit-learn's


def test_unfitted_estimator_raises_not_fitted() -> None:
    fa = OnlineFactorAnalysis(2)
    X = np.zeros((3, 5))
    for call in (lambda: fa.transform(X), lambda: fa.score_samples(X), lambda: fa.score(X), fa.get_covariance,
                 fa.get_precision, fa.get_feature_names_out):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()
    for attribute in ("components_", "noise_variance_", "mean_", "n_samples_seen_", "n_features_in_"):
        assert not hasattr(fa, attribute)


@pytest.mark.parametrize(("params", "error", "needle"), [
    ({"n_components": 0}, ValueError, "n_components"),
    ({"n_components": -2}, ValueError, "n_components"),
    ({"n_components": 1.5}, TypeError, "n_components"),
    ({"n_components": 2, "algorithm": "gibbs"}, ValueError, "algorithm"),
    ({"n_components": 2, "n_warmup": -1}, ValueError, "n_warmup"),
    ({"n_components": 2, "lr": 0.0}, ValueError, "lr"),
    ({"n_components": 2, "noise_floor": float("nan")}, ValueError, "noise_floor"),
    ({"n_components": 2, "dtype": "float16"}, ValueError, "dtype"),
    ({"n_components": 2, "random_state": -3}, ValueError, "seed"),
])
def test_hyper_parameters_are_validated_at_fit_not_init(params: dict[str, Any], error: type, needle: str) -> None:
    fa = OnlineFactorAnalysis(**params)  # scikit-learn convention: __init__ only stores
    X = np.random.default_rng(0).standard_normal((20, 5))
    with pytest.raises(error, match=needle):
        fa.fit(X)
    with pytest.raises(error, match=needle):
        fa.partial_fit(X)
    assert not hasattr(fa, "n_features_in_")


def test_failed_fit_keeps_the_previous_model(fa_stream: StreamFactory) -> None:
    X = fa_stream(D, K, 80, 8)
    fa = OnlineFactorAnalysis(K, n_warmup=5, random_state=0).fit(X)
    before = engine_state(fa._model)
    bad = X.copy()
    bad[-1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fa.fit(bad)
    with pytest.raises(ValueError, match="n_components"):
        fa.set_params(n_components=0).fit(X)
    assert_same_state(engine_state(fa._model), before)


@pytest.mark.parametrize(("data", "error", "needle"), [
    (np.zeros((0, 4)), ValueError, "0 sample"),
    (np.zeros(4), ValueError, "Reshape your data"),
    (np.zeros((3, 4, 2)), ValueError, "2D array"),
    (np.ones((3, 4)) * (1 + 1j), ValueError, "Complex data not supported"),
    (np.array([["a", "b"], ["c", "d"]]), TypeError, "numeric"),
])
def test_query_input_errors(data: Any, error: type, needle: str) -> None:
    ours = OnlineFactorAnalysis(2, n_warmup=5, random_state=0).fit(np.random.default_rng(0).standard_normal((30, 4)))
    for method in (ours.transform, ours.score_samples, ours.partial_fit):
        with pytest.raises(error, match=needle):
            method(data)


def test_query_rejects_values_beyond_the_documented_magnitude(fitted_pair: Any) -> None:
    ours, _, queries = fitted_pair
    huge = queries[:2].copy()
    huge[1, 0] = 1e101
    for query in (ours.score_samples, ours.score, ours.transform):  # scikit-learn's wording, not the core's
        with pytest.raises(ValueError, match=r"^Input X contains a value with \|x\| > 1e\+100"):
            query(huge)
    huge[1, 0] = np.nan
    for query in (ours.score_samples, ours.score, ours.transform):
        with pytest.raises(ValueError, match="^Input X contains NaN or infinity"):
            query(huge)
    huge[1, 0] = 1e100  # the bound itself is accepted, and the log density stays finite
    assert np.isfinite(ours.score_samples(huge)).all()


def test_pickle_round_trip_preserves_predictions(fitted_pair: Any) -> None:
    ours, _, queries = fitted_pair
    restored = pickle.loads(pickle.dumps(ours))
    np.testing.assert_array_equal(restored.score_samples(queries), ours.score_samples(queries))
    assert restored.get_params() == ours.get_params()


# ---------------------------------------------------------------------------------------------------
# Without scikit-learn
# ---------------------------------------------------------------------------------------------------

WITHOUT_SKLEARN = textwrap.dedent(
    """
    import pickle, sys
    sys.modules["sklearn"] = None  # any `import sklearn...` now raises ImportError
    import numpy as np
    import onlinefa
    assert "sklearn" not in sys.modules or sys.modules["sklearn"] is None
    from onlinefa import NotFittedError, OnlineFactorAnalysis
    assert [c.__name__ for c in OnlineFactorAnalysis.__mro__] == [
        "OnlineFactorAnalysis", "EstimatorBase", "ClassTaggedPickle", "ParamsMixin", "object"
    ], OnlineFactorAnalysis.__mro__
    fa = OnlineFactorAnalysis(2, n_warmup=10, random_state=0)
    assert fa.get_params()["n_components"] == 2 and fa.set_params(n_warmup=5) is fa
    assert repr(fa).startswith("OnlineFactorAnalysis(")
    try:
        fa.transform(np.zeros((2, 6)))
    except NotFittedError as err:
        assert isinstance(err, ValueError) and isinstance(err, AttributeError)
    else:
        raise AssertionError("no NotFittedError")
    try:
        fa.set_params(bogus=1)
    except ValueError:
        pass
    else:
        raise AssertionError("set_params accepted an unknown parameter")
    X = np.random.default_rng(0).standard_normal((100, 6))
    Z = fa.fit_transform(X)
    assert Z.shape == (100, 2) and np.isfinite(fa.score(X))
    again = pickle.loads(pickle.dumps(fa))
    assert np.array_equal(again.transform(X), Z)
    for vb in (onlinefa.VBFA(2, max_iter=20, random_state=0), onlinefa.OnlineVBFA(2, random_state=0)):
        assert type(vb).__mro__[-2:] == (onlinefa._params.ParamsMixin, object)
        assert vb.fit(X).transform(X).shape == (100, 2) and np.isfinite(vb.score(X, None))
    print("ok")
    """
)


def test_estimator_works_without_scikit_learn() -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_SKLEARN], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_onlinefa_does_not_import_scikit_learn() -> None:
    code = "import sys, onlinefa; print('sklearn' in sys.modules, 'scipy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_default_em_differs_from_the_thesis_algorithm(fa_stream: StreamFactory) -> None:
    # Guards the parametrised test above against options that are silently ignored.
    X = fa_stream(D, K, 400, 0)
    default = OnlineFactorAnalysis(K, n_warmup=20, random_state=7).fit(X)
    thesis = OnlineFactorAnalysis(K, n_warmup=20, random_state=7, whiten=False, schedule="harmonic").fit(X)
    assert np.abs(default.get_covariance() - thesis.get_covariance()).max() > 1e-6


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"whiten": "yes"}, TypeError, "whiten must be a bool"),
    ({"schedule": "linear"}, ValueError, "schedule must be one of"),
    ({"schedule": "power", "kappa": 0.3}, ValueError, "kappa"),
    ({"schedule": "constant", "rho": 0.0}, ValueError, "rho"),
    ({"schedule": "power", "tau0": -1.0}, ValueError, "tau0"),
])
def test_bad_schedule_options_are_rejected_at_fit(
    fa_stream: StreamFactory, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    X = fa_stream(D, K, 50, 0)
    with pytest.raises(error, match=message):
        OnlineFactorAnalysis(K, **options).fit(X)


def test_checkpoint_without_the_schedule_parameters_loads_as_the_thesis_algorithm(
    fa_stream: StreamFactory, tmp_path: Any
) -> None:
    # A checkpoint written before whiten/schedule/... existed holds the thesis's Algorithm 2.
    from onlinefa.checkpoint import load_state, save_state

    X = fa_stream(D, K, 300, 0)
    thesis = OnlineFactorAnalysis(K, n_warmup=20, random_state=7, whiten=False, schedule="harmonic")
    thesis.fit(X[:200])
    path = tmp_path / "old.npz"
    thesis.save(path)
    state = load_state(path, "OnlineFactorAnalysis")
    for name in ("whiten", "schedule", "tau0", "kappa", "rho"):
        del state[f"param.{name}"]
    save_state(path, "OnlineFactorAnalysis", state)
    restored = OnlineFactorAnalysis.load(path)
    assert restored.get_params() == thesis.get_params()
    np.testing.assert_array_equal(restored.partial_fit(X[200:]).components_, thesis.partial_fit(X[200:]).components_)


@pytest.mark.parametrize("params", [{}, {"n_components": 50}, {"n_components": 2, "batch_size": 40, "max_iter": 2, "tol": 0},
                                    {"n_components": 2, "batch_size": 40}])
def test_default_and_resolved_estimators_load_back(params: dict[str, Any], tmp_path: Any) -> None:
    # n_components=None (and K >= D, fitted with D - 1 factors) are valid stored hyper-parameters.
    X = np.random.default_rng(0).standard_normal((200, 6))
    fitted = OnlineFactorAnalysis(random_state=0, **params).fit(X)
    fitted.save(tmp_path / "fa.npz")
    loaded = OnlineFactorAnalysis.load(tmp_path / "fa.npz")
    assert loaded.get_params() == fitted.get_params()
    np.testing.assert_array_equal(loaded.components_, fitted.components_)
