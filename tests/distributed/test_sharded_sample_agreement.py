"""Sharded ``sample(n, seed)``: ranks that pass different arguments all raise instead of returning slices of
different draws.

The ranks are threads (the ``allreduce=`` hook, see ``thread_ranks``). With the same arguments the
concatenated slices are still the single-process model's draws (``test_distributed.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from thread_ranks import run_ranks

from onlinefa.distributed import ShardedOnlineEM, ShardedVIFA

D, K = 13, 2
BOUNDS = [0, 4, 9, D]
VIFA_OPTIONS = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2}


def stream(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, K)) @ rng.standard_normal((K, D)) + 0.4 * rng.standard_normal((n, D))


def build(kind: str, comm: dict[str, Any], rows: slice) -> Any:
    if kind == "em":
        return ShardedOnlineEM(rows.stop - rows.start, K, seed=1, n_warmup=5, **comm).update(stream(30)[:, rows])
    return ShardedVIFA(rows.stop - rows.start, K, seed=1, **comm, **VIFA_OPTIONS)


ARGUMENTS = {  # (n_samples, seed) of each rank
    "different n": [(4, 7), (4, 7), (5, 7)],
    "different seed": [(4, 7), (4, 8), (4, 7)],
    "seed on some ranks only": [(4, None), (4, 7), (4, 7)],
    "n differs on rank 0": [(3, None), (4, None), (4, None)],
}


@pytest.mark.parametrize("kind", ["em", "vifa"])
@pytest.mark.parametrize("case", list(ARGUMENTS))
def test_different_sample_arguments_raise_on_every_rank(kind: str, case: str) -> None:
    calls = ARGUMENTS[case]

    def body(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        model = build(kind, comm, rows)
        n, seed = calls[rank]
        return model.sample(n, seed)

    _, errors = run_ranks(BOUNDS, body, timeout=20.0)
    for rank, err in enumerate(errors):
        assert isinstance(err, ValueError), (rank, err)
        assert f"rank {rank}" in str(err) and "same n_samples and seed" in str(err), err
