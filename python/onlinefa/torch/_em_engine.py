"""Online EM (Brownlie 2021, Algorithm 2, with the library's defaults) with its rows in torch tensors on any device.

The model splits as the Rust core's does: the D-sized rows θ̄ (``mean``), Ā (``a_bar``, D×K), d̄² (``dsq_bar``) and
d (``d_last``) live here, on their device in their dtype; the K×K part (B̄, Σ, the basis of F, the pending step,
the schedule and the warm-up) is the Rust core's own step, ``_core.OnlineEMStep``, the same code the NumPy-facing
``onlinefa.OnlineEM`` runs. Per sample t, with ρ = ρ_t and ρ' the running mean's step from that step:

1. the previous sample's rank-one step, kept pending until now: Ā ← (Ā + ρ_{t−1} (d_{t−1} m_{t−1}ᵀ − Ā)) W, with W
   the whitening map of the last M-step (or I);
2. F and ψ of the current model: F₀ σ̂ and σ̂² during warm-up, else F = Ā H̄⁻¹ (Ā in the whitened basis) and
   ψ = max(d̄² − rowsum(F ⊙ Ā), floor) (4.33, 4.35);
3. e = θ_t − θ̄_{t−1}; θ̄_t = θ̄_{t−1} + ρ' e; d_t = e − ρ' e; d̄²_t = d̄²_{t−1} + ρ (d_t² − d̄²_{t−1}) (lines 5, 6, 14);
4. the sums S = Fᵀ Ψ⁻¹ F, u = Fᵀ Ψ⁻¹ d and Σ d̄²_t, handed to the step, which does the E-step (4.23), line 10 and
   the M-step (lines 11, 13) and keeps the next pending step.

Only S, u (K×K and K numbers) cross rows, so a step reads and writes the D-sized state once. A step whose K×K
algebra fails leaves the model as it was before the sample (the pending step, now applied, is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _core
from ._row_store import KkStepRows
from ._em_triton import available as fused_available
from ._em_triton import fused_pass

_ROWS = ("mean", "a_bar", "dsq_bar", "d_last")


@dataclass(frozen=True)
class Settings:
    """The hyper-parameters of one model, as ``repr`` and the base class read them."""

    n_features: int
    n_components: int
    n_warmup: int
    whiten: bool
    schedule: str
    scaling: str
    shrink: bool


@dataclass
class Pending:
    """The previous sample's rank-one step, applied by the next pass: Ā ← (Ā + ρ (d mᵀ − Ā)) W."""

    rho: float
    m: torch.Tensor  # (K,), float64 on the CPU
    transform: torch.Tensor | None  # W (K×K), float64 on the CPU


def new_step(n_features: int, n_components: int, dtype: torch.dtype, **config: Any) -> Any:
    """The Rust core's K×K step for rows of ``dtype`` (``config``: the OnlineEM hyper-parameters)."""
    return _core.OnlineEMStep(n_features, n_components, dtype=str(dtype).removeprefix("torch."), **config)


