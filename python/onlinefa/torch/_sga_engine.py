"""Online SGA (Brownlie 2021, Algorithm 1, with the library's defaults) in torch operations, on any device.

The same update as the Rust core's ``OnlineSGA`` and the same state (θ̄ ``mean``, F ``loadings``, ψ ``psi``, the
last deviation ``d_last``; the pending step's m and P = Σ + m mᵀ), so that checkpoints move between the two.
Per sample t, with ρ' the running mean's step (1/t under ``scaling="data"``) and α = ``lr``:

* warm-up (t ≤ n_warmup): θ̄ ← θ̄ + ρ' (x − θ̄), d = x − θ̄ (lines 5, 6); under ``"data"`` ψ's storage holds
  the running d̄² ← d̄² + ρ' (d² − d̄²), and σ̂² = mean(d̄²) sets the start;
* after it, one pass per row: on the first pass of a data-scaled run the start F ← σ̂ F₀, ψ ← max(d̄², floor);
  then the previous sample's gradient step with d' = d_last (lines 10–14, (4.24)–(4.26))::

      g = f P,   ∇β = ½ ψ⁻¹ (d'² − 2 d' f·m + g·f) − ½
      f ← clip(f + α s (d' m − g)),   s = ψ⁻¹, or 1 when preconditioned by ψ (``"data"``)
      ψ ← clip(ψ · exp(clip(α ∇β)), floor, MAX_STATE)

  then θ̄ and d as in warm-up, and the E-step sums S = Σ_rows f fᵀ/ψ, u = Σ_rows f d/ψ (the only cross-row
  quantities, K×K and K);
* the E-step (4.23): Σ = (I + S)⁻¹, m = Σ u, P = Σ + m mᵀ, applied by the next pass.

Under the whitened rule (``lr="auto"``, ``rule="whitened"``) the step of sample t takes a = 1/t,
a_F = min(a, 1/(1 + m·m)) as α, then f ← clip(f L) with L Lᵀ = (1 − a_F) I + a_F P, and ψ ← ψ + a (q − ψ) with
q = d'² − 2 d' f·m + g·f instead of the exp step (a step that cannot diverge, so it is not checked).

The K×K part (the E-step, the rule's step sizes, the warm-up, σ̂² and the pending step) is the Rust core's own
step, ``_core.OnlineSGAStep``, run in float64 on the CPU on the pass's sums; the D-sized state stays on its device
in its dtype. The row step is
computed in float64 and rounded to the state's dtype once (the Rust core's float32 kernel uses an equivalent
residual form in float32 arithmetic; both stay within float32's rounding of the float64 model). A step that fails
changes nothing: the new rows are adopted only after the step succeeded. On CUDA with Triton importable
(K ≤ 16) the pass after the start runs as one fused kernel (``_sga_triton``), the same arithmetic in the state's
dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _core
from ..errors import NumericalBreakdownError
from ._row_store import KkStepRows
from ._sga_triton import available as fused_available
from ._sga_triton import fused_pass
from ._kk_algebra import MAX_STATE, cpu64, loading_bound, stored

#: ψ growing more than this factor past both its previous value and d'² in one step is a diverged step.
MAX_PSI_OVERSHOOT = 1e6
#: Bound of α ∇β under ``"data"`` (ψ moves by at most a factor e per sample); ``"unit"`` caps it at 700.
MAX_LOG_PSI_STEP = 1.0
_ROWS = ("mean", "loadings", "psi", "d_last")


@dataclass(frozen=True)
class SGASettings:
    """The hyper-parameters of one model, as ``repr`` and the base class read them."""

    n_features: int
    n_components: int
    n_warmup: int
    lr: float
    schedule: str
    scaling: str
    #: "gradient" (constant ``lr``) or "whitened" (steps of 1/t; ``lr`` unused).
    rule: str = "gradient"


@dataclass
class SGAStep:
    """The previous sample's gradient step: m (K) and P = Σ + m mᵀ (K×K), float64 on the CPU, with its step
    sizes: the F step's, the natural ψ step's (None: the log-ψ step) and the whitening factor L (K×K)."""

    m: torch.Tensor
    p: torch.Tensor
    f_rate: float
    psi_rate: float | None = None
    whiten: torch.Tensor | None = None


def new_step(n_features: int, n_components: int, dtype: torch.dtype, **config: Any) -> Any:
    """The Rust core's K×K step for rows of ``dtype`` (``config``: the OnlineSGA hyper-parameters)."""
    return _core.OnlineSGAStep(n_features, n_components, dtype=str(dtype).removeprefix("torch."), **config)


