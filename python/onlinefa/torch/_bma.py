"""Bayesian model averaging over posterior draws: :func:`bayesian_model_average`, :func:`refresh_batch_norm`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
import torch

from .._validation import SeedLike, check_int, check_seed
from ._params import ParameterVector
from ._sampling import sample_parameters

__all__ = ["bayesian_model_average", "refresh_batch_norm"]

#: What to pass instead of a one-shot iterator.
_REITERABLE = "pass a list of batches or a DataLoader, which can be iterated again"


def refuse_one_shot(loader: object, name: str, n_passes: int) -> None:
    """ValueError when ``loader`` is a one-shot iterator (a generator, ``iter(...)``: ``iter(x) is x``) but
    must be iterated ``n_passes`` > 1 times. Decided from the type: no iterator is created."""
    if n_passes > 1 and isinstance(loader, Iterator):
        raise ValueError(
            f"{name} is a one-shot iterator ({type(loader).__name__}): it is iterated once per draw "
            f"(n_samples={n_passes}) and would be exhausted after the first; {_REITERABLE}"
        )


def no_batches_error(loader: object, name: str) -> ValueError:
    if isinstance(loader, Iterator):
        return ValueError(
            f"{name} yielded no batches: it is a one-shot iterator ({type(loader).__name__}) that was already "
            f"exhausted, e.g. by an earlier call; {_REITERABLE}"
        )
    return ValueError(f"{name} yielded no batches")


#: Keys of a dict batch that hold targets, not inputs (the Hugging Face Trainer's default label names).
LABEL_KEYS = ("labels", "label", "label_ids")


def moved_to(value: object, device: torch.device) -> object:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _inputs(batch: object, device: torch.device) -> object:
    """The inputs of a batch (its first element when it is a tuple or list), moved to ``device``."""
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    return moved_to(inputs, device)


def _forward(module: torch.nn.Module, batch: object, device: torch.device) -> object:
    """The module's output on a batch: a dict batch (the Hugging Face Trainer's) as keyword arguments
    without its labels, anything else through :func:`_inputs`."""
    if isinstance(batch, Mapping):
        return module(**{key: moved_to(value, device) for key, value in batch.items() if key not in LABEL_KEYS})
    return module(_inputs(batch, device))


def _overrides_predict_step(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a Lightning module that defines its own ``predict_step``."""
    for base in type(module).__mro__:
        if base.__name__ == "LightningModule" and base.__module__.startswith(("lightning", "pytorch_lightning")):
            return getattr(type(module), "predict_step") is not getattr(base, "predict_step")
    return False


