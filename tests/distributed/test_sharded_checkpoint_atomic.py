"""A sharded checkpoint is replaced as a whole or not at all.

A directory holds one good checkpoint; a second ``save`` into it fails at one point — one rank's file write
runs out of space, rank 0's manifest switch fails, or a rank dies before (or just after) writing its file.
Every surviving rank must raise (within the process group's timeout, never hang), and the directory's
previous checkpoint must still load as exactly the model that wrote it. The ranks are real processes
(spawned, ``torch.distributed`` over gloo); the parent loads the directory with ranks simulated by threads.
Also: a checkpoint of the previous layout (files without a generation in their names) still loads, and a
save into it leaves only the new generation; the manifest's own checks (paths, rank names, fields, digest).
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import pickle
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spawn_helpers import factor_stream, run_bounded
from thread_ranks import run_ranks

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from onlinefa.distributed import ShardedOnlineEM  # noqa: E402 - after the torch skip, like the others
from engine_state import engine_state  # noqa: E402

D, K = 23, 2
LAYOUTS = {2: [0, 10, D], 3: [0, 7, 15, D]}
#: Collective timeout of the workers: a dead peer is noticed after this.
COLLECTIVE_TIMEOUT = 5.0
DATA = Path(__file__).resolve().parents[1] / "data"


def stream(n: int, seed: int = 0) -> np.ndarray:
    return factor_stream(n, D, K, seed)


def _inject(fault: str, rank: int) -> None:
    """Install ``fault`` in this worker process (only on the rank it concerns)."""
    from onlinefa import checkpoint
    from onlinefa.distributed import _shared

    if fault == "rank_file_enospc" and rank == 1:
        original = checkpoint._write_archive

        def half_written(handle: Any, members: Any) -> None:
            handle.write(b"PK\x03\x04 partial")  # some bytes reach the disk, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        checkpoint._write_archive = half_written  # type: ignore[assignment]
        assert original is not None
    elif fault == "manifest_enospc" and rank == 0:
        replace = os.replace

        def failing_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if os.fspath(dst).endswith("manifest.json"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            replace(src, dst, *args, **kwargs)

        os.replace = failing_replace  # type: ignore[assignment]
    elif fault == "dies_before_writing" and rank == 1:
        def die(self: Any, path: Path) -> None:
            os._exit(0)  # dies without a word, before its file exists

        _shared.ShardedGaussianMixin._save_local = die  # type: ignore[method-assign]
    elif fault == "dies_after_writing" and rank == 2:
        save_local = _shared.ShardedGaussianMixin._save_local

        def write_then_die(self: Any, path: Path) -> None:
            save_local(self, path)
            os._exit(0)  # its file of the new generation is complete, the others never hear of it

        _shared.ShardedGaussianMixin._save_local = write_then_die  # type: ignore[method-assign]


def fault_worker(rank: int, world: int, tmp: str, fault: str) -> None:
    from onlinefa.distributed import ShardedOnlineEM

    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    lo, hi = LAYOUTS[world][rank], LAYOUTS[world][rank + 1]
    x = stream(120)
    model = ShardedOnlineEM(hi - lo, K, seed=4).update(x[:80, lo:hi])
    model.save(f"{tmp}/ckpt")  # the good checkpoint
    good = engine_state(model.local_model)
    model.update(x[80:, lo:hi])
    _inject(fault, rank)
    started = time.monotonic()
    try:
        model.save(f"{tmp}/ckpt")
        outcome = ("no error", "")
    except Exception as err:  # noqa: BLE001 - reported to the test
        outcome = (type(err).__name__, f"{err}\n{traceback.format_exc()}")
    elapsed = time.monotonic() - started
    Path(f"{tmp}/rank{rank}.pkl").write_bytes(pickle.dumps({"good": good, "outcome": outcome, "elapsed": elapsed}))
    os._exit(0)  # a process group with a dead peer cannot be torn down cleanly


def equal_states(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(np.asarray(a[k]), np.asarray(b[k])) if isinstance(a[k], np.ndarray) else a[k] == b[k]
        for k in a)


def load_states(directory: Path, world: int) -> list[dict[str, Any]]:
    def body(rank: int, comm: dict[str, Any], rows: slice) -> dict[str, Any]:
        state: dict[str, Any] = engine_state(ShardedOnlineEM.load(directory, **comm).local_model)
        return state

    results, errors = run_ranks(LAYOUTS[world], body, timeout=20.0)
    assert errors == [None] * world, errors
    return results


FAULTS = [  # (fault, world, rank that fails or dies, exception the survivors raise)
    ("rank_file_enospc", 3, 1, "RuntimeError"),
    ("manifest_enospc", 2, 0, "RuntimeError"),
    ("dies_before_writing", 3, 1, "ShardCommunicationError"),
    ("dies_after_writing", 3, 2, "ShardCommunicationError"),
]


@pytest.mark.parametrize(("fault", "world", "culprit", "survivor_error"), FAULTS)
@pytest.mark.slow
def test_a_failed_sharded_save_keeps_the_previous_checkpoint(
    fault: str, world: int, culprit: int, survivor_error: str, tmp_path: Path
) -> None:
    run_bounded(fault_worker, world, tmp_path, fault)
    dead = fault.startswith("dies")
    reports = {r: pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes())
               for r in range(world) if not (dead and r == culprit)}
    for rank, report in reports.items():
        kind, message = report["outcome"]
        if rank == culprit:  # the rank whose write failed raises its own error
            assert kind == "OSError" and f"rank {rank}" in message and "No space left" in message, message
        else:
            assert kind == survivor_error, message
            assert f"rank {rank}" in message
        # Bounded: the collective timeout (dead peer) or at once (a reported failure), never a hang.
        assert report["elapsed"] < COLLECTIVE_TIMEOUT + 10.0
    # The directory's previous checkpoint loads, and is exactly the model that wrote it.
    loaded = load_states(tmp_path / "ckpt", world)
    for rank, report in reports.items():
        assert equal_states(loaded[rank], report["good"]), rank
    # Nothing of the failed generation is left by the ranks that could clean up.
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    leftovers = [n for n in names if n != "manifest.json" and n not in manifest["files"]]
    if fault == "dies_after_writing":  # only the dead rank's own file, which nobody else may delete
        assert len(leftovers) == 1 and leftovers[0].startswith(f"rank-{culprit:05d}-"), names
    else:
        assert leftovers == [], names
    # The next successful save replaces the checkpoint and removes every orphan.
    x = stream(120)

    def resave(rank: int, comm: dict[str, Any], rows: slice) -> dict[str, Any]:
        model = ShardedOnlineEM.load(tmp_path / "ckpt", **comm).update(x[80:, rows])
        model.save(tmp_path / "ckpt")
        state: dict[str, Any] = engine_state(model.local_model)
        return state

    saved, errors = run_ranks(LAYOUTS[world], resave, timeout=20.0)
    assert errors == [None] * world, errors
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(["manifest.json", *manifest["files"]])
    for a, b in zip(load_states(tmp_path / "ckpt", world), saved):
        assert equal_states(a, b)


def _fixture_states() -> list[dict[str, Any]]:
    stored = np.load(DATA / "sharded_em_v1_previous_layout_expected.npz")
    states: list[dict[str, Any]] = [{}, {}]
    for key in stored.files:
        rank, name = key.split(".", 1)
        value = stored[key]
        states[int(rank[4:])][name] = value if value.ndim else value.item()
    return states


def test_a_checkpoint_of_the_previous_layout_loads_and_is_replaced_cleanly(tmp_path: Path) -> None:
    directory = tmp_path / "old"
    shutil.copytree(DATA / "sharded_em_v1_previous_layout", directory)
    bounds = [0, 6, 14]

    def load(rank: int, comm: dict[str, Any], rows: slice) -> Any:
        return ShardedOnlineEM.load(directory, **comm)

    models, errors = run_ranks(bounds, load)
    assert errors == [None, None], errors
    for model, want in zip(models, _fixture_states()):
        got = engine_state(model.local_model)
        assert got.pop("shrink") is False  # written before the option existed: the fit as it is
        assert got.keys() == want.keys()
        for key in want:
            assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), key

    def load_and_save(rank: int, comm: dict[str, Any], rows: slice) -> dict[str, Any]:
        model = ShardedOnlineEM.load(directory, **comm)
        model.save(directory)
        state: dict[str, Any] = engine_state(model.local_model)
        return state

    states, errors = run_ranks(bounds, load_and_save)
    assert errors == [None, None], errors
    manifest = json.loads((directory / "manifest.json").read_text())
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted(["manifest.json", *manifest["files"]])
    assert "rank-00000-of-00002.npz" not in names and "rank-00001-of-00002.npz" not in names
    reloaded, errors = run_ranks(bounds, lambda r, c, s: engine_state(ShardedOnlineEM.load(directory, **c).local_model))
    assert errors == [None, None]
    for a, b in zip(reloaded, states):
        assert equal_states(a, b)


# -- the manifest's own integrity (ranks as threads) -------------------------------------------------------
def _saved(tmp_path: Path) -> Path:
    x = stream(40)
    directory = tmp_path / "ckpt"

    def save(rank: int, comm: dict[str, Any], rows: slice) -> None:
        ShardedOnlineEM(rows.stop - rows.start, K, seed=4, **comm).update(x[:, rows]).save(directory)

    assert run_ranks(LAYOUTS[2], save)[1] == [None, None]
    return directory


def _load_errors(directory: Path) -> list[BaseException | None]:
    return run_ranks(LAYOUTS[2], lambda r, c, s: ShardedOnlineEM.load(directory, **c))[1]


def _edit(directory: Path, edit: Any, *, redigest: bool = True) -> None:
    from onlinefa.distributed._shared import _manifest_digest

    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    if redigest:
        manifest["sha256"] = _manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


def test_a_manifest_entry_pointing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    directory = _saved(tmp_path)
    outside = tmp_path / "elsewhere.npz"
    shutil.copy(directory / json.loads((directory / "manifest.json").read_text())["files"][0], outside)
    _edit(directory, lambda m: m["files"].__setitem__(0, "../elsewhere.npz"))
    errors = _load_errors(directory)
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert "manifest.json" in str(errors[0]) and "'../elsewhere.npz'" in str(errors[0])


def test_swapped_files_and_digests_are_refused(tmp_path: Path) -> None:
    directory = _saved(tmp_path)
    _edit(directory, lambda m: (m["files"].reverse(), m["digests"].reverse()))
    errors = _load_errors(directory)
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert "as rank 0's file" in str(errors[0])


@pytest.mark.parametrize("field, value", [("row_ranges", "abc"), ("row_ranges", [[0, 10], [11, D]]),
                                          ("digests", [[1, 2], [3, 4]]), ("files", None), ("generation", -1)])
def test_malformed_manifest_fields_are_errors_naming_the_manifest(field: str, value: Any, tmp_path: Path) -> None:
    directory = _saved(tmp_path)
    _edit(directory, lambda m: m.__setitem__(field, value))
    errors = _load_errors(directory)
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert "manifest.json" in str(errors[0]) and repr(field) in str(errors[0])


def test_a_damaged_manifest_fails_its_own_digest(tmp_path: Path) -> None:
    directory = _saved(tmp_path)
    _edit(directory, lambda m: m["row_ranges"][0].__setitem__(1, 11) or m["row_ranges"][1].__setitem__(0, 11),
          redigest=False)
    errors = _load_errors(directory)
    assert all(isinstance(e, ValueError) for e in errors), errors
    assert "SHA-256 does not match" in str(errors[0])
