"""Pickling and ``save``/``load`` shared by every model whose Rust engine exports ``get_state()``, and the
hyper-parameter entries of estimator checkpoints."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Self


class CheckpointMixin:
    """Exact checkpoints through the engine's state map (see :mod:`onlinefa.checkpoint` for the format).

    Subclasses hold their engine in ``_core`` and implement :meth:`_restore`, which rebuilds the engine
    and the Python-side attributes from a state map.
    """

    def _engine_state(self) -> dict[str, Any]:
        state: dict[str, Any] = getattr(self, "_core").get_state()
        return state

    def _restore(self, state: dict[str, Any]) -> None:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "state": self._engine_state()}

    def __setstate__(self, payload: dict[str, Any]) -> None:
        if not isinstance(payload, dict) or payload.get("class") != type(self).__name__:
            raise ValueError(f"not a pickled {type(self).__name__}")
        self._restore(payload["state"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write an exact checkpoint of the model (atomic; see :mod:`onlinefa.checkpoint`).

        Parameters
        ----------
        path : str or path-like
            Destination ``.npz`` file. It is written to a temporary file first and then renamed, so a
            crash mid-save never destroys an existing checkpoint.
        """
        from .checkpoint import save_state

        save_state(path, type(self).__name__, self._engine_state())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a checkpoint written by :meth:`save`; updates then continue bit-identically.

        Raises
        ------
        ValueError
            The file is not a regular file, is truncated, corrupted, of an unknown format version, holds
            another model, or holds a value the algorithm cannot continue from; the message names the file.
        """
        from .checkpoint import load_state

        state = load_state(path, cls.__name__, adopt=True)  # arrays move into the engine, not copied
        model = cls.__new__(cls)
        try:
            model.__setstate__({"class": cls.__name__, "state": state})
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)!r} is not a valid {cls.__name__} checkpoint: {err}") from err
        return model


def param_entries(params: dict[str, Any]) -> dict[str, Any]:
    """An estimator's hyper-parameters as checkpoint entries ``param.<name>``.

    Raises
    ------
    TypeError
        ``random_state`` is neither None nor an int (a RandomState/Generator cannot be stored portably).
    """
    random_state = params.get("random_state")
    if not (random_state is None or isinstance(random_state, (int, np.integer))):
        raise TypeError(
            "save() stores random_state only when it is None or an int; set an int seed, or pickle "
            "the estimator instead"
        )
    return {f"param.{name}": value for name, value in params.items()}


def prefixed(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``state`` whose names start with ``prefix``, with the prefix removed."""
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
