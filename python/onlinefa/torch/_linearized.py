"""The linearised (GLM) predictive of a Gaussian posterior over a network's parameters.

Immer, Korzepa and Bauer, "Improving predictions of Bayesian neural nets via local linearization"
(AISTATS 2021), eq. (6): around the posterior mean c the network is replaced by its first-order expansion

    f_lin(x; θ) = f(x; c) + J_c(x) (θ − c),

and a draw θ_s = c + √scale · δ_s, δ_s = F h_s + ψ^{1/2} ⊙ z_s (:func:`~onlinefa.torch.sample_parameters`
at scale 1), predicts f(x; c) + √scale · J_c(x) δ_s. Each J_c(x) δ_s is one Jacobian-vector product
(``torch.func.jvp``, forward mode): nothing D×D and nothing per example that is D-sized. Because the draws
enter linearly, the predictions of every covariance scale follow from one pass (:class:`LinearizedPredictions`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from functools import cache
from typing import NamedTuple

import numpy as np
import torch

from .._gaussian import FactorGaussianMixin
from .._validation import SeedLike, check_int, check_seed
from ._bma import LABEL_KEYS, output_logits, no_batches_error, refuse_one_shot, moved_to
from ._params import ParameterVector
from ._posterior import MultiSWAG, gaussian_parameters
from ._sampling import check_scale, check_temperature, component_seeds, sample_parameters

__all__ = ["LinearizedPredictions", "linearized_model_average", "linearized_predictions"]


class LinearizedPredictions(NamedTuple):
    """The linearised outputs of S draws on N inputs, split into centre and unit-scale deviation.

    The outputs at covariance scale ``s`` and temperature ``T`` are ``(centre + √s · deviation) / T``
    (:meth:`outputs`).
    """

    centre: torch.Tensor  #: (S, N, ...) f(x_n; c), c the mean of the component draw s came from (equal within it)
    deviation: torch.Tensor  #: (S, N, ...) J_c(x_n) δ_s, the draw's deviation from c pushed forward
    targets: torch.Tensor | None  #: (N, ...) the batches' targets where they carry them, else None

    def outputs(self, scale: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
        """The S draws' outputs ``(centre + √scale · deviation) / temperature``, shape (S, N, ...).

        Parameters
        ----------
        scale : float, default=1.0
            Covariance scale (>= 0).
        temperature : float, default=1.0
            Divides the outputs: the softmax temperature of classification logits (> 0; 1 leaves them).

        Returns
        -------
        torch.Tensor
        """
        scaled = torch.add(self.centre, self.deviation, alpha=check_scale(scale) ** 0.5)
        divisor = check_temperature(temperature)
        return scaled if divisor == 1.0 else scaled / divisor

    def variance(self, scale: float = 1.0) -> torch.Tensor:
        """Each draw's output variance under the linearised Gaussian of its component, at covariance ``scale``.

        Through the linearisation a Gaussian N(c, s Σ) over θ gives Gaussian outputs, mean f(x; c) and
        covariance s J_c(x) Σ J_c(x)ᵀ (Immer et al., eq. (6)). Its diagonal is estimated from the deviations
        of the component's own draws, whose mean is zero exactly: s · (1/S_m) Σ_{t in m} (J_c(x) δ_t)².
        With :func:`regression_log_likelihood` (``centre`` as the draws, this as ``variance``) it gives the
        linearised network's predictive N(f(x; c), s J Σ Jᵀ + σ²) itself, with no sampling error in its
        mean. The draws of one component are the consecutive draws with equal ``centre`` (as
        :func:`linearized_predictions` lays them out; one component when they are all equal).

        Parameters
        ----------
        scale : float, default=1.0
            Covariance scale (>= 0).

        Returns
        -------
        torch.Tensor
            Shape (S, N, ...), the dtype of ``deviation``.
        """
        factor = check_scale(scale)
        squares = self.deviation.square()
        variance = torch.empty_like(squares)
        for run in _component_runs(self.centre):
            variance[run] = squares[run].mean(dim=0, keepdim=True)
        return variance * factor if factor != 1.0 else variance


def _component_runs(centre: torch.Tensor) -> list[slice]:
    """The runs of consecutive draws whose centres are equal: one slice per mixture component."""
    starts = [0] + [s for s in range(1, centre.shape[0]) if not torch.equal(centre[s], centre[s - 1])]
    return [slice(begin, end) for begin, end in zip(starts, starts[1:] + [centre.shape[0]])]


def _parameter_names(module: torch.nn.Module, vector: ParameterVector) -> tuple[str, ...]:
    """The names in ``module.named_parameters()`` of the tensors θ covers, in θ's order."""
    by_identity = {id(tensor): name for name, tensor in module.named_parameters(remove_duplicate=False)}
    missing = [index for index, tensor in enumerate(vector.parameters) if id(tensor) not in by_identity]
    if missing:
        raise ValueError(f"parameters {missing} of θ are not parameters of the module")
    return tuple(by_identity[id(tensor)] for tensor in vector.parameters)


