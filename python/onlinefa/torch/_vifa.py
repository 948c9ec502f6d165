"""One VIFA training step on a PyTorch module: :func:`vifa_step`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
import torch

from .._validation import check_int
from ..vifa import VIFA
from ._params import ParameterVector
from ._vifa_model import VIFA as DeviceVIFA

__all__ = ["vifa_step"]

BatchT = TypeVar("BatchT")


def _flat_gradient(loss: torch.Tensor, vector: ParameterVector) -> torch.Tensor:
    """∇θ loss as a float64 (D,) tensor on the parameters' device (zeros for parameters the loss does not
    depend on)."""
    grads = torch.autograd.grad(loss, vector.parameters, allow_unused=True)
    filled = [torch.zeros_like(p) if g is None else g for p, g in zip(vector.parameters, grads)]
    return ParameterVector(filled, dtype=torch.float64).gather()


def vifa_step(
    vifa: VIFA | DeviceVIFA,
    module: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, BatchT], torch.Tensor],
    batch: BatchT,
    *,
    n_data: int,
    parameters: Iterable[torch.Tensor] | None = None,
) -> float:
    """One VIFA training step (thesis Algorithm 3) with the gradients of a PyTorch module.

    For each of the ``vifa.n_grad_samples`` draws: θ = ``vifa.sample()`` is assigned into the module,
    ``loss = loss_fn(module, batch)`` (the mini-batch **mean** negative log-likelihood) is differentiated
    with ``torch.autograd.grad`` (the parameters' ``.grad`` is left untouched), and ``n_data`` × ∇θ loss —
    the unbiased estimate of the full-data NLL gradient that :meth:`VIFA.step` expects — is passed to
    ``vifa.step``. The module keeps the last draw.

    Parameters
    ----------
    vifa : VIFA
        With no draw pending. A VIFA with ``device=`` gets its draws and gradients as tensors on the
        parameters' device (no host copy).
    module : torch.nn.Module
    loss_fn : callable
        ``(module, batch) -> scalar tensor``, the mean NLL of the mini-batch (e.g. cross-entropy).
    batch : object
        Passed to ``loss_fn`` unchanged.
    n_data : int
        N, the size of the training set (>= 1).
    parameters : iterable of torch.Tensor, optional
        The tensors θ covers (default ``module.parameters()``), D = ``vifa.n_features`` entries.

    Returns
    -------
    float
        The mini-batch loss, averaged over the draws of the step.

    Raises
    ------
    TypeError
        ``vifa`` is not a VIFA, or ``loss_fn`` does not return a scalar tensor.
    ValueError
        D differs between ``vifa`` and the parameters; a non-finite loss or gradient (no step is made).
    RuntimeError
        Draws are already pending in ``vifa``. If ``loss_fn`` raises, the draws taken so far stay
        pending (a VIFA draw cannot be withdrawn): step them yourself or restore a checkpoint.
    """
    if not isinstance(vifa, VIFA):
        raise TypeError(f"vifa must be an onlinefa.VIFA, got {type(vifa).__name__}")
    n = check_int(n_data, "n_data", 1)
    vector = ParameterVector(module if parameters is None else parameters, dtype=torch.float64)
    if len(vector) != vifa.n_features:
        raise ValueError(f"the VIFA model has {vifa.n_features} features but the parameters {len(vector)}")
    if vifa.n_pending:
        raise RuntimeError(f"{vifa.n_pending} VIFA draw(s) are already pending; call vifa.step() first")
    losses: list[float] = []
    rows: list[torch.Tensor] = []
    for _ in range(vifa.n_grad_samples):
        vector.assign(vifa.sample())
        loss = loss_fn(module, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("loss_fn must return a scalar tensor (the mini-batch mean negative log-likelihood)")
        rows.append(_flat_gradient(loss.reshape(()), vector))
        losses.append(float(loss.detach()))
    gradients = torch.stack(rows) * n
    if not (bool(torch.isfinite(gradients).all()) and np.all(np.isfinite(losses))):
        raise ValueError("the loss or its gradient is not finite at the drawn parameters; no step was made (the draws stay pending)")
    if isinstance(vifa, DeviceVIFA):
        vifa.step(gradients)
    else:
        vifa.step(gradients.cpu().numpy())
    return float(np.mean(losses))
