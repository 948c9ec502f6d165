"""The linearised predictive against a dense Jacobian and central finite differences (D <= 50), against
exact BMA on a network that is linear in θ, and the scale rules against closed forms on a linear-Gaussian
model whose exact posterior is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
scipy_optimize = pytest.importorskip("scipy.optimize")

from onlinefa.torch import (  # noqa: E402
    MultiSWAG,
    ParameterVector,
    bayesian_model_average,
    linearized_model_average,
    linearized_predictions,
    sample_parameters,
    select_scale,
)


class Gaussian:
    """A fixed N(c, F Fᵀ + diag ψ)."""

    def __init__(self, mean: np.ndarray, loadings: np.ndarray, noise_variance: np.ndarray) -> None:
        self.mean, self.loadings, self.noise_variance = mean, loadings, noise_variance


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()  # D = 26


def _posterior(d: int, k: int, seed: int, width: float = 0.3) -> Gaussian:
    rng = np.random.default_rng(seed)
    return Gaussian(rng.standard_normal(d), width * rng.standard_normal((d, k)), width**2 * rng.uniform(0.1, 1, d))


def _inputs(n: int = 5) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def _output_at(module: torch.nn.Module, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ParameterVector(module, dtype=torch.float64).assign(theta)
    with torch.no_grad():
        return module(x)


def test_deviation_is_the_dense_jacobian_times_the_draw_and_matches_finite_differences() -> None:
    module, x = _mlp(), _inputs()
    post = _posterior(26, 3, seed=1)
    before = [p.detach().clone() for p in module.parameters()]
    got = linearized_predictions(module, post, [(x,)], n_samples=4, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters())), "θ must be left as it was"
    mean = torch.as_tensor(post.mean)
    draws = torch.cat(list(sample_parameters(post, 4, seed=5, dtype=torch.float64)))

    def flat_output(theta: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, dict(zip([n for n, _ in module.named_parameters()],
                                                           _split(module, theta))), (x,))

    jacobian = torch.autograd.functional.jacobian(flat_output, mean)  # (N, C, D), dense
    for s in range(4):
        delta = draws[s] - mean
        expected = torch.einsum("ncd,d->nc", jacobian, delta)
        assert torch.allclose(got.deviation[s], expected, rtol=1e-10, atol=1e-12)
        step = 1e-5
        central = (_output_at(module, mean + step * delta, x) - _output_at(module, mean - step * delta, x)) / (2 * step)
        assert torch.allclose(got.deviation[s], central, rtol=1e-6, atol=1e-8)
        assert torch.allclose(got.centre[s], _output_at(module, mean, x), rtol=0, atol=1e-13)


def _split(module: torch.nn.Module, theta: torch.Tensor) -> list[torch.Tensor]:
    sizes = [p.numel() for p in module.parameters()]
    return [part.view(p.shape) for part, p in zip(theta.split(sizes), module.parameters())]


def test_a_network_linear_in_theta_predicts_exactly_as_bma() -> None:
    torch.manual_seed(1)
    module = torch.nn.Linear(3, 4).double()  # logits linear in θ: linearisation is exact
    post = _posterior(16, 2, seed=2, width=1.0)
    x = _inputs(6)
    for scale in (0.3, 2.0):
        lin = linearized_model_average(module, post, [(x[:4],), (x[4:],)], n_samples=7, scale=scale, seed=3)
        bma = bayesian_model_average(module, post, [(x[:4],), (x[4:],)], n_samples=7, scale=scale, seed=3)
        assert torch.allclose(lin, bma, rtol=1e-12, atol=1e-14)


def test_a_mixture_linearises_each_component_around_its_own_mean() -> None:
    module, x = _mlp(), _inputs()
    parts = [_posterior(26, 2, seed=s) for s in (3, 4)]
    got = linearized_predictions(module, MultiSWAG(parts), [(x, torch.zeros(5))], n_samples=5, seed=1)
    counts = MultiSWAG(parts).split(5)
    assert got.centre.shape == (5, 5, 2) and got.targets is not None and got.targets.shape == (5,)
    for s in range(5):
        part = parts[0] if s < counts[0] else parts[1]
        assert torch.allclose(got.centre[s], _output_at(module, torch.as_tensor(part.mean), x), atol=1e-13)


def test_outputs_scale_the_deviation_by_the_root_of_the_scale() -> None:
    module, x = _mlp(), _inputs()
    got = linearized_predictions(module, _posterior(26, 2, seed=1), [(x,)], n_samples=2, seed=0)
    assert torch.allclose(got.outputs(4.0), got.centre + 2.0 * got.deviation)
    with pytest.raises(ValueError, match="scale"):
        got.outputs(-1.0)


def test_bad_arguments_are_refused() -> None:
    module, x = _mlp(), _inputs()
    with pytest.raises(ValueError, match="features"):
        linearized_predictions(module, _posterior(25, 2, seed=1), [(x,)], n_samples=1)
    with pytest.raises(ValueError, match="one-shot"):
        linearized_predictions(module, _posterior(26, 2, seed=1), iter([(x,)]), n_samples=2)
    with pytest.raises(ValueError, match="no batches"):
        linearized_predictions(module, _posterior(26, 2, seed=1), [], n_samples=1)
    with pytest.raises(ValueError, match="task"):
        linearized_model_average(module, _posterior(26, 2, seed=1), [(x,)], task="ranking")


# --- scale rules on Bayesian linear regression y = X w + ε, ε ~ N(0, σ²), w ~ N(0, α⁻¹ I) ---------------

SIGMA2, ALPHA, N_ROWS, N_FEATURES = 0.5, 2.0, 40, 3


def _linear_problem(seed: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N_ROWS, N_FEATURES))
    y = X @ rng.standard_normal(N_FEATURES) + math.sqrt(SIGMA2) * rng.standard_normal(N_ROWS)
    precision = X.T @ X / SIGMA2 + ALPHA * np.eye(N_FEATURES)
    covariance = np.linalg.inv(precision)
    mean = covariance @ X.T @ y / SIGMA2
    module = torch.nn.Linear(N_FEATURES, 1, bias=False).double()
    return module, torch.as_tensor(X), torch.as_tensor(y), mean, covariance


def _gaussian_with_covariance(mean: np.ndarray, covariance: np.ndarray) -> Gaussian:
    """N(mean, covariance) written as F Fᵀ + ψ I (ψ half the smallest eigenvalue, F its Cholesky rest)."""
    psi = 0.5 * float(np.linalg.eigvalsh(covariance).min())
    loadings = np.linalg.cholesky(covariance - psi * np.eye(len(mean)))
    return Gaussian(mean, loadings, np.full(len(mean), psi))


@pytest.mark.parametrize("too_narrow", [0.1, 1.0, 30.0])
@pytest.mark.slow
def test_the_elbo_rule_recovers_the_exact_posterior_scale(too_narrow: float) -> None:
    # Σ = Σ_post / s₀: the ELBO over scales of this shape peaks at s = D / tr(P Σ) = s₀ exactly; the rule
    # estimates E_q log p by S = 8000 draws, whose relative error in tr(X Σ Xᵀ) is below sqrt(2/S) = 0.016,
    # so 0.08 in log s is five standard errors.
    module, X, y, mean, covariance = _linear_problem(seed=0)
    post = _gaussian_with_covariance(mean, covariance / too_narrow)
    predictions = linearized_predictions(module, post, [(X, y)], n_samples=8000, seed=1)
    chosen = select_scale(predictions, rule="elbo", task="regression", noise_variance=SIGMA2, posterior=post,
                          prior_precision=ALPHA)
    assert abs(math.log(chosen.scale / too_narrow)) < 0.08, chosen
    assert not chosen.at_bound


@pytest.mark.slow
def test_the_validation_rule_maximises_the_closed_form_predictive_density() -> None:
    # The mixture of S Gaussians N(x c + √s x δ_s, σ²) tends to N(x c, σ² + s xᵀΣx); the closed form's
    # maximiser over s, found by SciPy, is what the rule must choose (S = 8000, same tolerance as above).
    module, X, y, mean, covariance = _linear_problem(seed=3)
    rng = np.random.default_rng(4)
    X_val = rng.standard_normal((200, N_FEATURES))
    y_val = X_val @ rng.multivariate_normal(mean, covariance) + math.sqrt(SIGMA2) * rng.standard_normal(200)
    post = _gaussian_with_covariance(mean, covariance / 20.0)
    shape = np.einsum("nd,de,ne->n", X_val, covariance / 20.0, X_val)

    def negative_density(log_scale: float) -> float:
        variance = SIGMA2 + math.exp(log_scale) * shape
        return float(np.mean(0.5 * (y_val - X_val @ mean) ** 2 / variance + 0.5 * np.log(2 * math.pi * variance)))

    best = scipy_optimize.minimize_scalar(negative_density, bounds=(-5.0, 10.0), method="bounded",
                                          options={"xatol": 1e-8}).x
    predictions = linearized_predictions(module, post, [(torch.as_tensor(X_val), torch.as_tensor(y_val))],
                                         n_samples=8000, seed=2)
    chosen = select_scale(predictions, task="regression", noise_variance=SIGMA2, within_standard_error=False)
    assert abs(math.log(chosen.scale) - best) < 0.08, (chosen, math.exp(best))
    assert abs(chosen.score + negative_density(best)) < 0.01


def test_the_validation_rule_on_labels_prefers_width_where_the_centre_is_wrong() -> None:
    # Classification: one row whose centre logits favour the wrong class; a wider posterior hedges it.
    centre = torch.tensor([[[4.0, 0.0]]]).expand(200, 1, 2)
    deviation = torch.randn(200, 1, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    from onlinefa.torch import LinearizedPredictions

    wrong = select_scale(LinearizedPredictions(centre, deviation, torch.tensor([1])), bounds=(1e-2, 1e2))
    right = select_scale(LinearizedPredictions(centre, deviation, torch.tensor([0])), bounds=(1e-2, 1e2))
    assert wrong.scale > 10.0 and right.scale < 0.05


def test_select_scale_refuses_bad_arguments() -> None:
    from onlinefa.torch import LinearizedPredictions

    preds = LinearizedPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2), None)
    with pytest.raises(ValueError, match="no targets"):
        select_scale(preds)
    with pytest.raises(ValueError, match="rule"):
        select_scale(preds, rule="aic", targets=torch.zeros(3))
    with pytest.raises(ValueError, match="noise_variance"):
        select_scale(preds, task="regression", targets=torch.zeros(3, 2), noise_variance=0.0)
    with pytest.raises(ValueError, match="noise_variance"):
        select_scale(preds, rule="elbo", task="regression", targets=torch.zeros(3, 2), prior_precision=1.0,
                     posterior=_posterior(4, 1, seed=0))
    with pytest.raises(TypeError, match="within_standard_error"):
        select_scale(preds, targets=torch.zeros(3), within_standard_error="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bounds"):
        select_scale(preds, targets=torch.zeros(3), bounds=(1.0, 0.5))
    with pytest.raises(ValueError, match="posterior"):
        select_scale(preds, rule="elbo", targets=torch.zeros(3), prior_precision=1.0)
    post = Gaussian(np.zeros(4), np.zeros((4, 1)), np.zeros(4))
    with pytest.raises(ValueError, match="zero"):
        select_scale(preds, rule="elbo", targets=torch.zeros(3), posterior=post, prior_precision=1.0)
    with pytest.raises(ValueError, match="prior_precision"):
        select_scale(preds, rule="elbo", targets=torch.zeros(3), posterior=post)
    with pytest.raises(ValueError, match="targets"):
        select_scale(preds, targets=torch.zeros(4))


class _DictModel(torch.nn.Module):
    """A Hugging Face–style model: keyword inputs, an output mapping with ``logits``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, input_values: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"logits": self.body(input_values)}


