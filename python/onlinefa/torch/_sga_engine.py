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

The K×K algebra runs in float64 on the CPU; the D-sized state stays on its device in its dtype. The row step is
computed in float64 and rounded to the state's dtype once (the Rust core's float32 kernel uses an equivalent
residual form in float32 arithmetic; both stay within float32's rounding of the float64 model). A step that fails
changes nothing: the new state is adopted only after the E-step succeeded. On CUDA with Triton importable
(K ≤ 16) the pass after the start runs as one fused kernel (``_sga_triton``), the same arithmetic in the state's
dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import NumericalBreakdownError
from ._sga_triton import available as fused_available
from ._sga_triton import fused_pass
from ._kk_algebra import MAX_STATE, cpu64, eye64, loading_bound, relative_floor, spd_factor, spd_inverse, step_size, stored

#: ψ growing more than this factor past both its previous value and d'² in one step is a diverged step.
MAX_PSI_OVERSHOOT = 1e6
#: Bound of α ∇β under ``"data"`` (ψ moves by at most a factor e per sample); ``"unit"`` caps it at 700.
MAX_LOG_PSI_STEP = 1.0
#: Largest latent second moment a step accepts (its products with the loadings stay finite in float64).
MAX_LATENT_MOMENT = 1e150


@dataclass
class SGASettings:
    """The hyper-parameters of one model (the checkpoint's configuration entries)."""

    n_features: int
    n_components: int
    n_warmup: int
    noise_floor: float
    lr: float
    schedule: str
    tau0: float
    kappa: float
    rho: float
    scaling: str
    #: "gradient" (constant ``lr``) or "whitened" (steps of 1/t; ``lr`` unused).
    rule: str = "gradient"

    def mean_step(self, t: int) -> float:
        """Step of the running mean: 1/t under ``scaling="data"``, the schedule's ρ_t under ``"unit"``."""
        if self.scaling == "data":
            return 1.0 / t
        return step_size(self.schedule, self.tau0, self.kappa, self.rho, t)


@dataclass
class SGAStep:
    """The previous sample's gradient step: m (K) and P = Σ + m mᵀ (K×K), float64 on the CPU, with its step
    sizes: the F step's, the natural ψ step's (None: the log-ψ step) and the whitening factor L (K×K)."""

    m: torch.Tensor
    p: torch.Tensor
    f_rate: float
    psi_rate: float | None = None
    whiten: torch.Tensor | None = None


def step_rates(settings: SGASettings, m: torch.Tensor, p: torch.Tensor, t: int) -> SGAStep:
    """Sample t's step (m, P) with the rule's step sizes (as the Rust core's ``StepRates``)."""
    if settings.rule != "whitened":
        return SGAStep(m, p, settings.lr)
    a = 1.0 / t
    a_f = min(a, 1.0 / (1.0 + float(m @ m)))
    target = a_f * p + (1.0 - a_f) * eye64(p.shape[0])
    return SGAStep(m, p, a_f, a, spd_factor(target, "the whitening step (1 − a) I + a P"))


