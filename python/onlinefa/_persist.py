"""Pickling and ``save``/``load`` shared by every model whose Rust engine exports ``get_state()``.

Two mixins, one per kind of model:

* :class:`CheckpointMixin` — the streaming models (``OnlineEM``, ``OnlineSGA``, ``MiniBatchEM``, ``VIFA``):
  the checkpoint is the engine's state map itself.
* :class:`EstimatorPersistMixin` — the scikit-learn style estimators that wrap a Rust engine (``VBFA``,
  ``OnlineVBFA``, ``GFA``, ``OnlineGFA``): hyper-parameters plus the engine's state map.

The entries of estimator checkpoints (``param.<name>``, ``param.<name>.json``, ``engine.<key>``, ...) are
documented in :mod:`onlinefa.checkpoint`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from ._pickle_tag import ClassTaggedPickle

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
    def load(cls, path: str | os.PathLike[str], *, device: Any = None) -> Self:
        """Read a checkpoint written by :meth:`save`; updates then continue bit-identically.

        Parameters
        ----------
        path : str or path-like
            The checkpoint file.
        device : str or torch.device, optional
            Models with a ``device`` argument (``OnlineEM``, ``OnlineSGA``, ``VIFA``): where the rows go (None:
            the Rust core; a torch device: torch tensors there). A checkpoint saved from either form loads into
            either.

        Raises
        ------
        ValueError
            The file is not a regular file, is truncated, corrupted, of an unknown format version, holds
            another model, or holds a value the algorithm cannot continue from; the message names the file.
        TypeError
            ``device`` given to a model that has no device form (nothing is read).
        """
        from ._device import check_device_form
        from .checkpoint import load_state

        check_device_form(cls, device)

        state = load_state(path, cls.__name__, adopt=True)  # arrays move into the engine, not copied
        model = cls.__new__(cls)
        try:
            model.__setstate__({"class": cls.__name__, "state": state})
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)!r} is not a valid {cls.__name__} checkpoint: {err}") from err
        if device is not None:
            moved: Self = getattr(model, "to")(device)
            return moved
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


#: Prefix of the hyper-parameter entries of an estimator checkpoint.
PARAM_PREFIX = "param."
#: Suffix of a hyper-parameter entry that holds JSON text (``param.<name>.json``).
JSON_PARAM_SUFFIX = ".json"
#: Prefix of the engine's entries in an estimator checkpoint.
ENGINE_PREFIX = "engine."
#: Entry holding all hyper-parameters as one JSON object in GFA checkpoints of the first layout.
LEGACY_JSON_PARAMS = "params"
#: Hyper-parameter values stored as plain checkpoint entries (everything else is stored as JSON).
_PLAIN = (type(None), bool, int, float, str, np.bool_, np.integer, np.floating)


def _json_default(value: object) -> object:
    """NumPy scalars and arrays as Python values (for the JSON of hyper-parameters and labels)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


def to_json(value: object) -> str:
    """``value`` as JSON text, NumPy scalars and arrays as numbers and lists (TypeError for other objects)."""
    return json.dumps(value, default=_json_default, sort_keys=True)


def param_entries(params: dict[str, Any]) -> dict[str, Any]:
    """An estimator's hyper-parameters as checkpoint entries.

    A value that is None, a bool, int, float or str (NumPy scalars included) is the entry
    ``param.<name>``; any other value (a list, tuple or array, e.g. GFA's ``groups``) is stored as JSON
    text in the entry ``param.<name>.json``. :func:`checkpoint_params` reverses this.

    Raises
    ------
    TypeError
        ``random_state`` is neither None nor an int (a RandomState/Generator cannot be stored portably),
        or a value cannot be written as JSON.
    """
    random_state = params.get("random_state")
    if not (random_state is None or isinstance(random_state, (int, np.integer))):
        raise TypeError(
            "save() stores random_state only when it is None or an int; set an int seed, or pickle "
            "the estimator instead"
        )
    entries: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, _PLAIN):
            entries[PARAM_PREFIX + name] = value
        else:
            entries[PARAM_PREFIX + name + JSON_PARAM_SUFFIX] = to_json(value)
    return entries


