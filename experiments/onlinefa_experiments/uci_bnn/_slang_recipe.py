"""SLANG's published UCI recipe, for the ``slang_recipe`` method of the ``uci-bnn`` experiment.

Mishkin et al. ("SLANG: Fast Structured Covariance Approximations for Bayesian Deep Learning with Natural
Gradient", NeurIPS 2018) trained every UCI network for 120 epochs of minibatches of 10 with rank L = 1,
S = 4 training draws (2 on the larger sets), a mean-gradient moving average of rate 0.9, an initial
diagonal precision of 1 and a bias prior precision of 1e-6, with one learning rate α per data set (the
precision's step β = α), and searched the prior precision λ and the noise precision τ (τ in the target's
original units) by Bayesian optimisation inside a box of (ln λ, ln τ) chosen per data set (their public
experiment code). This module holds those per-data-set settings; the experiment searches the same box
with an evenly spaced grid of the protocol's size (cell midpoints) instead of Bayesian optimisation.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SlangRecipe", "recipe_for", "grid_points", "RECIPE_BATCH_SIZE", "RECIPE_BIAS_PRIOR_PRECISION"]

#: Minibatch size of every published SLANG UCI run.
RECIPE_BATCH_SIZE = 10
#: Prior precision of the biases in the published runs.
RECIPE_BIAS_PRIOR_PRECISION = 1e-6


class SlangRecipe(NamedTuple):
    """One data set's published SLANG settings."""

    learning_rate: float  #: α (and β)
    log_prior_precision: tuple[float, float]  #: search box of ln λ
    log_noise_precision: tuple[float, float]  #: search box of ln τ, τ in the target's original units
    n_mc_samples: int = 4


#: The published settings per data set (short names); other sets get :data:`DEFAULT_RECIPE`.
RECIPES: dict[str, SlangRecipe] = {
    "boston": SlangRecipe(0.01, (-2.0, 2.0), (-2.6, -2.2)),
    "concrete": SlangRecipe(0.005, (-2.0, 2.0), (-3.7, -2.7)),
    "energy": SlangRecipe(0.01, (-4.0, 0.0), (-0.3, 0.1)),
    "yacht": SlangRecipe(0.08, (-2.0, 2.0), (-1.6, -0.6)),
    "naval": SlangRecipe(0.01, (-4.0, 0.0), (10.9, 11.4), n_mc_samples=2),
}

#: The published code's generic box and rate, for data sets without their own settings.
DEFAULT_RECIPE = SlangRecipe(0.01, (-4.0, 4.0), (0.0, 5.0))


def recipe_for(dataset: str) -> SlangRecipe:
    """The published settings of ``dataset`` (short name), or the generic ones."""
    return RECIPES.get(dataset, DEFAULT_RECIPE)


def _midpoints(bounds: tuple[float, float], count: int) -> list[float]:
    low, high = bounds
    width = (high - low) / count
    return [low + (i + 0.5) * width for i in range(count)]


def grid_points(dataset: str, n_prior: int, n_noise: int) -> list[tuple[float, float]]:
    """(ln λ, ln τ) at the midpoints of an ``n_prior`` × ``n_noise`` grid of cells over the published box.

    Parameters
    ----------
    dataset : str
        Short name of the data set.
    n_prior, n_noise : int
        Grid points along ln λ and along ln τ (≥ 1).

    Returns
    -------
    list of (float, float)
        ``n_prior * n_noise`` points, ln λ varying slowest.
    """
    if n_prior < 1 or n_noise < 1:
        raise ValueError("the SLANG recipe grid needs at least one point per axis")
    recipe = recipe_for(dataset)
    return [(p, t) for p in _midpoints(recipe.log_prior_precision, n_prior)
            for t in _midpoints(recipe.log_noise_precision, n_noise)]
