"""A learned homoscedastic Gaussian noise for regression with VIFA: :class:`GaussianNoise`, :func:`vifa_regression_step`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

from .._validation import check_int
from ..vifa import VIFA
from ._vifa import vifa_step
from ._vifa_model import VIFA as DeviceVIFA

__all__ = ["GaussianNoise", "vifa_regression_step"]

Batch = tuple[torch.Tensor, torch.Tensor]


def _positive_finite(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    out = float(value)
    if not (math.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return out


class GaussianNoise:
    """The noise variance σ² of a regression likelihood y ~ N(f(x; θ), σ²), learned by empirical Bayes.

    Under q(θ) the expected log-likelihood of N targets is
    E_q[log p(y | θ, σ²)] = −(N/2) log(2πσ²) − E_q[S(θ)] / (2σ²), with S(θ) = Σ_n (y_n − f(x_n; θ))² the
    sum of squared residuals. The ELBO depends on σ² only through this term, so its gradient in
    s = log σ² is closed-form: ∂(−ELBO)/∂s = (N/2) (1 − E_q[S] / (N σ²)), zero at σ² = E_q[S] / N, the
    expected mean squared residual. :meth:`step` takes one Adam step on s along this gradient, estimated
    from the mean squared residuals of the network draws (and mini-batches) of a VIFA step, so σ² is
    maximised jointly with VIFA's ELBO instead of being fixed by hand (a too small σ² makes the
    likelihood over-confident, and a posterior then "gains" only by widening to compensate).

    Parameters
    ----------
    variance : float, default=1.0
        Initial σ² (> 0), e.g. the training mean squared residual of the point estimate.
    lr : float, default=0.01
        Adam learning rate of s = log σ² (> 0). Adam uses β₁ = 0.9, β₂ = 0.999, ε = 1e-8 with bias
        correction, like :class:`onlinefa.VIFA`'s ``optimizer="adam"``.

    Attributes
    ----------
    log_variance : float
        s = log σ², the optimised parameter.
    n_steps : int
        Adam steps taken.

    Examples
    --------
    >>> import torch
    >>> noise = GaussianNoise(variance=1.0, lr=0.05)
    >>> for _ in range(2000):
    ...     _ = noise.step([0.25], n_data=100)   # every draw's mean squared residual is 0.25
    >>> round(noise.variance, 3)
    0.25
    """

    def __init__(self, variance: float = 1.0, *, lr: float = 0.01) -> None:
        self.log_variance = math.log(_positive_finite(variance, "variance"))
        self.lr = _positive_finite(lr, "lr")
        self.n_steps = 0
        self._m = 0.0
        self._v = 0.0
        self._recorded: list[float] = []

    @property
    def variance(self) -> float:
        """σ² = exp s."""
        return math.exp(self.log_variance)

    def nll(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood ½ log(2πσ²) + (y − f)² / (2σ²) over the batch, at the current σ².

        The batch's mean squared residual (detached) is recorded for the next :meth:`step`.

        Parameters
        ----------
        prediction, target : torch.Tensor
            f(x; θ) and y, of the same number of elements.

        Returns
        -------
        torch.Tensor
            A scalar, differentiable in ``prediction``.

        Raises
        ------
        ValueError
            ``prediction`` and ``target`` have different numbers of elements, or none.
        """
        if prediction.numel() != target.numel() or target.numel() == 0:
            raise ValueError(f"prediction has {prediction.numel()} elements but target {target.numel()} (need equal, > 0)")
        residual = prediction.reshape(-1) - target.reshape(-1).to(prediction.dtype)
        mse = (residual**2).mean()
        self._recorded.append(float(mse.detach()))
        return 0.5 * (math.log(2.0 * math.pi) + self.log_variance) + 0.5 * mse / self.variance

    def gradient(self, mean_squared_residuals: Iterable[float], n_data: int) -> float:
        """∂(−ELBO)/∂s = (N/2) (1 − m / σ²), m = the average of ``mean_squared_residuals`` (an unbiased
        estimate of E_q[S] / N from draws of q and uniformly drawn mini-batches).

        Parameters
        ----------
        mean_squared_residuals : iterable of float
            Mean squared residuals, one per draw (each >= 0, finite).
        n_data : int
            N, the training-set size (>= 1).

        Returns
        -------
        float
        """
        values = np.asarray(list(mean_squared_residuals), dtype=np.float64)
        n = check_int(n_data, "n_data", 1)
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0.0):
            raise ValueError("mean_squared_residuals must be a non-empty sequence of finite values >= 0")
        return 0.5 * n * (1.0 - float(values.mean()) / self.variance)

    def step(self, mean_squared_residuals: Iterable[float] | None = None, *, n_data: int) -> float:
        """One Adam step on s = log σ² along :meth:`gradient`.

        Parameters
        ----------
        mean_squared_residuals : iterable of float, optional
            Default: the values recorded by :meth:`nll` since the last step (then cleared).
        n_data : int
            N, the training-set size.

        Returns
        -------
        float
            The new σ².

        Raises
        ------
        ValueError
            No residuals (none given and none recorded), or invalid values; σ² is unchanged.
        """
        values = list(self._recorded) if mean_squared_residuals is None else list(mean_squared_residuals)
        grad = self.gradient(values, n_data)
        if mean_squared_residuals is None:
            self._recorded.clear()
        self.n_steps += 1
        self._m = 0.9 * self._m + 0.1 * grad
        self._v = 0.999 * self._v + 0.001 * grad * grad
        m_hat = self._m / (1.0 - 0.9**self.n_steps)
        v_hat = self._v / (1.0 - 0.999**self.n_steps)
        self.log_variance -= self.lr * m_hat / (math.sqrt(v_hat) + 1e-8)
        return self.variance

    def __repr__(self) -> str:
        return f"GaussianNoise(variance={self.variance:.6g}, lr={self.lr}, n_steps={self.n_steps})"


