"""``bayesian_model_average`` iterates its loaders once per draw: one-shot iterators are named as such.

A generator passed twice (or with more than one draw) used to end in "the loader yielded no batches",
and an exhausted ``bn_loader`` silently reset every batch-norm layer to mean 0 and variance 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import onlinefa

torch = pytest.importorskip("torch")

from onlinefa.torch import bayesian_model_average, refresh_batch_norm  # noqa: E402


def network(batch_norm: bool = False) -> Any:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(3, 4)] + ([torch.nn.BatchNorm1d(4)] if batch_norm else []) + [torch.nn.Linear(4, 2)]
    return torch.nn.Sequential(*layers)


def posterior_for(net: Any) -> Any:
    D = sum(p.numel() for p in net.parameters())
    rng = np.random.default_rng(0)
    return onlinefa.OnlineEM(D, 2, n_warmup=3, seed=0).update(0.1 * rng.standard_normal((20, D)))


def batches(n: int = 3) -> list[Any]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 3, generator=g), torch.zeros(5, dtype=torch.long)) for _ in range(n)]


def test_a_generator_is_refused_for_several_draws_before_anything_runs() -> None:
    net = network()
    posterior = posterior_for(net)
    before = [p.detach().clone() for p in net.parameters()]
    generator = (batch for batch in batches())
    with pytest.raises(ValueError, match=r"the loader is a one-shot iterator \(generator\).*n_samples=3.*list"):
        bayesian_model_average(net, posterior, generator, n_samples=3, seed=0)
    assert next(generator)[0].shape == (5, 3)  # not consumed
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before))
    with pytest.raises(ValueError, match=r"the loader is a one-shot iterator \(list_iterator\)"):
        bayesian_model_average(net, posterior, iter(batches()), n_samples=2, seed=0)


def test_a_generator_passed_twice_is_named_exhausted() -> None:
    net = network()
    posterior = posterior_for(net)
    generator = (batch for batch in batches())
    first = bayesian_model_average(net, posterior, generator, n_samples=1, seed=0)  # one pass: fine
    torch.testing.assert_close(first, bayesian_model_average(net, posterior, batches(), n_samples=1, seed=0),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="one-shot iterator .generator. that was already exhausted"):
        bayesian_model_average(net, posterior, generator, n_samples=1, seed=0)


def test_an_empty_list_keeps_the_plain_message() -> None:
    net = network()
    with pytest.raises(ValueError, match="^the loader yielded no batches$"):
        bayesian_model_average(net, posterior_for(net), [], n_samples=2, seed=0)


def test_lists_and_other_reiterables_still_work_for_many_draws() -> None:
    class Reiterable:
        def __iter__(self) -> Iterator[Any]:
            return iter(batches())

    net = network()
    posterior = posterior_for(net)
    out = bayesian_model_average(net, posterior, Reiterable(), n_samples=4, seed=0)
    torch.testing.assert_close(out, bayesian_model_average(net, posterior, batches(), n_samples=4, seed=0),
                               rtol=0, atol=0)


def test_a_one_shot_batch_norm_loader_is_refused_and_an_exhausted_one_changes_nothing() -> None:
    net = network(batch_norm=True)
    posterior = posterior_for(net)
    with pytest.raises(ValueError, match="bn_loader is a one-shot iterator"):
        bayesian_model_average(net, posterior, batches(), n_samples=2, seed=0, bn_loader=iter(batches()))
    layer = net[1]
    refresh_batch_norm(net, batches())
    stats = [layer.running_mean.clone(), layer.running_var.clone(), layer.num_batches_tracked.clone()]
    assert not torch.equal(stats[0], torch.zeros(4))
    exhausted = iter(batches())
    list(exhausted)
    with pytest.raises(ValueError, match="the batch-norm loader yielded no batches: it is a one-shot iterator"):
        refresh_batch_norm(net, exhausted)
    for before, after in zip(stats, [layer.running_mean, layer.running_var, layer.num_batches_tracked]):
        assert torch.equal(before, after)
    assert layer.momentum == 0.1


def test_a_generator_seed_is_accepted() -> None:
    net = network()
    posterior = posterior_for(net)
    seed = int(np.random.default_rng(7).integers(0, 2**63 - 1))
    torch.testing.assert_close(
        bayesian_model_average(net, posterior, batches(), n_samples=3, seed=np.random.default_rng(7)),
        bayesian_model_average(net, posterior, batches(), n_samples=3, seed=seed), rtol=0, atol=0)
