"""Hyper-parameter grids of the ``uci-bnn`` experiment and the per-split choice on a validation split.

Every method is tuned on a grid of the same size: the weight decay λ (the prior precision, in the
per-point objective) crossed with one method-specific setting (see :data:`._methods.GRID_KIND`). For
each grid point the method is fitted on 80 % of the training rows and predicts the other 20 %; the
regression noise variance σ² of its Gaussian predictive is then set, for every method alike, to the
value of a fixed log grid that maximises the validation log-likelihood
(:func:`._metrics.tune_noise_variance`). The grid point with the best validation log-likelihood wins;
its σ² is kept for the test predictions of the refit on all training rows.
"""

from __future__ import annotations

from typing import NamedTuple

from ._methods import GRID_KIND, Config
from ._slang_recipe import grid_points


class Grid(NamedTuple):
    """The search space: λ crossed with one setting per grid kind."""

    weight_decays: tuple[float, ...]
    epoch_fractions: tuple[float, ...]  #: MAP / ensembles: early stopping at f · E epochs
    collect_lrs: tuple[float, ...]  #: SWAG family / VIFA: the constant SGD rate η
    dropout_rates: tuple[float, ...]  #: MC dropout: p
    slang_lrs: tuple[float, ...]  #: SLANG: its learning rate

    def configs(self, method: str, dataset: str) -> list[Config]:
        """The grid points of ``method`` on ``dataset`` (short name), (λ, setting) pairs.

        ``slang_recipe`` gets (ln λ, ln τ) pairs instead: a ``len(weight_decays)`` × ``len(slang_lrs)`` grid over
        SLANG's published search box of ``dataset`` (:func:`._slang_recipe.grid_points`).
        """
        kind = GRID_KIND[method]
        if kind == "slang_recipe":
            return grid_points(dataset, len(self.weight_decays), len(self.slang_lrs))
        second = {"map": self.epoch_fractions, "collect": self.collect_lrs, "dropout": self.dropout_rates,
                  "slang": self.slang_lrs}[kind]
        return [(lam, value) for lam in self.weight_decays for value in second]

    def describe(self) -> str:
        """One line per grid, for the report."""
        return (f"λ ∈ {list(self.weight_decays)} crossed with: MAP/ensembles early stopping at "
                f"{list(self.epoch_fractions)} × E epochs; SWAG family, VIFA, MultiSWAG-FA: SGD rate η ∈ "
                f"{list(self.collect_lrs)}; MC dropout: p ∈ {list(self.dropout_rates)}; SLANG: learning rate ∈ "
                f"{list(self.slang_lrs)}; SLANG (published recipe): {len(self.weight_decays)} × "
                f"{len(self.slang_lrs)} (ln λ, ln τ) cell midpoints of its published box")


def _sizes_agree(grid: Grid) -> bool:
    sizes = {len(grid.epoch_fractions), len(grid.collect_lrs), len(grid.dropout_rates), len(grid.slang_lrs)}
    return len(sizes) == 1


def check_grid(grid: Grid) -> None:
    """Raise ValueError unless every method gets the same number of grid points."""
    if not grid.weight_decays or not _sizes_agree(grid):
        raise ValueError("every method must get a grid of the same size (equal-length second axes)")
