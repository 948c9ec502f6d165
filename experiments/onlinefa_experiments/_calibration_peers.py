"""The peers of the ``calibration`` experiment, each run through its own library with its documented recipe.

- ``laplace``: laplace-torch's default (``Laplace(net, "classification")``: last layer, KFAC), fitted on the
  training rows, prior precision by the marginal likelihood, GLM predictive with the probit link;
  ``laplace_all``: the same over all weights.
- ``ivon``: ivon-opt's ``IVON(params, lr=0.1, ess=N)`` (its README), one training draw per step, the
  prediction averaged over ``n_draws`` sampled parameters.
- ``swag_peer``: torch-uncertainty's ``SWAG`` wrapper (its defaults: rank 20, scale 1, 16 draws), updated
  once per epoch over the same collection epochs.

None is a dependency of onlinefa: ``pip install laplace-torch ivon-opt torch-uncertainty`` brings them, and a
missing one is skipped with that message.
"""

from __future__ import annotations

import copy
import importlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._calibration_runs import Budget, Predictor, Split, training_loss
from ._swag_train import build_mlp

#: Raw outputs of a sampled method: inputs (N, P) → (S, N, C) float64, one slice per draw.
Outputs = Callable[[torch.Tensor], torch.Tensor]

#: Peer method → (the module it imports, the pip package that brings it).
PEER_PACKAGES: dict[str, tuple[str, str]] = {
    "laplace": ("laplace", "laplace-torch"),
    "laplace_all": ("laplace", "laplace-torch"),
    "ivon": ("ivon", "ivon-opt"),
    "swag_peer": ("torch_uncertainty", "torch-uncertainty"),
}


def missing_peers(methods: list[str]) -> dict[str, str]:
    """``{method: pip package}`` for each requested peer whose library does not import."""
    missing = {}
    for method in methods:
        if method in PEER_PACKAGES:
            module, package = PEER_PACKAGES[method]
            try:
                importlib.import_module(module)
            except ImportError:
                missing[method] = package
    return missing


def peer_version(method: str) -> str:
    """The installed version of a peer's package."""
    from importlib.metadata import version

    return version(PEER_PACKAGES[method][1])


def _loader(split: Split, batch_size: int) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(split.x_train, split.y_train), batch_size=batch_size, shuffle=False)


def laplace_predictor(module: torch.nn.Module, split: Split, budget: Budget, all_weights: bool
                      ) -> tuple[Predictor, float]:
    """laplace-torch on the trained ``module`` (left unchanged); returns the predictor and the fit's seconds."""
    from laplace import Laplace

    start = time.perf_counter()
    net = copy.deepcopy(module).eval()
    subset = "all" if all_weights else "last_layer"
    la = Laplace(net, "classification", subset_of_weights=subset, hessian_structure="kron")
    la.fit(_loader(split, budget.batch_size))
    la.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")
    seconds = time.perf_counter() - start

    def predict(x: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            probabilities = la(x, pred_type="glm", link_approx="probit")
        if not isinstance(probabilities, torch.Tensor):
            raise TypeError(f"laplace-torch returned a {type(probabilities).__name__}, not probabilities")
        return probabilities.double().numpy()

    return predict, seconds


def _epochs(split: Split, budget: Budget, orders: list[torch.Tensor], module: torch.nn.Module,
            step: Callable[[torch.Tensor, torch.Tensor], None], after_epoch: Callable[[int], None]) -> None:
    module.train()
    for epoch, order in enumerate(orders):
        for begin in range(0, order.numel(), budget.batch_size):
            index = order[begin : begin + budget.batch_size]
            step(split.x_train[index], split.y_train[index])
        after_epoch(epoch)


def ivon_outputs(split: Split, n_outputs: int, budget: Budget, orders: list[torch.Tensor], init_seed: int
                 ) -> tuple[Outputs, float]:
    """A network trained by IVON (README settings) on the same batches; returns its sampled outputs and
    the training seconds."""
    import ivon

    torch.manual_seed(init_seed)
    module = build_mlp(split.x_train.shape[1], budget.hidden, n_outputs)
    optimizer = ivon.IVON(module.parameters(), lr=0.1, ess=split.x_train.shape[0])

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            training_loss(module(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    start = time.perf_counter()
    _epochs(split, budget, orders, module, step, lambda epoch: None)
    seconds = time.perf_counter() - start

    def outputs(x: torch.Tensor) -> torch.Tensor:
        module.eval()
        draws = []
        with torch.no_grad():
            for _ in range(budget.n_draws):
                with optimizer.sampled_params():
                    draws.append(module(x).double())
        return torch.stack(draws)

    return outputs, seconds


def swag_peer_outputs(split: Split, n_outputs: int, budget: Budget, orders: list[torch.Tensor], init_seed: int
                      ) -> tuple[Outputs, float]:
    """torch-uncertainty's SWAG around SGD on the same batches; returns its sampled outputs and seconds."""
    from torch_uncertainty.methods.swag import SWAG

    torch.manual_seed(init_seed)
    module = build_mlp(split.x_train.shape[1], budget.hidden, n_outputs)
    optimizer = torch.optim.SGD(module.parameters(), lr=budget.lr)
    swag = SWAG(module, cycle_start=budget.epochs - budget.collect_epochs - 1, cycle_length=1)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        training_loss(module(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    start = time.perf_counter()
    _epochs(split, budget, orders, module, step, lambda epoch: swag.update_wrapper(epoch))
    seconds = time.perf_counter() - start

    def outputs(x: torch.Tensor) -> torch.Tensor:
        swag.eval()
        with torch.no_grad():
            concatenated: torch.Tensor = swag(x)  # the draws' outputs, one after the other
        return concatenated.double().reshape(-1, x.shape[0], n_outputs)

    return outputs, seconds


def mean_softmax(outputs: Outputs) -> Predictor:
    """The classification predictor of sampled outputs: the mean of their softmax."""
    return lambda x: torch.softmax(outputs(x), dim=-1).mean(dim=0).numpy()
