"""``onlinefa.torch.OnlineEM``: the default online EM posterior with its state in torch tensors on any device."""

from __future__ import annotations

import copy
import os
from typing import Any, Literal

import numpy as np
import torch

from .. import _core
from ..errors import NotFittedError
from ..streaming import OnlineEM as NumpyOnlineEM
from ..streaming import DEFAULT_NOISE_FLOOR, common_args, check_scaling, schedule_args
from ._em_engine import MAX_INPUT, EMEngine, Settings

#: Up to this many state values (D·K) a failed batch restores the model to its state before the batch (a
#: copy is kept), as the Rust core does; larger models keep the rows before the failing one.
SNAPSHOT_MAX_ELEMENTS = 1 << 18
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _state_dtype(dtype: object) -> torch.dtype:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be float64 or float32 (a name or a torch dtype), got {dtype!r}")
    return _DTYPES[name]


class OnlineEM:
    """Online EM factor analysis (the library's default :class:`onlinefa.OnlineEM`) on torch tensors.

    The same algorithm, arguments, defaults and checkpoints as :class:`onlinefa.OnlineEM`, with the D-sized
    state (θ̄, Ā, d̄², d) in ``dtype`` on ``device`` and the K×K algebra in float64 on the CPU: a snapshot
    already on the GPU is fitted there, without a copy to the host. In float64 it equals the Rust core to
    rounding (tested to 1e-10 relative over 1,000 samples). On the CPU the Rust core is faster; use this class
    for state that lives on an accelerator.

    Parameters
    ----------
    n_features, n_components, n_warmup, init, seed, noise_floor, whiten, schedule, tau0, kappa, rho, scaling
        As for :class:`onlinefa.OnlineEM`.
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Storage of the D-sized state.
    device : str or torch.device, default "cpu"
        Where the D-sized state lives (e.g. ``"cuda"``).

    Examples
    --------
    >>> import torch, onlinefa.torch
    >>> em = onlinefa.torch.OnlineEM(20, 3, seed=0).update(torch.randn(50, 20, dtype=torch.float64))
    >>> em.loadings.shape, em.n_seen
    (torch.Size([20, 3]), 50)
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
        device: str | torch.device = "cpu",
    ) -> None:
        state_dtype = _state_dtype(dtype)
        args = common_args(n_features, n_components, n_warmup, init, seed, noise_floor, "float64")
        sched = schedule_args(schedule, tau0, kappa, rho)
        d, k = args["n_features"], args["n_components"]
        init_loadings = args["init"]
        if init_loadings is None:
            seed_value = args["seed"]
            seed_value = int(np.random.default_rng().integers(2**63)) if seed_value is None else seed_value
            init_loadings = _core.orthonormal_init(d, k, seed_value)
        settings = Settings(d, k, args["n_warmup"], args["noise_floor"], bool(whiten), sched["schedule"],
                            sched["tau0"], sched["kappa"], sched["rho"], check_scaling(scaling))
        self._engine = EMEngine(settings, torch.as_tensor(init_loadings), state_dtype, torch.device(device))

    # -- updates ------------------------------------------------------------------------------------------
    def update(self, X: Any) -> "OnlineEM":
        """Apply one sample (shape (D,)) or the rows of an (n, D) batch, in order.

        Tensors on another device are moved to the model's. The whole batch is checked first (shape, NaN,
        infinity, magnitude): a bad batch raises ``ValueError`` and changes nothing. A numerical breakdown
        (:class:`onlinefa.NumericalBreakdownError`) leaves a model of at most ``SNAPSHOT_MAX_ELEMENTS`` state
        values as it was before the batch, and a larger one as it was before the failing row.
        """
        engine = self._engine
        batch = self._checked_batch(X)
        size = engine.settings.n_features * engine.settings.n_components
        backup = copy.deepcopy(engine) if size <= SNAPSHOT_MAX_ELEMENTS else None
        try:
            for row in batch:
                engine.step(row)
        except Exception:
            if backup is not None:
                self._engine = backup
            raise
        return self

    def _checked_batch(self, X: Any) -> torch.Tensor:
        """``X`` as an (n, D) floating tensor on the model's device; ValueError for a wrong shape, NaN, infinity
        or a value beyond the state dtype's range (naming the first bad row)."""
        engine = self._engine
        batch = torch.as_tensor(X).to(device=engine.device)
        if batch.ndim == 1:
            batch = batch[None, :]
        d = engine.settings.n_features
        if batch.ndim != 2 or batch.shape[1] != d:
            raise ValueError(f"X must have shape (n_samples, {d}) or ({d},), got {tuple(batch.shape)}")
        if not batch.is_floating_point():
            batch = batch.to(torch.float64)
        finite = torch.isfinite(batch).all(dim=1)
        too_large = (batch.abs() > MAX_INPUT[engine.dtype]).any(dim=1) & finite
        bad = (~finite | too_large).nonzero()
        if bad.numel():
            row = int(bad[0, 0])
            kind = "NaN or infinity" if not bool(finite[row]) else (
                f"a value with |x| > {MAX_INPUT[engine.dtype]:e} (the largest accepted with "
                f"{str(engine.dtype).removeprefix('torch.')} state)")
            raise ValueError(f"row {row} of X holds {kind}; nothing was applied")
        return batch

    # -- the fitted Gaussian ------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        """D."""
        return self._engine.settings.n_features

    @property
    def n_components(self) -> int:
        """K."""
        return self._engine.settings.n_components

    @property
    def n_seen(self) -> int:
        """Samples applied so far."""
        return self._engine.n_seen

    @property
    def n_warmup(self) -> int:
        """Samples during which F and ψ stay at their initial values (queries answer with a first fit)."""
        return self._engine.settings.n_warmup

    @property
    def is_fitted(self) -> bool:
        """Whether warm-up is over."""
        return self._engine.is_fitted

    @property
    def device(self) -> torch.device:
        """Where the D-sized state lives."""
        return self._engine.device

    @property
    def dtype(self) -> torch.dtype:
        """The D-sized state's dtype."""
        return self._engine.dtype

    def _answering(self) -> EMEngine:
        engine = self._engine
        if engine.is_fitted:
            return engine
        if engine.n_seen < 2 or engine.pending is None or (engine.settings.scaling == "data"
                                                           and engine.scale_sq <= 0):
            raise NotFittedError(
                f"OnlineEM has seen {engine.n_seen} samples: a first fit needs two samples that differ (the "
                f"fitted Gaussian then has rank at most n_seen − 1 until the warm-up of "
                f"{engine.settings.n_warmup} ends). Feed more samples.")
        return engine.ended_warmup()

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fitted Gaussian (mean c, loadings F, noise variances ψ) as float64 tensors on the device.

        Raises
        ------
        NotFittedError
            Before two distinct samples (during warm-up the first fit from the samples so far answers).
        """
        engine = self._answering()
        f, psi = engine.fitted_rows(engine.applied_a_bar())
        return engine.mean.to(torch.float64), f, psi

    @property
    def mean(self) -> torch.Tensor:
        """c = θ̄ (D,)."""
        return self.snapshot()[0]

    @property
    def loadings(self) -> torch.Tensor:
        """F (D, K)."""
        return self.snapshot()[1]

    @property
    def noise_variance(self) -> torch.Tensor:
        """ψ (D,)."""
        return self.snapshot()[2]

    def sample(self, n_samples: int = 1, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draws θ = c + F h + ψ^{1/2} ⊙ z (h, z standard normal) on the device, shape (n_samples, D)."""
        mean, f, psi = self.snapshot()
        h = torch.randn(n_samples, self.n_components, dtype=torch.float64, device=self.device, generator=generator)
        z = torch.randn(n_samples, self.n_features, dtype=torch.float64, device=self.device, generator=generator)
        return mean + h @ f.T + z * psi.sqrt()

    # -- checkpoints --------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of :class:`onlinefa.OnlineEM` (NumPy arrays and scalars): ``to_numpy`` and ``save``
        use it, and it loads into either class."""
        return self._engine.get_state()

    @classmethod
    def from_state(cls, state: dict[str, Any], *, device: str | torch.device = "cpu") -> "OnlineEM":
        """The model of a state map of either class; the Rust core validates it first (ValueError)."""
        checked = _core.OnlineEMCore.from_state(dict(state)).get_state()
        model = cls.__new__(cls)
        model._engine = EMEngine.from_state(checked, torch.device(device))
        return model

    def to_numpy(self) -> NumpyOnlineEM:
        """The same model as :class:`onlinefa.OnlineEM` (Rust core, host memory); updates continue alike."""
        model = NumpyOnlineEM.__new__(NumpyOnlineEM)
        model.__setstate__({"class": "OnlineEM", "state": self.get_state()})
        return model

    @classmethod
    def from_numpy(cls, model: NumpyOnlineEM, *, device: str | torch.device = "cpu") -> "OnlineEM":
        """The same model as a :class:`onlinefa.OnlineEM`, with its state moved to ``device``."""
        return cls.from_state(model.__getstate__()["state"], device=device)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a checkpoint that :func:`onlinefa.load` (an :class:`onlinefa.OnlineEM`) and :meth:`load` read."""
        self.to_numpy().save(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> "OnlineEM":
        """Read an :class:`onlinefa.OnlineEM` checkpoint onto ``device``."""
        return cls.from_numpy(NumpyOnlineEM.load(path), device=device)

    def __repr__(self) -> str:
        s = self._engine.settings
        return (f"onlinefa.torch.OnlineEM(n_features={s.n_features}, n_components={s.n_components}, "
                f"whiten={s.whiten}, schedule={s.schedule!r}, scaling={s.scaling!r}, n_warmup={s.n_warmup}, "
                f"dtype={str(self.dtype).removeprefix('torch.')!r}, device={str(self.device)!r}, n_seen={self.n_seen})")
