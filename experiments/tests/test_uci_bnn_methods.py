"""Methods of the ``uci-bnn`` experiment: SLANG's published recipe (its grid, what reaches ``fit_slang``) and
SWAG-FA on MC dropout's run."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")
from scipy.stats import norm  # noqa: E402

from onlinefa_experiments.uci_bnn import _noise_and_score  # noqa: E402

from onlinefa_experiments.uci_bnn import _methods  # noqa: E402
from onlinefa_experiments.uci_bnn._methods import Budget, Result, Stage  # noqa: E402
from onlinefa_experiments.uci_bnn._metrics import tune_noise_variance  # noqa: E402
from onlinefa_experiments.uci_bnn._slang_recipe import DEFAULT_RECIPE, grid_points, recipe_for  # noqa: E402
from onlinefa_experiments.uci_bnn._tuning import Grid  # noqa: E402


def test_grid_is_cell_midpoints_of_the_published_box_with_the_protocol_size() -> None:
    grid = Grid((1e-4, 1e-3, 1e-2), (0.5, 1.0), (0.005, 0.02), (0.01, 0.05), (0.01, 0.03))
    points = grid.configs("slang_recipe", "yacht")
    assert len(points) == len(grid.configs("mc_dropout", "yacht")) == 6
    # Yacht's box: ln λ ∈ (-2, 2) in 3 cells, ln τ ∈ (-1.6, -0.6) in 2 cells
    expected = [(p, t) for p in (-4 / 3, 0.0, 4 / 3) for t in (-1.35, -0.85)]
    np.testing.assert_allclose(np.array(points), np.array(expected), atol=1e-12)
    assert grid_points("no-such-set", 1, 1) == [(0.0, 2.5)] and recipe_for("no-such-set") == DEFAULT_RECIPE
    with pytest.raises(ValueError, match="at least one point"):
        grid_points("yacht", 0, 2)


class _Posterior:
    def predict_draws(self, x: Any, n_draws: int, seed: int) -> np.ndarray:
        return np.zeros((n_draws, len(x)))


def test_stage_passes_the_recipe_and_converts_the_noise_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def fake_fit_slang(x: Any, y: Any, **kwargs: Any) -> _Posterior:
        calls.append(kwargs)
        return _Posterior()

    monkeypatch.setattr(_methods, "load_slang", lambda: fake_fit_slang)
    rng = np.random.default_rng(0)
    budget = Budget(128, 4, 2, 2, 2, 3, 1, 7, 1e-2)
    stage = Stage(rng.normal(size=(20, 3)), rng.normal(size=20), rng.normal(size=(5, 3)), 4, budget,
                  np.random.SeedSequence(1), (1.0,), "yacht", 3.0)
    result = stage.run("slang_recipe", (-1.0, -0.5))
    assert result.draws.shape == (3, 5)
    (kwargs,) = calls
    # τ = e^-0.5 in the target's units is τ s_y² = 9 e^-0.5 for targets divided by s_y = 3
    assert math.isclose(kwargs["noise_precision"], 9.0 * math.exp(-0.5), rel_tol=1e-12)
    assert math.isclose(kwargs["prior_precision"], math.exp(-1.0), rel_tol=1e-12)
    assert (kwargs["batch_size"], kwargs["learning_rate"], kwargs["n_epochs"], kwargs["rank"]) == (10, 0.08, 7, 1)
    assert kwargs["bias_prior_precision"] == 1e-6 and kwargs["n_mc_samples"] == 4
    # it predicts with the noise it was trained with, σ² = 1 / (τ s_y²)
    assert result.noise_variance is not None
    assert math.isclose(result.noise_variance, math.exp(0.5) / 9.0, rel_tol=1e-12)


def test_own_noise_is_kept_and_scored_where_others_are_tuned() -> None:
    rng = np.random.default_rng(1)
    draws, y_val = rng.normal(size=(4, 50)), rng.normal(size=50)
    noise, score = _noise_and_score(Result(draws, 0.0, 0.3), y_val)
    # independent closed form: mean over points of log (1/S) Σ_s N(y; μ_s, 0.3)
    density = norm.pdf(y_val[None, :], loc=draws, scale=math.sqrt(0.3)).mean(axis=0)
    assert noise == 0.3 and math.isclose(score, float(np.mean(np.log(density))), rel_tol=1e-12)
    assert _noise_and_score(Result(draws, 0.0), y_val) == tune_noise_variance(draws, y_val)


def test_swag_fa_on_dropout_trains_the_mc_dropout_network_and_fits_its_last_epochs() -> None:
    import onlinefa
    from onlinefa.torch import ParameterVector

    rng = np.random.default_rng(2)
    budget = Budget(8, 6, 2, 4, 2, 5, 1, 1, 1e-2)  # 6 epochs, the last 2 collected, 4 snapshots per epoch
    stage = Stage(rng.normal(size=(32, 3)), rng.normal(size=32), rng.normal(size=(7, 3)), 4, budget,
                  np.random.SeedSequence(3), (1.0,))
    plain = ParameterVector(stage._dropout_network(1e-3, 0.1, None)).numpy()
    posterior = onlinefa.OnlineEM(plain.size, 2, seed=0)
    collected = ParameterVector(stage._dropout_network(1e-3, 0.1, posterior)).numpy()
    np.testing.assert_array_equal(collected, plain)  # the snapshots do not change the training run
    assert posterior.n_seen == 2 * 4  # 4 steps per epoch, one snapshot per step, 2 epochs
    result = stage.run("swag_fa_dropout", (1e-3, 0.1))
    assert result.draws.shape == (5, 7) and np.all(np.isfinite(result.draws))
    assert np.ptp(result.draws, axis=0).min() > 0.0  # every pass draws its own weights and mask


def test_swa_on_dropout_is_the_posterior_mean_under_mc_dropout_passes() -> None:
    from onlinefa.torch import ParameterVector

    from onlinefa_experiments.uci_bnn._methods import _seed
    from onlinefa_experiments.uci_bnn._train import dropout_draws

    rng = np.random.default_rng(4)
    budget = Budget(8, 6, 2, 4, 2, 5, 1, 1, 1e-2)
    stage = Stage(rng.normal(size=(32, 3)), rng.normal(size=32), rng.normal(size=(7, 3)), 4, budget,
                  np.random.SeedSequence(5), (1.0,))
    config = (1e-3, 0.1)
    result = stage.run("swa_dropout", config)
    model, posterior, _ = stage._dropout_collected(*config)
    ParameterVector(model).assign(posterior.mean)
    seed = _seed(stage.seed, 9, int(config[0] * 1e9), int(config[1] * 1e9))
    np.testing.assert_array_equal(result.draws, dropout_draws(model, stage.inputs, budget.n_draws, seed))
    assert np.ptp(result.draws, axis=0).min() > 0.0  # the masks still vary
