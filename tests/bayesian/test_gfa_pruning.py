"""GFA drops factors without support: the bound-checked pruning and the variance-explained rule.

The data follow docs/design/gfa.md §2 ("Why a factor without support survived"): three groups of 25, 35 and 20
features, 4 true factors with a fixed group × factor activity pattern, noise precisions 0.5, 2 and 8, 300 rows.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import onlinefa
from onlinefa import _core

SIZES = (25, 35, 20)
TAUS = (0.5, 2.0, 8.0)
PATTERN = np.array([[1, 1, 0, 1], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=bool)


def data(seed: int, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, PATTERN.shape[1]))
    blocks = []
    for m, d in enumerate(SIZES):
        w = rng.standard_normal((PATTERN.shape[1], d)) * PATTERN[m][:, None]
        blocks.append(z @ w + rng.standard_normal((n, d)) / np.sqrt(TAUS[m]))
    return np.hstack(blocks)


def recovered(fit: onlinefa.GFA) -> bool:
    """4 factors whose active cells (share > 2%) are PATTERN up to a permutation of the factors."""
    found = fit.activity_ > 0.02
    if found.shape != PATTERN.shape:
        return False
    return any(np.array_equal(found[:, list(p)], PATTERN) for p in itertools.permutations(range(4)))


def test_pattern_and_factor_count_recovered_on_fixed_seeds() -> None:
    # K = 12 at the start, seeds 0..19. Without the bound-checked pruning 6 of the 20 fits keep a fifth
    # factor that is active nowhere (14/20 recovered); with it 20/20 (docs/results/gfa.md). Pass mark 18/20: a
    # method whose per-seed success probability were the old 0.70 would reach it with probability 3.5%
    # (binomial), while one at >= 0.95 misses it with probability < 8% (we measured 20/20 here and
    # 120/120 over the designs of docs/design/gfa.md, so a platform's rounding may flip a seed or two, not more).
    successes = sum(recovered(onlinefa.GFA(12, groups=list(SIZES), random_state=seed).fit(data(seed)))
                    for seed in range(20))
    assert successes >= 18, successes


@pytest.mark.parametrize("seed", [7, 9])
def test_a_factor_without_support_is_dropped(seed: int) -> None:
    # On these seeds coordinate ascent from the default start ends with a fifth factor that explains < 1% of
    # one group's variance and nothing elsewhere: a local optimum of the bound (more sweeps leave it there).
    stuck = onlinefa.GFA(8, groups=list(SIZES), bound_pruning=False, random_state=seed, tol=1e-10,
                         max_iter=20000).fit(data(seed))
    assert stuck.converged_ and stuck.n_components_ == 5
    peak = stuck.activity_.max(axis=0)
    assert np.sort(peak)[0] < 0.01 and np.sort(peak)[1] > 0.1
    fitted = onlinefa.GFA(8, groups=list(SIZES), random_state=seed).fit(data(seed))
    assert fitted.n_components_ == 4 and recovered(fitted)
    assert fitted.lower_bound() > stuck.lower_bound() + 10.0  # removing it raises the bound (by ~50 nats)
    assert fitted.n_components_history_[-1] == 4 and 5 in fitted.n_components_history_
    # the kept history stays monotone between changes of K (the rejected trial's sweeps are not in it)
    same_k = fitted.n_components_history_[1:] == fitted.n_components_history_[:-1]
    steps = np.diff(fitted.elbo_)[same_k]
    assert (steps >= -1e-10 * np.abs(fitted.elbo_[1:][same_k])).all()


def test_pruning_never_lowers_the_bound() -> None:
    for seed in range(5):
        x = data(seed)
        plain = onlinefa.GFA(8, groups=list(SIZES), bound_pruning=False, random_state=seed).fit(x)
        pruned = onlinefa.GFA(8, groups=list(SIZES), random_state=seed).fit(x)
        assert pruned.lower_bound() >= plain.lower_bound()
        assert pruned.n_components_ <= plain.n_components_


@pytest.mark.parametrize("drop_tol", [1e-3, 0.05])
def test_variance_rule_holds_for_every_returned_factor(drop_tol: float) -> None:
    for seed in range(3):
        fit = onlinefa.GFA(8, groups=list(SIZES), drop_tol=drop_tol, bound_pruning=False,
                           random_state=seed).fit(data(seed))
        assert fit.activity_.max(axis=0).min() >= drop_tol


def test_without_dropping_nothing_is_pruned() -> None:
    fit = onlinefa.GFA(6, groups=list(SIZES), drop_factors=False, random_state=0).fit(data(0))
    assert fit.n_components_ == 6


def test_bad_bound_pruning_is_rejected_and_the_fit_kept() -> None:
    fit = onlinefa.GFA(6, groups=list(SIZES), random_state=0).fit(data(0))
    before = fit.components_.copy()
    with pytest.raises(TypeError, match="bound_pruning"):
        fit.set_params(bound_pruning="yes").fit(data(1))
    np.testing.assert_array_equal(fit.components_, before)


def test_drop_components_removes_exactly_those_factors() -> None:
    x = data(0)
    engine = onlinefa.GFA(6, groups=list(SIZES), drop_factors=False, random_state=0, max_iter=5).fit(x)._core
    copy = _core.GFACore.from_state(engine.get_state())
    f = engine.loading_mean()
    assert copy.drop_components([1, 4]) == [1, 4]
    np.testing.assert_array_equal(copy.loading_mean(), f[:, [0, 2, 3, 5]])
    np.testing.assert_array_equal(copy.latent_mean(), engine.latent_mean()[:, [0, 2, 3, 5]])
    assert copy.kept_components() == [0, 2, 3, 5]
    for bad in ([6], [0, 1, 2, 3, 4, 5]):
        with pytest.raises(ValueError):
            engine.drop_components(bad)
    np.testing.assert_array_equal(engine.loading_mean(), f)  # unchanged by the rejected calls
