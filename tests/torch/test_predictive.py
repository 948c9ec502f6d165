"""The regression predictive of posterior draws: the mixture log-likelihood against SciPy's normal density,
the fitted noise variance against its closed form (one draw) and against a dense search (several)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
scipy_stats = pytest.importorskip("scipy.stats")

from onlinefa.torch import fit_noise_variance, regression_log_likelihood  # noqa: E402


def _draws(s: int, n: int, p: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (n,) if p is None else (n, p)
    truth = torch.randn(shape, generator=g, dtype=torch.float64)
    draws = truth + 0.3 * torch.randn((s, *shape), generator=g, dtype=torch.float64)
    return draws, truth + 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("outputs", [None, 1, 3])
def test_the_mixture_log_likelihood_equals_scipys(outputs: int | None) -> None:
    draws, y = _draws(4, 6, outputs)
    got = regression_log_likelihood(draws, y, 0.3).numpy()
    d, t = draws.numpy().reshape(4, 6, -1), y.numpy().reshape(6, -1)
    density = scipy_stats.norm.pdf(t[None], loc=d, scale=math.sqrt(0.3)).prod(axis=2)  # (S, N)
    np.testing.assert_allclose(got, np.log(density.mean(axis=0)), rtol=1e-12)


def test_targets_of_n_values_match_draws_with_one_output() -> None:
    draws, y = _draws(3, 5, 1)
    np.testing.assert_array_equal(regression_log_likelihood(draws, y.reshape(-1), 0.2),
                                  regression_log_likelihood(draws, y, 0.2))


def test_one_draw_fits_the_mean_squared_residual() -> None:
    draws, y = _draws(1, 50, 2)
    expected = float(((y - draws[0]) ** 2).mean())
    # A maximum located from float64 values of the objective is resolved to about sqrt(eps) = 1.5e-8 of the
    # argument (the objective is flat to second order there), hence the bound.
    assert fit_noise_variance(draws, y) == pytest.approx(expected, rel=1e-7)


def test_several_draws_fit_the_maximum_of_a_dense_search() -> None:
    draws, y = _draws(8, 40, seed=3)

    def score(variance: float) -> float:
        return float(regression_log_likelihood(draws, y, variance).mean())

    fitted = fit_noise_variance(draws, y)
    dense = np.geomspace(1e-4, 10.0, 20001)
    best = max(dense, key=score)
    assert abs(math.log(fitted / best)) < 1e-3
    assert score(fitted) >= score(float(best)) - 1e-12
    assert score(fitted) >= max(score(fitted * 1.001), score(fitted / 1.001))


def test_bad_input_is_refused() -> None:
    draws, y = _draws(2, 4)
    with pytest.raises(ValueError, match="noise_variance"):
        regression_log_likelihood(draws, y, 0.0)
    with pytest.raises(ValueError, match="do not match"):
        regression_log_likelihood(draws, y[:3], 1.0)
    with pytest.raises(ValueError, match="finite"):
        regression_log_likelihood(draws, y * float("nan"), 1.0)
    with pytest.raises(ValueError, match="exactly"):
        fit_noise_variance(torch.zeros(1, 3), torch.zeros(3))


def test_the_draws_own_variances_enter_each_gaussian_as_scipys() -> None:
    draws, y = _draws(4, 6, 2, seed=5)
    g = torch.Generator().manual_seed(6)
    variance = 0.5 * torch.rand(draws.shape, generator=g, dtype=torch.float64)
    got = regression_log_likelihood(draws, y, 0.3, variance=variance).numpy()
    scale = np.sqrt(0.3 + variance.numpy())
    density = scipy_stats.norm.pdf(y.numpy()[None], loc=draws.numpy(), scale=scale).prod(axis=2)
    np.testing.assert_allclose(got, np.log(density.mean(axis=0)), rtol=1e-12)


@pytest.mark.parametrize("own", [0.1, 0.9])
def test_a_constant_own_variance_leaves_the_rest_of_the_squared_residual(own: float) -> None:
    # One draw, the same variance v on every point: the best σ² + v is the mean squared residual m, so
    # σ² = m − v where that is positive; where v > m, no σ² > 0 helps and the bracket's low end, 1e-12 m,
    # is returned.
    draws, y = _draws(1, 400, seed=7)
    m = float(((y - draws[0]) ** 2).mean())
    assert 0.1 < m < 0.9  # the residuals' s.d. is about 0.58
    fitted = fit_noise_variance(draws, y, variance=torch.full_like(draws, own))
    if own < m:
        assert fitted == pytest.approx(m - own, rel=1e-6)
    else:
        assert fitted <= 1e-11 * m


def test_bad_own_variances_are_refused() -> None:
    draws, y = _draws(2, 4)
    for bad, message in ((torch.ones(2, 3), "does not match"), (-torch.ones(2, 4), ">= 0"),
                         (torch.full((2, 4), float("nan")), "finite")):
        with pytest.raises(ValueError, match=message):
            regression_log_likelihood(draws, y, 1.0, variance=bad)
        with pytest.raises(ValueError, match=message):
            fit_noise_variance(draws, y, variance=bad)
