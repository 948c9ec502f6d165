"""``onlinefa.VIFA(..., device=...)``: VIFA (Algorithm 3) with its D-sized state in torch tensors on any device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _core
from ..vifa import VIFA as NumpyVIFA
from ._input import as_input_tensor
from ._kk_algebra import MAX_INPUT
from ._torch_model import TorchGaussianModel, locked, state_dtype
from ._vifa_engine import VIFAEngine


class VIFA(TorchGaussianModel):
    """What ``onlinefa.VIFA(..., device=...)`` builds: VIFA with its state in torch tensors.

    The same objective, step, arguments, defaults and checkpoints as :class:`onlinefa.VIFA`, with c, F, β and
    Adam's moments in ``dtype`` on ``device``, the training draws and gradients as tensors on that device, and
    the K×K algebra in float64 on the CPU. Given the same draws and gradients, a float64 model equals the Rust
    core to 1e-10 relative over 1,000 steps (tested). The draws' noise comes from torch generators on the
    device keyed by (seed, draw index): a model's random stream depends only on its seed and counters, and is
    not the Rust core's stream, so a model continued by the other class draws other (equally distributed)
    noise. A model with draws waiting for :meth:`step` cannot be saved or converted (their noise lives only
    here); step them first.

    Parameters
    ----------
    n_features, n_components, prior_precision, lr_mean, lr_loadings, lr_log_noise, optimizer, seed, init, \
