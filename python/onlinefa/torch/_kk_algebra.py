"""The numeric limits and small helpers the torch row stores share with the Rust core.

K×K matrices and K-vectors live in float64 on the CPU, whatever the device of the D-sized state; the limits are
the Rust core's per state dtype (largest accepted input, ψ's ceiling). Online EM's and online SGA's K×K steps
are the Rust core's own (``_core.OnlineEMStep``, ``_core.OnlineSGAStep``), and so is VIFA's (``_core.VIFAStep``).
"""

from __future__ import annotations

import torch

#: Largest |x| accepted and the ceiling of the state, per state dtype.
MAX_INPUT = {torch.float64: 1e100, torch.float32: 1e18}
MAX_STATE = {torch.float64: 1e150, torch.float32: 1e18}
#: Largest f_j² / ψ an SGA step leaves in a row (the Rust core's ``MAX_LOADING_RATIO``): Fᵀ Ψ⁻¹ F stays finite.
MAX_LOADING_RATIO = 1e200


def loading_bound(psi: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """min(MAX_STATE, √(MAX_LOADING_RATIO · ψ)) per row (float64), rounded to the state's ``dtype`` as the
    Rust kernels round it: the bound of |f_j| after an SGA step with the new ψ."""
    bound = torch.sqrt(MAX_LOADING_RATIO * psi.to(torch.float64)).clamp(max=MAX_STATE[dtype])
    return bound.to(dtype).to(torch.float64)


def cpu64(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as float64 on the CPU, where the K×K algebra runs."""
    return tensor.to(dtype=torch.float64, device="cpu")


def stored(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` rounded to the state's ``dtype`` and back: what the state holds, as float64."""
    return values.to(dtype).to(torch.float64)