def vifa_regression_step(
    vifa: VIFA | DeviceVIFA,
    module: torch.nn.Module,
    batch: Batch,
    *,
    n_data: int,
    noise: GaussianNoise,
    predict: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
    parameters: Iterable[torch.Tensor] | None = None,
    learn_prior_precision: bool = False,
) -> float:
    """One VIFA step for regression with a learned noise variance, then one step of σ² on the same draws.

    :func:`onlinefa.torch.vifa_step` with the loss ``noise.nll(predict(module, x), y)`` (the Gaussian
    NLL at the current σ²), followed by ``noise.step(n_data=n_data)`` on the mean squared residuals of the
    step's draws: both q and σ² ascend the same ELBO.

    Parameters
    ----------
    vifa : VIFA
    module : torch.nn.Module
    batch : (x, y) tuple of torch.Tensor
        A mini-batch drawn uniformly from the N training examples.
    n_data : int
        N.
    noise : GaussianNoise
    predict : callable, optional
        ``(module, x) -> f(x; θ)``; default ``module(x)``.
    parameters : iterable of torch.Tensor, optional
        As in :func:`onlinefa.torch.vifa_step`.
    learn_prior_precision : bool, default=False
        After the step, set the prior precision α to the ELBO's maximiser for the new q,
        :meth:`onlinefa.VIFA.optimal_prior_precision` (empirical Bayes; costs one snapshot of q per step).

    Returns
    -------
    float
        The mini-batch mean NLL, averaged over the draws (at the σ² before the step).

    Raises
    ------
    TypeError
        ``noise`` is not a GaussianNoise, or ``batch`` is not an (x, y) pair.
    ValueError, RuntimeError
        As :func:`onlinefa.torch.vifa_step`; σ² is then unchanged.
    """
    if not isinstance(noise, GaussianNoise):
        raise TypeError(f"noise must be a GaussianNoise, got {type(noise).__name__}")
    if not (isinstance(batch, tuple) and len(batch) == 2):
        raise TypeError("batch must be an (x, y) tuple of tensors")
    forward = predict if predict is not None else (lambda m, x: m(x))

    def loss_fn(m: torch.nn.Module, b: Batch) -> torch.Tensor:
        return noise.nll(forward(m, b[0]), b[1])

    noise._recorded.clear()
    try:
        loss = vifa_step(vifa, module, loss_fn, batch, n_data=n_data, parameters=parameters)
    except BaseException:
        noise._recorded.clear()
        raise
    noise.step(n_data=n_data)
    if learn_prior_precision:
        vifa.set_prior_precision(vifa.optimal_prior_precision())
    return loss