def test_dict_batches_pass_as_keywords_and_their_labels_are_the_targets() -> None:
    model, x = _DictModel(), _inputs()
    labels = torch.tensor([0, 1, 1, 0, 1])
    post = _posterior(26, 2, seed=1)
    batches = [{"input_values": x[:3], "labels": labels[:3]}, {"input_values": x[3:], "labels": labels[3:]}]
    got = linearized_predictions(model, post, batches, n_samples=3, seed=4)
    plain = linearized_predictions(model.body, post, [(x,)], n_samples=3, seed=4)
    assert torch.equal(got.targets, labels)
    assert torch.allclose(got.centre, plain.centre) and torch.allclose(got.deviation, plain.deviation)
    assert plain.targets is None


def test_the_one_standard_error_rule_takes_the_widest_scale_within_one_se_of_the_best() -> None:
    # An independent NumPy transcription on a dense grid: per-row log mixture densities, the best mean, one
    # standard error of the mean at the best, and the last scale above the best still within it.
    gen = torch.Generator().manual_seed(3)
    centre = (3.0 * torch.randn(1, 60, 4, generator=gen, dtype=torch.float64)).expand(40, 60, 4)
    deviation = torch.randn(40, 60, 4, generator=gen, dtype=torch.float64)
    labels = centre[0].argmax(dim=-1)
    labels[:4] = (labels[:4] + 1) % 4  # four rows whose centre is wrong: an interior best
    from onlinefa.torch import LinearizedPredictions

    predictions = LinearizedPredictions(centre, deviation, labels)
    grid = np.linspace(math.log(1e-3), math.log(1e3), 6001)

    def rows(log_scale: float) -> np.ndarray:
        logits = (centre + math.exp(0.5 * log_scale) * deviation).numpy()
        log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        picked = log_p[:, np.arange(60), labels.numpy()]
        return np.log(np.exp(picked).mean(axis=0))

    means = np.array([rows(v).mean() for v in grid])
    best = int(means.argmax())
    threshold = means[best] - rows(grid[best]).std(ddof=1) / math.sqrt(60)
    last = best
    while last + 1 < grid.size and means[last + 1] >= threshold:
        last += 1
    widest = select_scale(predictions, bounds=(1e-3, 1e3))
    plain = select_scale(predictions, bounds=(1e-3, 1e3), within_standard_error=False)
    assert abs(math.log(plain.scale) - grid[best]) < 0.01
    assert abs(math.log(widest.scale) - grid[last]) < 0.01
    assert widest.scale > 1.5 * plain.scale  # the rule moved: the test can tell it from the maximiser