def _bounded(values: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``values`` kept in [lo, hi], NaN (an overflowing step) sent to ``hi``, as the Rust core."""
    return torch.nan_to_num(values, nan=hi).clamp(min=lo, max=hi)


class SGAEngine(KkStepRows):
    """The rows of one online SGA model in torch tensors on ``device``, and its K×K step (Rust)."""

    _step_class = _core.OnlineSGAStep

    def __init__(self, kk_step: Any, n_features: int, schedule: str, init: torch.Tensor, dtype: torch.dtype,
                 device: torch.device) -> None:
        d = n_features
        #: The K×K part: ``_core.OnlineSGAStep``.
        self.kk_step, self.dtype, self.device = kk_step, dtype, device
        self.settings = SGASettings(d, int(kk_step.n_components), int(kk_step.n_warmup), float(kk_step.lr),
                                    schedule, str(kk_step.scaling), str(kk_step.rule))
        self.mean = torch.zeros(d, dtype=dtype, device=device)
        self.loadings = init.to(dtype=dtype, device=device).clone()
        self.psi = torch.ones(d, dtype=dtype, device=device)
        self.d_last = torch.zeros(d, dtype=dtype, device=device)
        #: This sample's new D-sized state and whether it is active, between local_sums and apply_sums.
        self._next: tuple[bool, dict[str, torch.Tensor]] | None = None

    @property
    def pending(self) -> SGAStep | None:
        """The step the next pass applies (float64 on the CPU), or None."""
        pending = self.kk_step.pending()
        if pending is None:
            return None
        m, p, whiten = pending
        _, _, _, _, f_rate, psi_rate = self.kk_step.plan()
        return SGAStep(torch.from_numpy(m), torch.from_numpy(p), float(f_rate), psi_rate,
                       None if whiten is None else torch.from_numpy(whiten))

    # -- the row-local part of a pass ------------------------------------------------------------------------
    def current_rows(self, start: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(F, ψ) with the start (when ``start``) and the pending step applied, stored values as float64, and
        whether the step diverged (a ψ growing more than ``MAX_PSI_OVERSHOOT``-fold past its scale)."""
        pending = self.pending
        f = self.loadings.to(torch.float64)
        psi = self.psi.to(torch.float64)
        if start:
            if self.scale_sq <= 0:
                psi = torch.ones_like(psi)  # no scale at all: F₀ kept, ψ = 1
            else:
                f = stored(f * math.sqrt(self.scale_sq), self.dtype)
                psi = stored(psi.clamp(min=self.floor()), self.dtype)
        if pending is None:
            return f, psi, False
        return self._gradient_step(f, psi, pending)

    def _gradient_step(self, f: torch.Tensor, psi: torch.Tensor,
                       pending: SGAStep) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Lines 10–14 with the pending m, P and d' = d_last; also whether a ψ step diverged."""
        s, lr, floor = self.settings, pending.f_rate, self.floor()
        precondition = s.scaling == "data"
        m = pending.m.to(f.device)
        p = pending.p.to(f.device)
        d = self.d_last.to(torch.float64)
        g = f @ p
        q = d * d - 2.0 * d * (f @ m) + torch.linalg.vecdot(g, f)
        inv_psi = psi.reciprocal()
        log_step = lr * (0.5 * inv_psi * q - 0.5)
        if precondition:
            log_step = log_step.clamp(-MAX_LOG_PSI_STEP, MAX_LOG_PSI_STEP)
        else:
            log_step = torch.nan_to_num(log_step, nan=700.0).clamp(max=700.0)
        grad = torch.outer(d, m) - g
        if not precondition:
            grad = grad * inv_psi[:, None]
        hi = MAX_STATE[self.dtype]
        new_f = _bounded(f + lr * grad, -hi, hi)
        if pending.whiten is not None:
            new_f = _bounded(new_f @ pending.whiten.to(f.device), -hi, hi)
        new_f = stored(new_f, self.dtype)
        if pending.psi_rate is not None:
            # ψ + a (q − ψ) lies between ψ and q ≥ 0: it cannot diverge, so it is not checked.
            new_psi = stored(_bounded(psi + pending.psi_rate * (q - psi), floor, hi), self.dtype)
            return self._bound_loadings(new_f, new_psi), new_psi, False
        new_psi = stored(_bounded(psi * torch.exp(log_step), floor, hi), self.dtype)
        diverged = bool((new_psi > MAX_PSI_OVERSHOOT * torch.maximum(psi, d * d)).any())
        return self._bound_loadings(new_f, new_psi), new_psi, diverged

    def _bound_loadings(self, f: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
        """f ← clip(f, ±min(MAX_STATE, √(MAX_LOADING_RATIO · ψ))) with the new ψ: Fᵀ Ψ⁻¹ F stays finite."""
        bound = loading_bound(psi, self.dtype)[:, None]
        return stored(torch.minimum(torch.maximum(f.to(torch.float64), -bound), bound), self.dtype)

    def _log_step_bounds(self) -> tuple[float, float]:
        """(lower, upper) bound of the log-ψ step α ∇β: ±1 under ``"data"``; under ``"unit"`` only the upper
        bound 700 (NaN is sent to it)."""
        if self.settings.scaling == "data":
            return -MAX_LOG_PSI_STEP, MAX_LOG_PSI_STEP
        return -math.inf, 700.0

    def _moments(self, x: torch.Tensor, rho: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(θ̄_t stored, d_t = x − θ̄_t in float64) of this sample (lines 5, 6)."""
        m0 = self.mean.to(torch.float64)
        new_mean = (m0 + rho * (x.to(torch.float64) - m0)).to(self.dtype)
        return new_mean, x.to(torch.float64) - new_mean.to(torch.float64)

    # -- one sample --------------------------------------------------------------------------------------
    def step(self, x: torch.Tensor) -> None:
        """Apply one sample (D values on the state's device, already validated)."""
        s_sum, u_sum, scalar = self.local_sums(x)
        self.apply_sums(s_sum, u_sum, scalar, self.settings.n_features)

    def local_sums(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """First half of a step: this engine's rows' share of the cross-row sums for sample ``x``, (S, u, Σ d̄²)
        with S, u float64 on the CPU (Σ d̄² only during a data-scaled warm-up); the new row state waits for
        :meth:`apply_sums`. Rows split across processes add their sums (the sharded model)."""
        k = self.settings.n_components
        _, rho, fitting, start, _, _ = self.kk_step.plan()
        if fitting and not start and self.kk_step.pending() is not None and fused_available(self.device, k):
            # the same pass fused into one read of the state and one write of the new rows (Triton)
            s_sum, u_sum, diverged, fused_state = fused_pass(self, x, rho, self.floor(), MAX_STATE[self.dtype],
                                                             self._log_step_bounds())
            if diverged:
                raise _diverged()
            self._next = (True, fused_state)
            return s_sum, u_sum, 0.0
        new_mean, d = self._moments(x, rho)
        if not fitting:
            state = {"mean": new_mean, "d_last": d.to(self.dtype)}
            dsq_sum = 0.0
            if self.settings.scaling == "data":
                v0 = self.psi.to(torch.float64)
                state["psi"] = (v0 + rho * (d * d - v0)).to(self.dtype)
                dsq_sum = float(state["psi"].to(torch.float64).sum())
            self._next = (False, state)
            return torch.zeros(k, k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64), dsq_sum
        f, psi, diverged = self.current_rows(start)
        if diverged:
            raise _diverged()
        d_stored = stored(d, self.dtype)
        y = f * psi.reciprocal()[:, None]
        self._next = (True, {"mean": new_mean, "d_last": d_stored.to(self.dtype), "loadings": f.to(self.dtype),
                             "psi": psi.to(self.dtype)})
        return cpu64(y.T @ f), cpu64(y.T @ d_stored), 0.0

    def apply_sums(self, s_sum: torch.Tensor, u_sum: torch.Tensor, dsq_sum: float, n_total: int) -> None:
        """Second half of a step: the K×K step (the E-step (4.23) after warm-up) from the sums over all ``n_total``
        rows, then the sample's new row state is adopted. Nothing changes if the step fails."""
        pending, self._next = self._next, None
        if pending is None:
            raise RuntimeError("apply_sums needs the local_sums of the same sample first")
        _, state = pending
        self.kk_step.apply(cpu64(s_sum).contiguous().numpy(), cpu64(u_sum).contiguous().numpy(), float(dsq_sum),
                           int(n_total))
        for name, value in state.items():
            setattr(self, name, value)

    # -- checkpoints (the Rust core's state map) ------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of the Rust core's ``OnlineSGA`` (NumPy arrays and Python scalars)."""

        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = dict(self.kk_step.get_state())
        state["n_features"] = self.settings.n_features
        state.update({name: host(getattr(self, name)) for name in _ROWS})
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "SGAEngine":
        """The engine of a state map written by :meth:`get_state` or by the Rust core (validated there first)."""
        d = int(state["n_features"])
        dtype = torch.float32 if np.asarray(state["loadings"]).dtype == np.float32 else torch.float64
        kk_step = _core.OnlineSGAStep.from_state(dict(state), d, str(dtype).removeprefix("torch."))
        engine = cls(kk_step, d, str(state["schedule"]), torch.as_tensor(np.asarray(state["loadings"])), dtype,
                     device)
        for name in _ROWS:
            setattr(engine, name, torch.as_tensor(np.asarray(state[name])).to(dtype=dtype, device=device).clone())
        return engine


def _diverged() -> NumericalBreakdownError:
    return NumericalBreakdownError(
        "the SGA step diverged (a noise variance grew more than 10^6-fold past the data's scale in one step); "
        "lower lr or use scaling='data'")