def checkpoint_params(
    state: Mapping[str, Any], names: list[str], owner: str, legacy: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The hyper-parameters stored by :func:`param_entries` in an estimator checkpoint's ``state``.

    Parameters
    ----------
    state : mapping
        The checkpoint's entries.
    names : list of str
        The estimator's hyper-parameter names; the stored ones must be exactly these.
    owner : str
        The estimator's class name, for the message.
    legacy : mapping, optional
        Hyper-parameters added after the format first shipped, with the values that reproduce the
        estimator of that time: a checkpoint that lacks exactly some of them gets these values.

    Raises
    ------
    ValueError
        A JSON entry that does not decode, a name stored twice, or stored names other than ``names``.
    """
    params: dict[str, Any] = {}
    for key, value in prefixed(dict(state), PARAM_PREFIX).items():
        name = key.removesuffix(JSON_PARAM_SUFFIX)
        if name in params:
            raise ValueError(f"the hyper-parameter {name} is stored twice")
        if key.endswith(JSON_PARAM_SUFFIX):
            if not isinstance(value, str):
                raise ValueError(f"the hyper-parameter entry {PARAM_PREFIX + key} is not JSON text")
            value = json.loads(value)  # json.JSONDecodeError is a ValueError
        params[name] = value
    expected = set(names)
    if legacy and set(params) | set(legacy) == expected:
        params = {**legacy, **params}
    if set(params) != expected:
        raise ValueError(f"the stored hyper-parameters do not match {owner}")
    return params


def prefixed(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of ``state`` whose names start with ``prefix``, with the prefix removed."""
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


class EstimatorPersistMixin(ClassTaggedPickle):
    """Exact pickles and checkpoints of an estimator that wraps a Rust engine (VB-FA and GFA families).

    Pickles hold the estimator's attributes (class-tagged, see :class:`ClassTaggedPickle`) with the engine
    replaced by its state map ``get_state()`` under ``_engine_state``; the engine class's ``from_state``
    validates that map on the way back before anything is restored. Checkpoints hold the hyper-parameters
    and the engine's state map (layout in this module's docstring).

    Hooks of a subclass:

    * ``_core_class`` — the engine class (with ``from_state``);
    * ``_engine_attribute`` — the attribute holding the engine (default ``"_core"``);
    * ``_transient_attributes`` — further attributes left out of pickles (copies derived from the engine,
      locks); ``_adopt`` sets them again;
    * ``_adopt(engine)`` — install a restored engine and set the fitted attributes it determines;
    * ``_fitted_entries()`` / ``_check_restored(engine_state, state)`` — checkpoint entries of a fitted
      model beyond the engine's, and the checks (and attributes) they give on loading;
    * ``_reads_json_params`` — whether :meth:`load` also reads the first GFA layout (one JSON ``params``).
    """

    _core_class: ClassVar[Any]
    _engine_attribute: ClassVar[str] = "_core"
    _transient_attributes: ClassVar[tuple[str, ...]] = ()
    _reads_json_params: ClassVar[bool] = False

    def _adopt(self, engine: Any) -> None:  # pragma: no cover - provided by subclasses
        """Make ``engine`` the fitted model (and set every attribute derived from it)."""
        raise NotImplementedError

    def _fitted_entries(self) -> dict[str, Any]:
        """Checkpoint entries of a fitted estimator besides the engine's (none by default)."""
        return {}

    def _check_restored(self, engine_state: dict[str, Any], state: dict[str, Any]) -> None:
        """ValueError unless a checkpoint's hyper-parameters and entries agree with its (valid) engine state;
        sets the fitted attributes the engine does not determine. Runs before :meth:`_adopt`."""

    # -- pickling -------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Pickle/deepcopy state: the attributes, with the engine as its exact state map (no derived copies).

        Unpickling runs code; never unpickle a model from an untrusted source (use :meth:`save`/:meth:`load`).
        """
        state = dict(super().__getstate__())
        engine = state.pop(self._engine_attribute, None)
        for name in self._transient_attributes:
            state.pop(name, None)
        if engine is not None:
            state["_engine_state"] = engine.get_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`__getstate__`; the engine state is validated by the core (ValueError)."""
        self._check_pickle_class(state)
        state = dict(state)
        engine_state = state.pop("_engine_state", None)
        engine = None if engine_state is None else self._core_class.from_state(engine_state)
        super().__setstate__(state)
        if engine is not None:
            self._adopt(engine)

    # -- checkpoints ----------------------------------------------------------------------------------
    def _checkpoint_state(self) -> dict[str, Any]:
        state = param_entries(cast(Any, self).get_params())
        engine = self.__dict__.get(self._engine_attribute)
        if engine is not None:
            state.update(self._fitted_entries())
            state.update({ENGINE_PREFIX + key: value for key, value in engine.get_state().items()})
        return state

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write an exact checkpoint (hyper-parameters and, once fitted, the whole model), atomically.

        See :mod:`onlinefa.checkpoint` for the file format; :meth:`load` (or :func:`onlinefa.load`) then
        restores an estimator whose queries and further updates are bit-identical.

        Parameters
        ----------
        path : str or path-like
            Destination file, used as given.

        Raises
        ------
        TypeError
            A hyper-parameter the portable format cannot store (``random_state`` other than None or an
            int, e.g. a RandomState or Generator object); pickle the estimator instead.
        """
        from .checkpoint import save_state

        save_state(path, type(self).__name__, self._checkpoint_state())

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
            An estimator of this class, fitted exactly as saved (or unfitted if it was).

        Raises
        ------
        ValueError
            The file is truncated, corrupted, of an unknown format version, holds another model, or holds
            a value the algorithm cannot continue from (a negative precision, a wrong shape, NaN, ...);
            the message names the file.
        """
        from .checkpoint import load_state

        state = load_state(path, cls.__name__)
        try:
            return cls._from_checkpoint(state)
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(f"{os.fspath(path)!r} is not a valid {cls.__name__} checkpoint: {err}") from err

    @classmethod
    def _stored_params(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The hyper-parameters of a checkpoint, in the current layout or (GFA) the first JSON one."""
        if cls._reads_json_params and LEGACY_JSON_PARAMS in state:
            if any(key.startswith(PARAM_PREFIX) for key in state):
                raise ValueError("the hyper-parameters are stored in two layouts")
            params = json.loads(state[LEGACY_JSON_PARAMS])
            if not isinstance(params, dict):
                raise ValueError("the stored hyper-parameters are not a JSON object")
            return params  # names missing from these files take the constructor's defaults, as they did
        return checkpoint_params(state, cast(Any, cls)._get_param_names(), cls.__name__)

    @classmethod
    def _from_checkpoint(cls, state: dict[str, Any]) -> Self:
        estimator: Self = cast(Any, cls)(**cls._stored_params(state))
        engine_state = prefixed(state, ENGINE_PREFIX)
        if engine_state:
            engine = cls._core_class.from_state(engine_state)
            estimator._check_restored(engine_state, state)
            estimator._adopt(engine)
        return estimator
