"""What the torch row stores of online EM and online SGA share: the Rust K×K step beside the D-sized rows.

A store keeps its rows in torch tensors on its device and the K×K part of the model in ``kk_step``, a
``_core.OnlineEMStep`` or ``_core.OnlineSGAStep`` (the same code the NumPy-facing classes run). Copies and pickles
go through the step's own ``copy`` and state map, since a Rust object neither deep-copies nor pickles.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, TypeVar

import torch

Store = TypeVar("Store", bound="KkStepRows")


Copied = TypeVar("Copied")


def copy_with_step(engine: Copied, memo: dict[int, Any]) -> Copied:
    """A deep copy of a row store whose ``kk_step`` is a Rust step (copied by its own ``copy``)."""
    clone = type(engine).__new__(type(engine))
    for name, value in engine.__dict__.items():
        clone.__dict__[name] = value.copy() if name == "kk_step" else copy.deepcopy(value, memo)
    return clone


class KkStepRows:
    """Base of ``EMEngine`` and ``SGAEngine``: a K×K step (``kk_step``) and rows of ``dtype`` on ``device``."""

    #: The binding's step class (``from_state`` rebuilds a pickled step).
    _step_class: ClassVar[Any]
    kk_step: Any
    dtype: torch.dtype
    device: torch.device
    settings: Any

    def __deepcopy__(self: Store, memo: dict[int, Any]) -> Store:
        return copy_with_step(self, memo)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["kk_step"] = self.kk_step.get_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.kk_step = self._step_class.from_state(state["kk_step"], self.settings.n_features, self.dtype_name)

    @property
    def dtype_name(self) -> str:
        """"float32" or "float64"."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def n_seen(self) -> int:
        return int(self.kk_step.n_seen)

    @property
    def scale_sq(self) -> float:
        return float(self.kk_step.scale_sq)

    @property
    def is_fitted(self) -> bool:
        return bool(self.kk_step.is_fitted)

    def floor(self) -> float:
        """The noise floor of the next pass (the step's, for this dtype)."""
        return float(self.kk_step.floor)
