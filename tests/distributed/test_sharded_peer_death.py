"""A peer dying in the middle of a sharded update or step leaves every survivor as it was before the call.

ShardedOnlineEM/ShardedOnlineSGA take one collective per sample of a batch and ShardedVIFA two per step,
with local work in between. Here one rank dies (``os._exit``) just before one of those collectives, after
the others have applied part of the call (two samples of a six-sample batch; the local half of a VIFA step).
Every survivor must raise ``ShardCommunicationError`` within the process group's timeout (never hang), and
its state must equal its state before the call bit for bit: the core's whole state, and for VIFA also the
precision built from B = Fᵀ Ψ⁻¹ F summed over the ranks (read through the local latent means). The ranks
are real processes (spawned, ``torch.distributed`` over gloo). Above the size bound of the state copy, a
half-stepped VIFA rank refuses every later step with a clear error.
"""

from __future__ import annotations

import datetime
import os
import pickle
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spawn_helpers import factor_stream, run_bounded
from engine_state import engine_state

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

D, K = 23, 2
LAYOUTS = {2: [0, 10, D], 3: [0, 7, 15, D]}
#: Collective timeout of the workers: a dead peer is noticed after this at the latest.
COLLECTIVE_TIMEOUT = 5.0
VIFA_OPTIONS = {"prior_precision": 0.1, "lr_mean": 1e-2, "lr_loadings": 1e-2, "lr_log_noise": 1e-2,
                "optimizer": "adam", "n_grad_samples": 2}


def stream(n: int, seed: int = 0) -> np.ndarray:
    return factor_stream(n, D, K, seed)


def _die_at_call(module: Any, call: int) -> None:
    """Make this process exit silently when ``module.exchange`` is called for the ``call``-th time (from 1)."""
    exchange = module.exchange
    count = [0]

    def dying(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] == call:
            os._exit(0)
        return exchange(*args, **kwargs)

    module.exchange = dying


def _no_backup(module: Any) -> None:
    """Make the size bound of the state copy 0 in ``module`` (every model is then 'too large' to copy)."""

    class Core:
        def __getattr__(self, name: str) -> Any:
            from onlinefa import _core
            return getattr(_core, name)

        @staticmethod
        def snapshot_max_elements() -> int:
            return 0

    module._core = Core()


def worker(rank: int, world: int, tmp: str, kind: str, culprit: int, call: int, backup: bool,
           device: str | None = None) -> None:
    from onlinefa.distributed import ShardedOnlineEM, ShardedOnlineSGA, ShardedVIFA, _streaming, _vifa

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = stream(60)
    probe = np.ascontiguousarray(x[:5, lo:hi])
    model: Any
    if kind == "vifa":
        model = ShardedVIFA(hi - lo, K, seed=3, **VIFA_OPTIONS)
        for _ in range(3):  # a few steps, so that Adam's moments are not zero
            model.step(np.stack([model.sample() - 1.0 for _ in range(2)]))
        grads = np.stack([model.sample() - 1.0 for _ in range(2)])  # the pending draws of the failing step
        if not backup:
            _no_backup(_vifa)
        before = engine_state(model.local_model)
        latent_before = model.local_model._core.latent_mean(probe)
        if rank == culprit:
            _die_at_call(_vifa, call)
        call_it = lambda: model.step(grads)  # noqa: E731
    else:
        cls = ShardedOnlineEM if kind == "em" else ShardedOnlineSGA
        model = cls(hi - lo, K, seed=4, n_warmup=10, device=device).update(x[:40, lo:hi])
        before = engine_state(model.local_model)
        latent_before = None
        if rank == culprit:
            _die_at_call(_streaming, call)
        call_it = lambda: model.update(x[40:46, lo:hi])  # noqa: E731
    started = time.monotonic()
    try:
        call_it()
        outcome = ("no error", "")
    except Exception as err:  # noqa: BLE001 - reported to the test
        outcome = (type(err).__name__, f"{err}\n{traceback.format_exc()}")
    elapsed = time.monotonic() - started
    after = engine_state(model.local_model)
    report: dict[str, Any] = {"before": before, "after": after, "outcome": outcome, "elapsed": elapsed}
    if kind == "vifa":
        report["latent"] = (latent_before, model.local_model._core.latent_mean(probe))
        try:  # a later step (it never reaches a collective when the rank refuses it)
            model.step(grads)
            report["later"] = ("no error", "")
        except Exception as err:  # noqa: BLE001
            report["later"] = (type(err).__name__, str(err))
    Path(f"{tmp}/rank{rank}.pkl").write_bytes(pickle.dumps(report))
    os._exit(0)  # a process group with a dead peer cannot be torn down cleanly


