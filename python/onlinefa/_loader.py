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
    from .checkpoint import stored_class

    kind = stored_class(path)
    if kind == "OnlineFactorAnalysis":
        from .estimator import OnlineFactorAnalysis

        return OnlineFactorAnalysis.load(path)
    if kind in ("GFA", "OnlineGFA"):
        from .gfa import GFA
        from .online_gfa import OnlineGFA

        return (GFA if kind == "GFA" else OnlineGFA).load(path)
    from ._models import OnlineEM, OnlineSGA
    from .minibatch import MiniBatchEM
    from .vbfa import VBFA, OnlineVBFA
    from .vifa import VIFA

    classes: dict[str, Any] = {
        "OnlineEM": OnlineEM,
        "OnlineSGA": OnlineSGA,
        "VIFA": VIFA,
        "MiniBatchEM": MiniBatchEM,
        "VBFA": VBFA,
        "OnlineVBFA": OnlineVBFA,
    }
    if kind not in classes:
        raise ValueError(f"{os.fspath(path)!r} holds a model of class {kind!r}, which this onlinefa cannot load")
    return classes[kind].load(path)
