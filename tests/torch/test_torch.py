"""onlinefa.torch: parameter vectors, snapshot collection, chunked sampling, BMA, MultiSWAG, vifa_step, to_torch.

References are independent of the code under test: ``torch.nn.utils.parameters_to_vector`` /
``vector_to_parameters`` on copies, hand-written prediction loops, NumPy transcriptions of batch-norm
statistics and of the Gaussian's covariance, ``torch.autograd`` gradients, and the models' own
``log_prob``/``score_samples``.
"""

from __future__ import annotations

import copy
import doctest
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onlinefa  # noqa: E402
import onlinefa.torch as oft  # noqa: E402
from engine_state import engine_state  # noqa: E402
from onlinefa.torch import (  # noqa: E402
    MultiSWAG,
    ParameterVector,
    SnapshotCollector,
    bayesian_model_average,
    refresh_batch_norm,
    sample_parameters,
    to_torch,
    vifa_step,
)

ROOT = Path(__file__).resolve().parents[2]


def _net(seed: int = 0, dtype: Any = None, n_out: int = 3) -> Any:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, n_out))
    return net if dtype is None else net.to(dtype)


def _fitted_em(center: Any, seed: int, spread: float = 0.05, n: int = 300, k: int = 2) -> Any:
    """An OnlineEM posterior fitted on noisy copies of ``center`` (a parameter-space Gaussian)."""
    c = np.asarray(center, dtype=np.float64)
    rng = np.random.default_rng(seed)
    samples = c + spread * rng.standard_normal((n, c.shape[0])) @ np.diag(rng.uniform(0.5, 1.5, c.shape[0]))
    return onlinefa.OnlineEM(c.shape[0], k, n_warmup=20, seed=seed).update(samples)


def _vector(net: Any) -> Any:
    return torch.nn.utils.parameters_to_vector([p.detach().clone() for p in net.parameters()])


def _loader(n_batches: int = 3, batch: int = 5, seed: int = 1, shift: float = 0.0) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 3, generator=g) * 2.0 + shift, torch.randint(0, 3, (batch,), generator=g))
        for _ in range(n_batches)
    ]


# -- ParameterVector ------------------------------------------------------------------------------


def test_assigned_and_gathered_vectors_are_not_aliased_by_later_sgd_steps() -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    pv = ParameterVector(net)
    gathered = pv.gather()
    gathered_copy = gathered.clone()
    assigned = gathered + 0.25
    assigned_copy = assigned.clone()
    assigned_np = (gathered + 0.5).numpy()
    assigned_np_copy = assigned_np.copy()
    pv.assign(assigned)
    np.testing.assert_array_equal(_vector(net).numpy(), assigned_copy.numpy())
    for x, y in _loader():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    after_steps = _vector(net)
    assert not torch.equal(after_steps, assigned_copy)  # the steps did move the parameters
    assert torch.equal(assigned, assigned_copy) and torch.equal(gathered, gathered_copy)
    pv.assign(assigned_np)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(_loader()[0][0]), _loader()[0][1]).backward()
    opt.step()
    np.testing.assert_array_equal(assigned_np, assigned_np_copy)
    with torch.no_grad():
        gathered.add_(1.0)  # writing into a gathered vector leaves the network alone
    assert torch.equal(_vector(net), pv.gather())


def _mixed_parameters() -> list[Any]:
    g = torch.Generator().manual_seed(3)
    non_contiguous = torch.nn.Parameter(torch.randn(4, 5, generator=g).t())  # transposed view
    strided = torch.randn(6, 4, generator=g)[::2, 1:]  # a slice with a step: not contiguous
    half = torch.nn.Parameter(torch.randn(7, generator=g).half())
    bf16 = torch.nn.Parameter(torch.randn(2, 3, generator=g).bfloat16())
    plain = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_(True)
    scalar = torch.nn.Parameter(torch.tensor(1.5))
    assert not non_contiguous.is_contiguous() and not strided.is_contiguous()
    return [non_contiguous, half, strided, bf16, plain, scalar]