def equal_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        (isinstance(b[k], np.ndarray) and a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]))
        if isinstance(a[k], np.ndarray) else a[k] == b[k]
        for k in a)


CASES = [  # (model, world size, rank that dies, at which of its exchange calls, where the rows are)
    # The 4th per-sample collective: the survivors have applied samples 0-2 of 6 (EM takes no agreement first).
    ("em", 3, 2, 4, None),
    ("em", 2, 0, 2, None),
    # SGA: call 1 is the agreement on the batch; at call 4 the survivors have applied samples 0-1 and the
    # running mean of sample 2 (its pass changes the state before the collective).
    ("sga", 3, 1, 4, None),
    # The same on torch rows (SGA there needs no agreement: its pass changes nothing before the collective).
    ("em", 3, 2, 4, "cpu"),
    ("sga", 3, 1, 4, "cpu"),
    # VIFA: call 2 is the collective of B after the local step (the survivors stepped c, F, β and Adam's moments).
    ("vifa", 3, 1, 2, None),
    ("vifa", 2, 0, 2, None),
]


@pytest.mark.parametrize(("kind", "world", "culprit", "call", "device"), CASES)
@pytest.mark.slow
def test_survivors_keep_their_state_when_a_peer_dies_mid_call(
    kind: str, world: int, culprit: int, call: int, device: str | None, tmp_path: Path
) -> None:
    run_bounded(worker, world, tmp_path, kind, culprit, call, True, device)
    for rank in range(world):
        if rank == culprit:
            assert not (tmp_path / f"rank{rank}.pkl").exists()
            continue
        report = pickle.loads((tmp_path / f"rank{rank}.pkl").read_bytes())
        name, message = report["outcome"]
        assert name == "ShardCommunicationError", message
        assert report["elapsed"] < COLLECTIVE_TIMEOUT + 10.0
        assert equal_states(report["after"], report["before"]), (rank, report["after"]["n_seen" if kind != "vifa"
                                                                                       else "n_steps"])
        assert f"rank {rank}" in message and "restored to its state before" in message, message
        if kind == "vifa":
            latent_before, latent_after = report["latent"]  # the precision from the summed B is restored
            assert latent_after.tobytes() == latent_before.tobytes()
            # The next step is attempted (and fails only because the peer is gone), not refused as diverged.
            later_name, later = report["later"]
            assert later_name == "ShardCommunicationError" and "the collective for step failed" in later, later
            assert "finite" not in later


@pytest.mark.slow
def test_a_half_stepped_vifa_rank_above_the_copy_bound_says_so(tmp_path: Path) -> None:
    """Without a copy (state above the bound), a survivor says it is half-stepped and refuses later steps
    with that reason, instead of 'parameters are no longer finite' or a wrong model."""
    world, culprit = 2, 1
    run_bounded(worker, world, tmp_path, "vifa", culprit, 2, False)
    report = pickle.loads((tmp_path / "rank0.pkl").read_bytes())
    name, message = report["outcome"]
    assert name == "ShardCommunicationError" and "half-stepped" in message and "load a checkpoint" in message
    later_name, later = report["later"]
    assert later_name == "ShardCommunicationError", later
    assert "could not be restored" in later and "load a checkpoint" in later and "finite" not in later
