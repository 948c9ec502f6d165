"""The promises of docs/guide/usage.md, one test each, named after the promise: read this file as the list.

Each test checks its promise directly on small models (seconds in total). Deeper tests of the same
promise live in the files named in the comments (fuzzing, threads, fork, memory).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa import OnlineFactorAnalysis
from engine_state import engine_state

D, K = 8, 2
RNG = np.random.default_rng(7)
X = (RNG.standard_normal((120, K)) @ RNG.standard_normal((K, D)) + RNG.standard_normal((120, D))) * 2.0 + 1.0


def _em() -> onlinefa.OnlineEM:
    return onlinefa.OnlineEM(D, K, seed=0)


def _state_bytes(model: onlinefa.OnlineEM) -> dict[str, object]:
    return {k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in engine_state(model).items()}


# -- scikit-learn ---------------------------------------------------------------------------------------
def test_fit_equals_partial_fit_over_consecutive_chunks_bit_for_bit() -> None:
    whole = OnlineFactorAnalysis(K, random_state=0).fit(X)
    chunked = OnlineFactorAnalysis(K, random_state=0)
    for start in range(0, len(X), 17):
        chunked.partial_fit(X[start : start + 17])
    assert whole.components_.tobytes() == chunked.components_.tobytes()
    assert whole.noise_variance_.tobytes() == chunked.noise_variance_.tobytes()


def test_batch_with_another_number_of_features_is_a_value_error() -> None:
    fa = OnlineFactorAnalysis(K, random_state=0).fit(X)
    with pytest.raises(ValueError, match=f"X has 7 features, but OnlineFactorAnalysis is expecting {D} features"):
        fa.partial_fit(X[:, :7])


def test_failed_fit_or_partial_fit_changes_nothing() -> None:
    fa = OnlineFactorAnalysis(K, random_state=0).fit(X)
    before = fa.components_.copy(), fa.n_samples_seen_
    bad = X[:10].copy()
    bad[6, 3] = np.nan
    for call in (fa.partial_fit, fa.fit):
        with pytest.raises(ValueError):
            call(bad)
        assert fa.components_.tobytes() == before[0].tobytes() and fa.n_samples_seen_ == before[1]


def test_score_samples_equals_sklearn_factor_analysis_for_the_same_parameters() -> None:
    decomposition = pytest.importorskip("sklearn.decomposition")
    fa = OnlineFactorAnalysis(K, random_state=0).fit(X)
    reference = decomposition.FactorAnalysis(K).fit(X)
    reference.components_, reference.noise_variance_, reference.mean_ = fa.components_, fa.noise_variance_, fa.mean_
    np.testing.assert_allclose(fa.score_samples(X), reference.score_samples(X), rtol=1e-10)


def test_query_methods_accept_magnitudes_up_to_1e100() -> None:
    fa = OnlineFactorAnalysis(K, random_state=0).fit(X)
    huge = np.full((1, D), 1e100)
    assert np.isfinite(fa.transform(huge)).all() and np.isfinite(fa.score_samples(huge)).all()
    with pytest.raises(ValueError):
        fa.score_samples(huge * 10)


# -- checkpoints (more: test_checkpoint.py, test_checkpoint_hygiene.py) ---------------------------------
def test_save_load_and_pickle_continue_bit_identically(tmp_path: Path) -> None:
    model = _em().update(X[:60])
    model.save(tmp_path / "fa.ckpt")
    copies = [onlinefa.OnlineEM.load(tmp_path / "fa.ckpt"), pickle.loads(pickle.dumps(model))]
    for copy in (*copies, model):
        copy.update(X[60:])
    assert _state_bytes(copies[0]) == _state_bytes(model) == _state_bytes(copies[1])


def test_save_is_atomic_leaves_no_temporary_file_and_uses_the_path_as_given(tmp_path: Path) -> None:
    model = _em().update(X)
    model.save(tmp_path / "fa.ckpt")
    model.save(tmp_path / "fa.ckpt")  # overwriting is safe
    assert sorted(os.listdir(tmp_path)) == ["fa.ckpt"]


def test_damaged_files_are_value_errors_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fa.ckpt"
    _em().update(X).save(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fa.ckpt"):
        onlinefa.OnlineEM.load(path)
    with pytest.raises(FileNotFoundError):
        onlinefa.OnlineEM.load(tmp_path / "missing.ckpt")


def test_estimator_save_refuses_a_random_state_object(tmp_path: Path) -> None:
    fa = OnlineFactorAnalysis(K, random_state=np.random.RandomState(0)).fit(X)
    with pytest.raises(TypeError):
        fa.save(tmp_path / "sk.ckpt")


# -- input (more: test_input_layouts.py, test_input_rejection.py, test_interop.py) ------------------------
def test_integer_data_is_converted_once_to_float64() -> None:
    ints = np.round(X * 10).astype(np.int32)
    assert _state_bytes(_em().update(ints)) == _state_bytes(_em().update(ints.astype(np.float64)))


def test_exports_give_the_same_gaussian() -> None:
    from onlinefa.interop import to_torch_low_rank

    model = _em().update(X)
    loc, cov_factor, cov_diag = to_torch_low_rank(model)
    mean, loadings, psi = model.snapshot()
    assert loc.tobytes() == mean.tobytes() and cov_factor.tobytes() == loadings.tobytes()
    assert cov_diag.tobytes() == psi.tobytes()
    stats = pytest.importorskip("scipy.stats")
    dense = stats.multivariate_normal(mean, loadings @ loadings.T + np.diag(psi))
    np.testing.assert_allclose(dense.logpdf(X[:5]), model.log_prob(X[:5]), rtol=1e-10)


# -- bad input, extreme values, constant features (more: test_bad_input.py, test_hostile.py) --------------
def test_bad_rows_name_the_first_bad_row_and_apply_no_row() -> None:
    model = _em().update(X[:30])
    before = _state_bytes(model)
    bad = X[30:40].copy()
    bad[4, 1] = np.inf
    with pytest.raises(ValueError, match="row 4"):
        model.update(bad)
    assert _state_bytes(model) == before


@pytest.mark.parametrize("dtype, limit", [("float64", 1e100), ("float32", 1e18)])
def test_magnitude_limits_per_state_dtype(dtype: str, limit: float) -> None:
    model = onlinefa.OnlineEM(D, K, seed=0, dtype=dtype)
    model.update(np.full(D, limit))
    with pytest.raises(ValueError):
        model.update(np.full(D, limit * 10))


def test_constant_feature_gets_a_zero_loading_row_and_the_noise_floor() -> None:
    data = X.copy()
    data[:, 0] = 5.0
    model = _em().update(data)
    assert np.all(model.loadings[0] == 0.0)
    assert 0.0 < model.noise_variance[0] <= 1e-10 * np.mean(np.var(data, axis=0)) * 10
    assert np.isfinite(model.log_prob(data)).all()


@pytest.mark.parametrize("factor", [1e-4, 1e4])
def test_scaled_data_gives_scaled_covariance(factor: float) -> None:
    plain, scaled = _em().update(X), _em().update(X * factor)
    np.testing.assert_allclose(scaled.covariance(), factor**2 * plain.covariance(), rtol=1e-8)


def test_queries_before_a_first_fit_raise_not_fitted_while_the_mean_is_available() -> None:
    model = _em().update(X[:1])
    assert not model.is_fitted
    np.testing.assert_allclose(model.mean, X[:1].mean(axis=0))
    for query in (lambda: model.loadings, lambda: model.log_prob(X), lambda: model.sample(1), model.snapshot):
        with pytest.raises(onlinefa.NotFittedError):
            query()


# -- threads, fork, query memory: test_concurrency.py, test_fork.py, test_queries.py ----------------------
def test_queries_read_one_consistent_state_and_stream_in_the_core() -> None:
    model = _em().update(X)
    mean, loadings, psi = model.snapshot()
    from onlinefa import _gaussian

    np.testing.assert_allclose(model.log_prob(X[:3]), _gaussian.log_prob(X[:3], mean, loadings, psi), rtol=1e-10)
    assert model.sample(2, seed=0, dtype=np.float32).dtype == np.float32