def test_gather_matches_parameters_to_vector_for_mixed_dtypes_and_layouts() -> None:
    params = _mixed_parameters()
    reference = torch.nn.utils.parameters_to_vector([p.detach().to(torch.float64).contiguous() for p in params])
    pv64 = ParameterVector(params, dtype=torch.float64)
    assert len(pv64) == reference.numel() == 20 + 7 + 9 + 6 + 5 + 1
    out = torch.empty(len(pv64), dtype=torch.float64)
    gathered = pv64.gather(out=out)
    assert gathered is out and torch.equal(gathered, reference)  # float16/bfloat16 -> float64 is exact
    assert not gathered.requires_grad and gathered.is_contiguous()
    pv32 = ParameterVector(params)
    assert torch.equal(pv32.gather(), reference.float())
    np.testing.assert_array_equal(pv32.numpy(), reference.float().numpy())
    assert pv64.numpy().dtype == np.float64 and ParameterVector(params, dtype=torch.bfloat16).numpy().dtype == np.float32
    buffer = np.empty(len(pv64))
    assert pv64.numpy(out=buffer) is buffer
    np.testing.assert_array_equal(buffer, reference.numpy())


def test_assign_round_trips_and_casts_to_each_parameter_dtype() -> None:
    params = _mixed_parameters()
    originals = [p.detach().clone() for p in params]
    pv = ParameterVector(params, dtype=torch.float64)
    target = torch.linspace(-2.0, 2.0, len(pv), dtype=torch.float64)
    pv.assign(target)
    reference, start = [], 0  # slice i of the vector, reshaped and rounded to parameter i's dtype
    for original in originals:
        reference.append(target[start : start + original.numel()].reshape(original.shape).to(original.dtype))
        start += original.numel()
    for p, r in zip(params, reference):
        assert p.dtype == r.dtype and torch.equal(p.detach(), r)
    pv.assign(pv.gather())  # a round trip changes nothing, whatever the dtypes
    for p, r in zip(params, reference):
        assert torch.equal(p.detach(), r)