# --- the softmax temperature chosen with the scale ----------------------------------------------------------


def test_outputs_divide_by_the_temperature_and_refuse_a_bad_one() -> None:
    module, x = _mlp(), _inputs()
    got = linearized_predictions(module, _posterior(26, 2, seed=1), [(x,)], n_samples=2, seed=0)
    assert torch.allclose(got.outputs(4.0, 2.5), (got.centre + 2.0 * got.deviation) / 2.5)
    assert torch.equal(got.outputs(4.0, 1.0), got.outputs(4.0))
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="temperature"):
            got.outputs(1.0, bad)
    with pytest.raises(TypeError, match="temperature"):
        got.outputs(1.0, True)


def test_the_model_average_divides_every_draws_logits_by_the_temperature() -> None:
    module, x = _mlp(), _inputs()
    post = _posterior(26, 2, seed=1)
    got = linearized_model_average(module, post, [(x,)], n_samples=3, scale=2.0, seed=5, temperature=0.7)
    draws = linearized_predictions(module, post, [(x,)], n_samples=3, seed=5)
    logits = (draws.centre + math.sqrt(2.0) * draws.deviation).numpy() / 0.7
    expected = np.exp(logits - logits.max(axis=-1, keepdims=True))
    expected = (expected / expected.sum(axis=-1, keepdims=True)).mean(axis=0)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="temperature"):
        linearized_model_average(module, post, [(x,)], n_samples=3, task="regression", temperature=2.0)