class EMEngine(KkStepRows):
    """The rows of one online EM model in torch tensors on ``device``, and its K×K step (Rust)."""

    _step_class = _core.OnlineEMStep

    def __init__(self, kk_step: Any, n_features: int, schedule: str, init: torch.Tensor | None,
                 dtype: torch.dtype, device: torch.device) -> None:
        d, k = n_features, int(kk_step.n_components)
        #: The K×K part: ``_core.OnlineEMStep``.
        self.kk_step, self.dtype, self.device = kk_step, dtype, device
        self.settings = Settings(d, k, int(kk_step.n_warmup), bool(kk_step.whiten), schedule, str(kk_step.scaling),
                                 bool(kk_step.shrink))
        self.mean = torch.zeros(d, dtype=dtype, device=device)
        self.a_bar = torch.zeros(d, k, dtype=dtype, device=device)
        self.dsq_bar = torch.zeros(d, dtype=dtype, device=device)
        self.d_last = torch.zeros(d, dtype=dtype, device=device)
        #: F₀ while warm-up lasts (None once the step has left the warm-up basis).
        self.init_loadings = None if init is None else init.to(dtype=dtype, device=device)
        #: The sample's (θ̄, d̄², d) between local_sums and apply_sums.
        self._moments: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def pending(self) -> Pending | None:
        """The step the next pass applies to Ā (float64 on the CPU), or None."""
        pending = self.kk_step.pending()
        if pending is None:
            return None
        rho, m, transform = pending
        return Pending(float(rho), torch.from_numpy(m), None if transform is None else torch.from_numpy(transform))

    @property
    def h_inv(self) -> torch.Tensor | None:
        """H̄⁻¹ (K×K, float64 on the CPU) when F = Ā H̄⁻¹; None in warm-up and in the whitened basis."""
        _, h_inv = self.kk_step.basis()
        return None if h_inv is None else torch.from_numpy(h_inv)

    def effective_samples(self) -> float:
        """Effective number of samples behind the running averages."""
        return float(self.kk_step.effective_samples)

    def applied_a_bar(self) -> torch.Tensor:
        """Ā with the pending step applied (a new tensor in the state's dtype)."""
        a = self.a_bar.to(torch.float64)
        p = self.pending
        if p is not None:
            # (1 − ρ) a + ρ d mᵀ, one pass
            a = torch.addr(a, self.d_last.to(torch.float64), p.m.to(a.device), beta=1.0 - p.rho, alpha=p.rho)
            if p.transform is not None:
                a = a @ p.transform.to(a.device)
        return a.to(self.dtype)

    def fitted_rows(self, a_bar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(F, ψ) of the current model from Ā (pending step applied), in float64 on the device."""
        if self.init_loadings is not None:
            sigma = float(self.kk_step.warmup_scale)
            f = self.init_loadings.to(torch.float64) * sigma
            return f, torch.full((f.shape[0],), sigma * sigma, dtype=torch.float64, device=f.device)
        a = a_bar.to(torch.float64)
        h_inv = self.h_inv
        f = a if h_inv is None else a @ h_inv.to(a.device)
        psi = torch.clamp(self.dsq_bar.to(torch.float64) - torch.linalg.vecdot(f, a), min=self.floor())
        return f, psi

    def ended_warmup(self) -> "EMEngine":
        """The model whose warm-up ended with the last sample (the first M-step on the statistics so far); it
        shares this model's rows (read only) and leaves this model unchanged."""
        ended = EMEngine.__new__(EMEngine)
        ended.__dict__.update(self.__dict__)
        ended.kk_step = self.kk_step.ended_warmup()
        ended.init_loadings = None
        return ended

    # -- one sample --------------------------------------------------------------------------------------
    def step(self, x: torch.Tensor) -> None:
        """Apply one sample (D values on the state's device, already validated)."""
        s_sum, u_sum, dsq_sum = self.local_sums(x)
        self.apply_sums(s_sum, u_sum, dsq_sum, self.settings.n_features)

    def local_sums(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """First half of a step: apply the pending step to Ā (the same model) and return this engine's rows'
        share of the cross-row sums for sample ``x``, (S, u, Σ d̄²) with S, u float64 on the CPU; the sample's
        moments wait for :meth:`apply_sums`. Rows split across processes add their sums (the sharded model)."""
        _, rho, mean_rho = self.kk_step.rates()
        if self.init_loadings is None and fused_available(self.device, self.settings.n_components):
            # the same pass fused into one read and one write of the state (Triton)
            s_sum, u_sum, dsq_sum, self._moments = fused_pass(self, x, rho, mean_rho)
            self.kk_step.drop_pending()
            return s_sum, u_sum, dsq_sum
        # 1. the pending step (the same model as before: its loadings and noise are unchanged by it)
        self.a_bar = self.applied_a_bar()
        self.kk_step.drop_pending()
        # 2.-3. F, ψ of the current model; this sample's moments (stored rounding, as the Rust core)
        f, psi = self.fitted_rows(self.a_bar)
        e = (x.to(torch.float64) - self.mean.to(torch.float64)).to(self.dtype).to(torch.float64)
        step = mean_rho * e
        new_mean = (self.mean.to(torch.float64) + step).to(self.dtype)
        d_exact = e - step
        d = d_exact.to(self.dtype).to(torch.float64)  # the stored d_t, which the E-step also uses
        dsq0 = self.dsq_bar.to(torch.float64)
        new_dsq = (dsq0 + rho * (d_exact * d_exact - dsq0)).to(self.dtype)
        # 4. the E-step sums (K×K and K, the only cross-row quantities)
        y = f * psi.reciprocal()[:, None]
        self._moments = (new_mean, new_dsq, d.to(self.dtype))
        return _host(y.T @ f), _host(y.T @ d), float(new_dsq.to(torch.float64).sum())

    def apply_sums(self, s_sum: torch.Tensor, u_sum: torch.Tensor, dsq_sum: float, n_total: int) -> None:
        """Second half of a step: the K×K step from the sums over all ``n_total`` rows, then the sample's moments
        are adopted. Nothing changes if the K×K step fails (``NumericalBreakdownError``)."""
        moments, self._moments = self._moments, None
        if moments is None:
            raise RuntimeError("apply_sums needs the local_sums of the same sample first")
        self.kk_step.apply(_host(s_sum).numpy(), _host(u_sum).numpy(), float(dsq_sum), int(n_total))
        self.mean, self.dsq_bar, self.d_last = moments
        if self.init_loadings is not None and self.kk_step.is_fitted:
            self.init_loadings = None

    # -- checkpoints (the Rust core's state map) ------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of the Rust core's ``OnlineEM`` (NumPy arrays and Python scalars)."""

        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = dict(self.kk_step.get_state())
        state["n_features"] = self.settings.n_features
        state.update({name: host(getattr(self, name)) for name in _ROWS})
        if self.init_loadings is not None:
            state["init_loadings"] = host(self.init_loadings)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "EMEngine":
        """The engine of a state map written by :meth:`get_state` or by the Rust core (validated there first)."""
        d = int(state["n_features"])
        dtype = torch.float32 if np.asarray(state["a_bar"]).dtype == np.float32 else torch.float64
        kk_step = _core.OnlineEMStep.from_state(dict(state), d, str(dtype).removeprefix("torch."))
        init = state.get("init_loadings")
        engine = cls(kk_step, d, str(state["schedule"]), None if init is None else torch.as_tensor(init), dtype,
                     device)
        for name in _ROWS:
            setattr(engine, name, torch.as_tensor(np.asarray(state[name])).to(dtype=dtype, device=device).clone())
        return engine


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as contiguous float64 on the CPU, where the K×K step runs."""
    return tensor.to(dtype=torch.float64, device="cpu").contiguous()
