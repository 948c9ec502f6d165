"""The model kinds of onlinefa, in one table: the class each name stands for and where it is defined.

``onlinefa.load`` (which class a checkpoint restores into), ``OnlineFactorAnalysis`` (which streaming model
its ``algorithm`` names and which inner model its checkpoints may hold) and ``onlinefa fit`` (which
``--method`` builds which class) all read this table, so a new model family is registered here once. The
defining modules are imported on first use: ``import onlinefa`` stays NumPy-only and the command line
starts without importing any model it does not run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelKind:
    """One model family.

    Attributes
    ----------
    name : str
        The class name, as written in checkpoints (``__class__``) and pickles.
    module : str
        The module that defines the class.
    method : str or None
        Short name of a streaming algorithm (``OnlineFactorAnalysis(algorithm=...)``,
        ``onlinefa fit --method ...``), or None for a model that is not one.
    inner : bool
        True when an ``OnlineFactorAnalysis`` checkpoint may hold this model as its inner model.
    thesis : str or None
        Name of the class's constructor of the thesis's algorithm exactly (``onlinefa fit --config thesis``).
    """

    name: str
    module: str
    method: str | None = None
    inner: bool = False
    thesis: str | None = None

    def model_class(self) -> type[Any]:
        """The class itself (its module is imported on the first call)."""
        cls: type[Any] = getattr(importlib.import_module(self.module), self.name)
        return cls


KINDS: tuple[ModelKind, ...] = (
    ModelKind("OnlineEM", "onlinefa.streaming", method="em", inner=True, thesis="algorithm2"),
    ModelKind("OnlineSGA", "onlinefa.streaming", method="sga", inner=True, thesis="algorithm1"),
    ModelKind("MiniBatchEM", "onlinefa.minibatch", inner=True),
    ModelKind("VIFA", "onlinefa.vifa"),
    ModelKind("OnlineFactorAnalysis", "onlinefa.estimator"),
    ModelKind("VBFA", "onlinefa.vbfa"),
    ModelKind("OnlineVBFA", "onlinefa.vbfa"),
    ModelKind("GFA", "onlinefa.gfa"),
    ModelKind("OnlineGFA", "onlinefa.online_gfa"),
)

_BY_NAME = {kind.name: kind for kind in KINDS}
_BY_METHOD = {kind.method: kind for kind in KINDS if kind.method is not None}

#: The short names of the streaming algorithms, in table order (``("em", "sga")``).
STREAMING_METHODS: tuple[str, ...] = tuple(_BY_METHOD)


def kind_named(name: str) -> ModelKind | None:
    """The kind whose class is called ``name``, or None."""
    return _BY_NAME.get(name)


def streaming_kind(method: str) -> ModelKind:
    """The kind of a streaming algorithm's short name (KeyError for an unknown name)."""
    return _BY_METHOD[method]


def streaming_class(method: str) -> type[Any]:
    """The streaming model class of a short algorithm name (KeyError for an unknown name)."""
    return _BY_METHOD[method].model_class()


def inner_class(name: str) -> type[Any] | None:
    """The class called ``name`` if an ``OnlineFactorAnalysis`` checkpoint may hold it, else None."""
    kind = _BY_NAME.get(name)
    return kind.model_class() if kind is not None and kind.inner else None