def test_parameter_vector_rejects_bad_input_without_changing_anything() -> None:
    net = _net()
    pv = ParameterVector(net)
    before = _vector(net)
    with pytest.raises(ValueError, match="shape"):
        pv.assign(torch.zeros(len(pv) + 1))
    with pytest.raises(TypeError, match="real"):
        pv.assign(np.array(["a"] * len(pv)))
    with pytest.raises(ValueError, match="contiguous tensor of shape"):
        pv.gather(out=torch.empty(len(pv), dtype=torch.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        pv.numpy(out=np.empty(len(pv), dtype=np.int64))
    assert torch.equal(_vector(net), before)
    with pytest.raises(TypeError, match="single tensor"):
        ParameterVector(torch.zeros(3))
    with pytest.raises(TypeError, match="floating-point"):
        ParameterVector([torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(TypeError, match="dtype"):
        ParameterVector(net, dtype=torch.int32)
    with pytest.raises(ValueError, match="no parameter entries"):
        ParameterVector([])
    with pytest.raises(ValueError, match="twice"):
        ParameterVector([net[0].weight, net[0].weight])


# -- sample_parameters ---------------------------------------------------------------------------


def test_chunked_draws_equal_unchunked_draws_for_a_seed() -> None:
    em = _fitted_em(np.linspace(-1.0, 1.0, 11), seed=0)
    whole = torch.cat(list(sample_parameters(em, 23, seed=7, chunk_size=23)))
    assert whole.shape == (23, 11)
    for chunk_size in (1, 2, 5, 8, 100):
        chunks = list(sample_parameters(em, 23, seed=7, chunk_size=chunk_size))
        assert all(c.shape[0] <= chunk_size for c in chunks)
        assert torch.equal(torch.cat(chunks), whole)
    assert not torch.equal(torch.cat(list(sample_parameters(em, 23, seed=8))), whole)
    assert list(sample_parameters(em, 0, seed=7)) == []


def test_chunked_draws_do_not_depend_on_how_the_blas_rounds_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for a BLAS whose rounding of a row depends on the product's row count (PyTorch's AVX-512
    # GEMM differs by one ulp between 1, 2, 5, 8 and 23 rows): the perturbation is a relative 1e-6 per
    # row of the product, far above one float32 ulp, so any chunking that changes the product's shape
    # changes the draws.
    real_addmm = torch.addmm

    def shape_dependent_addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = real_addmm(bias, a, b)
        return out + out.abs() * (1e-6 * a.shape[0])

    monkeypatch.setattr(torch, "addmm", shape_dependent_addmm)
    em = _fitted_em(np.linspace(-1.0, 1.0, 11), seed=0)
    whole = torch.cat(list(sample_parameters(em, 23, seed=7, chunk_size=23)))
    for chunk_size in (1, 2, 5, 8, 100):
        assert torch.equal(torch.cat(list(sample_parameters(em, 23, seed=7, chunk_size=chunk_size))), whole)
    # Fewer draws with the same seed are the first rows of more draws (a mixture component draws alone).
    assert torch.equal(torch.cat(list(sample_parameters(em, 3, seed=7))), whole[:3])


def test_sampling_moments_match_the_scaled_factor_gaussian() -> None:
    em = _fitted_em(np.array([0.5, -1.0, 2.0, 0.0, 3.0, -0.5]), seed=1, spread=0.8)
    mean, loadings, noise = em.mean, em.loadings, em.noise_variance
    scale, n = 0.5, 100_000
    sigma = scale * (loadings @ loadings.T + np.diag(noise))  # NumPy transcription of scale·(F Fᵀ + Ψ)
    draws = torch.cat(list(sample_parameters(em, n, scale=scale, seed=2024, dtype=torch.float64, chunk_size=4096)))
    x = draws.numpy()
    # Bounds: 5 standard errors per entry. The sample mean's error has sd sqrt(Σ_ii/n); a Gaussian
    # sample covariance entry has variance (Σ_ii Σ_jj + Σ_ij²)/n. With 6 + 21 checked entries the chance
    # that a correct sampler exceeds 5 s.e. anywhere is < 27·5.8e-7. Using scale 1 instead of 0.5 (or
    # dropping F Fᵀ or Ψ) moves entries by hundreds of standard errors.
    mean_se = np.sqrt(np.diag(sigma) / n)
    assert np.all(np.abs(x.mean(axis=0) - mean) <= 5.0 * mean_se)
    cov_se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / n)
    assert np.all(np.abs(np.cov(x, rowvar=False) - sigma) <= 5.0 * cov_se)


def test_sample_parameters_validates_eagerly() -> None:
    em = _fitted_em(np.zeros(4), seed=0)
    with pytest.raises(ValueError, match="scale"):
        sample_parameters(em, 3, scale=-1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        sample_parameters(em, 3, chunk_size=0)
    with pytest.raises(TypeError, match="dtype"):
        sample_parameters(em, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match="fitted onlinefa model"):
        sample_parameters(object(), 3)


# -- MultiSWAG ------------------------------------------------------------------------------------


def _separated_mixture() -> tuple[MultiSWAG, list[Any]]:
    centers = [np.full(5, 100.0 * m) for m in range(3)]
    return MultiSWAG([_fitted_em(c, seed=m) for m, c in enumerate(centers)]), centers


def test_multiswag_splits_draws_evenly_and_deterministically() -> None:
    mixture, centers = _separated_mixture()
    assert mixture.split(7) == [3, 2, 2] and mixture.split(2) == [1, 1, 0]
    draws = torch.cat(list(sample_parameters(mixture, 7, seed=11, dtype=torch.float64)))
    nearest = [int(np.argmin([np.abs(d.numpy() - c).max() for c in centers])) for d in draws]
    assert nearest == [0, 0, 0, 1, 1, 2, 2]
    for chunk_size in (1, 3, 7):
        again = torch.cat(list(sample_parameters(mixture, 7, seed=11, dtype=torch.float64, chunk_size=chunk_size)))
        assert torch.equal(again, draws)
    # Component m draws with the m-th child of numpy.random.SeedSequence(seed), as documented.
    children = np.random.SeedSequence(11).spawn(3)
    start = 0
    for component, count, child in zip(mixture.components, [3, 2, 2], children):
        seed = int(child.generate_state(1, np.uint64)[0])
        alone = torch.cat(list(sample_parameters(component, count, seed=seed, dtype=torch.float64)))
        assert torch.equal(alone, draws[start : start + count])
        start += count
    assert not torch.equal(torch.cat(list(sample_parameters(mixture, 7, seed=12, dtype=torch.float64))), draws)


def test_multiswag_rejects_empty_and_mismatched_components() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MultiSWAG([])
    with pytest.raises(ValueError, match="different numbers of features"):
        MultiSWAG([_fitted_em(np.zeros(4), seed=0), _fitted_em(np.zeros(5), seed=0)])


# -- bayesian_model_average -----------------------------------------------------------------------


def _hand_written_average(net: Any, draws: Any, loader: Any, task: str) -> Any:
    reference = copy.deepcopy(net)
    reference.eval()
    outputs = []
    with torch.no_grad():
        for theta in draws:
            torch.nn.utils.vector_to_parameters(theta, reference.parameters())
            logits = torch.cat([reference(x) for x, _ in loader])
            outputs.append(torch.softmax(logits, dim=-1) if task == "classification" else logits)
    stacked = torch.stack(outputs)
    return stacked.mean(dim=0) if task == "classification" else stacked


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_bma_equals_a_hand_written_average_and_restores_the_module(task: str) -> None:
    net = _net(n_out=3 if task == "classification" else 2)
    net.train()
    before = _vector(net)
    posterior = _fitted_em(before.numpy(), seed=5, spread=0.3)
    loader = _loader()
    result = bayesian_model_average(net, posterior, loader, n_samples=6, seed=3, task=task)
    draws = torch.cat(list(sample_parameters(posterior, 6, seed=3)))
    expected = _hand_written_average(net, draws, loader, task)
    shape = (15, 3) if task == "classification" else (6, 15, 2)
    assert result.shape == expected.shape == shape
    torch.testing.assert_close(result, expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(_vector(net), before) and net.training
    plug_in = _hand_written_average(net, before[None, :], loader, task)
    assert (result - (plug_in if task == "classification" else plug_in.expand(6, -1, -1))).abs().max() > 1e-3
    if task == "classification":
        torch.testing.assert_close(result.sum(dim=1), torch.ones(15))


def test_bma_accepts_a_multiswag_mixture() -> None:
    net = _net()
    center = _vector(net).numpy()
    mixture = MultiSWAG([_fitted_em(center + shift, seed=i, spread=0.2) for i, shift in enumerate((0.0, 0.3))])
    loader = _loader()
    result = bayesian_model_average(net, mixture, loader, n_samples=5, seed=9)
    draws = torch.cat(list(sample_parameters(mixture, 5, seed=9)))
    torch.testing.assert_close(result, _hand_written_average(net, draws, loader, "classification"), rtol=1e-6, atol=1e-7)


class _FailingLoader:
    """Yields its batches on the first ``good_passes`` iterations, then raises mid-pass."""

    def __init__(self, batches: list[tuple[Any, Any]], good_passes: int) -> None:
        self.batches, self.good_passes, self.passes = batches, good_passes, 0

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        self.passes += 1
        for i, batch in enumerate(self.batches):
            if self.passes > self.good_passes and i == 1:
                raise RuntimeError("loader failed")
            yield batch


def test_bma_restores_parameters_buffers_and_mode_on_error() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    net.train()
    before = _vector(net)
    buffers = [b.clone() for b in net.buffers()]
    posterior = _fitted_em(before.numpy(), seed=0, spread=0.3)
    with pytest.raises(RuntimeError, match="loader failed"):
        bayesian_model_average(net, posterior, _FailingLoader(_loader(), 2), n_samples=4, bn_loader=_loader(shift=2.0))
    assert torch.equal(_vector(net), before) and net.training
    assert all(torch.equal(a, b) for a, b in zip(net.buffers(), buffers))


def test_bma_rejects_bad_arguments() -> None:
    net = _net()
    posterior = _fitted_em(_vector(net).numpy(), seed=0)
    with pytest.raises(ValueError, match="task"):
        bayesian_model_average(net, posterior, _loader(), task="ranking")
    with pytest.raises(ValueError, match="n_samples"):
        bayesian_model_average(net, posterior, _loader(), n_samples=0)
    with pytest.raises(ValueError, match="features"):
        bayesian_model_average(net, _fitted_em(np.zeros(5), seed=0), _loader())


# -- batch-norm refresh ---------------------------------------------------------------------------


def test_refresh_batch_norm_recomputes_running_statistics() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(3, momentum=0.3), torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net.eval()
    loader = _loader(n_batches=4, batch=6, shift=3.0)
    refresh_batch_norm(net, loader)
    # NumPy: with momentum=None a layer's running statistics are the plain averages over the batches
    # of the batch means and of the unbiased batch variances.
    inputs = [x.numpy().astype(np.float64) for x, _ in loader]
    np.testing.assert_allclose(net[0].running_mean.numpy(), np.mean([x.mean(axis=0) for x in inputs], axis=0), rtol=1e-5)
    np.testing.assert_allclose(
        net[0].running_var.numpy(), np.mean([x.var(axis=0, ddof=1) for x in inputs], axis=0), rtol=1e-5
    )
    assert int(net[0].num_batches_tracked) == 4 and net[0].momentum == 0.3 and not net.training
    # The second layer sees normalised-then-linear activations: compare with the same reset + forward by hand.
    manual = copy.deepcopy(net)
    for layer in (manual[0], manual[2]):
        layer.reset_running_stats()
        layer.momentum = None
    manual.train()
    with torch.no_grad():
        for x, _ in loader:
            manual(x)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(net[2], name), getattr(manual[2], name))
    assert np.abs(net[0].running_mean.numpy() - 3.0).max() < 1.5  # far from the initial zeros


def test_bma_with_bn_loader_refreshes_statistics_for_each_draw() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    posterior = _fitted_em(_vector(net).numpy(), seed=2, spread=0.3)
    loader, bn_loader = _loader(), _loader(n_batches=2, batch=8, seed=4, shift=1.0)
    result = bayesian_model_average(net, posterior, loader, n_samples=4, seed=1, bn_loader=bn_loader)
    draws = torch.cat(list(sample_parameters(posterior, 4, seed=1)))
    reference = copy.deepcopy(net)
    probabilities = []
    with torch.no_grad():
        for theta in draws:
            torch.nn.utils.vector_to_parameters(theta, reference.parameters())
            reference[1].reset_running_stats()
            reference[1].momentum = None
            reference.train()
            for x, _ in bn_loader:
                reference(x)
            reference.eval()
            probabilities.append(torch.softmax(torch.cat([reference(x) for x, _ in loader]), dim=-1))
    torch.testing.assert_close(result, torch.stack(probabilities).mean(dim=0), rtol=1e-6, atol=1e-7)
    without_refresh = bayesian_model_average(net, posterior, loader, n_samples=4, seed=1)
    assert (result - without_refresh).abs().max() > 1e-3


# -- SnapshotCollector ----------------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def update(self, theta: Any) -> None:
        self.rows.append(np.array(theta))


@pytest.mark.parametrize("every", [1, 3])
def test_collector_feeds_exactly_every_nth_step(every: int) -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    n_features = sum(p.numel() for p in net.parameters())
    em = onlinefa.OnlineEM(n_features, 2, n_warmup=2, seed=0)
    recorder = _Recorder()
    after_each_step = []
    batches = _loader(n_batches=10)
    with SnapshotCollector(em, net, every=every).attach(opt) as collector, SnapshotCollector(
        recorder, net, every=every
    ).attach(opt) as recording:
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            after_each_step.append(torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone().numpy())
    assert not collector.attached and not recording.attached
    expected = np.array(after_each_step[every - 1 :: every])
    assert collector.n_snapshots == len(expected) == 10 // every and collector.n_steps == 10
    np.testing.assert_array_equal(np.array(recorder.rows), expected)
    np.testing.assert_allclose(em.mean, expected.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-7)
    assert em.n_seen == len(expected)
    assert 0.0 < collector.seconds_per_snapshot < 1.0
    opt.step()  # detached: no more snapshots
    assert collector.n_snapshots == len(expected)
    collector.collect()  # an explicit snapshot
    assert collector.n_snapshots == len(expected) + 1 and em.n_seen == len(expected) + 1


def test_collector_feeds_a_partial_fit_estimator_and_validates() -> None:
    net = _net()
    fa = onlinefa.OnlineFactorAnalysis(n_components=2, n_warmup=1, random_state=0)
    collector = SnapshotCollector(fa, net)
    collector.collect()
    collector.collect()
    np.testing.assert_allclose(fa.mean_, _vector(net).numpy(), rtol=1e-6)
    assert fa.n_samples_seen_ == 2
    with pytest.raises(TypeError, match="update"):
        SnapshotCollector(object(), net)
    with pytest.raises(ValueError, match="every"):
        SnapshotCollector(fa, net, every=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    collector.attach(opt)
    with pytest.raises(RuntimeError, match="already attached"):
        collector.attach(opt)
    collector.detach()
    assert np.isnan(SnapshotCollector(fa, net).seconds_per_snapshot)


def test_collector_refuses_a_module_whose_layers_changed() -> None:
    # A replaced layer is a new tensor the old vector does not hold: the collector must not keep feeding
    # the detached old weights. Each change is refused before the posterior sees anything.
    net = _net()
    em = onlinefa.OnlineEM(len(_vector(net)), 2, seed=0)
    collector = SnapshotCollector(em, net)
    collector.collect()
    before = engine_state(em)

    def unchanged() -> bool:
        after = engine_state(em)
        return collector.n_snapshots == 1 and all(
            np.array_equal(after[key], value) if isinstance(value, np.ndarray) else after[key] == value
            for key, value in before.items()
        )

    old_layer = net[2]
    net[2] = torch.nn.Linear(4, 3)  # same shapes, new tensors
    with pytest.raises(RuntimeError, match="no longer the tensors"):
        collector.collect()
    assert unchanged()
    net[2] = old_layer  # put back: collecting works again
    collector.collect()
    assert em.n_seen == 2
    net.append(torch.nn.Linear(3, 2))  # a layer added
    with pytest.raises(RuntimeError, match="no longer the tensors"):
        collector.collect()
    net.pop(3)
    with torch.no_grad():
        net[0].bias.data = torch.zeros(5)  # same Parameter object, resized
    with pytest.raises(RuntimeError, match="changed shape"):
        collector.collect()
    with pytest.raises(RuntimeError, match="changed shape"):
        collector.parameter_vector.assign(torch.zeros(len(collector.parameter_vector)))
    assert em.n_seen == 2


def test_parameter_vector_of_tensors_follows_in_place_changes() -> None:
    # Tensors given directly (no module) and in-place edits of a module's parameters are not changes.
    net = _net()
    vector = ParameterVector(list(net.parameters()))
    with torch.no_grad():
        net[0].weight.mul_(2.0)
    torch.testing.assert_close(vector.gather(), _vector(net))
    module_vector = ParameterVector(net)
    net.load_state_dict(_net(seed=5).state_dict())  # copies into the same tensors
    torch.testing.assert_close(module_vector.gather(), _vector(_net(seed=5)))


# -- vifa_step ------------------------------------------------------------------------------------


def _vifa(n_features: int) -> Any:
    return onlinefa.VIFA(
        n_features, 2, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3, seed=4,
        init_noise_variance=np.full(n_features, 0.01),
    )  # fmt: skip


def test_vifa_step_passes_n_data_times_the_mini_batch_gradient() -> None:
    net = _net(dtype=torch.float64, n_out=1)
    x = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.randn(8, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    n_features, n_data = sum(p.numel() for p in net.parameters()), 1000
    seen: list[Any] = []

    def loss_fn(module: Any, batch: tuple[Any, Any]) -> Any:
        seen.append(_vector(module))
        return torch.nn.functional.mse_loss(module(batch[0]), batch[1])

    vi, twin = _vifa(n_features), _vifa(n_features)
    loss = vifa_step(vi, net, loss_fn, (x, y), n_data=n_data)
    # Reference: the same draw from an identically seeded twin, the gradient by torch.autograd on a copy.
    theta = twin.sample()
    np.testing.assert_array_equal(seen[0].numpy(), theta)
    reference = copy.deepcopy(net)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(theta), reference.parameters())
    reference_loss = torch.nn.functional.mse_loss(reference(x), y)
    grads = torch.autograd.grad(reference_loss, list(reference.parameters()))
    twin.step(n_data * torch.nn.utils.parameters_to_vector(grads).numpy())
    assert loss == pytest.approx(float(reference_loss.detach()), rel=1e-12)
    for name in ("mean", "loadings", "noise_variance"):
        np.testing.assert_allclose(getattr(vi, name), getattr(twin, name), rtol=1e-12, atol=1e-15)
    assert vi.n_steps == 1 and vi.n_pending == 0
    assert all(p.grad is None for p in net.parameters())  # .grad is left untouched
    assert np.abs(vi.mean - _vifa(n_features).mean).max() > 1e-4  # the step moved c


def test_vifa_step_averages_several_draws_and_rejects_bad_input() -> None:
    net = _net(dtype=torch.float64, n_out=1)
    n_features = sum(p.numel() for p in net.parameters())
    vi = onlinefa.VIFA(n_features, 2, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3,
                       seed=1, n_grad_samples=3)  # fmt: skip
    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    losses: list[float] = []

    def loss_fn(module: Any, batch: Any) -> Any:
        loss = (module(batch) ** 2).mean()
        losses.append(float(loss.detach()))
        return loss

    assert vifa_step(vi, net, loss_fn, x, n_data=10) == pytest.approx(np.mean(losses))
    assert len(losses) == 3 and vi.n_steps == 1
    with pytest.raises(ValueError, match="features"):
        vifa_step(_vifa(n_features + 1), net, loss_fn, x, n_data=10)
    with pytest.raises(ValueError, match="n_data"):
        vifa_step(vi, net, loss_fn, x, n_data=0)
    with pytest.raises(TypeError, match="VIFA"):
        vifa_step(object(), net, loss_fn, x, n_data=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scalar"):
        vifa_step(_vifa(n_features), net, lambda m, b: m(b), x, n_data=1)


# -- to_torch -------------------------------------------------------------------------------------


def _fitted_models() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 2)) @ rng.standard_normal((2, 6)) + 0.3 * rng.standard_normal((400, 6)) + 1.0
    swag = oft.SWAG(6, max_rank=3)
    swag.update(x[:20])
    return {
        "OnlineEM": onlinefa.OnlineEM(6, 2, seed=0).update(x),
        "OnlineSGA": onlinefa.OnlineSGA(6, 2, seed=0).update(x),
        "VIFA": onlinefa.VIFA(6, 2, prior_precision=1.0, lr_mean=0.0, lr_loadings=0.0, lr_log_noise=0.0, seed=0,
                              init_mean=x[0], init_noise_variance=np.linspace(0.5, 2.0, 6)),
        "VBFA": onlinefa.VBFA(2, random_state=0, max_iter=50).fit(x),
        "OnlineVBFA": onlinefa.OnlineVBFA(2, random_state=0).partial_fit(x[:200]).partial_fit(x[200:]),
        "OnlineFactorAnalysis": onlinefa.OnlineFactorAnalysis(2, random_state=0).fit(x),
        "SWAG": swag,
    }  # fmt: skip


def test_to_torch_covariance_and_log_prob_match_every_model() -> None:
    points = np.random.default_rng(1).standard_normal((5, 6)) * 2.0
    for name, model in _fitted_models().items():
        q = to_torch(model)
        if hasattr(model, "get_covariance"):  # estimators: their own dense covariance and score_samples
            covariance, log_prob = model.get_covariance(), model.score_samples(points)
        else:
            covariance = model.loadings @ model.loadings.T + np.diag(model.noise_variance)
            log_prob = model.log_prob(points)
        np.testing.assert_allclose(q.covariance_matrix.numpy(), covariance, rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(q.log_prob(torch.from_numpy(points)).numpy(), log_prob, rtol=1e-9, err_msg=name)
        assert q.loc.dtype == torch.float64


def test_swag_diagonal_without_loadings_exports_and_samples() -> None:
    x = np.random.default_rng(2).standard_normal((30, 5))
    swag = oft.SWAG(5, diagonal=True)
    swag.update(x)
    assert swag.loadings.shape == (5, 0)
    q = to_torch(swag)
    np.testing.assert_allclose(q.covariance_matrix.numpy(), np.diag(swag.noise_variance), rtol=1e-12)
    np.testing.assert_allclose(q.log_prob(torch.from_numpy(x[:3])).numpy(), swag.log_prob(x[:3]), rtol=1e-10)
    draws = torch.cat(list(sample_parameters(swag, 4, seed=0, dtype=torch.float64)))
    assert draws.shape == (4, 5) and torch.isfinite(draws).all()


class _SnapshotModel:
    """Consistent (mean, loadings, noise_variance) from snapshot(); the properties disagree on purpose."""

    mean = np.zeros(3)
    loadings = np.zeros((3, 1))
    noise_variance = np.ones(3)

    def snapshot(self) -> tuple[Any, Any, Any]:
        return np.array([1.0, 2.0, 3.0]), np.array([[1.0], [0.0], [2.0]]), np.array([0.5, 1.5, 2.5])


def test_snapshot_is_preferred_over_the_properties() -> None:
    q = to_torch(_SnapshotModel())
    f = np.array([[1.0], [0.0], [2.0]])
    np.testing.assert_array_equal(q.loc.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(q.covariance_matrix.numpy(), f @ f.T + np.diag([0.5, 1.5, 2.5]), rtol=1e-12)


def test_to_torch_rejects_unfitted_and_foreign_models() -> None:
    with pytest.raises(TypeError, match="fitted onlinefa model"):
        to_torch(object())
    with pytest.raises(ValueError):
        to_torch(onlinefa.OnlineFactorAnalysis(2))


# -- docs and docstrings --------------------------------------------------------------------------


def test_usage_pytorch_workflow_snippet_runs() -> None:
    text = (ROOT / "docs" / "guide" / "usage.md").read_text(encoding="utf-8")
    section = text.split("## PyTorch workflow", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "the PyTorch workflow section has no python block"
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0], "docs/guide/usage.md", "exec"), namespace)  # noqa: S102
    probabilities = namespace["probabilities"]
    assert probabilities.shape == (namespace["n_test"], namespace["n_classes"])
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(namespace["n_test"]))


@pytest.mark.parametrize("module", ["_params", "_sampling", "_distributions"])
def test_docstring_examples(module: str) -> None:
    import importlib

    result = doctest.testmod(importlib.import_module(f"onlinefa.torch.{module}"))
    assert result.attempted > 0 and result.failed == 0


def _rust_model(name: str) -> object:
    # three strong factors, so that the reported F (shrunk to what the samples support) is far from zero
    rng = np.random.default_rng(4)
    x = 3.0 * rng.standard_normal((60, 3)) @ rng.standard_normal((3, 40)) + rng.standard_normal((60, 40))
    if name == "vifa":
        return onlinefa.VIFA(40, 3, prior_precision=1.0, lr_mean=1e-3, lr_loadings=1e-3, lr_log_noise=1e-3, seed=0)
    if name == "sga":
        return onlinefa.OnlineSGA(40, 3, seed=0).update(x)
    return onlinefa.OnlineEM(40, 3, seed=0, dtype="float32" if name == "em32" else "float64").update(x)


def _drawn_by_hand(model: object, n_samples: int, seed: int, dtype: torch.dtype) -> np.ndarray:
    """c + F h + ψ^½ z in float64 from the model's snapshot, with the normals of ``sample_parameters``: one block
    of K + D of ``torch.randn`` per draw, in the draws' dtype, from ``torch.Generator().manual_seed(seed)``."""
    c, f, psi = (np.asarray(part, dtype=np.float64) for part in getattr(model, "snapshot")())
    generator = torch.Generator().manual_seed(seed)
    k = f.shape[1]
    rows = []
    for _ in range(n_samples):
        noise = torch.randn(k + c.shape[0], generator=generator, dtype=dtype).double().numpy()
        rows.append(c + f @ noise[:k] + np.sqrt(psi) * noise[k:])
    return np.array(rows)


@pytest.mark.parametrize("name", ["em32", "em64", "sga", "vifa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draws_of_a_rust_model_are_written_by_its_engine_without_a_copy_of_f(name: str, dtype: torch.dtype,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with a Rust engine writes the draws in place over their normals (no snapshot, so no D×K copy of
    F): c + F h + ψ^½ z of the same normals as before, computed in float64 and rounded once, whatever the
    chunk size."""
    model = _rust_model(name)
    reference = _drawn_by_hand(model, 19, 3, dtype)
    monkeypatch.setattr(model, "snapshot", lambda *args, **kwargs: pytest.fail("snapshot() was called"))
    # float64: the same sums in another order; float32: the float64 value rounded once (within one ulp)
    tolerance = 1e-12 if dtype == torch.float64 else 2.0**-23
    first = None
    for chunk_size in (1, 5, 19):
        draws = torch.cat(list(sample_parameters(model, 19, seed=3, dtype=dtype, chunk_size=chunk_size)))
        assert draws.dtype == dtype
        np.testing.assert_allclose(draws.double().numpy(), reference, rtol=tolerance, atol=0)
        first = draws if first is None else first
        assert torch.equal(draws, first)


def test_scaled_draws_of_a_rust_model_widen_around_its_mean() -> None:
    """θ = c + √scale · (θ₁ − c) with θ₁ the scale-1 draw, computed in float64 (then rounded once)."""
    em = onlinefa.OnlineEM(40, 3, seed=0).update(np.random.default_rng(6).standard_normal((60, 40)))
    for dtype, scale, tolerance in ((torch.float64, 4.0, 1e-12), (torch.float32, 0.25, 2.0**-23)):
        unit = _drawn_by_hand(em, 10, 1, dtype)
        wide = torch.cat(list(sample_parameters(em, 10, seed=1, dtype=dtype, scale=scale))).double().numpy()
        np.testing.assert_allclose(wide, em.mean + scale**0.5 * (unit - em.mean), rtol=tolerance, atol=0)


def test_draws_refuse_a_model_updated_between_their_blocks() -> None:
    """The blocks of draws read the model one after the other: an update in between would mix two Gaussians."""
    x = np.random.default_rng(7).standard_normal((61, 40))
    em = onlinefa.OnlineEM(40, 3, seed=0).update(x[:60])
    draws = sample_parameters(em, 16, seed=1)
    next(draws)
    em.update(x[60])
    with pytest.raises(RuntimeError, match="changed while its draws were read"):
        next(draws)