def _call_inputs(batch: object, device: torch.device) -> tuple[tuple[object, ...], dict[str, object]]:
    """Positional and keyword arguments of the module's forward for one batch (as :func:`bayesian_model_average`)."""
    if isinstance(batch, Mapping):
        return (), {key: moved_to(value, device) for key, value in batch.items() if key not in LABEL_KEYS}
    inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    return (moved_to(inputs, device),), {}


def _batch_targets(batch: object) -> torch.Tensor | None:
    if isinstance(batch, Mapping):
        found = [batch[key] for key in LABEL_KEYS if key in batch]
        return found[0] if found and isinstance(found[0], torch.Tensor) else None
    if isinstance(batch, (tuple, list)) and len(batch) > 1 and isinstance(batch[1], torch.Tensor):
        return batch[1]
    return None


@cache
def _load_forward_mode_rules() -> None:
    """Import PyTorch's forward-mode decompositions once, quietly: importing them scripts functions with
    ``torch.jit.script``, which recent PyTorch reports as deprecated on the user's first ``jvp``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        import torch._decomp.decompositions_for_jvp  # noqa: F401


class _Linearization:
    """f(x; c) and J_c(x) δ for one module, one set of parameter names and one mean c."""

    def __init__(self, module: torch.nn.Module, vector: ParameterVector, mean: torch.Tensor) -> None:
        self.module, self.vector = module, vector
        self.names = _parameter_names(module, vector)
        _load_forward_mode_rules()
        self.mean = self._split(mean)

    def _split(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(flat[part].view(tensor.shape) for part, tensor in zip(self.vector._slices, self.vector.parameters))

    def push_forward(self, batch: object, deviation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f(x; c), J_c(x) δ)`` on one batch, by one forward-mode Jacobian-vector product."""
        args, kwargs = _call_inputs(batch, self.vector.device)

        def forward(*tensors: torch.Tensor) -> torch.Tensor:
            values = dict(zip(self.names, tensors))
            return output_logits(torch.func.functional_call(self.module, values, args, kwargs))

        result = torch.func.jvp(forward, self.mean, self._split(deviation))
        return result[0], result[1]


def _posterior_mean(posterior: object) -> np.ndarray:
    """c of a posterior: the model's own mean where it has one (no copy of F is made), else its Gaussian's."""
    if isinstance(posterior, FactorGaussianMixin):
        return np.asarray(posterior.mean, dtype=np.float64)
    return gaussian_parameters(posterior).mean


def _components(posterior: object, n_samples: int, seed: int | None) -> list[tuple[object, int, int | None]]:
    """(Gaussian, draws, seed) per mixture component, exactly as :func:`sample_parameters` splits them."""
    if isinstance(posterior, MultiSWAG):
        parts = zip(posterior.components, posterior.split(n_samples), component_seeds(seed, len(posterior)))
        return [(component, count, component_seed) for component, count, component_seed in parts if count > 0]
    return [(posterior, n_samples, seed)]


