"""``onlinefa.load``: one loader for every checkpoint kind."""

from __future__ import annotations

import os
from typing import Any


def load(path: str | os.PathLike[str], *, device: Any = None) -> Any:
    """Read any onlinefa checkpoint: a model saved with ``save`` or written by ``onlinefa fit``.

    Parameters
    ----------
    path : str or path-like
        Checkpoint file.
    device : str or torch.device, optional
        For ``OnlineEM``, ``OnlineSGA`` and ``VIFA``: where the model's rows go (None: the Rust core; a torch
        device: torch tensors there, see their ``device`` argument). Other models refuse a device (TypeError).

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
    TypeError
        ``device`` given for a model that has no device form (nothing is read).
    """
    from ._device import check_device_form
    from ._registry import kind_named
    from .checkpoint import stored_class

    kind = stored_class(path)
    model_kind = kind_named(kind)
    if model_kind is None:
        raise ValueError(f"{os.fspath(path)!r} holds a model of class {kind!r}, which this onlinefa cannot load")
    model_class = model_kind.model_class()
    if device is None:
        return model_class.load(path)
    check_device_form(model_class, device)  # before anything is read (not every model's load takes a device)
    return model_class.load(path, device=device)
