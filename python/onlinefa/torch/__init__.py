"""PyTorch workflow: collect SGD iterates, sample posterior parameter vectors, average predictions.

Needs PyTorch (the optional extra ``torch``: ``pip install ".[torch]"`` in the source tree); this is the only part of onlinefa that imports torch.

- :class:`ParameterVector`: the flat vector θ of a module's parameters (copy out, copy in).
- :class:`SnapshotCollector`: feeds θ to a streaming posterior (``OnlineEM``, ``OnlineSGA``, ``SWAG``,
  ...) every N optimiser steps, through ``Optimizer.register_step_post_hook``.
- :func:`sample_parameters`: chunked draws θ ~ N(c, scale·(F Fᵀ + Ψ)) from any onlinefa posterior or a
  :class:`MultiSWAG` mixture.
- :func:`bayesian_model_average`: predictions averaged over draws, with batch-norm refresh
  (:func:`refresh_batch_norm`); :func:`regression_log_likelihood` and :func:`fit_noise_variance`: the
  regression predictive of its draws (a mixture of Gaussians with a given or fitted noise variance).
- :func:`linearized_predictions`, :func:`linearized_model_average`: the linearised (GLM) predictive
  f(x; c) + J(x)(θ − c) of the draws, by Jacobian-vector products; :func:`select_scale`: the covariance
  scale chosen by held-out likelihood or by the ELBO of the training data.
- :func:`vifa_step`: one VIFA training step on a module.
- :class:`GaussianNoise`, :func:`vifa_regression_step`: a regression noise variance σ² learned from the
  ELBO alongside VIFA (empirical Bayes).
- :func:`to_torch`: any model's Gaussian as ``torch.distributions.LowRankMultivariateNormal``.
- Models with their rows in torch tensors on any device are the library's own classes with ``device=``:
  ``onlinefa.OnlineEM(D, K, device="cuda")``, ``onlinefa.OnlineSGA``, ``onlinefa.VIFA``, and
  ``onlinefa.distributed.ShardedOnlineEM`` / ``ShardedOnlineSGA`` / ``ShardedVIFA`` for rows split across
  processes.
- :class:`SWAG`: the SWAG baseline of Maddox et al. (NumPy-based, in :mod:`onlinefa.torch.swag`).

See the "PyTorch workflow" section of docs/guide/usage.md for an end-to-end example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._bma import bayesian_model_average, refresh_batch_norm
from ..errors import SlowCollectionWarning
from ._collect import SnapshotCollector
from ._distributions import to_torch
from ._noise import GaussianNoise, vifa_regression_step
from ._linearized import LinearizedPredictions, linearized_model_average, linearized_predictions
from ._params import ParameterVector
from ._posterior import GaussianParameters, MultiSWAG, gaussian_parameters
from ._predictive import fit_noise_variance, regression_log_likelihood
from ._sampling import sample_parameters
from ._scale import ScaleSelection, select_scale
from ._vifa import vifa_step

if TYPE_CHECKING:
    from .swag import SWAG

__all__ = [
    "GaussianNoise", "GaussianParameters", "LinearizedPredictions", "MultiSWAG", "ParameterVector", "SWAG",
    "ScaleSelection", "SlowCollectionWarning", "SnapshotCollector", "bayesian_model_average",
    "fit_noise_variance", "gaussian_parameters", "linearized_model_average", "linearized_predictions",
    "refresh_batch_norm", "regression_log_likelihood", "select_scale",
    "sample_parameters", "to_torch", "vifa_regression_step",
    "vifa_step",
]  # fmt: skip


#: The device classes this module had before they became the library's classes with ``device=``.
_MOVED = {"OnlineEM": "onlinefa.OnlineEM", "OnlineSGA": "onlinefa.OnlineSGA", "VIFA": "onlinefa.VIFA",
          "ShardedOnlineEM": "onlinefa.distributed.ShardedOnlineEM",
          "ShardedOnlineSGA": "onlinefa.distributed.ShardedOnlineSGA",
          "ShardedVIFA": "onlinefa.distributed.ShardedVIFA"}


def __getattr__(name: str) -> Any:
    # SWAG lives in its own (NumPy-only) module, imported on first use.
    if name == "SWAG":
        from .swag import SWAG

        return SWAG
    if name in _MOVED:
        raise AttributeError(f"onlinefa.torch.{name} is now {_MOVED[name]}(..., device=...): the same model with "
                             "its rows in torch tensors on that device")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
