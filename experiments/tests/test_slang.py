"""SLANG (the UCI benchmark's baseline) against a dense NumPy transcription of Mishkin et al. (NeurIPS 2018),
Algorithm 1, and, at full rank, against the exact full-covariance Gaussian natural-gradient VI step."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onlinefa_experiments.uci_bnn import _slang  # noqa: E402

N_IN, N_HIDDEN = 2, 3
DIM = _slang.n_parameters(N_IN, N_HIDDEN)  # 3*2 + 3 + 3 + 1 = 13
TAU = 2.5


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is faster than two (and much faster on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- dense NumPy reference


def np_unpack(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    h = N_HIDDEN
    w1 = theta[: h * N_IN].reshape(h, N_IN)
    b1 = theta[h * N_IN: h * N_IN + h]
    w2 = theta[h * N_IN + h: h * N_IN + 2 * h]
    return w1, b1, w2, float(theta[-1])


def np_forward(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2 = np_unpack(theta)
    return np.maximum(x @ w1.T + b1, 0.0) @ w2 + b2


def np_grads(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-example gradients of τ/2 (y − f)², by hand (back-propagation written out), shape (M, D)."""
    w1, b1, w2, b2 = np_unpack(theta)
    pre = x @ w1.T + b1
    hidden = np.maximum(pre, 0.0)
    df = -TAU * (y - (hidden @ w2 + b2))                      # dℓ/df, shape (M,)
    d_pre = df[:, None] * w2[None, :] * (pre > 0)              # (M, H)
    d_w1 = d_pre[:, :, None] * x[:, None, :]                   # (M, H, n_in)
    return np.concatenate([d_w1.reshape(len(x), -1), d_pre, df[:, None] * hidden, df[:, None]], axis=1)


def dense_slang_step(mean: np.ndarray, factor: np.ndarray, diag: np.ndarray, grads: np.ndarray, *, n_data: int,
                     lr: float, beta: float, prior: np.ndarray, rank: int) -> tuple[np.ndarray, ...]:
    """Algorithm 1 with D×D matrices: exact eigendecomposition, exact top-L truncation, diagonal correction, and
    the mean step with the exact inverse of the new precision. ``grads``: all per-example gradients, (K, D)."""
    c = n_data / grads.shape[0]
    g_hat = c * grads.sum(axis=0)
    fisher = c * grads.T @ grads
    a = (1 - beta) * factor @ factor.T + beta * fisher
    evals, evecs = np.linalg.eigh(a)
    top = np.argsort(evals)[::-1][:rank]
    new_factor = evecs[:, top] * np.sqrt(np.maximum(evals[top], 0.0))
    new_diag = (1 - beta) * diag + beta * prior + np.maximum(np.diag(a) - (new_factor ** 2).sum(axis=1), 0.0)
    precision = new_factor @ new_factor.T + np.diag(new_diag)
    new_mean = mean - lr * np.linalg.solve(precision, g_hat + prior * mean)
    return new_mean, new_factor, new_diag, precision