def _bounded(values: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``values`` kept in [lo, hi], NaN (an overflowing step) sent to ``hi``, as the Rust core."""
    return torch.nan_to_num(values, nan=hi).clamp(min=lo, max=hi)


class SGAEngine:
    """The state of one online SGA model and its update, in torch tensors on ``device``."""

    def __init__(self, settings: SGASettings, init: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        d = settings.n_features
        self.settings, self.dtype, self.device = settings, dtype, device
        self.n_seen = 0
        self.mean = torch.zeros(d, dtype=dtype, device=device)
        self.loadings = init.to(dtype=dtype, device=device).clone()
        self.psi = torch.ones(d, dtype=dtype, device=device)
        self.d_last = torch.zeros(d, dtype=dtype, device=device)
        self.pending: SGAStep | None = None
        self.scale_sq = 0.0
        #: This sample's new D-sized state and whether it is active, between local_sums and apply_sums.
        self._next: tuple[bool, dict[str, torch.Tensor]] | None = None

    @property
    def is_fitted(self) -> bool:
        return self.n_seen > self.settings.n_warmup

    def floor(self) -> float:
        """The noise floor: absolute under ``"unit"``, relative to σ̂² under ``"data"``."""
        s = self.settings
        return relative_floor(s.scaling, s.noise_floor, self.scale_sq, self.dtype)

    # -- the row-local part of a pass ------------------------------------------------------------------------
    def current_rows(self, start: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(F, ψ) with the start (when ``start``) and the pending step applied, stored values as float64, and
        whether the step diverged (a ψ growing more than ``MAX_PSI_OVERSHOOT``-fold past its scale)."""
        f = self.loadings.to(torch.float64)
        psi = self.psi.to(torch.float64)
        if start:
            if self.scale_sq <= 0:
                psi = torch.ones_like(psi)  # no scale at all: F₀ kept, ψ = 1
            else:
                f = stored(f * math.sqrt(self.scale_sq), self.dtype)
                psi = stored(psi.clamp(min=self.floor()), self.dtype)
        if self.pending is None:
            return f, psi, False
        return self._gradient_step(f, psi)

    def _gradient_step(self, f: torch.Tensor, psi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Lines 10–14 with the pending m, P and d' = d_last; also whether a ψ step diverged."""
        assert self.pending is not None
        s, lr, floor = self.settings, self.pending.f_rate, self.floor()
        precondition = s.scaling == "data"
        m = self.pending.m.to(f.device)
        p = self.pending.p.to(f.device)
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
        if self.pending.whiten is not None:
            new_f = _bounded(new_f @ self.pending.whiten.to(f.device), -hi, hi)
        new_f = stored(new_f, self.dtype)
        if self.pending.psi_rate is not None:
            # ψ + a (q − ψ) lies between ψ and q ≥ 0: it cannot diverge, so it is not checked.
            new_psi = stored(_bounded(psi + self.pending.psi_rate * (q - psi), floor, hi), self.dtype)
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
        t = self.n_seen + 1
        k = self.settings.n_components
        rho = self.settings.mean_step(t)
        fitting = t > self.settings.n_warmup
        start = fitting and self.settings.scaling == "data" and t == self.settings.n_warmup + 1
        if fitting and not start and self.pending is not None and fused_available(self.device, k):
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
        """Second half of a step: the E-step (4.23) from the sums over all ``n_total`` rows, then the sample's new
        row state is adopted. Nothing changes if the E-step fails."""
        pending, self._next = self._next, None
        if pending is None:
            raise RuntimeError("apply_sums needs the local_sums of the same sample first")
        active, state = pending
        step = _estep(s_sum, u_sum, self.settings, self.n_seen + 1) if active else None
        for name, value in state.items():
            setattr(self, name, value)
        self.pending = step
        if not active and self.settings.scaling == "data":
            self.scale_sq = dsq_sum / n_total
        self.n_seen += 1

    # -- checkpoints (the Rust core's state map) ------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of the Rust core's ``OnlineSGA`` (NumPy arrays and Python scalars)."""
        s = self.settings

        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = {
            "kind": "OnlineSGA", "n_features": s.n_features, "n_components": s.n_components,
            "n_warmup": s.n_warmup, "noise_floor": s.noise_floor, "lr": s.lr, "schedule": s.schedule,
            "tau0": s.tau0 if s.schedule == "power" else 0.0, "kappa": s.kappa if s.schedule == "power" else 1.0,
            "rho": s.rho if s.schedule == "constant" else 1.0, "scaling": s.scaling, "scale_sq": self.scale_sq,
            "rule": s.rule,
            "n_seen": self.n_seen, "mean": host(self.mean), "loadings": host(self.loadings), "psi": host(self.psi),
            "d_last": host(self.d_last),
        }
        if self.pending is not None:
            state.update(pending_m=host(self.pending.m), pending_p=host(self.pending.p))
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "SGAEngine":
        """The engine of a state map written by :meth:`get_state` or by the Rust core (validated there first)."""
        settings = SGASettings(int(state["n_features"]), int(state["n_components"]), int(state["n_warmup"]),
                               float(state["noise_floor"]), float(state["lr"]), str(state["schedule"]),
                               float(state["tau0"]), float(state["kappa"]), float(state["rho"]),
                               str(state["scaling"]), str(state.get("rule", "gradient")))
        dtype = torch.float32 if np.asarray(state["loadings"]).dtype == np.float32 else torch.float64
        engine = cls(settings, torch.as_tensor(np.asarray(state["loadings"])), dtype, device)
        engine.n_seen, engine.scale_sq = int(state["n_seen"]), float(state["scale_sq"])
        for name in ("mean", "psi", "d_last"):
            setattr(engine, name, torch.as_tensor(np.asarray(state[name])).to(dtype=dtype, device=device).clone())
        if "pending_m" in state:
            engine.pending = step_rates(settings,
                                        torch.as_tensor(np.asarray(state["pending_m"], dtype=np.float64)).clone(),
                                        torch.as_tensor(np.asarray(state["pending_p"], dtype=np.float64)).clone(),
                                        engine.n_seen)
        return engine


def _diverged() -> NumericalBreakdownError:
    return NumericalBreakdownError(
        "the SGA step diverged (a noise variance grew more than 10^6-fold past the data's scale in one step); "
        "lower lr or use scaling='data'")


def _estep(s_sum: torch.Tensor, u_sum: torch.Tensor, settings: SGASettings, t: int) -> SGAStep:
    """(4.23) from the sums of sample t: Σ = (I + S)⁻¹, m = Σ u, and P = Σ + m mᵀ for the next step."""
    lower = spd_factor(eye64(s_sum.shape[0]) + s_sum, "I + Fᵀ Ψ⁻¹ F")
    m = torch.cholesky_solve(u_sum[:, None], lower)[:, 0]
    p = spd_inverse(lower) + torch.outer(m, m)
    if not bool(torch.isfinite(p).all()) or float(p.abs().max()) > MAX_LATENT_MOMENT or \
            float(m.abs().max()) > MAX_LATENT_MOMENT:
        raise NumericalBreakdownError("the latent second moment Σ + m mᵀ (a divergent SGA step) is not positive "
                                      "definite: the model diverged; restore a checkpoint")
    return step_rates(settings, m, p, t)
