"""onlinefa.distributed.ShardedOnlineEM, on either row store (the Rust core, torch tensors): a peer dying at the
last collective of an update (the one that sums the Gram of the reporting map, after every sample's) leaves
each survivor as it was before the call.

The ranks are spawned processes over gloo; the dying rank exits (``os._exit``) when the update reaches that
collective. Every survivor must raise ``ShardCommunicationError`` within the group's timeout, and its local
model's state must equal its state before the call (before the fix it had every sample applied).
"""

from __future__ import annotations

import datetime
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from engine_state import engine_state  # noqa: E402
from spawn_helpers import factor_stream, run_bounded  # noqa: E402

D, K, BATCH = 23, 2, 6
LAYOUTS = {2: [0, 10, D], 3: [0, 7, 15, D]}
COLLECTIVE_TIMEOUT = 5.0


def worker(rank: int, world: int, tmp: str, culprit: int, device: str | None) -> None:
    from onlinefa.distributed import ShardedOnlineEM, _streaming

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = torch.from_numpy(np.ascontiguousarray(factor_stream(60, D, K, 0)[:, lo:hi]))
    model = ShardedOnlineEM(hi - lo, K, seed=4, n_warmup=10, device=device).update(x[:40])
    before = engine_state(model.local_model)
    if rank == culprit:  # die at the update's last collective: one per sample, then the reporting map's
        exchange, calls = _streaming.exchange, [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == BATCH + 1:
                os._exit(0)
            return exchange(*args, **kwargs)

        _streaming.exchange = dying
    try:
        model.update(x[40:40 + BATCH])
        outcome = ("no error", "")
    except Exception as err:  # noqa: BLE001 - reported to the test
        outcome = (type(err).__name__, str(err))
    after = engine_state(model.local_model)
    same = all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)
    Path(f"{tmp}/rank{rank}.pkl").write_bytes(pickle.dumps({"outcome": outcome, "same": same,
                                                              "n_seen": (before["n_seen"], after["n_seen"])}))
    os._exit(0)  # a process group with a dead peer cannot be torn down cleanly


@pytest.mark.slow
@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize(("world", "culprit"), [(2, 1), (3, 0)])
def test_a_peer_lost_at_the_reporting_map_leaves_the_survivors_unchanged(world: int, culprit: int, device: str | None,
                                                                          tmp_path: Path) -> None:
    run_bounded(worker, world, tmp_path, culprit, device)
    for rank in range(world):
        if rank == culprit:
            assert not (tmp_path / f"rank{rank}.pkl").exists()
            continue
        report = pickle.loads((tmp_path / f"rank{rank}.pkl").read_bytes())
        name, message = report["outcome"]
        assert name == "ShardCommunicationError", message
        assert report["same"], report["n_seen"]