def linearized_predictions(
    module: torch.nn.Module,
    posterior: object,
    loader: Iterable[object],
    *,
    n_samples: int = 30,
    seed: SeedLike = None,
    parameters: Iterable[torch.Tensor] | None = None,
) -> LinearizedPredictions:
    """The linearised outputs f(x; c) + J_c(x) δ_s of S posterior draws on every batch of ``loader``.

    Draw s is the s-th draw of :func:`sample_parameters` with the same ``seed`` at scale 1 (for a
    :class:`MultiSWAG` mixture each component is linearised around its own mean). The module runs in eval
    mode with its current buffers (batch-norm statistics are not refreshed per draw) and its parameters
    are never modified.

    Parameters
    ----------
    module : torch.nn.Module
    posterior : model or MultiSWAG
        Gaussian over θ (D = the number of entries of ``parameters``).
    loader : iterable of batches
        As for :func:`bayesian_model_average` (iterated once per draw: not a one-shot iterator when S > 1).
        A tuple/list batch's second element, or a dict batch's ``labels``, is collected as the targets.
    n_samples : int, default=30
        Number of draws S (>= 1).
    seed : int, numpy.random.Generator or numpy.random.SeedSequence, optional
    parameters : iterable of torch.Tensor, optional
        The tensors θ covers (default ``module.parameters()``); they must be parameters of ``module``.

    Returns
    -------
    LinearizedPredictions
        Float32 or, for float64 parameters, float64 tensors on the parameters' device.

    Raises
    ------
    ValueError
        ``n_samples`` < 1, the posterior's D differs from the parameters', an empty or one-shot loader,
        or parameters that are not the module's.
    """
    n = check_int(n_samples, "n_samples", 1)
    refuse_one_shot(loader, "the loader", n)
    vector = ParameterVector(module if parameters is None else parameters)
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in vector.parameters) else torch.float32
    centres: list[torch.Tensor] = []
    deviations: list[torch.Tensor] = []
    targets: torch.Tensor | None = None
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for component, count, component_seed in _components(posterior, n, check_seed(seed)):
                mean = torch.as_tensor(_posterior_mean(component), dtype=dtype, device=vector.device)
                if mean.shape[0] != len(vector):
                    raise ValueError(f"the posterior has {mean.shape[0]} features but the parameters {len(vector)}")
                linear = _Linearization(module, vector, mean)
                first = len(centres)
                for chunk in sample_parameters(component, count, seed=component_seed, dtype=dtype, device=vector.device):
                    for theta in chunk:
                        centre, pushed, seen = _pass(linear, loader, theta - mean)
                        # f(x; c) is the component's own: its first pass's values, bit for bit, on any device
                        centres.append(centre if len(centres) == first else centres[first])
                        deviations.append(pushed)
                        if len(centres) == 1:  # every pass reads the same batches: keep the first's targets
                            targets = seen
    finally:
        module.train(training)
    return LinearizedPredictions(torch.stack(centres), torch.stack(deviations), targets)


def _pass(linear: _Linearization, loader: Iterable[object], deviation: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One draw over the loader: the concatenated centre and pushed-forward outputs, and the targets
    when every batch carries them."""
    centres, pushed, targets = [], [], []
    for batch in loader:
        centre, push = linear.push_forward(batch, deviation)
        centres.append(centre)
        pushed.append(push)
        found = _batch_targets(batch)
        if found is not None:
            targets.append(found.detach())
    if not centres:
        raise no_batches_error(loader, "the loader")
    joined = torch.cat(targets) if targets and len(targets) == len(centres) else None
    return torch.cat(centres), torch.cat(pushed), joined


def linearized_model_average(
    module: torch.nn.Module,
    posterior: object,
    loader: Iterable[object],
    *,
    n_samples: int = 30,
    scale: float = 1.0,
    seed: SeedLike = None,
    task: str = "classification",
    parameters: Iterable[torch.Tensor] | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`bayesian_model_average` through the linearised network f(x; c) + J_c(x)(θ − c).

    Parameters
    ----------
    module, posterior, loader, n_samples, seed, parameters
        As for :func:`linearized_predictions`.
    scale : float, default=1.0
        Covariance scale of the draws (e.g. the one :func:`select_scale` chose).
    task : {"classification", "regression"}, default="classification"
    temperature : float, default=1.0
        Classification only: the draws' logits are divided by it before the softmax (e.g. the temperature
        :func:`select_scale` chose with ``temperature=True``).

    Returns
    -------
    torch.Tensor
        Classification: the mean over draws of softmax(logits), shape (N, C). Regression: every draw's
        prediction, shape (S, N, ...), for :func:`regression_log_likelihood`; the linearised Gaussian itself,
        whose mean carries no sampling error, is :func:`linearized_predictions`'s ``centre`` with
        :meth:`LinearizedPredictions.variance` (the recipe of :func:`select_scale` for regression).

    Raises
    ------
    ValueError
        ``task`` unknown, a temperature other than 1 for regression, or as :func:`linearized_predictions`.
    """
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    scale, temperature = check_scale(scale), check_temperature(temperature)
    if task == "regression" and temperature != 1.0:
        raise ValueError(f"a temperature applies to classification logits only, got {temperature} for regression")
    predictions = linearized_predictions(module, posterior, loader, n_samples=n_samples, seed=seed,
                                         parameters=parameters)
    outputs = predictions.outputs(scale, temperature)
    if task == "regression":
        return outputs
    return torch.softmax(outputs, dim=-1).mean(dim=0)
