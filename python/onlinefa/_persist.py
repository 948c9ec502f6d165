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

    def _savable_state(self) -> dict[str, Any]:
        """The engine's state, checked to be one that :meth:`load` accepts (see :func:`check_savable`)."""
        state = self._engine_state()
        check_savable(self, state)
        return state

    def __getstate__(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "state": self._savable_state()}

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

        Raises
        ------
        ValueError
            The model's state is one that :meth:`load` would refuse (e.g. a non-finite entry left by a
            numerical breakdown): nothing is written and an existing file at ``path`` is left intact.
        """
        from .checkpoint import save_state

        save_state(path, type(self).__name__, self._savable_state())

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


#: Values checked at a time by :func:`check_savable` (bounds its temporary memory).
_CHECK_CHUNK = 1 << 20


def check_savable(model: object, state: dict[str, Any]) -> None:
    """Refuse (ValueError) a model state that loading would reject, before anything is written.

    Every float array and float scalar must be finite (checked in chunks, without a copy of the state). A
    state of at most ``onlinefa._core.snapshot_max_elements()`` values is also rebuilt into a throwaway model
    exactly as :meth:`CheckpointMixin.load` does, so every check of loading applies.
    """
    from . import _core

    name = type(model).__name__
    total = 0
    for key, value in state.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            flat = value.reshape(-1)
            total += flat.size
            for start in range(0, flat.size, _CHECK_CHUNK):
                if not np.isfinite(flat[start:start + _CHECK_CHUNK]).all():
                    raise ValueError(
                        f"refusing to save or pickle this {name}: its state entry `{key}` is not finite (a "
                        "numerical breakdown in an earlier update), so the checkpoint could not be loaded; "
                        "nothing was written. Restore an earlier checkpoint."
                    )
        elif isinstance(value, float) and not np.isfinite(value):
            raise ValueError(f"refusing to save or pickle this {name}: its state entry `{key}` is {value}")
    if isinstance(model, CheckpointMixin) and total <= _core.snapshot_max_elements():
        twin = type(model).__new__(type(model))
        try:
            twin._restore(dict(state))
        except ValueError as err:
            raise ValueError(
                f"refusing to save or pickle this {name}: loading its state would fail ({err}); nothing was "
                "written. Restore an earlier checkpoint."
            ) from err


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
