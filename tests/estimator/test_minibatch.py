"""Mini-batch online EM (onlinefa.MiniBatchEM) and whole-data-set fitting (onlinefa.fit_minibatch).

* A NumPy transcription of the mini-batch algorithm (E-step of the whole batch with one F and Ψ, stepwise
  statistics over batches, M-step, optional whitening) is the reference: the core must agree to rounding
  (relative 1e-9 after a dozen batches: the K×K algebra is the same, only GEMM summation orders differ).
* Whole-data fits are compared with scikit-learn's batch FactorAnalysis, the maximum-likelihood fit, on
  data drawn from a known FA model.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

import onlinefa
from onlinefa import MiniBatchEM, NotFittedError, fit_minibatch
from onlinefa.errors import ConvergenceWarning
from onlinefa.estimator import MINIBATCH_MAX_ITER
from onlinefa.minibatch import data_moments
from engine_state import engine_state


def fa_data(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loadings = rng.standard_normal((d, k))
    psi = rng.uniform(0.5, 1.5, d)
    offset = rng.standard_normal(d) * 3
    x = offset + rng.standard_normal((n, k)) @ loadings.T + rng.standard_normal((n, d)) * np.sqrt(psi)
    return x, loadings @ loadings.T + np.diag(psi)


class ReferenceMiniBatchEM:
    """The mini-batch algorithm written out in NumPy, one batch at a time."""

    def __init__(self, init: np.ndarray, *, whiten: bool, kappa: float, tau0: float, floor: float,
                 mean: np.ndarray | None = None, variance: np.ndarray | None = None) -> None:
        d, k = init.shape
        self.f0, self.whiten, self.kappa, self.tau0, self.floor = init, whiten, kappa, tau0, floor
        self.fixed = mean is not None
        self.mean = np.zeros(d) if mean is None else mean
        self.dsq = np.zeros(d) if variance is None else variance
        self.a, self.b = np.zeros((d, k)), np.zeros((k, k))
        self.n, self.t = 0, 0
        self.average: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        if self.fixed:
            self._start()

    def start_average(self) -> None:
        self.average = []

    def apply_average(self) -> None:
        # Plain means of the statistics kept in the window (each one rotated into the current basis as the
        # whitening steps came), then the M-step with the current Σ.
        assert self.average is not None
        if self.average:
            k = self.f.shape[1]
            sigma = np.linalg.inv(np.eye(k) + (self.f / self.psi[:, None]).T @ self.f)
            self.a, self.b, self.dsq = (np.mean([entry[i] for entry in self.average], axis=0) for i in range(3))
            self._m_step(sigma + self.b)
        self.average = None

    def _m_step(self, h: np.ndarray) -> None:
        if self.whiten:
            r_inv = np.linalg.inv(np.linalg.cholesky(h))
            self.a = self.a @ r_inv.T
            self.b = r_inv @ self.b @ r_inv.T
            if self.average is not None:
                self.average = [(a @ r_inv.T, r_inv @ b @ r_inv.T, q) for a, b, q in self.average]
            self.f = self.a
        else:
            self.f = self.a @ np.linalg.inv(h)
        self.psi = np.maximum(self.dsq - np.sum(self.f * self.a, axis=1), self.floor * self.dsq.mean())

    def _start(self) -> None:
        self.f = self.f0 * np.sqrt(self.dsq.mean())
        self.psi = np.maximum(self.dsq, self.floor * self.dsq.mean())

    def update(self, x: np.ndarray) -> None:
        b = x.shape[0]
        if not self.fixed:
            self.mean = self.mean + (x.sum(axis=0) - b * self.mean) / (self.n + b)
        dev = x - self.mean
        self.t += 1
        rho = max((self.t + self.tau0) ** -self.kappa, 1.0 / self.t)
        self.dsq = (1 - rho) * self.dsq + rho * (dev**2).mean(axis=0)
        if self.t == 1 and not self.fixed:
            self._start()
        k = self.f.shape[1]
        c = (self.f / self.psi[:, None]).T  # C = Fᵀ Ψ⁻¹
        sigma = np.linalg.inv(np.eye(k) + c @ self.f)  # (4.23)
        m = dev @ (c.T @ sigma)  # rows m_i = Σ C d_i
        self.a = (1 - rho) * self.a + rho * dev.T @ m / b
        self.b = (1 - rho) * self.b + rho * m.T @ m / b
        if self.average is not None:
            self.average.append((self.a, self.b, self.dsq))
        self._m_step(sigma + self.b)
        self.n += b


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("known_moments", [True, False])
def test_matches_the_numpy_transcription(whiten: bool, known_moments: bool) -> None:
    x, _ = fa_data(600, 15, 3, 1)
    init = onlinefa._core.orthonormal_init(15, 3, 7)
    moments = {"mean": x.mean(axis=0), "variance": x.var(axis=0)} if known_moments else {}
    model = MiniBatchEM(15, 3, batch_size=50, init=init, whiten=whiten, kappa=0.6, tau0=1.0, **moments)
    reference = ReferenceMiniBatchEM(init, whiten=whiten, kappa=0.6, tau0=1.0, floor=1e-10, **moments)
    model.update(x)
    for start in range(0, 600, 50):
        reference.update(x[start:start + 50])
    assert model.n_batches == 12 and model.n_seen == 600
    np.testing.assert_allclose(model.mean, reference.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.loadings, reference.f, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.noise_variance, reference.psi, rtol=1e-9)


@pytest.mark.parametrize("whiten", [True, False])
def test_averaging_matches_the_numpy_transcription(whiten: bool) -> None:
    # Averaging starts after 4 of 12 batches; the averaged statistics and the M-step from them must agree
    # with the reference, which keeps every averaged statistic and takes plain means at the end.
    x, _ = fa_data(600, 15, 3, 4)
    init = onlinefa._core.orthonormal_init(15, 3, 8)
    moments = {"mean": x.mean(axis=0), "variance": x.var(axis=0)}
    model = MiniBatchEM(15, 3, batch_size=50, init=init, whiten=whiten, kappa=0.6, tau0=1.0, **moments)
    reference = ReferenceMiniBatchEM(init, whiten=whiten, kappa=0.6, tau0=1.0, floor=1e-10, **moments)
    for start in range(0, 600, 50):
        if start == 200:
            model.start_average()
            reference.start_average()
        model.update(x[start:start + 50])
        reference.update(x[start:start + 50])
    assert model.n_averaged == 8
    np.testing.assert_allclose(model.loadings, reference.f, rtol=1e-9, atol=1e-9)  # the plain iterate
    model.apply_average()
    reference.apply_average()
    assert model.n_averaged is None
    np.testing.assert_allclose(model.loadings, reference.f, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(model.noise_variance, reference.psi, rtol=1e-9)
    # and the next batch continues from the averaged statistics
    model.update(x[:50])
    reference.update(x[:50])
    np.testing.assert_allclose(model.loadings, reference.f, rtol=1e-9, atol=1e-9)


def reference_exact_step(x: np.ndarray, mean: np.ndarray, f: np.ndarray, psi: np.ndarray, floor: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """One exact PX-EM step for factor analysis (Rubin & Thayer's EM, then the whitening rotation)."""
    k = f.shape[1]
    dev = x - mean
    sigma = np.linalg.inv(np.eye(k) + (f / psi[:, None]).T @ f)
    m = dev @ ((f / psi[:, None]) @ sigma)
    a, b, dsq = dev.T @ m / len(x), m.T @ m / len(x), (dev**2).mean(axis=0)
    r_inv = np.linalg.inv(np.linalg.cholesky(sigma + b))
    f_new = a @ r_inv.T
    return f_new, np.maximum(dsq - np.sum(f_new * f_new, axis=1), floor)


def test_exact_step_matches_the_numpy_transcription_and_never_lowers_the_likelihood() -> None:
    x, _ = fa_data(700, 12, 3, 9)
    moments = {"mean": x.mean(axis=0), "variance": x.var(axis=0)}
    model = MiniBatchEM(12, 3, batch_size=64, seed=2, **moments).update(x[:128])  # far from converged
    scores = [model.log_prob(x).mean()]
    for _ in range(8):
        f, psi = reference_exact_step(x, model.mean, model.loadings, model.noise_variance,
                                      1e-10 * x.var(axis=0).mean())
        n_batches = model.n_batches
        model.exact_step(x)  # 11 batches of 64 rows, sums added in order
        assert model.n_batches == n_batches
        np.testing.assert_allclose(model.loadings @ model.loadings.T, f @ f.T, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(model.noise_variance, psi, rtol=1e-9)
        scores.append(model.log_prob(x).mean())
    # EM never lowers the likelihood of the rows it is computed on (up to rounding)
    assert all(b >= a - 1e-10 * abs(a) for a, b in zip(scores, scores[1:]))
    assert scores[-1] > scores[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_core_scores_equal_the_log_density(dtype: type) -> None:
    # The passes are scored by the core's E-step kernel (Woodbury form); it must equal the mean log density
    # of the model (or of the model apply_average would make) computed by the Gaussian query.
    x, _ = fa_data(500, 11, 3, 12)
    rows = x[:300].astype(dtype)
    model = MiniBatchEM(11, 3, batch_size=50, seed=4).update(x[:200]).start_average().update(x[200:])
    plain = model._core.mean_log_prob(rows)
    averaged = model._core.mean_log_prob(rows, True)
    np.testing.assert_allclose(plain, model.log_prob(rows.astype(np.float64)).mean(), rtol=1e-12)
    assert averaged != plain
    model.apply_average()
    np.testing.assert_allclose(averaged, model.log_prob(rows.astype(np.float64)).mean(), rtol=1e-12)
    bad = rows.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="row 7 "):
        model._core.mean_log_prob(bad)


def test_core_scores_stay_accurate_when_some_noise_variances_sit_at_the_floor() -> None:
    # Two copies of a column are explained exactly: their ψ falls to the floor and I + Fᵀ Ψ⁻¹ F is
    # ill-conditioned (~1e9). The log density is then a small difference of two terms of the size of
    # Σ d²/ψ (~1e9 here), so both computations carry an error of a few ulps of that size; the score must
    # match the Gaussian query within 64 ulps of it (forming Σ = P⁻¹ instead of solving with the Cholesky
    # factor was wrong by whole nats on such data).
    x, _ = fa_data(2000, 8, 2, 13)
    x = np.column_stack([x, x[:, 0]])
    model, _ = fit_minibatch(x, 3, batch_size=100, max_iter=20, random_state=0)
    assert model.noise_variance.min() < 1e-6 * np.median(model.noise_variance)
    rows = x[:500]
    scale = np.mean(np.sum((rows - model.mean) ** 2 / model.noise_variance, axis=1))
    assert scale > 1e8
    difference = model._core.mean_log_prob(rows) - model.log_prob(rows).mean()
    assert abs(difference) <= 64 * np.finfo(np.float64).eps * scale


def test_exact_step_refuses_bad_input_and_an_unfitted_model() -> None:
    x, _ = fa_data(100, 6, 2, 10)
    with pytest.raises(RuntimeError, match="fitted"):
        MiniBatchEM(6, 2, batch_size=50, seed=0).exact_step(x)
    model = MiniBatchEM(6, 2, batch_size=50, seed=0).update(x)
    before = [np.array(v) for v in model.snapshot()]
    bad = x.copy()
    bad[70, 4] = np.inf
    with pytest.raises(ValueError, match="row 20 "):  # the second batch's 21st row
        model.exact_step(bad)
    with pytest.raises(ValueError):
        model.exact_step(x[:, :5])
    core = model._core
    a, b, q, n = core.exact_sums(x)
    with pytest.raises(ValueError, match="exact EM sums"):
        core.apply_exact(a, b, -q, n)
    with pytest.raises(ValueError, match="exact EM sums"):
        core.apply_exact(a[:, :1], b, q, n)
    with pytest.raises(ValueError, match="exact EM sums"):
        core.apply_exact(a, b, q, 0)
    for old, new in zip(before, model.snapshot()):
        np.testing.assert_array_equal(old, new)


def test_averaging_call_order_and_checkpoints(tmp_path: Path) -> None:
    x, _ = fa_data(300, 8, 2, 5)
    model = MiniBatchEM(8, 2, batch_size=50, seed=0).update(x[:100])
    with pytest.raises(RuntimeError, match="start_average"):
        model.apply_average()
    before = model.loadings.copy()
    model.start_average().apply_average()  # nothing averaged: only stops averaging
    np.testing.assert_array_equal(model.loadings, before)
    twin = pickle.loads(pickle.dumps(model))
    model.start_average().update(x[100:150]).discard_average()
    twin.update(x[100:150])
    assert model.n_averaged is None
    np.testing.assert_array_equal(model.loadings, twin.loadings)  # discarding changes nothing else
    model.start_average().update(x[150:200])
    model.save(tmp_path / "averaging.npz")
    twins = [pickle.loads(pickle.dumps(model)), onlinefa.load(tmp_path / "averaging.npz")]
    assert [t.n_averaged for t in twins] == [1, 1] == [model.n_averaged] * 2
    for m in (model, *twins):
        m.update(x[200:]).apply_average()
    for twin in twins:
        np.testing.assert_array_equal(model.loadings, twin.loadings)
        np.testing.assert_array_equal(model.noise_variance, twin.noise_variance)


def test_float32_input_is_read_as_its_values() -> None:
    x, _ = fa_data(300, 10, 2, 2)
    x32 = x.astype(np.float32)
    a = MiniBatchEM(10, 2, batch_size=100, seed=0).update(x32)
    b = MiniBatchEM(10, 2, batch_size=100, seed=0).update(x32.astype(np.float64))
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_whole_data_fit_is_close_to_scikit_learn() -> None:
    # The maximum-likelihood fit (scikit-learn) is the best any estimator of this model family can do on
    # these rows; the mini-batch fit must come within 10% of its relative covariance error, and within
    # 0.2% of its average log-likelihood on held-out rows from the same model.
    decomposition = pytest.importorskip("sklearn.decomposition")
    x, cov = fa_data(24000, 40, 4, 3)
    train, test = x[:20000], x[20000:]
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1):  # BLAS threads oversubscribe a loaded machine badly
        batch = decomposition.FactorAnalysis(4, random_state=0).fit(train)
    model, history = fit_minibatch(train, 4, batch_size=1000, max_iter=10, random_state=0)

    def error(loadings: np.ndarray, psi: np.ndarray) -> float:
        return float(np.linalg.norm(loadings @ loadings.T + np.diag(psi) - cov) / np.linalg.norm(cov))

    assert error(model.loadings, model.noise_variance) <= 1.1 * error(batch.components_.T, batch.noise_variance_)
    ours, theirs = model.log_prob(test).mean(), batch.score(test)
    assert abs(ours - theirs) <= 2e-3 * abs(theirs)
    assert 2 <= history.n_passes <= 10 and history.converged and history.n_exact_steps >= 1


def test_data_moments_are_exact_in_chunks(tmp_path: Path) -> None:
    x, _ = fa_data(1001, 6, 2, 4)
    x += 1e6  # a large offset: the pairwise combination keeps the variance exact
    np.save(tmp_path / "x.npy", x)
    # in memory: one parallel read by the core; memory map: chunks of 97 rows combined in Python
    for data in (x, x.astype(np.float32), np.load(tmp_path / "x.npy", mmap_mode="r")):
        mean, variance = data_moments(data, chunk_rows=97)
        np.testing.assert_allclose(mean, data.mean(axis=0, dtype=np.float64), rtol=1e-14)
        np.testing.assert_allclose(variance, data.var(axis=0, dtype=np.float64), rtol=1e-8)


def test_data_moments_name_the_first_bad_row(tmp_path: Path) -> None:
    x, _ = fa_data(500, 6, 2, 4)
    x[311, 2] = np.inf
    x[402, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    for data in (x, np.load(tmp_path / "x.npy", mmap_mode="r")):
        with pytest.raises(ValueError, match="row 311 contains NaN, infinity"):
            data_moments(data, chunk_rows=97)


def test_rows_are_read_in_place_like_the_gathered_batch() -> None:
    x, _ = fa_data(400, 9, 2, 7)
    rows = np.random.default_rng(0).permutation(400)[:250]
    a = MiniBatchEM(9, 2, batch_size=60, seed=3).update(x[:40])
    b = MiniBatchEM(9, 2, batch_size=60, seed=3).update(x[:40])
    a.update(x, rows=rows)
    b.update(x[rows])
    a.update(np.asfortranarray(x), rows=rows - 400)  # negative indices and non-contiguous rows
    b.update(x[rows])
    assert a.n_batches == b.n_batches == 1 + 2 * 5
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_bad_rows_are_refused_before_any_batch() -> None:
    x, _ = fa_data(100, 5, 2, 8)
    model = MiniBatchEM(5, 2, batch_size=10, seed=0).update(x[:20])
    before = [np.array(v) for v in model.snapshot()]
    with pytest.raises(IndexError, match="out of bounds"):
        model.update(x, rows=np.r_[0:30, 100])
    with pytest.raises(IndexError, match="out of bounds"):
        model.update(x, rows=[-101])
    with pytest.raises(TypeError, match="integers"):
        model.update(x, rows=np.arange(10.0))
    with pytest.raises(TypeError, match="integers"):
        model.update(x, rows=np.zeros((2, 2), dtype=int))
    bad = x.copy()
    bad[55, 1] = np.nan
    with pytest.raises(ValueError, match="row 5 "):  # the 6th row of the batch holding row 55
        model.update(bad, rows=np.arange(50, 60))
    assert model.n_seen == 20
    for old, new in zip(before, model.snapshot()):
        np.testing.assert_array_equal(old, new)


def test_memory_mapped_fit_equals_the_in_memory_fit(tmp_path: Path) -> None:
    x, _ = fa_data(3000, 12, 2, 5)
    path = tmp_path / "x.npy"
    np.save(path, x)
    mapped = np.load(path, mmap_mode="r")
    a, _ = fit_minibatch(mapped, 2, batch_size=256, max_iter=3, tol=0, random_state=1)
    b, _ = fit_minibatch(x, 2, batch_size=256, max_iter=3, tol=0, random_state=1, shuffle="blocks")
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_bad_batch_leaves_the_model_unchanged() -> None:
    x, _ = fa_data(200, 8, 2, 6)
    model = MiniBatchEM(8, 2, batch_size=100, seed=0).update(x)
    before = [np.array(v) for v in model.snapshot()]
    bad = x[:50].copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="row 7"):
        model.update(bad)
    with pytest.raises(ValueError):
        model.update(x[:, :5])
    after = model.snapshot()
    assert model.n_seen == 200
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(NotFittedError):
        _ = MiniBatchEM(5, 2, seed=0).loadings
    with pytest.raises(ValueError, match="together"):
        MiniBatchEM(5, 2, mean=np.zeros(5))
    with pytest.raises(ValueError, match="variance"):
        MiniBatchEM(5, 2, mean=np.zeros(5), variance=-np.ones(5))
    with pytest.raises(ValueError, match="n_components"):
        MiniBatchEM(5, 5)
    with pytest.raises(ValueError, match="batch_size"):
        MiniBatchEM(5, 2, batch_size=0)
    with pytest.raises(ValueError, match="shuffle"):
        fit_minibatch(np.ones((10, 4)), 1, shuffle="sometimes")
    with pytest.raises(ValueError, match="tol"):
        fit_minibatch(np.ones((10, 4)), 1, tol=-1.0)
    with pytest.raises(ValueError, match="data matrix"):
        fit_minibatch(np.ones(10), 1)


def test_a_path_is_fitted_like_the_array(tmp_path: Path) -> None:
    x, _ = fa_data(2000, 9, 2, 8)
    path = tmp_path / "x.npy"
    np.save(path, x.astype(np.float32))
    a, _ = fit_minibatch(path, 2, batch_size=300, max_iter=2, tol=0, random_state=3)
    b, _ = fit_minibatch(x.astype(np.float32), 2, batch_size=300, max_iter=2, tol=0, random_state=3,
                         shuffle="blocks")
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    with pytest.raises(ValueError, match="C-order"):
        fit_minibatch(tmp_path / "f.npy", 2)


# -- OnlineFactorAnalysis(batch_size=B, max_iter=...) ------------------------------------------------


def test_estimator_with_batches_is_fit_minibatch() -> None:
    pytest.importorskip("sklearn")
    x, _ = fa_data(1500, 10, 2, 9)
    # 6 passes end before the stopping rule (a ConvergenceWarning); the default max_iter="auto" is 100.
    for max_iter, passes in ((6, 6), ("auto", MINIBATCH_MAX_ITER)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            estimator = onlinefa.OnlineFactorAnalysis(2, batch_size=100, max_iter=max_iter, random_state=4).fit(x)
        model, history = fit_minibatch(x, 2, batch_size=100, max_iter=passes, random_state=4)
        assert len(caught) == (0 if history.converged else 1)
        np.testing.assert_array_equal(estimator.mean_, model.mean)
        np.testing.assert_array_equal(estimator.noise_variance_, model.noise_variance)
        np.testing.assert_array_equal(estimator.components_, onlinefa.canonical_loadings(model.loadings).T)
        assert estimator.n_iter_ == history.n_passes
    assert history.converged and not caught


def test_estimator_passes_improve_a_one_pass_fit() -> None:
    # Standardised breast-cancer features (569 rows, 30 strongly collinear features): one online pass
    # leaves the fit short of the maximum-likelihood one; shuffled passes must close the gap to within 1%
    # of scikit-learn's held-out average log-likelihood, both per sample and in mini-batches.
    datasets = pytest.importorskip("sklearn.datasets")
    decomposition = pytest.importorskip("sklearn.decomposition")
    raw = datasets.load_breast_cancer().data
    x = (raw - raw.mean(0)) / raw.std(0)
    order = np.random.default_rng(0).permutation(len(x))
    train, test = x[order[:455]], x[order[455:]]
    reference = decomposition.FactorAnalysis(5, random_state=0).fit(train).score(test)
    one_pass = onlinefa.OnlineFactorAnalysis(5, random_state=0).fit(train).score(test)
    assert one_pass < reference - 0.01 * abs(reference)  # the gap that passes must close
    for options in ({"max_iter": 50}, {"batch_size": 32, "max_iter": 50}):
        with warnings.catch_warnings():  # these slow, ill-conditioned fits may use all 50 passes
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted = onlinefa.OnlineFactorAnalysis(5, random_state=0, **options).fit(train)
        assert fitted.score(test) >= reference - 0.01 * abs(reference), options


def test_estimator_batch_options_are_validated_and_checkpoints_continue_exactly(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    x, _ = fa_data(200, 6, 2, 10)
    with pytest.raises(ValueError, match="algorithm='em'"):
        onlinefa.OnlineFactorAnalysis(2, algorithm="sga", batch_size=10).fit(x)
    with pytest.raises(ValueError, match="max_iter"):
        onlinefa.OnlineFactorAnalysis(2, max_iter=0).fit(x)
    with pytest.raises(ValueError, match="tol"):
        onlinefa.OnlineFactorAnalysis(2, max_iter=2, tol=float("nan")).fit(x)
    fitted = onlinefa.OnlineFactorAnalysis(2, batch_size=50, random_state=0).fit(x)
    fitted.save(tmp_path / "m.npz")
    restored = onlinefa.OnlineFactorAnalysis.load(tmp_path / "m.npz")
    for model in (fitted, restored):  # the restored model continues bit-identically
        model.partial_fit(x[:60])
    np.testing.assert_array_equal(fitted.components_, restored.components_)
    np.testing.assert_array_equal(fitted.noise_variance_, restored.noise_variance_)
    streamed = onlinefa.OnlineFactorAnalysis(2, batch_size=50, random_state=0)
    for chunk in np.array_split(x, 4):
        streamed.partial_fit(chunk)
    assert streamed.n_samples_seen_ == 200 and np.isfinite(streamed.score(x))


def test_pickle_round_trip_and_corrupt_state_is_refused() -> None:
    import pickle

    x, _ = fa_data(300, 7, 2, 11)
    model = MiniBatchEM(7, 2, batch_size=64, seed=0).update(x)
    clone = pickle.loads(pickle.dumps(model))
    for m in (model, clone):
        m.update(x[:100])
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_array_equal(getattr(model, name), getattr(clone, name))
    assert clone.batch_size == 64 and clone.n_batches == model.n_batches
    state = engine_state(model)
    for key, value in (("psi", -np.ones(7)), ("dsq", np.full(7, np.nan)), ("b_bar", np.array([[1.0, 2.0], [0.0, 1.0]])),
                       ("n_batches", 10**9)):
        with pytest.raises(ValueError, match="mini-batch EM state"):
            onlinefa._core.MiniBatchEMCore.from_state({**state, key: value})


def test_cli_minibatch_fit_writes_a_loadable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onlinefa.cli import main

    x, _ = fa_data(3000, 10, 2, 12)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "model.npz"
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "2", "--minibatch", "250", "--passes", "4", "--seed", "3",
                 "-o", str(out)]) == 0
    assert "MiniBatchEM" in capsys.readouterr().out
    loaded = onlinefa.load(out)
    direct, _ = fit_minibatch(tmp_path / "x.npy", 2, batch_size=250, max_iter=4, random_state=3)
    assert isinstance(loaded, MiniBatchEM)
    np.testing.assert_array_equal(loaded.loadings, direct.loadings)
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "2", "--minibatch", "250", "--method", "sga",
                 "-o", str(out)]) != 0
