"""Sharded queries refuse bad input on any rank, on every rank, as the single-process model does.

``log_prob`` and ``transform`` of a sharded model given NaN, ±Inf or a value above 1e100 on one rank only
must raise ``ValueError`` on every rank (the failing rank names the row, the others the failing rank),
never return NaN. Ranks as threads (``allreduce=``) and as spawned gloo processes.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onlinefa
from onlinefa.distributed import ShardedOnlineEM, ShardedOnlineSGA, ShardedVIFA
from spawn_helpers import run_bounded
from thread_ranks import run_ranks

D, K = 17, 2
BOUNDS = [0, 6, 11, D]


def data(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, K)) @ rng.standard_normal((K, D)) + 0.3 * rng.standard_normal((n, D))


def build(cls: Any, rows: slice, comm: dict[str, Any]) -> Any:
    if cls is ShardedVIFA:
        return ShardedVIFA(rows.stop - rows.start, K, seed=2, prior_precision=0.1, lr_mean=1e-2, lr_loadings=1e-2,
                           lr_log_noise=1e-2, **comm)
    return cls(rows.stop - rows.start, K, seed=2, **comm).update(data(30)[:, rows])


def test_the_single_process_model_refuses_the_same_input() -> None:
    x = data(4)
    x[2, 13] = np.nan
    model = onlinefa.OnlineEM(D, K, seed=2).update(data(30))
    for query in (model.log_prob, model.transform):
        with pytest.raises(ValueError, match="row 2 contains NaN"):
            query(x)


@pytest.mark.parametrize("cls", [ShardedOnlineEM, ShardedOnlineSGA, ShardedVIFA])
@pytest.mark.parametrize("query", ["log_prob", "transform"])
@pytest.mark.parametrize("bad", [np.nan, -np.inf, 1e101])
def test_bad_query_input_on_one_rank_raises_on_every_rank(cls: Any, query: str, bad: float) -> None:
    def body(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        model = build(cls, rows, comm)
        x = data(4)[:, rows].copy()
        if rank == 2:
            x[2, 1] = bad
        return getattr(model, query)(x)

    results, errors = run_ranks(BOUNDS, body, timeout=10.0)
    assert results == [None, None, None]
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert "rank 2: row 2 contains NaN, infinity or a value with magnitude above" in str(errors[2])
    assert "failed on rank(s) [2]" in str(errors[0]) and "failed on rank(s) [2]" in str(errors[1])


def gloo_worker(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    rows = slice([0, 8, D][rank], [0, 8, D][rank + 1])
    model = ShardedOnlineEM(rows.stop - rows.start, K, seed=2).update(data(30)[:, rows])
    messages = []
    for query in ("log_prob", "transform"):
        x = data(3)[:, rows].copy()
        if rank == 1:
            x[0, 0] = np.nan
        try:
            getattr(model, query)(x)
            messages.append("no error")
        except ValueError as err:
            messages.append(f"ValueError: {err}")
    Path(f"{tmp}/rank{rank}.txt").write_text("\n".join(messages))
    dist.barrier()
    os._exit(0)


@pytest.mark.slow
def test_bad_query_input_on_one_gloo_rank_raises_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch.multiprocessing")
    run_bounded(gloo_worker, 2, tmp_path)
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(lines) == 2 and all(line.startswith("ValueError: ") for line in lines), lines
