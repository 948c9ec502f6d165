"""The K×K algebra and the numeric limits the torch streaming engines share with the Rust core.

K×K matrices and K-vectors live in float64 on the CPU, whatever the device of the D-sized state; the limits are
the Rust core's per state dtype (largest accepted input, ψ's ceiling, the relative floor's lower bound).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch

from ..errors import NumericalBreakdownError

#: Largest |x| accepted, the ceiling of the state and the lower bound of the relative floor, per state dtype.
MAX_INPUT = {torch.float64: 1e100, torch.float32: 1e18}
MAX_STATE = {torch.float64: 1e150, torch.float32: 1e18}
#: Largest f_j² / ψ an SGA step leaves in a row (the Rust core's ``MAX_LOADING_RATIO``): Fᵀ Ψ⁻¹ F stays finite.
MAX_LOADING_RATIO = 1e200


def loading_bound(psi: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """min(MAX_STATE, √(MAX_LOADING_RATIO · ψ)) per row (float64), rounded to the state's ``dtype`` as the
    Rust kernels round it: the bound of |f_j| after an SGA step with the new ψ."""
    bound = torch.sqrt(MAX_LOADING_RATIO * psi.to(torch.float64)).clamp(max=MAX_STATE[dtype])
    return bound.to(dtype).to(torch.float64)
#: Adam's constants (Kingma & Ba 2015): β₁, β₂, ε.
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
MIN_FLOOR = {torch.float64: 1e-200, torch.float32: 1e-30}
MAX_FINITE = {torch.float64: float(np.finfo(np.float64).max), torch.float32: float(np.finfo(np.float32).max)}


def cpu64(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as float64 on the CPU, where the K×K algebra runs."""
    return tensor.to(dtype=torch.float64, device="cpu")


def eye64(k: int) -> torch.Tensor:
    """The K×K identity in float64 on the CPU."""
    return torch.eye(k, dtype=torch.float64)


def stored(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` rounded to the state's ``dtype`` and back: what the state holds, as float64."""
    return values.to(dtype).to(torch.float64)


def step_size(schedule: str, tau0: float, kappa: float, rho: float, t: int) -> float:
    """ρ_t of a schedule ("harmonic" 1/t, "power" (t + τ₀)^−κ, "constant" ρ), never below 1/t."""
    harmonic = 1.0 / t
    if schedule == "power":
        return max(float((t + tau0) ** -kappa), harmonic)
    if schedule == "constant":
        return max(rho, harmonic)
    return harmonic


def relative_floor(scaling: str, noise_floor: float, scale_sq: float, dtype: torch.dtype) -> float:
    """The noise floor: ``noise_floor`` under ``"unit"``, max(noise_floor · σ̂², MIN_FLOOR) (at most MAX_STATE)
    under ``"data"``."""
    if scaling == "unit":
        return noise_floor
    return min(max(noise_floor * scale_sq, MIN_FLOOR[dtype]), MAX_STATE[dtype])


def spd_factor(matrix: torch.Tensor, what: str) -> torch.Tensor:
    """Lower Cholesky factor of a K×K SPD matrix; the smallest jitter 1e-14·10ʲ·max|diag| that makes it
    factorise is added when rounding alone breaks it (as the Rust core does)."""
    lower, info = torch.linalg.cholesky_ex(matrix)
    if int(info) == 0:
        return cast(torch.Tensor, lower)
    scale = max(float(matrix.diagonal().abs().max()), np.finfo(np.float64).tiny)
    delta = 1e-14 * scale
    eye = eye64(matrix.shape[0])
    for _ in range(13):
        lower, info = torch.linalg.cholesky_ex(matrix + delta * eye)
        if int(info) == 0:
            return cast(torch.Tensor, lower)
        delta *= 10.0
    raise NumericalBreakdownError(f"{what} is not positive definite: the model diverged; restore a checkpoint")


def spd_inverse(lower: torch.Tensor) -> torch.Tensor:
    """M⁻¹ from M's Cholesky factor, symmetrised."""
    inv = torch.cholesky_inverse(lower)
    return (inv + inv.T) * 0.5
