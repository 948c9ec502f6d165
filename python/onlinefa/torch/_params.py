"""The flat parameter vector θ of a PyTorch module: :class:`ParameterVector`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from ..interop import as_numpy

__all__ = ["ParameterVector", "check_float_dtype"]


def check_float_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    """Return ``dtype`` if it is a floating-point ``torch.dtype`` (TypeError otherwise)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
    return dtype


def _parameter_list(module_or_parameters: torch.nn.Module | Iterable[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The tensors of a module (``module.parameters()`` order) or of an iterable, validated."""
    if isinstance(module_or_parameters, torch.Tensor):
        raise TypeError("pass a torch.nn.Module or an iterable of tensors, not a single tensor (wrap it in a list)")
    source = (
        module_or_parameters.parameters()
        if isinstance(module_or_parameters, torch.nn.Module)
        else module_or_parameters
    )
    try:
        tensors = tuple(source)
    except TypeError as err:
        raise TypeError(
            f"expected a torch.nn.Module or an iterable of tensors, got {type(module_or_parameters).__name__}"
        ) from err
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"parameter {i} is a {type(tensor).__name__}, expected a torch.Tensor")
        if not tensor.is_floating_point():
            raise TypeError(f"parameter {i} has dtype {tensor.dtype}; only floating-point parameters are supported")
    if len({id(t) for t in tensors}) != len(tensors):
        raise ValueError("the same tensor appears twice among the parameters")
    if sum(t.numel() for t in tensors) == 0:
        raise ValueError("there are no parameter entries (no tensors, or only empty ones)")
    return tensors


def _as_vector(vector: object) -> torch.Tensor:
    """A tensor view of a (D,) tensor or array-like (NumPy arrays are shared, not copied)."""
    if isinstance(vector, torch.Tensor):
        return vector
    arr = as_numpy(vector)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"vector must be a real numeric array, got dtype {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return torch.from_numpy(arr) if arr.flags.writeable else torch.from_numpy(arr.copy())


class ParameterVector:
    """The parameters of a module seen as one flat vector θ of length D.

    The order is that of ``module.parameters()`` (or of the given iterable), each tensor flattened in
    row-major order: the layout of ``torch.nn.utils.parameters_to_vector``. Nothing is shared with the
    parameters: :meth:`gather` and :meth:`numpy` copy out, :meth:`assign` copies in.

    Parameters
    ----------
    module_or_parameters : torch.nn.Module or iterable of torch.Tensor
        The module whose parameters form θ, or the tensors themselves (floating point, any dtype,
        device, layout or ``requires_grad``).
    dtype : torch.dtype, default=torch.float32
        The dtype of the vectors :meth:`gather` returns.

    Raises
    ------
    TypeError
        Not a module or an iterable of floating-point tensors, or ``dtype`` not a floating-point dtype.
    ValueError
        No parameter entries, or the same tensor given twice.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Linear(3, 2)
    >>> pv = ParameterVector(net)
    >>> len(pv)
    8
    >>> theta = pv.gather()
    >>> pv.assign(torch.zeros(8))
    >>> float(net.weight.detach().abs().sum()), float(theta.abs().sum()) > 0
    (0.0, True)
    """

    def __init__(
        self, module_or_parameters: torch.nn.Module | Iterable[torch.Tensor], *, dtype: torch.dtype = torch.float32
    ) -> None:
        self._dtype = check_float_dtype(dtype)
        self._parameters = _parameter_list(module_or_parameters)
        self._module = module_or_parameters if isinstance(module_or_parameters, torch.nn.Module) else None
        self._shapes = tuple(t.shape for t in self._parameters)
        bounds = np.cumsum([0] + [t.numel() for t in self._parameters])
        self._slices = tuple(slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))

    def __len__(self) -> int:
        return self._slices[-1].stop

    def __repr__(self) -> str:
        return f"ParameterVector(n_tensors={len(self._parameters)}, n_features={len(self)}, dtype={self._dtype})"

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the vectors :meth:`gather` returns."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device of the first parameter, where :meth:`gather` allocates by default."""
        return self._parameters[0].device

    @property
    def parameters(self) -> tuple[torch.Tensor, ...]:
        """The tensors forming θ, in order."""
        return self._parameters

    def _check_out(self, out: torch.Tensor, dtype: torch.dtype) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != (len(self),) or out.dtype != dtype or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous tensor of shape ({len(self)},) and dtype {dtype}, "
                f"got shape {tuple(out.shape)}, dtype {out.dtype}, contiguous={out.is_contiguous()}"
            )
        if out.requires_grad:
            raise ValueError("out must not require grad")

    def gather(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy the current parameter values into one flat vector.

        Parameters
        ----------
        out : torch.Tensor of shape (D,), optional
            Preallocated contiguous buffer of dtype ``self.dtype`` (any device) to write into.

        Returns
        -------
        torch.Tensor of shape (D,)
            ``out`` if given, else a new tensor on :attr:`device`; detached, contiguous, dtype ``self.dtype``.

        Raises
        ------
        TypeError, ValueError
            ``out`` is not a tensor of the right shape, dtype and layout (nothing is written).
        RuntimeError
            The module's parameters changed since this vector was made (a layer replaced, added or
            removed, or a parameter resized): nothing is read or written.
        """
        if out is None:
            out = torch.empty(len(self), dtype=self._dtype, device=self.device)
        else:
            self._check_out(out, self._dtype)
        self._copy_into(out)
        return out

    def _check_unchanged(self) -> None:
        """RuntimeError if θ's tensors are no longer the module's parameters or changed shape.

        A layer replaced (``net.fc = nn.Linear(...)``), added or removed after this vector was made leaves
        it holding tensors the module no longer trains: reading them would feed stale values without any
        sign. Checked on every read and write (one pass over the tensor list, no data touched).
        """
        current = self._parameters if self._module is None else tuple(self._module.parameters())
        same_tensors = len(current) == len(self._parameters) and all(
            a is b for a, b in zip(current, self._parameters)
        )
        if not same_tensors:
            raise RuntimeError(
                "the module's parameters are no longer the tensors this ParameterVector (or SnapshotCollector) "
                "was made from: a layer was replaced, added or removed. Make a new one for the changed module "
                "(and a new posterior if D changed)."
            )
        for i, (tensor, shape) in enumerate(zip(self._parameters, self._shapes)):
            if tensor.shape != shape:
                raise RuntimeError(
                    f"parameter {i} changed shape from {tuple(shape)} to {tuple(tensor.shape)} since this "
                    "ParameterVector was made; make a new one (and a new posterior if D changed)."
                )

    def _copy_into(self, out: torch.Tensor) -> None:
        self._check_unchanged()
        with torch.no_grad():
            for tensor, part in zip(self._parameters, self._slices):
                out[part].view(tensor.shape).copy_(tensor.detach())

    def numpy(self, out: NDArray[Any] | None = None) -> NDArray[Any]:
        """Copy the current parameter values into a NumPy vector.

        Parameters
        ----------
        out : ndarray of shape (D,), optional
            Preallocated writable C-contiguous float32/float64 array to write into.

        Returns
        -------
        ndarray of shape (D,)
            ``out`` if given, else a new array: float64 when ``self.dtype`` is float64, float32 otherwise.

        Raises
        ------
        TypeError, ValueError
            ``out`` is not a writable contiguous float32/float64 array of shape (D,) (nothing is written).
        RuntimeError
            The module's parameters changed since this vector was made (a layer replaced, added or
            removed, or a parameter resized): nothing is read or written.
        """
        if out is None:
            out = np.empty(len(self), dtype=np.float64 if self._dtype == torch.float64 else np.float32)
        elif not isinstance(out, np.ndarray) or out.dtype not in (np.float32, np.float64):
            raise TypeError("out must be a float32 or float64 NumPy array")
        elif out.shape != (len(self),) or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"out must be a writable C-contiguous array of shape ({len(self)},), got shape {out.shape}")
        self._copy_into(torch.from_numpy(out))
        return out

    def assign(self, vector: torch.Tensor | NDArray[Any]) -> None:
        """Copy a flat vector into the parameters.

        Each slice is cast to its parameter's dtype and device and copied under ``torch.no_grad``; the
        parameters never share memory with ``vector``, so later in-place updates of either leave the
        other untouched.

        Parameters
        ----------
        vector : torch.Tensor or array-like of shape (D,)
            The new θ (any real dtype, device or layout).

        Raises
        ------
        TypeError
            Not a real numeric vector.
        ValueError
            Wrong shape (no parameter is changed).
        RuntimeError
            The module's parameters changed since this vector was made (a layer replaced, added or
            removed, or a parameter resized): nothing is read or written.
        """
        values = _as_vector(vector)
        if values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"vector must be real, got dtype {values.dtype}")
        if values.shape != (len(self),):
            raise ValueError(f"vector has shape {tuple(values.shape)}, expected ({len(self)},)")
        self._check_unchanged()
        with torch.no_grad():
            for tensor, part in zip(self._parameters, self._slices):
                tensor.copy_(values[part].reshape(tensor.shape))
