"""The sharded models in real processes over ``torch.distributed`` (gloo on localhost, spawned workers).

Each test spawns 2–4 processes with ``torch.multiprocessing``, a ``file://`` rendezvous in a temporary
directory and a short collective timeout; workers write their results to files and the test compares them
with the single-process model in this process.
"""

from __future__ import annotations

import datetime
import os
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from engine_state import engine_state

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

D, K, N = 37, 3, 1000
LAYOUTS = {2: [0, 20, D], 3: [0, 5, 30, D], 4: [0, 9, 18, 27, D]}
VIFA_OPTIONS = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2,
                "optimizer": "adam"}
VIFA_STEPS = 300
TIMEOUT = datetime.timedelta(seconds=20)


def stream(n: int = N) -> np.ndarray:
    rng = np.random.default_rng(0)
    f = rng.standard_normal((D, K))
    return rng.standard_normal((n, K)) @ f.T + 0.3 * rng.standard_normal((n, D)) + 2.0


def vifa_target() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal(D), rng.uniform(0.5, 2.0, D)


def _init(rank: int, world: int, tmp: str, timeout: datetime.timedelta = TIMEOUT) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=timeout)


def _finish() -> None:
    """Leave once every rank is done, skipping interpreter teardown: destroying a gloo process group (and
    its threads) at exit can abort with "terminate called without an active exception" in one of the
    processes now and then, after all the work and its result files are complete."""
    dist.barrier()
    os._exit(0)


def _run(worker: Any, world: int, tmp: Path, *args: Any) -> None:
    mp.spawn(worker, args=(world, str(tmp), *args), nprocs=world, join=True)


def equivalence_worker(rank: int, world: int, tmp: str) -> None:
    from onlinefa.distributed import ShardedOnlineEM, ShardedOnlineSGA, ShardedVIFA

    _init(rank, world, tmp)
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = stream()
    out: dict[str, Any] = {}
    for name, cls, options in [("em", ShardedOnlineEM, {}), ("plain", ShardedOnlineEM, {"whiten": False}),
                               ("sga", ShardedOnlineSGA, {"lr": 1e-2})]:
        model = cls(hi - lo, K, seed=5, **options)
        for i in range(0, N, 10):
            model.update(torch.from_numpy(x[i: i + 10, lo:hi].copy()))
        out[f"{name}_mean"], out[f"{name}_f"], out[f"{name}_psi"] = model.mean, model.loadings, model.noise_variance
        out[f"{name}_logp"] = model.log_prob(x[:4, lo:hi])
        out[f"{name}_draws"] = model.sample(3, seed=8)
    centre, curvature = vifa_target()
    vi = ShardedVIFA(hi - lo, K, seed=3, **VIFA_OPTIONS)
    for _ in range(VIFA_STEPS):
        vi.step(curvature[lo:hi] * (vi.sample() - centre[lo:hi]))
    out["vifa_mean"], out["vifa_f"], out["vifa_psi"] = vi.mean, vi.loadings, vi.noise_variance
    # Bad input on one rank: every rank raises ValueError, nothing changes.
    em = ShardedOnlineEM(hi - lo, K, seed=5).update(x[:20, lo:hi])
    before = engine_state(em.local_model)
    batch = x[20:25, lo:hi].copy()
    if rank == world - 1:
        batch[2, 0] = np.nan
    try:
        em.update(batch)
        out["bad_raised"] = ""
    except ValueError as err:
        out["bad_raised"] = str(err)
    after = engine_state(em.local_model)
    out["bad_unchanged"] = all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)
    np.savez(f"{tmp}/rank{rank}.npz", **out)
    _finish()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_models_over_gloo_equal_the_single_process_models(world: int, tmp_path: Path) -> None:
    _run(equivalence_worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    x = stream()
    singles = {"em": onlinefa.OnlineEM(D, K, seed=5).update(x),
               "plain": onlinefa.OnlineEM(D, K, seed=5, whiten=False).update(x),
               "sga": onlinefa.OnlineSGA(D, K, seed=5, lr=1e-2).update(x)}
    centre, curvature = vifa_target()
    vi = onlinefa.VIFA(D, K, seed=3, **VIFA_OPTIONS)
    for _ in range(VIFA_STEPS):
        vi.step(curvature * (vi.sample() - centre))
    singles["vifa"] = vi

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    for name, single in singles.items():
        for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
            got = np.concatenate([p[f"{name}_{key}"] for p in parts])
            assert rel(got, want) < 1e-10, (name, key)
        if name != "vifa":
            assert rel(parts[0][f"{name}_logp"], single.log_prob(x[:4])) < 1e-10
            draws = np.concatenate([p[f"{name}_draws"] for p in parts], axis=1)
            assert rel(draws, single.sample(3, seed=8)) < 1e-10
    for rank, p in enumerate(parts):
        assert f"rank(s) [{world - 1}]" in str(p["bad_raised"]) or f"rank {world - 1}" in str(p["bad_raised"])
        assert bool(p["bad_unchanged"]), rank


def dead_rank_worker(rank: int, world: int, tmp: str) -> None:
    from onlinefa.distributed import ShardCommunicationError, ShardedOnlineEM

    _init(rank, world, tmp, datetime.timedelta(seconds=5))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    model = ShardedOnlineEM(hi - lo, K, seed=1)
    if rank == 1:
        os._exit(0)  # dies without a word, mid-stream
    try:
        model.update(stream(3)[:, lo:hi])
        message = "no error"
    except ShardCommunicationError as err:
        message = f"ShardCommunicationError: {err}"
    except Exception:  # noqa: BLE001 - reported to the test
        message = traceback.format_exc()
    Path(f"{tmp}/rank{rank}.txt").write_text(message)
    os._exit(0)  # the process group cannot be destroyed cleanly without its peer


@pytest.mark.slow
def test_a_dead_rank_makes_the_others_fail_clearly_instead_of_hanging(tmp_path: Path) -> None:
    _run(dead_rank_worker, 2, tmp_path)
    message = (tmp_path / "rank0.txt").read_text()
    assert message.startswith("ShardCommunicationError: rank 0"), message
    assert "peer rank may have died" in message


def fsdp_worker(rank: int, world: int, tmp: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from onlinefa.distributed import ShardedOnlineEM, local_parameter_vector

    _init(rank, world, tmp)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)).double()
    fully_shard(net, mesh=init_device_mesh("cpu", (world,)))
    optimiser = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(64, 5, generator=gen).double(), torch.randn(64, 2, generator=gen).double()
    n_local = local_parameter_vector(net).numel()
    posterior = ShardedOnlineEM(n_local, 2, seed=4)
    local_iterates, full_iterates = [], []
    for step in range(60):
        batch = slice((step * 8) % 64, (step * 8) % 64 + 8)
        optimiser.zero_grad()
        torch.nn.functional.mse_loss(net(inputs[batch]), targets[batch]).backward()
        optimiser.step()
        shard = local_parameter_vector(net)
        posterior.update(shard)  # no gather
        local_iterates.append(shard.numpy().copy())
        # For the test only: the gathered parameters, to check the layout of the shards.
        full_iterates.append(torch.cat([p.full_tensor().reshape(-1) for p in net.parameters()]).detach().numpy())
    np.savez(f"{tmp}/rank{rank}.npz", mean=posterior.mean, f=posterior.loadings, psi=posterior.noise_variance,
             local=np.array(local_iterates), full=np.array(full_iterates))
    _finish()


