"""Checkpoint files (placeholder until the checkpoint module lands): versioned .npz, atomic writes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

FORMAT_VERSION = 1


def save_state(path: str | os.PathLike[str], kind: str, state: dict[str, Any]) -> None:
    """Write ``state`` atomically."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with open(tmp, "wb") as handle:
        np.savez(handle, __format__=np.int64(FORMAT_VERSION), __class__=np.str_(kind), **state)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_state(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Read a state written by :func:`save_state`."""
    with np.load(path, allow_pickle=False) as data:
        state = {k: data[k] for k in data.files}
    state.pop("__format__")
    state.pop("__class__")
    return {k: (v.item() if v.ndim == 0 else v) for k, v in state.items()}
