"""The one place the tests reach into a model's Rust engine for its full state (counters, statistics and
settings: everything a checkpoint holds), to compare states bit for bit."""

from __future__ import annotations

from typing import Any


def engine_state(model: Any) -> dict[str, Any]:
    """The full engine state of ``model`` (an onlinefa model on the Rust core, or on a device: the same map),
    as a dict of copies."""
    state: dict[str, Any] = model.get_state() if hasattr(model, "_engine") else model._core.get_state()
    return state



def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two state maps hold the same keys with bit-identical values."""
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[key]), np.asarray(b[key])) for key in a)