def exact_ngvi_step(mean: np.ndarray, precision: np.ndarray, grads: np.ndarray, *, n_data: int, lr: float,
                    beta: float, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Full-covariance Gaussian natural-gradient VI with the empirical Fisher:
    Σ⁻¹ ← (1−β) Σ⁻¹ + β (Ĝ + diag λ), μ ← μ − α Σ_new (ĝ + λ μ)."""
    c = n_data / grads.shape[0]
    new_precision = (1 - beta) * precision + beta * (c * grads.T @ grads + np.diag(prior))
    return mean - lr * np.linalg.solve(new_precision, c * grads.sum(axis=0) + prior * mean), new_precision


# --------------------------------------------------------------------------- fixtures


def tiny_problem(seed: int, rank: int, n_draws: int = 2, batch: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(batch, N_IN)),
        "y": rng.normal(size=batch),
        "mean": rng.normal(size=DIM),
        "factor": rng.normal(size=(DIM, rank)) * 0.7,
        "diag": rng.uniform(0.5, 2.0, size=DIM),
        "eps": rng.normal(size=(n_draws, DIM)),
        "prior": np.where(_slang._bias_mask(N_IN, N_HIDDEN).numpy(), 0.3, 1.7),
    }


def torch_step(p: dict[str, np.ndarray], *, n_data: int, lr: float, beta: float,
               momentum: float = 0.0) -> tuple[object, np.ndarray, np.ndarray]:
    """SLANG's own sampling, per-example gradients and update; returns (new state, draws, gradients)."""
    t = torch.from_numpy
    state = _slang._State(mean=t(p["mean"]), factor=t(p["factor"]), diag=t(p["diag"]),
                          grad_average=torch.zeros(DIM, dtype=torch.float64))
    thetas = _slang._sample(state.mean, state.factor, state.diag, t(p["eps"]))
    net = _slang._Net(N_IN, N_HIDDEN)
    grads = net.per_example_grads(thetas, t(p["x"]), t(p["y"]), TAU)
    new = _slang._update(state, grads, n_data=n_data, learning_rate=lr, beta=beta, momentum=momentum,
                         prior=t(p["prior"]))
    return new, thetas.numpy(), grads.reshape(-1, DIM).numpy()


# --------------------------------------------------------------------------- building blocks


def test_flat_parameter_layout_matches_numpy_forward() -> None:
    rng = np.random.default_rng(0)
    theta, x = rng.normal(size=DIM), rng.normal(size=(7, N_IN))
    out = _slang._Net(N_IN, N_HIDDEN).forward(torch.from_numpy(theta), torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, np_forward(theta, x), rtol=1e-13, atol=1e-13)


def test_per_example_gradients_match_hand_backprop() -> None:
    p = tiny_problem(1, rank=2, n_draws=3)
    _, thetas, grads = torch_step(p, n_data=40, lr=0.1, beta=0.2)
    expected = np.concatenate([np_grads(theta, p["x"], p["y"]) for theta in thetas])
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(grads, expected, rtol=1e-12, atol=1e-12)


def test_fast_sampling_has_the_low_rank_plus_diagonal_covariance() -> None:
    p = tiny_problem(2, rank=3)
    zero = torch.zeros(DIM, dtype=torch.float64)
    # With ε = the identity the draws are the rows of Tᵀ, and Tᵀ... gives T Tᵀ, which must be (U Uᵀ + diag d)⁻¹.
    rows = _slang._sample(zero, torch.from_numpy(p["factor"]), torch.from_numpy(p["diag"]),
                          torch.eye(DIM, dtype=torch.float64)).numpy()
    covariance = np.linalg.inv(p["factor"] @ p["factor"].T + np.diag(p["diag"]))
    np.testing.assert_allclose(rows.T @ rows, covariance, rtol=1e-10, atol=1e-12)


def test_woodbury_solve_matches_dense_solve() -> None:
    p = tiny_problem(3, rank=4)
    v = np.random.default_rng(3).normal(size=DIM)
    got = _slang._woodbury_solve(torch.from_numpy(p["factor"]), torch.from_numpy(p["diag"]),
                                 torch.from_numpy(v)).numpy()
    expected = np.linalg.solve(p["factor"] @ p["factor"].T + np.diag(p["diag"]), v)
    np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-12)


# --------------------------------------------------------------------------- one SLANG step


