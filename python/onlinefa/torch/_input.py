"""The one check of what the torch models accept as data: a real, dense tensor (or array) without autograd
history, refused with ``TypeError`` otherwise, as the Rust core refuses it, before anything changes."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["as_input_tensor"]


def as_input_tensor(value: Any, name: str) -> torch.Tensor:
    """``value`` as a tensor the models can read; ``TypeError`` for what they must not.

    Refused: ``None`` and objects that are no array; complex values (their imaginary part would be dropped);
    tensors that require grad (every later update would join their autograd graph); sparse and other
    non-strided layouts; meta tensors (they hold no values). Other dtypes (integer, bool) are converted by
    the caller.
    """
    if value is None:
        raise TypeError(f"{name} must be an array or tensor of real numbers, got None")
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be an array or tensor of real numbers, got {type(value).__name__}: "
                            f"{err}") from None
    if tensor.requires_grad:
        raise TypeError(f"{name} requires grad (it has autograd history); pass {name}.detach(), e.g. "
                        "parameters_to_vector(net.parameters()).detach()")
    if tensor.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {tensor.layout}")
    if tensor.device.type == "meta":
        raise TypeError(f"{name} is a meta tensor: it holds no values")
    if tensor.is_complex():
        raise TypeError(f"{name} must be real, got dtype {tensor.dtype} (the imaginary part would be dropped)")
    if not (tensor.is_floating_point() or tensor.dtype in _INTEGER_DTYPES):
        raise TypeError(f"{name} must hold real numbers, got dtype {tensor.dtype}")
    return tensor


_INTEGER_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
