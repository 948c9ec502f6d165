"""`onlinefa demo`'s real-data table and batch-FA reference, against independent recomputations."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

import onlinefa
from onlinefa import _demo_mlp as mlp
from onlinefa._demo_batch import batch_fa, fa_log_likelihood
from onlinefa.cli import main
from onlinefa.datasets import load_uci, make_fa_model, sample_fa

LABEL = 22
TINY = ["--hidden", "6", "--pretrain-epochs", "30", "--snapshots", "40", "--rank", "3", "--draws", "7",
        "--seed", "3", "--dataset", "yacht"]


def _rows(out: str) -> dict[str, list[float]]:
    """Rows of the printed tables: label -> its numbers (a "-" cell ends the numbers)."""
    rows = {}
    for line in out.splitlines():
        numbers = []
        for field in line[LABEL:].split():
            try:
                numbers.append(float(field.replace(",", "")))
            except ValueError:
                break
        if numbers:
            rows[line[:LABEL].strip()] = numbers
    return rows


def _forward(theta: NDArray[np.float64], x: NDArray[np.float64], h: int) -> NDArray[np.float64]:
    """The documented layout θ = [W1 (n_in × H, row-major), b1, w2, b2], written out again."""
    n_in = x.shape[1]
    w1 = theta[: n_in * h].reshape(n_in, h)
    b1, w2, b2 = theta[n_in * h: n_in * h + h], theta[n_in * h + h: n_in * h + 2 * h], theta[-1]
    return np.asarray(np.tanh(x @ w1 + b1) @ w2 + b2)


def _bma(thetas: NDArray[np.float64], x: NDArray[np.float64], y: NDArray[np.float64], h: int, s2: float,
         scale: float) -> tuple[float, float]:
    """Mixture NLL and RMSE of the BMA mean, in raw target units, by direct (non-log-sum-exp) evaluation."""
    preds = np.array([_forward(t, x, h) for t in thetas])
    dens = np.exp(-((y - preds) ** 2) / (2 * s2)) / np.sqrt(2 * np.pi * s2)
    nll = -np.mean(np.log(dens.mean(axis=0))) + np.log(scale)
    rmse = np.sqrt(np.mean((preds.mean(axis=0) - y) ** 2)) * scale
    return float(nll), float(rmse)


def test_gradient_is_the_derivative_of_the_loss() -> None:
    rng = np.random.default_rng(0)
    x, y, h = rng.standard_normal((9, 4)), rng.standard_normal(9), 5
    theta = rng.standard_normal(mlp.n_parameters(4, h))
    _, grad = mlp.mlp_loss_and_gradient(theta, x, y, h)
    eps = 1e-6

    def loss(t: NDArray[np.float64]) -> float:
        return mlp.mlp_loss_and_gradient(t, x, y, h)[0]

    numeric = np.array([(loss(theta + eps * e) - loss(theta - eps * e)) / (2 * eps) for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    # and the loss is the documented one
    documented = 0.5 * np.mean((_forward(theta, x, h) - y) ** 2) + 0.5 * mlp.WEIGHT_DECAY * theta @ theta
    assert loss(theta) == pytest.approx(documented, rel=1e-12)


def test_real_table_matches_a_recomputation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--only", "real", *TINY]) == 0
    rows = _rows(capsys.readouterr().out)
    h, seed = 6, 3
    # The fixed split, written out from the documented rule: a seeded permutation, the first 10% held out.
    x, y = load_uci("yacht")
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:31], order[31:]
    mu, sd = x[train].mean(0), x[train].std(0)
    ym, ys = y[train].mean(), y[train].std()
    xtr, ytr, xte, yte = (x[train] - mu) / sd, (y[train] - ym) / ys, (x[test] - mu) / sd, (y[test] - ym) / ys
    split = mlp.load_split("yacht", seed)
    np.testing.assert_allclose(split.x_test, xte, rtol=1e-12, atol=1e-12)
    iterates = mlp.sgd_iterates(split, n_hidden=h, pretrain_epochs=30, n_snapshots=40, learning_rate=0.05,
                                batch_size=32, seed=seed)
    swa = iterates.mean(axis=0)
    s2 = float(np.mean((_forward(swa, xtr, h) - ytr) ** 2))
    var = iterates.var(axis=0)
    rng = np.random.default_rng(seed + 2)
    z, lat = rng.standard_normal((7, iterates.shape[1])), rng.standard_normal((7, 3))
    expected_swa = _bma(swa[None], xte, yte, h, s2, ys)
    expected_diag = _bma(swa + np.sqrt(var) * z, xte, yte, h, s2, ys)
    em = onlinefa.OnlineEM(iterates.shape[1], 3, seed=seed)
    em.update(iterates)
    c, f, psi = em.mean, em.loadings, em.noise_variance
    expected_em = _bma(c + lat @ f.T + np.sqrt(psi) * z, xte, yte, h, s2, ys)
    expected_ratio = float(np.mean((np.einsum("dk,dk->d", f, f) + psi) / var))
    # printed with 4 decimals
    np.testing.assert_allclose(rows["SWA (point)"], [*expected_swa, 0.0], atol=5e-5)
    np.testing.assert_allclose(rows["SWAG-diagonal"], [*expected_diag, 1.0], atol=5e-5)
    np.testing.assert_allclose(rows["online EM (default)"], [*expected_em, expected_ratio], atol=5e-5)
    # The network has learnt something: the SWA point beats predicting the training mean.
    assert expected_swa[1] < 0.5 * ys * np.sqrt(np.mean(yte**2))


def test_default_training_fits_the_data() -> None:
    """At the demo's defaults the network is far better than the constant predictor on held-out rows."""
    split = mlp.load_split("energy", 0)
    iterates = mlp.sgd_iterates(split, n_hidden=50, pretrain_epochs=500, n_snapshots=5, learning_rate=0.05,
                                batch_size=32, seed=0)
    pred = mlp.mlp_predict(iterates.mean(axis=0), split.x_test, 50)
    assert np.sqrt(np.mean((pred - split.y_test) ** 2)) < 0.2 * np.sqrt(np.mean(split.y_test**2))


