"""``onlinefa.load``: one loader for every checkpoint kind."""

from __future__ import annotations

import os
from typing import Any


def load(path: str | os.PathLike[str]) -> Any:
    """Read any onlinefa checkpoint: a model saved with ``save`` or written by ``onlinefa fit``.

    Parameters
    ----------
    path : str or path-like
        Checkpoint file.

    Returns
    -------
    OnlineEM, OnlineSGA, MiniBatchEM, VIFA, OnlineFactorAnalysis, VBFA, OnlineVBFA, GFA or OnlineGFA
        The model the file holds, restored exactly (updates continue bit-identically).

    Raises
    ------
    ValueError
        The file is not a valid checkpoint (truncated, corrupted, unknown version or model class).
    OSError
        The file cannot be opened.
    """
    from ._registry import kind_named
    from .checkpoint import stored_class

    kind = stored_class(path)
    model_kind = kind_named(kind)
    if model_kind is None:
        raise ValueError(f"{os.fspath(path)!r} holds a model of class {kind!r}, which this onlinefa cannot load")
    return model_kind.model_class().load(path)
