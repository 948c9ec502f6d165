"""The trainer callbacks' posterior on disk and inside a trainer's checkpoint: the library's checkpoint format
(:mod:`onlinefa.checkpoint`, SHA-256 digest-checked), holding the posterior's class-tagged pickle and the
optimiser step it was saved at.

State entries of kind :data:`POSTERIOR_KIND`:

================  ==========================================================================
entry             meaning
================  ==========================================================================
``class``         the posterior's class name (``"OnlineEM"``, ``"SWAG"``, ...)
``pickle``        uint8 array: the posterior's pickle (restored exactly)
``global_step``   the trainer's optimiser step when it was saved (that of its checkpoint)
``anneal_from``   float64 array: the learning rates an annealing to ``swa_lr`` started from, or none
================  ==========================================================================

A bit flip anywhere fails the digest (or the zip's CRC) and is refused with a ``ValueError`` naming where
the bytes came from, before anything is unpickled. As for any pickle, load posteriors only from trainer
checkpoints you trust (a trainer's checkpoint is itself a pickle).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import numpy as np

from ..checkpoint import load_state, save_state, state_from_bytes, state_to_bytes

__all__ = ["POSTERIOR_KIND", "SavedPosterior", "posterior_from_bytes", "posterior_to_bytes", "read_posterior",
           "write_posterior"]

#: The checkpoint kind (``__class__``) of a trainer callback's posterior.
POSTERIOR_KIND = "TrainerPosterior"


@dataclass(frozen=True)
class SavedPosterior:
    """A posterior read back, with the optimiser step it was saved at."""

    posterior: object
    global_step: int
    anneal_from: list[float] | None = None


def _state(posterior: object, global_step: int, anneal_from: list[float] | None) -> dict[str, object]:
    data = pickle.dumps(posterior, protocol=pickle.HIGHEST_PROTOCOL)
    return {"class": type(posterior).__name__, "pickle": np.frombuffer(data, dtype=np.uint8).copy(),
            "global_step": int(global_step),
            "anneal_from": None if anneal_from is None else np.asarray(anneal_from, dtype=np.float64)}


def _decode(state: dict[str, object], source: str) -> SavedPosterior:
    data, step, name = state.get("pickle"), state.get("global_step"), state.get("class")
    rates = state.get("anneal_from")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1
            and isinstance(step, int) and step >= 0 and isinstance(name, str)
            and (rates is None or (isinstance(rates, np.ndarray) and rates.ndim == 1
                                   and bool(np.all(np.isfinite(rates)))))):
        raise ValueError(f"{source} is not a trainer callback's posterior: its entries are not those written")
    try:
        posterior = pickle.loads(data.tobytes())
    except Exception as err:  # the digest matched, so the writer pickled something this process cannot read
        raise ValueError(f"{source}: the posterior ({name}) cannot be unpickled here: {err}") from err
    if type(posterior).__name__ != name:
        raise ValueError(f"{source}: the posterior is a {type(posterior).__name__}, the file says {name}")
    return SavedPosterior(posterior, step, None if rates is None else [float(r) for r in rates])


def posterior_to_bytes(posterior: object, global_step: int, anneal_from: list[float] | None = None) -> bytes:
    """``posterior`` saved at optimiser step ``global_step``, as the bytes of a checkpoint file."""
    return state_to_bytes(POSTERIOR_KIND, _state(posterior, global_step, anneal_from))


def posterior_from_bytes(data: bytes, source: str) -> SavedPosterior:
    """Read bytes of :func:`posterior_to_bytes`; ``ValueError`` naming ``source`` when they are damaged."""
    return _decode(state_from_bytes(data, POSTERIOR_KIND, source=source), source)


def write_posterior(path: str | os.PathLike[str], posterior: object, global_step: int,
                    anneal_from: list[float] | None = None) -> None:
    """Write ``posterior`` to ``path`` atomically (a crash leaves any previous file whole)."""
    save_state(path, POSTERIOR_KIND, _state(posterior, global_step, anneal_from))


def read_posterior(path: str | os.PathLike[str]) -> SavedPosterior:
    """Read a file of :func:`write_posterior`; ``ValueError`` naming the file when it is damaged."""
    return _decode(load_state(path, POSTERIOR_KIND), repr(os.fspath(path)))