def _tempered_problem(true_temperature: float, n_rows: int, n_draws: int, seed: int, flipped: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Centre logits 3·N(0, 1) and labels drawn from softmax(centre / true_temperature), except the first
    ``flipped`` rows, whose label is the class after the centre's choice. Deviations N(0, 1) on those rows
    and N(0, 0.1²) on the others: width pays on the flipped rows, the temperature on the rest."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(1, n_rows, 4, generator=gen, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits[0] / true_temperature, dim=-1), 1, generator=gen).reshape(-1)
    labels[:flipped] = (logits[0, :flipped].argmax(dim=-1) + 1) % 4
    spread = torch.full((1, n_rows, 1), 0.1, dtype=torch.float64)
    spread[0, :flipped] = 1.0
    deviation = spread * torch.randn(n_draws, n_rows, 4, generator=gen, dtype=torch.float64)
    return logits.expand(n_draws, n_rows, 4), deviation, labels


@pytest.mark.slow
def test_with_no_deviation_the_temperature_is_the_maximum_likelihood_one() -> None:
    # Zero deviations: every scale predicts alike and T is plain temperature scaling. Its maximum-likelihood
    # value, found by SciPy's bounded Brent search, must match; and with 4,000 rows drawn at T0 = 2 it must lie
    # within 4 standard errors of T0 (the observed Fisher information's, by central differences).
    from onlinefa.torch import LinearizedPredictions

    centre, deviation, labels = _tempered_problem(2.0, 4000, 1, seed=11)
    z, y = centre[0].numpy(), labels.numpy()

    def nll(log_t: float) -> float:
        scaled = z / math.exp(log_t)
        top = scaled.max(axis=1, keepdims=True)
        log_p = scaled - top - np.log(np.exp(scaled - top).sum(axis=1, keepdims=True))
        return float(-log_p[np.arange(y.size), y].sum())

    reference = scipy_optimize.minimize_scalar(nll, bounds=(0.0, math.log(10.0)), method="bounded",
                                               options={"xatol": 1e-8}).x
    chosen = select_scale(LinearizedPredictions(centre, 0.0 * deviation, labels), temperature=True)
    assert abs(math.log(chosen.temperature) - reference) < 1e-3
    h = 1e-3
    information = (nll(reference + h) - 2.0 * nll(reference) + nll(reference - h)) / h**2
    assert abs(reference - math.log(2.0)) < 4.0 / math.sqrt(information)


@pytest.mark.slow
def test_the_temperature_rule_transcribed_with_scipy() -> None:
    # The pair (s, T) maximising the held-out score, then the widest s within one standard error at that T:
    # nested bounded Brent searches of SciPy and a root of the threshold crossing, against the library's grids
    # and golden sections.
    from onlinefa.torch import LinearizedPredictions

    centre, deviation, labels = _tempered_problem(3.0, 80, 30, seed=6, flipped=4)
    c, d, y = centre.numpy(), deviation.numpy(), labels.numpy()
    log_t_bounds = (0.0, math.log(10.0))

    def rows(log_s: float, log_t: float) -> np.ndarray:
        logits = (c + math.exp(0.5 * log_s) * d) / math.exp(log_t)
        top = logits.max(axis=-1, keepdims=True)
        log_p = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
        picked = log_p[:, np.arange(y.size), y]
        peak = picked.max(axis=0)
        return peak + np.log(np.exp(picked - peak).mean(axis=0))

    def best_t(log_s: float) -> float:
        return scipy_optimize.minimize_scalar(lambda v: -rows(log_s, v).mean(), bounds=log_t_bounds,
                                              method="bounded", options={"xatol": 1e-7}).x

    def profile(log_s: float) -> float:
        return float(rows(log_s, best_t(log_s)).mean())

    coarse = np.linspace(math.log(1e-3), math.log(1e5), 33)
    top = int(np.argmax([profile(v) for v in coarse]))
    log_s_star = scipy_optimize.minimize_scalar(lambda v: -profile(v), bounds=(coarse[top - 1], coarse[top + 1]),
                                                method="bounded", options={"xatol": 1e-6}).x
    log_t_star = best_t(log_s_star)
    at_best = rows(log_s_star, log_t_star)
    threshold = at_best.mean() - at_best.std(ddof=1) / math.sqrt(y.size)
    grid = np.linspace(log_s_star, math.log(1e5), 400)
    above = [rows(v, log_t_star).mean() >= threshold for v in grid]
    first_out = above.index(False)
    log_s_widest = scipy_optimize.brentq(lambda v: rows(v, log_t_star).mean() - threshold, grid[first_out - 1],
                                         grid[first_out], xtol=1e-8)
    predictions = LinearizedPredictions(centre, deviation, labels)
    plain = select_scale(predictions, bounds=(1e-3, 1e5), within_standard_error=False, temperature=True)
    widest = select_scale(predictions, bounds=(1e-3, 1e5), temperature=True)
    assert 0 < top < coarse.size - 1 and 1.2 < math.exp(log_t_star) < 5.0  # an interior best
    assert plain.score > profile(log_s_star) - 1e-6
    assert abs(math.log(plain.scale) - log_s_star) < 0.05 and abs(math.log(plain.temperature) - log_t_star) < 0.01
    assert abs(math.log(widest.scale) - log_s_widest) < 0.02 and widest.temperature == plain.temperature
    assert widest.scale > 1.5 * plain.scale  # the rule moved: the test can tell it from the maximiser
    untempered = select_scale(predictions, bounds=(1e-3, 1e5), within_standard_error=False)
    assert untempered.temperature == 1.0 and abs(math.log(untempered.scale / plain.scale)) > 0.5  # T moves s


def test_the_temperature_never_sharpens_rows_classified_without_an_error() -> None:
    # Every label is the centre's choice: the likelihood grows as T falls, without limit. T stays at 1.
    from onlinefa.torch import LinearizedPredictions

    centre, deviation, _ = _tempered_problem(1.0, 50, 5, seed=2)
    chosen = select_scale(LinearizedPredictions(centre, deviation, centre[0].argmax(dim=-1)), temperature=True)
    assert 1.0 <= chosen.temperature < 1.001


def test_the_temperature_is_refused_where_it_has_no_meaning() -> None:
    from onlinefa.torch import LinearizedPredictions

    preds = LinearizedPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="temperature=True"):
        select_scale(preds, task="regression", noise_variance=1.0, temperature=True)
    post = Gaussian(np.zeros(4), np.ones((4, 1)), np.ones(4))
    with pytest.raises(ValueError, match="temperature=True"):
        select_scale(preds, rule="elbo", posterior=post, prior_precision=1.0, temperature=True)
    with pytest.raises(TypeError, match="temperature"):
        select_scale(preds, temperature=1.0)  # type: ignore[arg-type]


