"""Pickling and ``save``/``load`` of the GFA estimators (their Rust engine exports a validated state map)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ._pickle_tag import ClassTaggedPickle

if TYPE_CHECKING:
    from typing_extensions import Self

_ENGINE = "engine."


def _plain(value: object) -> object:
    """NumPy scalars and arrays as Python values (for the JSON of hyper-parameters and labels)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


class GFAPersistMixin(ClassTaggedPickle):
    """Exact pickles and checkpoints of a GFA estimator.

    The engine (the attribute named by ``_state_attribute``) travels as its state map (``get_state()``),
    which the core validates on the way back; the query engine ``_engine`` is rebuilt from it and every
    other attribute is kept as it is. Subclasses provide ``_core_class`` (the engine class) and
    ``_adopt(engine)`` (install a restored engine and the fitted attributes it determines).
    """

    _core_class: Any
    _state_attribute = "_core"

    def _adopt(self, engine: Any) -> None:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        engine = state.pop(self._state_attribute, None)
        state.pop("_core", None)
        if engine is not None:
            state["_engine_state"] = engine.get_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._check_pickle_class(state)
        state = dict(state)
        engine_state = state.pop("_engine_state", None)
        engine = None if engine_state is None else self._core_class.from_state(engine_state)
        parent = getattr(super(), "__setstate__", None)
        if parent is not None:
            parent(state)
        else:
            self.__dict__.update(state)
        if engine is not None:
            self._adopt(engine)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write an exact checkpoint (hyper-parameters, variational posterior, fit history), atomically.

        See :mod:`onlinefa.checkpoint` for the file format; :meth:`load` (or ``onlinefa.load``) restores the
        estimator with bit-identical predictions.

        Parameters
        ----------
        path : str or path-like
            Destination file, used as given.

        Raises
        ------
        TypeError
            A hyper-parameter the portable format cannot store (``random_state`` other than None or an
            int); pickle the estimator instead.
        """
        from .checkpoint import save_state

        params = cast(Any, self).get_params()
        if not (params["random_state"] is None or isinstance(params["random_state"], (int, np.integer))):
            raise TypeError("save() stores random_state only when it is None or an int; pickle the estimator instead")
        state: dict[str, Any] = {"params": json.dumps(params, default=_plain, sort_keys=True)}
        engine = self.__dict__.get(self._state_attribute)
        if engine is not None:
            state["group_labels"] = json.dumps(self.__dict__["group_labels_"], default=_plain)
            state.update({_ENGINE + key: value for key, value in engine.get_state().items()})
        save_state(path, type(self).__name__, state)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a checkpoint written by :meth:`save`.

        Parameters
        ----------
        path : str or path-like
            Checkpoint file.

        Returns
        -------
        estimator
            The estimator, fitted if it was fitted when saved.

        Raises
        ------
        ValueError
            The file is truncated, corrupted, of an unknown format version, holds another model, or holds a
            value the model cannot continue from; the message names the file.
        """
        from .checkpoint import load_state

        state = load_state(path, cls.__name__)
        try:
            return cls._from_checkpoint(state)
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(f"{os.fspath(path)!r} is not a valid {cls.__name__} checkpoint: {err}") from err

    @classmethod
    def _from_checkpoint(cls, state: dict[str, Any]) -> Self:
        estimator: Self = cast(Any, cls)(**json.loads(state["params"]))
        engine_state = {key[len(_ENGINE) :]: v for key, v in state.items() if key.startswith(_ENGINE)}
        if not engine_state:
            return estimator
        engine = cls._core_class.from_state(engine_state)
        index = np.asarray(engine_state["groups"]).astype(np.int64)
        labels = json.loads(state["group_labels"])
        if not isinstance(labels, list) or len(labels) != int(index.max()) + 1:
            raise ValueError("the group labels do not match the groups of the model")
        estimator.__dict__.update(group_index_=index, group_labels_=labels, n_features_in_=int(index.size))
        estimator._adopt(engine)
        return estimator