n_grad_samples, clip_grad_norm, init_mean, init_noise_variance
        As for :class:`onlinefa.VIFA` (validated by it).
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Storage of the D-sized state.
    device : str or torch.device, default "cpu"
        Where the D-sized state lives (e.g. ``"cuda"``).

    Examples
    --------
    >>> import torch, onlinefa
    >>> mu = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    >>> vi = onlinefa.VIFA(3, 2, prior_precision=0.0, lr_mean=1e-2, lr_loadings=1e-2, lr_log_noise=1e-2,
    ...                    optimizer="adam", seed=0, device="cpu")
    >>> for _ in range(3000):
    ...     _ = vi.step(vi.sample() - mu)
    >>> bool(torch.allclose(vi.mean, mu, atol=0.2))
    True
    """

    _core_class = _core.VIFACore
    _engine_class = VIFAEngine
    _numpy_class = NumpyVIFA

    def __init__(self, n_features: int, n_components: int, *, prior_precision: float, lr_mean: float,
                 lr_loadings: float, lr_log_noise: float, optimizer: str = "sgd", seed: Any = None,
                 init: Any = None, n_grad_samples: int = 1, clip_grad_norm: float | None = None,
                 init_mean: Any = None, init_noise_variance: Any = None, dtype: Any = "float64",
                 device: str | torch.device = "cpu") -> None:
        name = str(state_dtype(dtype)).removeprefix("torch.")
        start = NumpyVIFA(n_features, n_components, prior_precision=prior_precision, lr_mean=lr_mean,
                          lr_loadings=lr_loadings, lr_log_noise=lr_log_noise, optimizer=optimizer,  # type: ignore[arg-type]
                          seed=seed, init=init, n_grad_samples=n_grad_samples, clip_grad_norm=clip_grad_norm,
                          init_mean=init_mean, init_noise_variance=init_noise_variance, dtype=name)
        self._engine = VIFAEngine.from_state(start.__getstate__()["state"], torch.device(device))

    @classmethod
    def from_gaussian(cls, model: object, *, device: str | torch.device = "cpu", **options: Any) -> "VIFA":
        """Start from a fitted Gaussian with scale-aware learning rates, as :meth:`onlinefa.VIFA.from_gaussian`
        (same options; ``model`` may hold tensors on any device), with the state on ``device``."""
        return cls.from_numpy(NumpyVIFA.from_gaussian(model, **options), device=device)

    # -- training --------------------------------------------------------------------------------------
    @locked
    def sample(self, n_samples: int | None = None, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """The training draw (no arguments), or ``n_samples`` model draws.

        Without arguments: θ = F h + c + ψ^{1/2} ⊙ z (4.50) on the device (float64), remembered for
        :meth:`step`; RuntimeError when ``n_grad_samples`` draws already wait. With ``n_samples``: independent
        draws from q, shape (n_samples, D), nothing remembered (``generator`` seeds them).
        """
        if n_samples is None and generator is None:
            engine: VIFAEngine = self._engine
            return engine.draw(*engine.draw_noise())
        return super().sample(1 if n_samples is None else n_samples, generator=generator)

    @locked
    def step(self, grad: Any) -> "VIFA":
        """One optimiser step (Algorithm 3, lines 9–20) from the gradients of the full-data negative
        log-likelihood at the pending draws: shape (D,) or (L, D), a tensor on any device (moved to the model's).

        Raises
        ------
        RuntimeError
            Fewer than ``n_grad_samples`` draws are pending.
        ValueError
            Wrong shape, NaN, infinity or a magnitude beyond the state dtype's range: nothing changes.
        onlinefa.NumericalBreakdownError
            The step would make a parameter non-finite (learning rates too large): nothing changes.
        """
        self._engine.step(self._checked_gradients(grad))
        return self

    def _checked_gradients(self, grad: Any) -> torch.Tensor:
        engine: VIFAEngine = self._engine
        d, n_rows = engine.settings.n_features, engine.settings.n_grad_samples
        g = as_input_tensor(grad, "grad").to(device=engine.device)
        if g.ndim == 1 and n_rows == 1:
            g = g[None, :]
        if g.shape != (n_rows, d):
            expected = f"({d},) or (1, {d})" if n_rows == 1 else f"({n_rows}, {d})"
            raise ValueError(f"grad must have shape {expected} (one row per pending draw), got {tuple(g.shape)}")
        if not g.is_floating_point():
            g = g.to(torch.float64)
        if not bool(torch.isfinite(g).all()) or bool((g.abs() > MAX_INPUT[engine.dtype]).any()):
            raise ValueError(f"grad holds NaN, infinity or a value with |g| > {MAX_INPUT[engine.dtype]:e}; "
                             "nothing was applied")
        return g

    def fit(self, nll_gradient: Callable[[torch.Tensor], Any], n_steps: int) -> "VIFA":
        """``n_steps`` iterations: ``nll_gradient(θ)`` (a (D,) tensor on the device) at each training draw."""
        for _ in range(int(n_steps)):
            grads = [torch.as_tensor(nll_gradient(self.sample()), device=self.device)
                     for _ in range(self.n_grad_samples)]
            self.step(torch.stack(grads))
        return self

    @locked
    def set_learning_rates(self, *, lr_mean: float | None = None, lr_loadings: float | None = None,
                           lr_log_noise: float | None = None) -> "VIFA":
        """Change any of η_c, η_F, η_β (finite, >= 0) for the following steps."""
        new = [old if value is None else float(value) for old, value in
               zip(self._engine.settings.lr, (lr_mean, lr_loadings, lr_log_noise))]
        self._engine.kk_step.set_learning_rates(*new)  # ValueError (nothing changed) unless finite and >= 0
        return self

    @locked
    def set_prior_precision(self, prior_precision: float) -> "VIFA":
        """Change α, the precision of the prior N(0, α⁻¹ I), for the following steps (finite, >= 0)."""
        self._engine.kk_step.set_prior_precision(float(prior_precision))  # ValueError unless finite and >= 0
        return self

    def optimal_prior_precision(self) -> float:
        """α* = D / E_q[‖θ‖²] = D / (‖c‖² + ‖F‖²_F + Σ ψ), the ELBO's maximiser in α (as
        :meth:`onlinefa.VIFA.optimal_prior_precision`)."""
        mean, loadings, psi = self.snapshot()
        second_moment = float(mean @ mean) + float((loadings * loadings).sum()) + float(psi.sum())
        return self.n_features / second_moment

    @locked
    def pending_noise(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(h (n_pending, K) on the CPU, z (n_pending, D) on the device) of the draws waiting for :meth:`step`."""
        engine: VIFAEngine = self._engine
        k, d = engine.settings.n_components, engine.settings.n_features
        if not engine.pending:
            return torch.zeros(0, k, dtype=torch.float64), torch.zeros(0, d, dtype=torch.float64, device=self.device)
        return torch.stack([h for h, _ in engine.pending]), torch.stack([z for _, z in engine.pending])

    # -- the model -------------------------------------------------------------------------------------
    @locked
    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(c, F, ψ = exp β) as float64 tensors on the device."""
        c, f, _, psi = self._engine.rows64()
        return c, f, psi

    @property
    def log_noise_variance(self) -> torch.Tensor:
        """β = log ψ (D,), float64 on the device."""
        beta: torch.Tensor = self._engine.params["log_noise"]
        return beta.to(torch.float64)

    @property
    def n_steps(self) -> int:
        """Optimiser steps applied so far."""
        return int(self._engine.n_steps)

    @property
    def n_pending(self) -> int:
        """Training draws waiting for :meth:`step`."""
        return int(self._engine.n_pending)

    @property
    def n_grad_samples(self) -> int:
        """L, the draws averaged per step."""
        return int(self._engine.settings.n_grad_samples)

    @property
    def prior_precision(self) -> float:
        """α."""
        return float(self._engine.settings.prior_precision)

    @property
    def learning_rates(self) -> tuple[float, float, float]:
        """(η_c, η_F, η_β) of the next step."""
        lr: tuple[float, float, float] = self._engine.settings.lr
        return lr

    @property
    def seed(self) -> int:
        """Seed of the training draws."""
        return int(self._engine.seed)

    def __repr__(self) -> str:
        s = self._engine.settings
        return (f"onlinefa.VIFA(n_features={s.n_features}, n_components={s.n_components}, "
                f"optimizer={s.optimizer!r}, n_steps={self.n_steps}, "
                f"dtype={str(self.dtype).removeprefix('torch.')!r}, device={str(self.device)!r})")


# ``onlinefa.VIFA(..., device=...)`` builds this class; it is that class to ``isinstance``.
NumpyVIFA.register(VIFA)
