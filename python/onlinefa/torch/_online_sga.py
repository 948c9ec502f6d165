"""``onlinefa.OnlineSGA(..., device=...)``: online SGA (Algorithm 1 with the library's defaults) on torch tensors."""

from __future__ import annotations

from typing import Any, Literal

import torch

from .. import _core
from ..errors import NotFittedError
from ..streaming import OnlineSGA as NumpyOnlineSGA
from .._validation import sga_step_args
from ..streaming import DEFAULT_NOISE_FLOOR, check_scaling, common_args, schedule_args
from ._sga_engine import SGAEngine, new_step
from ._torch_model import TorchStreamingModel, initial_loadings, locked, state_dtype


class OnlineSGA(TorchStreamingModel):
    """What ``onlinefa.OnlineSGA(..., device=...)`` builds: online SGA with its rows in torch tensors.

    The same algorithm, arguments, defaults and checkpoints as :class:`onlinefa.OnlineSGA`, with the D-sized
    state (θ̄, F, ψ, d) in ``dtype`` on ``device``; the K×K part of each step (the E-step, the rule's step sizes,
    the warm-up) is the Rust core's own code, run in float64 on the CPU on the pass's sums. In float64 it equals
    the Rust core to rounding (tested to 1e-10 relative over 1,000 samples).

    Parameters
    ----------
    n_features, n_components, lr, n_warmup, init, seed, noise_floor, schedule, tau0, kappa, rho, scaling
        As for :class:`onlinefa.OnlineSGA`.
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Storage of the D-sized state.
    device : str or torch.device, default "cpu"
        Where the D-sized state lives (e.g. ``"cuda"``).

    Examples
    --------
    >>> import torch, onlinefa
    >>> sga = onlinefa.OnlineSGA(20, 3, seed=0, device="cpu").update(torch.randn(50, 20, dtype=torch.float64))
    >>> sga.loadings.shape, sga.n_seen
    (torch.Size([20, 3]), 50)
    """

    _core_class = _core.OnlineSGACore
    _engine_class = SGAEngine
    _numpy_class = NumpyOnlineSGA

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        lr: float | Literal["auto"] = "auto",
        n_warmup: int | Literal["auto"] = "auto",
        init: Any = None,
        seed: Any = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: Any = "float64",
        schedule: str = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        scaling: str = "data",
        device: str | torch.device = "cpu",
    ) -> None:
        args = common_args(n_features, n_components, n_warmup, init, seed, noise_floor, "float64")
        sched = schedule_args(schedule, tau0, kappa, rho)
        d, k, rows_dtype = args["n_features"], args["n_components"], state_dtype(dtype)
        step, _ = sga_step_args(lr, check_scaling(scaling))
        kk_step = new_step(d, k, rows_dtype, lr=step["lr"], rule=step["rule"], n_warmup=args["n_warmup"],
                           noise_floor=args["noise_floor"], scaling=check_scaling(scaling), **sched)
        self._engine = SGAEngine(kk_step, d, sched["schedule"], initial_loadings(args), rows_dtype,
                                 torch.device(device))

    @classmethod
    def algorithm1(cls, n_features: int, n_components: int, *, lr: float = 1e-3, n_warmup: int = 100,
                   init: Any = None, seed: Any = None, noise_floor: float = DEFAULT_NOISE_FLOOR,
                   dtype: Any = "float64", device: str | torch.device = "cpu") -> "OnlineSGA":
        """The thesis's Algorithm 1 exactly, as :meth:`onlinefa.OnlineSGA.algorithm1`."""
        return cls(n_features, n_components, lr=lr, n_warmup=n_warmup, init=init, seed=seed,
                   noise_floor=noise_floor, dtype=dtype, schedule="harmonic", scaling="unit", device=device)

    @locked
    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fitted Gaussian (mean c, loadings F, noise variances ψ) as float64 tensors on the device, with the
        last sample's gradient step applied.

        Raises
        ------
        NotFittedError
            Until the warm-up of ``n_warmup`` samples has ended.
        """
        engine: SGAEngine = self._engine
        if not engine.is_fitted:
            raise NotFittedError(f"OnlineSGA has seen {engine.n_seen} samples; its warm-up of "
                                 f"{engine.settings.n_warmup} must end first. Feed more samples.")
        f, psi, _ = engine.current_rows(start=False)
        return engine.mean.to(torch.float64), f, psi

    def __repr__(self) -> str:
        s = self._engine.settings
        lr = "'auto'" if s.rule == "whitened" else s.lr
        return (f"onlinefa.OnlineSGA(n_features={s.n_features}, n_components={s.n_components}, lr={lr}, "
                f"schedule={s.schedule!r}, scaling={s.scaling!r}, n_warmup={s.n_warmup}, "
                f"dtype={str(self.dtype).removeprefix('torch.')!r}, device={str(self.device)!r}, n_seen={self.n_seen})")


# ``onlinefa.OnlineSGA(..., device=...)`` builds this class; it is that class to ``isinstance``.
NumpyOnlineSGA.register(OnlineSGA)