@pytest.mark.slow
def test_fsdp2_shards_feed_the_posterior_without_a_gather(tmp_path: Path) -> None:
    world = 2
    _run(fsdp_worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    # The sharded model's whole vector is the rank-major concatenation of the local shards; it is a
    # permutation of the gathered parameter vector (each tensor's rows split over the ranks).
    rank_major = np.concatenate([p["local"] for p in parts], axis=1)
    full = parts[0]["full"]
    order = [int(np.flatnonzero(np.all(full == rank_major[:, [j]], axis=0))[0]) for j in range(rank_major.shape[1])]
    assert sorted(order) == list(range(full.shape[1]))
    single = onlinefa.OnlineEM(full.shape[1], 2, seed=4).update(full[:, order])
    for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
        got = np.concatenate([p[key] for p in parts])
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-10, key


def ddp_worker(rank: int, world: int, tmp: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from onlinefa.distributed import ShardedOnlineEM, shard_range

    _init(rank, world, tmp)
    torch.manual_seed(0)
    net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                                                      torch.nn.Linear(6, 1)).double())
    optimiser = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(2 + rank)  # each rank its own data, as in data-parallel training
    inputs, targets = torch.randn(64, 4, generator=gen).double(), torch.randn(64, 1, generator=gen).double()
    n_params = sum(p.numel() for p in net.parameters())
    start, stop = shard_range(n_params, rank, world)
    posterior = ShardedOnlineEM(stop - start, 2, seed=4)
    flats = []
    for step in range(40):
        batch = slice((step * 8) % 64, (step * 8) % 64 + 8)
        optimiser.zero_grad()
        torch.nn.functional.mse_loss(net(inputs[batch]), targets[batch]).backward()
        optimiser.step()
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in net.parameters()])
        posterior.update(flat[start:stop])
        flats.append(flat.numpy().copy())
    np.savez(f"{tmp}/rank{rank}.npz", mean=posterior.mean, f=posterior.loadings, psi=posterior.noise_variance,
             flat=np.array(flats))
    _finish()


@pytest.mark.slow
def test_ddp_ranks_split_the_replicated_parameters(tmp_path: Path) -> None:
    world = 2
    _run(ddp_worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    assert np.array_equal(parts[0]["flat"], parts[1]["flat"])  # DDP keeps the replicas identical
    single = onlinefa.OnlineEM(parts[0]["flat"].shape[1], 2, seed=4).update(parts[0]["flat"])
    for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
        got = np.concatenate([p[key] for p in parts])
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-10, key
