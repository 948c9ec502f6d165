"""Two sharded models called in opposite orders on two ranks raise on every rank instead of cross-wiring.

Each model's ranks agree on a tag when it is built or loaded, and every collective carries it: a collective
of model A on one rank that meets model B's on another makes every rank raise ``ValueError``, and no
model changes. The ranks are threads (the ``allreduce=`` hook, see ``thread_ranks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from thread_ranks import run_ranks

from onlinefa.distributed import ShardedOnlineEM
from engine_state import engine_state

D, K = 12, 2
BOUNDS = [0, 5, D]


def stream(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, K)) @ rng.standard_normal((K, D)) + 0.4 * rng.standard_normal((n, D))


def equal_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("call", ["update", "log_prob"])
@pytest.mark.parametrize("loaded", [False, True])
def test_models_called_in_opposite_orders_raise_on_every_rank(call: str, loaded: bool, tmp_path: Path) -> None:
    x = stream(40, 0)

    def body(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        models = [ShardedOnlineEM(rows.stop - rows.start, K, seed=s, n_warmup=5, **comm).update(x[:20, rows])
                  for s in (1, 2)]
        if loaded:
            for i, model in enumerate(models):
                model.save(tmp_path / f"m{i}")
            models = [ShardedOnlineEM.load(tmp_path / f"m{i}", **comm) for i in range(2)]
        before = [engine_state(m.local_model) for m in models]
        order = models if rank == 0 else models[::-1]
        errors = []
        for model in order:
            try:
                if call == "update":
                    model.update(x[20:26, rows])
                else:
                    model.log_prob(x[20:26, rows])
                errors.append(None)
            except ValueError as err:
                errors.append(str(err))
        after = [engine_state(m.local_model) for m in models]
        return errors, all(equal_states(a, b) for a, b in zip(after, before))

    results, errors = run_ranks(BOUNDS, body, timeout=20.0)
    assert errors == [None, None], errors
    for rank, (messages, unchanged) in enumerate(results):
        for message in messages:
            assert message is not None and f"rank {rank}" in message and "same order" in message, message
        assert unchanged