def test_batch_fa_reaches_the_maximum_likelihood_of_scikit_learn() -> None:
    sklearn_decomposition = pytest.importorskip("sklearn.decomposition")
    c, loadings, psi = make_fa_model(20, 3, spectrum=(1.0, 100.0), seed=2)
    samples = sample_fa(c, loadings, psi, 400, seed=3)
    cov = np.cov(samples, rowvar=False, bias=True)
    fit = batch_fa(cov, 3)
    assert fit.converged
    reference = sklearn_decomposition.FactorAnalysis(3, tol=1e-8, max_iter=100_000, svd_method="lapack").fit(samples)
    ll_sklearn = float(np.mean(reference.score_samples(samples)))
    assert fit.log_likelihood == pytest.approx(fa_log_likelihood(cov, fit.loadings, fit.noise_variance))
    assert fit.log_likelihood == pytest.approx(ll_sklearn, abs=1e-5)
    np.testing.assert_allclose(fit.covariance(), reference.get_covariance(), atol=1e-3 * np.abs(cov).max())
    # the Woodbury log-likelihood equals the dense formula
    full = fit.covariance()
    sign, logdet = np.linalg.slogdet(full)
    dense = -0.5 * (20 * np.log(2 * np.pi) + logdet + np.trace(np.linalg.solve(full, cov)))
    assert fit.log_likelihood == pytest.approx(dense, rel=1e-10)


def test_synthetic_table_prints_the_batch_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--only", "synthetic", "--features", "30", "--components", "2", "--seed", "1"]) == 0
    rows = _rows(capsys.readouterr().out)
    c, loadings, psi = make_fa_model(30, 2, spectrum=(1.0, 100.0), seed=1)
    samples = sample_fa(c, loadings, psi, 20_000, seed=2)
    true = loadings @ loadings.T + np.diag(psi)
    expected = []
    for t in (1_000, 5_000, 20_000):
        fit = batch_fa(np.cov(samples[:t], rowvar=False, bias=True), 2, seed=1)
        expected.append(np.linalg.norm(fit.covariance() - true) / np.linalg.norm(true))
    np.testing.assert_allclose(rows["batch FA (ML)"], expected, atol=5e-5)
    assert rows["batch FA (ML)"][2] < rows["batch FA (ML)"][0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--only", "real", "--snapshots", "1", "--rank", "10"], "--snapshots must be >= 2"),
    (["--only", "real", "--hidden", "0"], "--hidden must be >= 1"),
    (["--only", "real", "--rank", "501"], "--rank must be < D = 501"),
    (["--only", "real", "--learning-rate", "nan"], "--learning-rate must be a finite number > 0"),
    (["--only", "synthetic", "--components", "10", "--features", "10"], "--components must be < --features"),
])
def test_bad_options_are_refused_before_any_work(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""