@pytest.mark.parametrize(("rank", "n_draws", "batch"), [(1, 2, 5), (3, 2, 5), (4, 1, 8)])
def test_one_step_matches_dense_transcription(rank: int, n_draws: int, batch: int) -> None:
    p = tiny_problem(10 + rank, rank=rank, n_draws=n_draws, batch=batch)
    lr, beta, n_data = 0.3, 0.2, 40
    new, thetas, _ = torch_step(p, n_data=n_data, lr=lr, beta=beta)
    grads = np.concatenate([np_grads(theta, p["x"], p["y"]) for theta in thetas])
    mean, factor, diag, precision = dense_slang_step(p["mean"], p["factor"], p["diag"], grads, n_data=n_data,
                                                     lr=lr, beta=beta, prior=p["prior"], rank=rank)
    got_factor = new.factor.numpy()  # type: ignore[attr-defined]
    np.testing.assert_allclose(got_factor @ got_factor.T, factor @ factor.T, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(new.diag.numpy(), diag, rtol=1e-10, atol=1e-12)  # type: ignore[attr-defined]
    np.testing.assert_allclose(new.mean.numpy(), mean, rtol=1e-9, atol=1e-11)  # type: ignore[attr-defined]
    # The diagonal correction: the approximation keeps the diagonal of the exact update ...
    _, exact_precision = exact_ngvi_step(p["mean"], p["factor"] @ p["factor"].T + np.diag(p["diag"]), grads,
                                         n_data=n_data, lr=lr, beta=beta, prior=p["prior"])
    np.testing.assert_allclose(np.diag(precision), np.diag(exact_precision), rtol=1e-10)
    # ... but at low rank is not the exact update (so the full-rank test below can fail).
    assert np.abs(precision - exact_precision).max() > 1e-2


@pytest.mark.parametrize("start_factor", ["random", "zero"])
def test_full_rank_step_is_the_exact_natural_gradient_vi_step(start_factor: str) -> None:
    p = tiny_problem(20, rank=DIM, n_draws=2, batch=6)
    if start_factor == "zero":
        p["factor"] = np.zeros((DIM, DIM))
    lr, beta, n_data = 0.3, 0.2, 40
    new, thetas, _ = torch_step(p, n_data=n_data, lr=lr, beta=beta)
    grads = np.concatenate([np_grads(theta, p["x"], p["y"]) for theta in thetas])
    mean, precision = exact_ngvi_step(p["mean"], p["factor"] @ p["factor"].T + np.diag(p["diag"]), grads,
                                      n_data=n_data, lr=lr, beta=beta, prior=p["prior"])
    got_factor = new.factor.numpy()  # type: ignore[attr-defined]
    got_precision = got_factor @ got_factor.T + np.diag(new.diag.numpy())  # type: ignore[attr-defined]
    np.testing.assert_allclose(got_precision, precision, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(new.mean.numpy(), mean, rtol=1e-9, atol=1e-11)  # type: ignore[attr-defined]


def test_rank_above_the_update_rank_is_exact_too() -> None:
    """From U = 0, A = β Ĝ has rank ≤ S·M, so L = S·M < D already reproduces the exact step."""
    p = tiny_problem(21, rank=4, n_draws=1, batch=4)
    p["factor"] = np.zeros((DIM, 4))
    lr, beta, n_data = 0.5, 0.3, 30
    new, thetas, _ = torch_step(p, n_data=n_data, lr=lr, beta=beta)
    grads = np.concatenate([np_grads(theta, p["x"], p["y"]) for theta in thetas])
    mean, precision = exact_ngvi_step(p["mean"], np.diag(p["diag"]), grads, n_data=n_data, lr=lr, beta=beta,
                                      prior=p["prior"])
    got_factor = new.factor.numpy()  # type: ignore[attr-defined]
    got_precision = got_factor @ got_factor.T + np.diag(new.diag.numpy())  # type: ignore[attr-defined]
    np.testing.assert_allclose(got_precision, precision, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(new.mean.numpy(), mean, rtol=1e-9, atol=1e-11)  # type: ignore[attr-defined]


def test_first_step_is_the_same_with_the_bias_corrected_gradient_average() -> None:
    p = tiny_problem(22, rank=2)
    plain, _, _ = torch_step(p, n_data=40, lr=0.3, beta=0.2, momentum=0.0)
    averaged, _, _ = torch_step(p, n_data=40, lr=0.3, beta=0.2, momentum=0.9)
    np.testing.assert_allclose(averaged.mean.numpy(), plain.mean.numpy(), rtol=1e-12)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the fit


def test_fit_recovers_a_smooth_function_with_spread() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-2.0, 2.0, size=(80, 1))
    truth = lambda z: 0.8 * z[:, 0] + 0.4 * np.sin(2.0 * z[:, 0])  # noqa: E731
    y = truth(x) + 0.1 * rng.normal(size=80)
    posterior = _slang.fit_slang(x, y, n_hidden=16, prior_precision=1.0, noise_precision=100.0, rank=2,
                                 n_epochs=60, batch_size=16, learning_rate=0.05, seed=0, n_mc_samples=2)
    grid = np.linspace(-1.8, 1.8, 25)[:, None]
    draws = posterior.predict_draws(grid, n_samples=200, seed=1)
    assert draws.shape == (200, 25)
    rmse = np.sqrt(np.mean((draws.mean(axis=0) - truth(grid)) ** 2))
    assert rmse < 0.1, rmse
    spread = draws.std(axis=0)
    assert np.all(spread > 1e-3) and np.all(spread < 0.5), spread
    # Reproducible from its seeds.
    np.testing.assert_array_equal(posterior.predict_draws(grid, n_samples=5, seed=3),
                                  posterior.predict_draws(grid, n_samples=5, seed=3))


def test_fit_is_reproducible_and_leaves_the_global_generator_alone() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(30, 2)), rng.normal(size=30)
    kwargs = dict(n_hidden=4, prior_precision=1.0, noise_precision=1.0, rank=1, n_epochs=2, batch_size=10,
                  learning_rate=0.01, seed=7)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = _slang.fit_slang(x, y, **kwargs)  # type: ignore[arg-type]
    assert torch.equal(torch.get_rng_state(), before)
    b = _slang.fit_slang(x, y, **kwargs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.precision_diag, b.precision_diag)
    assert a.mean.shape == (_slang.n_parameters(2, 4),) and a.precision_factor.shape == (a.mean.shape[0], 1)


@pytest.mark.parametrize(("change", "message"), [
    ({"x": np.zeros((5,))}, "x must be"),
    ({"y": np.zeros(4)}, "y must have shape"),
    ({"y": np.array([0.0, 1.0, np.nan, 0.0, 0.0])}, "y must be finite"),
    ({"rank": 0}, "rank"),
    ({"noise_precision": -1.0}, "noise_precision"),
    ({"beta": 1.5}, "beta"),
    ({"momentum": 1.0}, "momentum"),
])
def test_bad_input_is_rejected(change: dict[str, object], message: str) -> None:
    kwargs: dict[str, object] = dict(x=np.zeros((5, 2)), y=np.zeros(5), n_hidden=3, prior_precision=1.0,
                                     noise_precision=1.0, rank=1, n_epochs=1, batch_size=2, learning_rate=0.01,
                                     seed=0)
    kwargs.update(change)
    x, y = kwargs.pop("x"), kwargs.pop("y")
    with pytest.raises(ValueError, match=message):
        _slang.fit_slang(x, y, **kwargs)  # type: ignore[arg-type]


def test_predict_rejects_wrong_width() -> None:
    posterior = _slang.fit_slang(np.zeros((4, 2)), np.zeros(4), n_hidden=3, prior_precision=1.0,
                                 noise_precision=1.0, rank=1, n_epochs=1, batch_size=2, learning_rate=0.01, seed=0)
    with pytest.raises(ValueError, match="2 columns"):
        posterior.predict_draws(np.zeros((3, 3)), n_samples=2, seed=0)
