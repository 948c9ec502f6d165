"""Pickles that only the class which wrote them can read (the estimators and the PyTorch SWAG models).

The Rust-backed models tag their pickles themselves (``{"class": ..., "state": ...}``, see
:mod:`onlinefa._persist`); this mixin does the same for classes pickled through their ``__dict__``.
"""

from __future__ import annotations

from typing import Any

#: Entry of every estimator's pickled state naming the class that wrote it (see :class:`ClassTaggedPickle`).
PICKLE_CLASS_KEY = "_onlinefa_class"


class ClassTaggedPickle:
    """Pickles that only the class which wrote them can read.

    ``__getstate__`` adds the writer's class name to the state; ``__setstate__`` refuses (ValueError) a
    state without it or with another name, before anything is restored. Without the tag a pickle of one
    model edited to name another class (or a state handed to the wrong ``__setstate__``) would be taken
    in silently and fail later, far from its cause.
    """

    def __getstate__(self) -> dict[str, Any]:
        parent = getattr(super(), "__getstate__", None)
        state = dict(parent() if parent is not None else self.__dict__)
        state[PICKLE_CLASS_KEY] = type(self).__name__
        return state

    def _check_pickle_class(self, state: object) -> None:
        """ValueError unless ``state`` was written by ``__getstate__`` of this very class.

        Subclasses that rebuild something from the state before calling ``super().__setstate__`` call
        this first, so that a foreign state is refused with this message and nothing is built from it.
        """
        name = type(self).__name__
        written_by = state.get(PICKLE_CLASS_KEY) if isinstance(state, dict) else None
        if written_by != name:
            origin = "no onlinefa estimator" if written_by is None else f"a {written_by}"
            raise ValueError(f"not a pickled {name}: the pickled state was written by {origin}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._check_pickle_class(state)
        state = {key: value for key, value in state.items() if key != PICKLE_CLASS_KEY}
        parent = getattr(super(), "__setstate__", None)
        if parent is not None:
            parent(state)
        else:
            self.__dict__.update(state)
