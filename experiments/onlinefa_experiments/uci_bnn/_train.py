"""Networks and training loops of the ``uci-bnn`` experiment (PyTorch, float32, CPU).

The benchmark's network: one hidden layer of ReLU units, trained on standardised data with the
per-point objective ``½ mean((y − f(x))²) + ½ λ ‖θ‖²`` (``λ`` the weight decay, i.e. a Gaussian prior
of precision ``α = λ N / σ²`` for a likelihood of noise variance ``σ²``). MC dropout's network has
dropout on its inputs and on the hidden layer, as in Gal and Ghahramani's benchmark code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
Data = tuple[torch.Tensor, torch.Tensor]


def build_network(n_inputs: int, n_hidden: int, dropout: float = 0.0) -> torch.nn.Sequential:
    """``n_inputs → n_hidden ReLU → 1``; with ``dropout`` > 0, dropout before both linear layers."""
    if dropout > 0.0:
        return torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(n_inputs, n_hidden), torch.nn.ReLU(),
                                   torch.nn.Dropout(dropout), torch.nn.Linear(n_hidden, 1))
    return torch.nn.Sequential(torch.nn.Linear(n_inputs, n_hidden), torch.nn.ReLU(), torch.nn.Linear(n_hidden, 1))


def as_tensors(X: FloatArray, y: FloatArray) -> Data:
    """float32 tensors of standardised inputs (N, d) and targets (N,)."""
    return torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    out = torch.Generator()
    out.manual_seed(int(seed))
    return out


def batches(data: Data, batch_size: int, rng: torch.Generator) -> Iterator[Data]:
    """One epoch of reshuffled mini-batches (the last partial batch kept)."""
    inputs, targets = data
    order = torch.randperm(inputs.shape[0], generator=rng)
    for start in range(0, inputs.shape[0], batch_size):
        index = order[start : start + batch_size]
        yield inputs[index], targets[index]


def half_mse(model: torch.nn.Module, batch: Data) -> torch.Tensor:
    """½ mean squared error of the mini-batch (the unit-variance Gaussian NLL up to a constant)."""
    return 0.5 * torch.mean((model(batch[0])[:, 0] - batch[1]) ** 2)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Data, n_epochs: int, batch_size: int,
          rng: torch.Generator, checkpoints: Sequence[int] = ()) -> dict[int, tuple[FloatArray, float]]:
    """``n_epochs`` epochs on ``½ mse`` (weight decay through the optimizer).

    Returns
    -------
    dict
        For each epoch count in ``checkpoints``: (θ after that many epochs as float64, seconds so far).
    """
    from onlinefa.torch import ParameterVector

    vector = ParameterVector(model, dtype=torch.float64)
    saved: dict[int, tuple[FloatArray, float]] = {}
    start = time.perf_counter()
    model.train()
    for epoch in range(1, n_epochs + 1):
        for batch in batches(data, batch_size, rng):
            optimizer.zero_grad(set_to_none=True)
            half_mse(model, batch).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        if epoch in checkpoints:
            saved[epoch] = (vector.numpy(), time.perf_counter() - start)
    return saved


def predict(model: torch.nn.Module, inputs: torch.Tensor) -> FloatArray:
    """Outputs (N,) in eval mode, float64."""
    model.eval()
    with torch.no_grad():
        out: FloatArray = model(inputs)[:, 0].double().numpy()
    return out


def dropout_draws(model: torch.nn.Module, inputs: torch.Tensor, n_draws: int, seed: int) -> FloatArray:
    """``n_draws`` stochastic forward passes with dropout active (MC dropout), shape (S, N)."""
    torch.manual_seed(int(seed))
    model.train()
    with torch.no_grad():
        out: FloatArray = np.stack([model(inputs)[:, 0].double().numpy() for _ in range(n_draws)])
    model.eval()
    return out
