"""onlinefa.torch.ShardedOnlineEM over gloo (2 and 3 spawned ranks, each shard a torch engine): the
concatenated model equals the single-process Rust OnlineEM, and bad input on one rank raises on every rank and
changes nothing."""

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


def stream() -> np.ndarray:
    rng = np.random.default_rng(0)
    f = rng.standard_normal((D, K))
    return (rng.standard_normal((N, K)) @ f.T + 0.3 * rng.standard_normal((N, D)) + 2.0) * 1e-2


def worker(rank: int, world: int, tmp: str) -> None:
    from onlinefa.torch import ShardedOnlineEM

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = torch.from_numpy(stream()[:, lo:hi].copy())
    out: dict[str, Any] = {}
    for name, options in [("em", {}), ("plain", {"whiten": False, "schedule": "power"})]:
        model = ShardedOnlineEM(hi - lo, K, seed=5, **options)
        for i in range(0, N, 25):
            model.update(x[i: i + 25])
        mean, f, psi = model.snapshot()
        out[f"{name}_mean"], out[f"{name}_f"], out[f"{name}_psi"] = mean.numpy(), f.numpy(), psi.numpy()
    em = ShardedOnlineEM(hi - lo, K, seed=5).update(x[:20])
    before = em.local_model.get_state()
    batch = x[20:25].clone()
    if rank == world - 1:
        batch[2, 0] = float("nan")
    try:
        em.update(batch)
        out["bad_raised"] = ""
    except ValueError as err:
        out["bad_raised"] = str(err)
    after = em.local_model.get_state()
    out["bad_unchanged"] = all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)
    np.savez(f"{tmp}/rank{rank}.npz", **out)
    dist.barrier()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_device_shards_equal_the_single_process_model(world: int, tmp_path: Path) -> None:
    run_bounded(worker, world, tmp_path)
    parts = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    x = stream()
    singles = {"em": onlinefa.OnlineEM(D, K, seed=5).update(x),
               "plain": onlinefa.OnlineEM(D, K, seed=5, whiten=False, schedule="power").update(x)}
    for name, single in singles.items():
        for key, want in (("mean", single.mean), ("f", single.loadings), ("psi", single.noise_variance)):
            got = np.concatenate([p[f"{name}_{key}"] for p in parts])
            assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-10, (name, key)
    for rank, part in enumerate(parts):
        assert "row 2" in str(part["bad_raised"]) or "rank" in str(part["bad_raised"]), rank
        assert bool(part["bad_unchanged"]), rank
