"""``device=``: one public class per algorithm, whatever holds its D-sized rows.

``onlinefa.OnlineEM(D, K)`` keeps its rows in the Rust core (host memory, NumPy in and out).
``onlinefa.OnlineEM(D, K, device="cuda:0")`` (any torch device, ``"cpu"`` included) drives the same Rust K×K
step with its rows in torch tensors on that device (torch tensors in and out). Both are ``onlinefa.OnlineEM``
(``isinstance`` holds); the device model's type is a private class of :mod:`onlinefa.torch`, registered as a
virtual subclass when that module is imported (which constructing one does). The sharded models of
:mod:`onlinefa.distributed` take ``device=`` for their rank's local model instead. Importing this module does not
import torch.
"""

from __future__ import annotations

import importlib
from abc import ABCMeta
from typing import Any, ClassVar


def device_class(path: str) -> Any:
    """The class at ``"module:Name"`` (imports torch through its module; ImportError names the extra)."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(
            f"device= keeps the model's rows in torch tensors and needs PyTorch: pip install \"onlinefa[torch]\" "
            f"({err})") from err
    return getattr(module, name)


def check_device_form(cls: type, device: Any) -> None:
    """TypeError when ``device`` is given for a class whose models have no device form (no ``to``)."""
    if device is not None and not callable(getattr(cls, "to", None)):
        raise TypeError(f"{cls.__name__} has no device form; load it without device=")


class DeviceDispatch(metaclass=ABCMeta):  # noqa: B024 - ABCMeta for register(), no abstract methods
    """Base of the public classes that take ``device=``: with a device, construction builds the device model.

    A class that supports devices names its device implementation in ``_device_impl`` (``"module:Name"``);
    subclasses that do not name one refuse ``device=`` with TypeError.
    """

    _device_impl: ClassVar[str] = ""

    def __new__(cls, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is None:
            return super().__new__(cls)
        if not cls.__dict__.get("_device_impl"):
            raise TypeError(f"{cls.__name__} does not take device= (only the library's own classes do)")
        # Not a subtype of cls, so Python does not run cls.__init__ on it: the device class built it whole.
        return device_class(cls._device_impl)(*args, device=device, **kwargs)


class DeviceMovable(DeviceDispatch):
    """A :class:`DeviceDispatch` class whose models move between row stores with :meth:`to`."""

    def to(self, device: Any) -> Any:
        """The same model with its rows on ``device``: a torch device (or its name, ``"cpu"`` included) for torch
        tensors there, None for the Rust core's host rows. Updates then continue as they would have here.

        Returns ``self`` when the rows are already where asked; otherwise a new model (this one is unchanged).
        """
        if device is None:
            return self
        return device_class(type(self)._device_impl).from_numpy(self, device=device)