def output_logits(output: object) -> torch.Tensor:
    """A prediction as a tensor: itself, or the ``logits`` of a model output (``transformers.ModelOutput``,
    a dict)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise TypeError(f"the module returned a {type(output).__name__}, neither a tensor nor an output with logits")


def _batch_norm_layers(module: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    return [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def refresh_batch_norm(module: torch.nn.Module, loader: Iterable[object], *, device: torch.device | None = None) -> None:
    """Recompute the running statistics of every batch-norm layer from one pass over ``loader``.

    Parameters drawn from a posterior need statistics of their own (Maddox et al., "A Simple Baseline
    for Bayesian Uncertainty in Deep Learning", §3): each layer's running mean and variance are reset
    and replaced by the plain average over the batches of the batch statistics (``momentum=None``),
    computed in training mode under ``torch.no_grad``. The module's training flag and the layers'
    momenta are restored; nothing happens without batch-norm layers.

    Parameters
    ----------
    module : torch.nn.Module
    loader : iterable of batches
        The inputs are the first element of each tuple/list batch, or the batch itself; a dict batch is
        passed as keyword arguments, less its labels.
    device : torch.device, optional
        Where to move the inputs (default: the device of the first parameter, else left alone).

    Raises
    ------
    ValueError
        ``loader`` yielded no batch (e.g. an exhausted generator); the statistics are then left as they
        were.
    """
    layers = _batch_norm_layers(module)
    if not layers:
        return
    if device is None:
        first = next(module.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    momenta = [layer.momentum for layer in layers]
    saved = [{name: b.detach().clone() for name, b in layer.named_buffers(recurse=False)} for layer in layers]
    was_training = module.training
    try:
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None
        module.train()
        n_batches = 0
        with torch.no_grad():
            for batch in loader:
                _forward(module, batch, device)
                n_batches += 1
        if n_batches == 0:
            with torch.no_grad():
                for layer, buffers in zip(layers, saved):
                    for name, value in buffers.items():
                        getattr(layer, name).copy_(value)
            raise no_batches_error(loader, "the batch-norm loader")
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        module.train(was_training)


def _to_device(batch: object, device: torch.device) -> object:
    """Every tensor of a batch (a tensor, a tuple/list or a dict of them) moved to ``device``."""
    if isinstance(batch, Mapping):
        return {key: moved_to(value, device) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(moved_to(value, device) for value in batch)
    return moved_to(batch, device)


@contextmanager
def _preserved(module: torch.nn.Module, parameters: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """Restore ``parameters``, the module's buffers and its training flag on exit (also on error)."""
    tensors = list(parameters) + [b for b in module.buffers() if all(b is not p for p in parameters)]
    saved = [t.detach().clone() for t in tensors]
    was_training = module.training
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in zip(tensors, saved):
                tensor.copy_(value)
        module.train(was_training)


def _predict(module: torch.nn.Module, loader: Iterable[object], device: torch.device) -> torch.Tensor:
    if _overrides_predict_step(module):
        step = getattr(module, "predict_step")
        outputs = [output_logits(step(_to_device(batch, device), index)) for index, batch in enumerate(loader)]
    else:
        outputs = [output_logits(_forward(module, batch, device)) for batch in loader]
    if not outputs:
        raise no_batches_error(loader, "the loader")
    return torch.cat(outputs)


def bayesian_model_average(
    module: torch.nn.Module,
    posterior: object,
    loader: Iterable[object],
    *,
    n_samples: int = 30,
    scale: float = 1.0,
    seed: SeedLike = None,
    task: str = "classification",
    bn_loader: Iterable[object] | None = None,
    parameters: Iterable[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Predict with parameter draws from a posterior and average (Bayesian model averaging).

    For each draw θ_s of :func:`sample_parameters` (same ``seed``, ``scale``): assign θ_s into the module,
    refresh the batch-norm statistics on ``bn_loader`` if given (:func:`refresh_batch_norm`), and predict
    every batch of ``loader`` in eval mode under ``torch.no_grad``. The loader is iterated once per draw,
    so it must give the same batches in the same order each time (no shuffling).

    Parameters
    ----------
    module : torch.nn.Module
    posterior : model or MultiSWAG
        Gaussian over θ (D = the number of entries of ``parameters``).
    loader : iterable of batches
        Inputs are the first element of each tuple/list batch (or the batch itself), moved to the
        parameters' device; a dict batch (the Hugging Face Trainer's) is passed as keyword arguments, less
        its labels (``"labels"``, ``"label"``, ``"label_ids"``). A Lightning module that defines
        ``predict_step`` predicts through it (``predict_step(batch, batch_idx)``, the batch moved to the
        device). The prediction is the module's output, or its ``logits`` (a ``transformers.ModelOutput``
        or a dict with that key). Iterated once per draw: a list or a DataLoader, not a generator (one is
        accepted only with ``n_samples=1``).
    n_samples : int, default=30
        Number of draws S (>= 1).
    scale : float, default=1.0
        Covariance scale of the draws (SWAG's 0.5 is ``scale=0.5``).
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
        Seed of the draws (a ``Generator`` gives one draw ``int(seed.integers(0, 2**63 - 1))``).
    task : {"classification", "regression"}, default="classification"
        See Returns.
    bn_loader : iterable of batches, optional
        Training data for recomputing batch-norm statistics after each assignment.
    parameters : iterable of torch.Tensor, optional
        The tensors θ covers (default ``module.parameters()``); the others keep their values.

    Returns
    -------
    torch.Tensor
        Classification: (1/S) Σ_s softmax(logits_s) over the last dimension, shape (N, C), float32 or
        the parameters' float64. Regression: the predictions of every draw stacked, shape (S, N, ...),
        from which callers form the predictive mean and variance.

    Raises
    ------
    ValueError
        ``task`` unknown, ``n_samples`` < 1, the posterior's D differs from the parameters', an empty
        loader, or ``loader``/``bn_loader`` a one-shot iterator (a generator, ``iter(...)``) while
        ``n_samples`` > 1 (each draw iterates them again: pass a list or a DataLoader). An exhausted
        one-shot iterator is named as such.

    Notes
    -----
    The parameters, buffers (batch-norm statistics included) and training flag of the module are
    restored afterwards, also when an exception interrupts the averaging.
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    n = check_int(n_samples, "n_samples", 1)
    refuse_one_shot(loader, "the loader", n)
    if bn_loader is not None:
        refuse_one_shot(bn_loader, "bn_loader", n)
    vector = ParameterVector(module if parameters is None else parameters)
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in vector.parameters) else torch.float32
    draws = sample_parameters(posterior, n, scale=scale, seed=check_seed(seed), dtype=dtype, device=vector.device)
    total: torch.Tensor | None = None
    per_draw: list[torch.Tensor] = []
    with _preserved(module, vector.parameters), torch.no_grad():
        for chunk in draws:
            if chunk.shape[1] != len(vector):
                raise ValueError(f"the posterior has {chunk.shape[1]} features but the parameters {len(vector)}")
            for theta in chunk:
                vector.assign(theta)
                if bn_loader is not None:
                    refresh_batch_norm(module, bn_loader, device=vector.device)
                module.eval()
                output = _predict(module, loader, vector.device)
                if task == "regression":
                    per_draw.append(output)
                    continue
                probabilities = torch.softmax(output.to(dtype), dim=-1)
                total = probabilities if total is None else total.add_(probabilities)
    if task == "regression":
        return torch.stack(per_draw)
    assert total is not None
    return total.div_(n)
