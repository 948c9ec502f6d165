"""onlinefa.distributed.ShardedOnlineEM, ShardedOnlineSGA and ShardedVIFA with device="cpu" over gloo (2 and 3
spawned ranks, each shard's rows in torch tensors): the concatenated model equals the single-process Rust model,
and bad input on one rank raises on every rank and changes nothing."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from spawn_helpers import run_bounded  # noqa: E402

D, K, N = 37, 3, 300
LAYOUTS = {2: [0, 20, D], 3: [0, 5, 30, D]}
CONFIGS: dict[str, dict[str, Any]] = {
    "em": {}, "plain": {"whiten": False, "schedule": "power"},
    "sga": {"sga": True, "lr": 1e-2}, "sga_unit": {"sga": True, "scaling": "unit", "n_warmup": 20, "lr": 1e-3},
}


def stream() -> np.ndarray:
    rng = np.random.default_rng(0)
    f = rng.standard_normal((D, K))
    return (rng.standard_normal((N, K)) @ f.T + 0.3 * rng.standard_normal((N, D)) + 2.0) * 1e-2


def worker(rank: int, world: int, tmp: str) -> None:
    from onlinefa.distributed import ShardedOnlineEM, ShardedOnlineSGA

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = torch.from_numpy(stream()[:, lo:hi].copy())
    out: dict[str, Any] = {}
    for name, options in CONFIGS.items():
        options = dict(options)
        sharded = ShardedOnlineSGA if options.pop("sga", False) else ShardedOnlineEM
        model = sharded(hi - lo, K, seed=5, device="cpu", **options)
        for i in range(0, N, 25):
            model.update(x[i: i + 25])
        mean, f, psi = model.snapshot()
        out[f"{name}_mean"], out[f"{name}_f"], out[f"{name}_psi"] = mean.numpy(), f.numpy(), psi.numpy()
    for name, sharded in (("em", ShardedOnlineEM), ("sga", ShardedOnlineSGA)):
        model = sharded(hi - lo, K, seed=5, device="cpu").update(x[:20])
        before = model.local_model.get_state()
        batch = x[20:25].clone()
        if rank == world - 1:
            batch[2, 0] = float("nan")
        try:
            model.update(batch)
            out[f"{name}_bad_raised"] = ""
        except ValueError as err:
            out[f"{name}_bad_raised"] = str(err)
        after = model.local_model.get_state()
        out[f"{name}_bad_unchanged"] = all(np.array_equal(np.asarray(before[k]), np.asarray(after[k]))
                                           for k in before)
    np.savez(f"{tmp}/rank{rank}.npz", **out)
    dist.barrier()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_device_shards_equal_the_single_process_model(world: int, tmp_path: Path) -> None:
    run_bounded(worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    x = stream()
    singles: dict[str, Any] = {}
    for name, options in CONFIGS.items():
        options = dict(options)
        single = onlinefa.OnlineSGA if options.pop("sga", False) else onlinefa.OnlineEM
        singles[name] = single(D, K, seed=5, **options).update(x)
    for name, single in singles.items():
        for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
            got = np.concatenate([p[f"{name}_{key}"] for p in parts])
            assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-10, (name, key)
    for rank, part in enumerate(parts):
        for name in ("em", "sga"):
            raised = str(part[f"{name}_bad_raised"])
            assert "row 2" in raised or "rank" in raised, (rank, name)
            assert bool(part[f"{name}_bad_unchanged"]), (rank, name)


VIFA_OPTIONS: dict[str, Any] = {"prior_precision": 0.1, "lr_mean": 1e-3, "lr_loadings": 1e-3, "lr_log_noise": 1e-3,
                                "optimizer": "adam", "n_grad_samples": 2, "clip_grad_norm": 5.0}


def vifa_gradient(theta: np.ndarray) -> np.ndarray:
    """∇ of the NLL ½ Σ_d w_d (θ_d − 1)² (a diagonal Gaussian target, so each rank computes its own slice)."""
    return np.linspace(1.0, 20.0, theta.shape[-1]) * (theta - 1.0)


def vifa_worker(rank: int, world: int, tmp: str) -> None:
    from onlinefa.distributed import ShardedVIFA

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    single = onlinefa.VIFA(D, K, seed=5, **VIFA_OPTIONS)  # the noise source: every rank takes its slice
    model = ShardedVIFA(hi - lo, K, seed=5, device="cpu", **VIFA_OPTIONS)
    weights = np.linspace(1.0, 20.0, D)[lo:hi]
    for _ in range(200):
        thetas = [single.sample() for _ in range(2)]
        h, z = single.pending_noise()
        engine = model.local_model._engine
        local = [engine.draw(torch.as_tensor(h_l), torch.as_tensor(z_l[lo:hi])) for h_l, z_l in zip(h, z)]
        single.step(np.stack([vifa_gradient(t) for t in thetas]))
        model.step(torch.stack([torch.as_tensor(weights) * (t - 1.0) for t in local]))
    mean, f, psi = model.snapshot()
    out: dict[str, Any] = {"mean": mean.numpy(), "f": f.numpy(), "psi": psi.numpy()}
    model.sample(), model.sample()
    before = {k: v.clone() for k, v in model.local_model._engine.params.items()}
    bad = torch.zeros(2, hi - lo, dtype=torch.float64)
    if rank == world - 1:
        bad[1, 0] = float("nan")
    try:
        model.step(bad)
        out["bad_raised"] = ""
    except ValueError as err:
        out["bad_raised"] = str(err)
    after = model.local_model._engine.params
    out["bad_unchanged"] = all(torch.equal(before[k], after[k]) for k in before) and model.n_steps == 200
    np.savez(f"{tmp}/rank{rank}.npz", **out)
    dist.barrier()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_device_vifa_shards_equal_the_single_process_model(world: int, tmp_path: Path) -> None:
    run_bounded(vifa_worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    single = onlinefa.VIFA(D, K, seed=5, **VIFA_OPTIONS)
    for _ in range(200):
        single.step(np.stack([vifa_gradient(single.sample()) for _ in range(2)]))
    for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
        got = np.concatenate([p[key] for p in parts])
        assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-10, key
    for rank, part in enumerate(parts):
        assert "rank" in str(part["bad_raised"]) or "grad" in str(part["bad_raised"]), rank
        assert bool(part["bad_unchanged"]), rank