# --- the linearised Gaussian of regression: its variance, and s and σ² chosen together --------------------


def test_the_variance_estimates_the_dense_jacobians_covariance_and_groups_components() -> None:
    # diag(J Σ Jᵀ) from a dense Jacobian of the MLP at each component's mean. Each estimate averages S_m
    # squared normal deviations: relative s.d. sqrt(2/S_m) = 0.032 at S_m = 2000, so 0.2 is six of them.
    module, x = _mlp(), _inputs()
    parts = [_posterior(26, 3, seed=s) for s in (3, 4)]
    got = linearized_predictions(module, MultiSWAG(parts), [(x,)], n_samples=4000, seed=2)
    first = MultiSWAG(parts).split(4000)[0]
    variance = got.variance(3.0)
    for part, rows in ((parts[0], slice(0, first)), (parts[1], slice(first, 4000))):
        assert all(torch.equal(got.centre[s], got.centre[rows.start]) for s in range(rows.start, rows.stop))
        expected = 3.0 * got.deviation[rows].square().mean(dim=0)
        assert torch.equal(variance[rows], expected.expand_as(variance[rows]))
        mean = torch.as_tensor(part.mean)

        def flat_output(theta: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(module, dict(zip([n for n, _ in module.named_parameters()],
                                                               _split(module, theta))), (x,))

        jacobian = torch.autograd.functional.jacobian(flat_output, mean)  # (N, C, D)
        covariance = part.loadings @ part.loadings.T + np.diag(part.noise_variance)
        exact = 3.0 * torch.einsum("ncd,de,nce->nc", jacobian, torch.as_tensor(covariance), jacobian)
        assert torch.allclose(variance[rows.start], exact, rtol=0.2), (variance[rows.start], exact)
    assert not torch.allclose(variance[0], variance[-1], rtol=0.2)


def _heteroscedastic_rows(scale: float, noise: float, n_rows: int, seed: int):  # type: ignore[no-untyped-def]
    """Centres 0, two draws with deviations ±√v_n (their mean square is v_n exactly), y_n ~ N(0, s v_n + σ²)."""
    from onlinefa.torch import LinearizedPredictions

    rng = np.random.default_rng(seed)
    unit = rng.uniform(0.05, 2.0, n_rows)
    y = rng.standard_normal(n_rows) * np.sqrt(scale * unit + noise)
    deviation = torch.as_tensor(np.stack([np.sqrt(unit), -np.sqrt(unit)])[..., None])
    predictions = LinearizedPredictions(torch.zeros(2, n_rows, 1, dtype=torch.float64), deviation, torch.as_tensor(y))
    return predictions, unit, y


def test_regression_takes_the_centres_noise_variance_and_the_best_scale_on_top_of_it() -> None:
    # σ² is the one the centre alone needs: with centres 0 the mean of y² (the closed form); s is then the
    # maximiser of the Gaussian likelihood at that σ², found independently by SciPy's bounded search.
    predictions, unit, y = _heteroscedastic_rows(4.0, 0.3, 2_000, seed=1)
    chosen = select_scale(predictions, task="regression")
    assert chosen.noise_variance == pytest.approx(float(np.mean(y**2)), rel=1e-6)
    noise = chosen.noise_variance

    def negative(log_scale: float) -> float:
        variance = math.exp(log_scale) * unit + noise
        return float(np.mean(0.5 * y**2 / variance + 0.5 * np.log(2 * math.pi * variance)))

    best = scipy_optimize.minimize_scalar(negative, bounds=(-6.0, 10.0), method="bounded",
                                          options={"xatol": 1e-10}).x
    assert abs(math.log(chosen.scale) - best) < 1e-4, (chosen, math.exp(best))
    assert chosen.score == pytest.approx(-negative(best), abs=1e-9)
    assert chosen.temperature == 1.0 and not chosen.at_bound


def test_regression_takes_the_maximiser_by_default_and_a_given_noise_variance_as_it_is() -> None:
    predictions, unit, y = _heteroscedastic_rows(2.0, 0.5, 300, seed=2)
    default = select_scale(predictions, task="regression")
    maximiser = select_scale(predictions, task="regression", within_standard_error=False)
    widened = select_scale(predictions, task="regression", within_standard_error=True)
    assert default == maximiser
    assert widened.scale > 1.05 * maximiser.scale and widened.score < maximiser.score
    fixed = select_scale(predictions, task="regression", noise_variance=0.5, within_standard_error=False)
    assert fixed.noise_variance == 0.5
    # σ² fixed at 0.5: the closed-form best s of N(0, s v + 0.5), by SciPy
    best = scipy_optimize.minimize_scalar(
        lambda log_s: float(np.mean(0.5 * y**2 / (math.exp(log_s) * unit + 0.5)
                                    + 0.5 * np.log(2 * math.pi * (math.exp(log_s) * unit + 0.5)))),
        bounds=(-6.0, 8.0), method="bounded", options={"xatol": 1e-10}).x
    assert abs(math.log(fixed.scale) - best) < 1e-4


def test_classification_reports_no_noise_variance() -> None:
    from onlinefa.torch import LinearizedPredictions

    centre = torch.tensor([[[2.0, 0.0]]]).expand(20, 3, 2)
    deviation = torch.randn(20, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    chosen = select_scale(LinearizedPredictions(centre, deviation, torch.tensor([0, 1, 0])), bounds=(1e-2, 1e2))
    assert chosen.noise_variance is None


def test_the_regression_score_is_the_per_draw_mixture_of_regression_log_likelihood() -> None:
    # select_scale sums the Gaussians once per component, weighted by its share of the draws; the score it
    # reports must equal the plain mixture over every draw (3 components of 3, 2 and 2 draws).
    from onlinefa.torch import regression_log_likelihood

    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    parts = [_posterior(21, 2, seed=s) for s in (5, 6, 7)]
    x = _inputs(40)
    y = torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = linearized_predictions(module, MultiSWAG(parts), [(x, y)], n_samples=7, seed=4)
    assert MultiSWAG(parts).split(7) == [3, 2, 2]
    chosen = select_scale(got, task="regression")
    assert chosen.noise_variance is not None
    per_draw = regression_log_likelihood(got.centre, y, chosen.noise_variance, variance=got.variance(chosen.scale))
    assert chosen.score == pytest.approx(float(per_draw.mean()), abs=1e-12)
