"""``onlinefa.OnlineEM(..., device=...)``: the default online EM posterior with its rows in torch tensors on any device."""

from __future__ import annotations

from typing import Any, Literal

import torch

from .. import _core
from ..errors import NotFittedError
from ..streaming import OnlineEM as NumpyOnlineEM
from ..streaming import DEFAULT_NOISE_FLOOR, common_args, check_scaling, schedule_args
from ._em_engine import EMEngine, new_step
from ._torch_model import TorchStreamingModel, initial_loadings, locked, mapped_rows, state_dtype


class OnlineEM(TorchStreamingModel):
    """What ``onlinefa.OnlineEM(..., device=...)`` builds: online EM with its rows in torch tensors.

    The same algorithm, arguments, defaults and checkpoints as :class:`onlinefa.OnlineEM`, with the D-sized
    state (θ̄, Ā, d̄², d) in ``dtype`` on ``device``: a snapshot already on the GPU is fitted there, without a
    copy to the host. The K×K part of each step (E-step, M-step, whitening, schedules, warm-up) is the Rust
    core's own code, run on the CPU in float64 on the pass's K×K sums, so the two classes differ only in how the
    D-sized pass rounds (tested to 1e-10 relative in float64 over 1,000 samples). On the CPU the Rust core is
    faster; use this class for state that lives on an accelerator.

    Parameters
    ----------
    n_features, n_components, n_warmup, init, seed, noise_floor, whiten, schedule, tau0, kappa, rho, scaling, shrink
        As for :class:`onlinefa.OnlineEM`.
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Storage of the D-sized state.
    device : str or torch.device, default "cpu"
        Where the D-sized state lives (e.g. ``"cuda"``).

    Examples
    --------
    >>> import torch, onlinefa
    >>> em = onlinefa.OnlineEM(20, 3, seed=0, device="cpu").update(torch.randn(50, 20, dtype=torch.float64))
    >>> em.loadings.shape, em.n_seen, isinstance(em, onlinefa.OnlineEM)
    (torch.Size([20, 3]), 50, True)
    """

    def __init__(
        self,
        n_features: int,
        n_components: int,
        *,
        n_warmup: int | Literal["auto"] = "auto",
        init: Any = None,
        seed: Any = None,
        noise_floor: float = DEFAULT_NOISE_FLOOR,
        dtype: Any = "float64",
        whiten: bool = True,
        schedule: str = "harmonic",
        tau0: float = 0.0,
        kappa: float = 0.9,
        rho: float = 0.01,
        scaling: str = "data",
        shrink: bool = True,
        device: str | torch.device = "cpu",
    ) -> None:
        args = common_args(n_features, n_components, n_warmup, init, seed, noise_floor, "float64")
        sched = schedule_args(schedule, tau0, kappa, rho)
        d, k, rows_dtype = args["n_features"], args["n_components"], state_dtype(dtype)
        kk_step = new_step(d, k, rows_dtype, n_warmup=args["n_warmup"], noise_floor=args["noise_floor"],
                           whiten=bool(whiten), scaling=check_scaling(scaling), shrink=bool(shrink), **sched)
        self._engine = EMEngine(kk_step, d, sched["schedule"], initial_loadings(args), rows_dtype,
                                torch.device(device))

    # -- the fitted Gaussian ------------------------------------------------------------------------------
    _core_class = _core.OnlineEMCore
    _engine_class = EMEngine
    _numpy_class = NumpyOnlineEM

    def _answering(self) -> EMEngine:
        engine: EMEngine = self._engine
        if engine.is_fitted:
            return engine
        if engine.n_seen < 2 or engine.pending is None or (engine.settings.scaling == "data"
                                                           and engine.scale_sq <= 0):
            raise NotFittedError(
                f"OnlineEM has seen {engine.n_seen} samples: a first fit needs two samples that differ (the "
                f"fitted Gaussian then has rank at most n_seen − 1 until the warm-up of "
                f"{engine.settings.n_warmup} ends). Feed more samples.")
        ended: EMEngine = engine.ended_warmup()
        return ended

    @locked
    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fitted Gaussian (mean c, loadings F, noise variances ψ) as float64 tensors on the device.

        Raises
        ------
        NotFittedError
            Before two distinct samples (during warm-up the first fit from the samples so far answers).
        """
        engine = self._answering()
        f, psi = engine.fitted_rows(engine.applied_a_bar())
        if engine.settings.shrink and engine.init_loadings is None:
            f, psi = mapped_rows(f, psi, self._report_map(engine.n_seen, f, psi, engine.effective_samples()))
        return engine.mean.to(torch.float64), f, psi

    def __repr__(self) -> str:
        s = self._engine.settings
        return (f"onlinefa.OnlineEM(n_features={s.n_features}, n_components={s.n_components}, "
                f"whiten={s.whiten}, shrink={s.shrink}, schedule={s.schedule!r}, scaling={s.scaling!r}, "
                f"n_warmup={s.n_warmup}, "
                f"dtype={str(self.dtype).removeprefix('torch.')!r}, device={str(self.device)!r}, n_seen={self.n_seen})")


# ``onlinefa.OnlineEM(..., device=...)`` builds this class; it is that class to ``isinstance``.
NumpyOnlineEM.register(OnlineEM)
