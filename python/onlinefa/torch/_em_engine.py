"""Online EM (Brownlie 2021, Algorithm 2, with the library's defaults) in torch operations, on any device.

The same exact update as the Rust core's ``OnlineEM``, and the same state, so that checkpoints move between the
two. Notation as there: θ̄ (``mean``), Ā (``a_bar``, D×K), d̄² (``dsq_bar``), B̄ (``b_bar``), Σ (``sigma``).
Per sample t, with ρ = ρ_t of the schedule and ρ' the running mean's step (1/t under ``scaling="data"``):

1. the previous sample's rank-one step, kept pending until now: Ā ← (Ā + ρ_{t−1} (d_{t−1} m_{t−1}ᵀ − Ā)) W, with W
   the whitening map of the last M-step (or I);
2. F and ψ of the current model: F₀ σ̂ and σ̂² during warm-up, else F = Ā H̄⁻¹ (Ā in the whitened basis) and
   ψ = max(d̄² − rowsum(F ⊙ Ā), floor) (4.33, 4.35);
3. e = θ_t − θ̄_{t−1}; θ̄_t = θ̄_{t−1} + ρ' e; d_t = e − ρ' e; d̄²_t = d̄²_{t−1} + ρ (d_t² − d̄²_{t−1}) (lines 5, 6, 14);
4. the E-step (4.23) from S = Fᵀ Ψ⁻¹ F and u = Fᵀ Ψ⁻¹ d: Σ = (I + S)⁻¹, m = Σ u (Cholesky of I + S);
5. B̄ ← B̄ + ρ (m mᵀ − B̄) (line 10) and, after warm-up, the M-step on H̄ = Σ + B̄ (lines 11, 13), with the
   whitening step R Rᵀ = H̄, B̄ ← R⁻¹ B̄ R⁻ᵀ, Σ ← R⁻¹ Σ R⁻ᵀ, W = R⁻ᵀ when ``whiten``.

Only S, u (K×K and K numbers) cross rows, so a step reads and writes the D-sized state once. A step whose K×K
algebra fails leaves the model as it was before the sample (the pending step, now applied, is dropped), as in the
Rust core. The K×K algebra runs in float64 on the CPU; the D-sized state stays on its device in its dtype.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from .. import _core
from ..errors import NumericalBreakdownError
from ._em_triton import available as fused_available
from ._em_triton import fused_pass
from ._kk_algebra import MAX_FINITE, MAX_INPUT, cpu64, eye64, relative_floor, spd_factor, spd_inverse, step_size

@dataclass
class Settings:
    """The hyper-parameters of one model (the checkpoint's configuration entries)."""

    n_features: int
    n_components: int
    n_warmup: int
    noise_floor: float
    whiten: bool
    schedule: str
    tau0: float
    kappa: float
    rho: float
    scaling: str
    shrink: bool = False

    def step_size(self, t: int) -> float:
        """ρ_t of the schedule (never below 1/t)."""
        return step_size(self.schedule, self.tau0, self.kappa, self.rho, t)

    def mean_step(self, rho: float, t: int) -> float:
        """Step of the running mean: 1/t under ``scaling="data"`` (θ_SWA), ρ_t under ``"unit"``."""
        return 1.0 / t if self.scaling == "data" else rho


@dataclass
class Pending:
    """The previous sample's rank-one step, applied by the next pass: Ā ← (Ā + ρ (d mᵀ − Ā)) W."""

    rho: float
    m: torch.Tensor  # (K,), float64 on the CPU
    transform: torch.Tensor | None  # W (K×K), float64 on the CPU


class EMEngine:
    """The state of one online EM model and its update, in torch tensors on ``device``."""

    def __init__(self, settings: Settings, init: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
        d, k = settings.n_features, settings.n_components
        self.settings, self.dtype, self.device = settings, dtype, device
        self.n_seen = 0
        self.mean = torch.zeros(d, dtype=dtype, device=device)
        self.a_bar = torch.zeros(d, k, dtype=dtype, device=device)
        self.dsq_bar = torch.zeros(d, dtype=dtype, device=device)
        self.d_last = torch.zeros(d, dtype=dtype, device=device)
        self.b_bar = torch.zeros(k, k, dtype=torch.float64)
        self.sigma = eye64(k)
        self.init_loadings: torch.Tensor | None = init.to(dtype=dtype, device=device)  # F₀ while warm-up lasts
        self.h_inv: torch.Tensor | None = None  # H̄⁻¹ (source "stats"); both None: whitened basis
        self.pending: Pending | None = None
        self.scale_sq = 0.0
        #: The sample's (θ̄, d̄², d) between local_sums and apply_sums.
        self._moments: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    # -- the model -------------------------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        return self.init_loadings is None

    def floor(self) -> float:
        """The noise floor: absolute under ``"unit"``, relative to σ̂² under ``"data"``."""
        s = self.settings
        return relative_floor(s.scaling, s.noise_floor, self.scale_sq, self.dtype)

    def warmup_scale(self) -> float:
        """σ of the warm-up start F₀ σ, ψ₀ = σ² (σ̂ under ``"data"`` once it is positive, else 1)."""
        return math.sqrt(self.scale_sq) if self.settings.scaling == "data" and self.scale_sq > 0 else 1.0

    def applied_a_bar(self) -> torch.Tensor:
        """Ā with the pending step applied (a new tensor in the state's dtype)."""
        a = self.a_bar.to(torch.float64)
        p = self.pending
        if p is not None:
            m = p.m.to(a.device)
            # (1 − ρ) a + ρ d mᵀ, one pass
            a = torch.addr(a, self.d_last.to(torch.float64), m, beta=1.0 - p.rho, alpha=p.rho)
            if p.transform is not None:
                a = a @ p.transform.to(a.device)
        return a.to(self.dtype)

    def fitted_rows(self, a_bar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(F, ψ) of the current model from Ā (pending step applied), in float64 on the device."""
        if self.init_loadings is not None:
            sigma = self.warmup_scale()
            f = self.init_loadings.to(torch.float64) * sigma
            return f, torch.full((f.shape[0],), sigma * sigma, dtype=torch.float64, device=f.device)
        a = a_bar.to(torch.float64)
        f = a if self.h_inv is None else a @ self.h_inv.to(a.device)
        psi = torch.clamp(self.dsq_bar.to(torch.float64) - torch.linalg.vecdot(f, a), min=self.floor())
        return f, psi

    def effective_samples(self) -> float:
        """Effective number of samples behind the running averages (the Rust core's computation)."""
        s = self.settings
        return float(_core.effective_samples(self.n_seen, s.schedule, s.tau0, s.kappa, s.rho))

    # -- one sample --------------------------------------------------------------------------------------
    def step(self, x: torch.Tensor) -> None:
        """Apply one sample (D values on the state's device, already validated)."""
        s_sum, u_sum, dsq_sum = self.local_sums(x)
        self.apply_sums(s_sum, u_sum, dsq_sum, self.settings.n_features)

    def local_sums(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """First half of a step: apply the pending step to Ā (the same model) and return this engine's rows'
        share of the cross-row sums for sample ``x``, (S, u, Σ d̄²) with S, u float64 on the CPU; the sample's
        moments wait for :meth:`apply_sums`. Rows split across processes add their sums (the sharded model)."""
        t = self.n_seen + 1
        rho = self.settings.step_size(t)
        mean_rho = self.settings.mean_step(rho, t)
        if self.init_loadings is None and fused_available(self.device, self.settings.n_components):
            # the same pass fused into one read and one write of the state (Triton)
            s_sum, u_sum, dsq_sum, self._moments = fused_pass(self, x, rho, mean_rho)
            self.pending = None
            return s_sum, u_sum, dsq_sum
        # 1. the pending step (the same model as before: its loadings and noise are unchanged by it)
        self.a_bar = self.applied_a_bar()
        self.pending = None
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
        return cpu64(y.T @ f), cpu64(y.T @ d), float(new_dsq.to(torch.float64).sum())

    def apply_sums(self, s_sum: torch.Tensor, u_sum: torch.Tensor, dsq_sum: float, n_total: int) -> None:
        """Second half of a step: the K×K step from the sums over all ``n_total`` rows, then the sample's moments
        are adopted. Nothing changes if the K×K step fails."""
        t = self.n_seen + 1
        moments, self._moments = self._moments, None
        if moments is None:
            raise RuntimeError("apply_sums needs the local_sums of the same sample first")
        self._finish(t, self.settings.step_size(t), s_sum, u_sum, dsq_sum / n_total)
        self.mean, self.dsq_bar, self.d_last = moments

    def _finish(self, t: int, rho: float, s_sum: torch.Tensor, u_sum: torch.Tensor, scale_sq: float) -> None:
        """The K×K part (lines 8–11, 13); nothing is stored unless it succeeds."""
        k = self.settings.n_components
        lower = spd_factor(eye64(k) + s_sum, "I + Fᵀ Ψ⁻¹ F")
        sigma = spd_inverse(lower)
        m = torch.cholesky_solve(u_sum[:, None], lower)[:, 0]
        if self.init_loadings is not None and self.settings.scaling == "data" and self.scale_sq <= 0:
            m = torch.zeros_like(m)  # no scale yet: the latent mean is not defined in the data's units
        limit = MAX_FINITE[self.dtype] / 4.0 / (2.0 * MAX_INPUT[self.dtype])
        if not bool((m.abs() <= limit).all()):
            raise NumericalBreakdownError("the latent mean of this sample is too large for the state's dtype; the sample "
                                 "lies far outside the scale of the data seen so far")
        b_bar = self.b_bar + (torch.outer(m, m) - self.b_bar) * rho
        if t > self.settings.n_warmup:
            transform = self.m_step(sigma, b_bar)
        else:
            self.b_bar, self.sigma, transform = b_bar, sigma, None
        self.pending = Pending(rho, m, transform)
        self.n_seen = t
        self.scale_sq = scale_sq

    def m_step(self, sigma: torch.Tensor, b_bar: torch.Tensor) -> torch.Tensor | None:
        """H̄ = Σ + B̄; F = Ā H̄⁻¹ (lazily, through ``h_inv``) or the whitening rotation; returns W for Ā."""
        lower = spd_factor(sigma + b_bar, "H̄ = Σ + B̄")
        self.init_loadings = None
        if not self.settings.whiten:
            self.h_inv, self.sigma, self.b_bar = spd_inverse(lower), sigma, b_bar
            return None
        r_inv = cast(torch.Tensor, torch.linalg.solve_triangular(lower, eye64(lower.shape[0]), upper=False))

        def moment(matrix: torch.Tensor) -> torch.Tensor:
            rotated = r_inv @ matrix @ r_inv.T
            return (rotated + rotated.T) * 0.5

        self.sigma, self.b_bar, self.h_inv = moment(sigma), moment(b_bar), None
        return r_inv.T.contiguous()

    def ended_warmup(self) -> "EMEngine":
        """A copy whose warm-up ended with the last sample (the first M-step on the statistics so far)."""
        ended = copy.deepcopy(self)
        ended.settings = dataclasses.replace(self.settings, n_warmup=self.n_seen - 1)
        transform = ended.m_step(self.sigma.clone(), self.b_bar.clone())
        if ended.pending is not None:
            ended.pending.transform = transform
        return ended

    # -- checkpoints (the Rust core's state map) ------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of the Rust core's ``OnlineEM`` (NumPy arrays and Python scalars)."""
        s = self.settings

        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = {
            "kind": "OnlineEM", "n_features": s.n_features, "n_components": s.n_components,
            "n_warmup": s.n_warmup, "noise_floor": s.noise_floor, "whiten": s.whiten,
            "schedule": s.schedule, "tau0": s.tau0 if s.schedule == "power" else 0.0,
            "kappa": s.kappa if s.schedule == "power" else 1.0, "rho": s.rho if s.schedule == "constant" else 1.0,
            "scaling": s.scaling, "shrink": s.shrink, "scale_sq": self.scale_sq, "n_seen": self.n_seen,
            "mean": host(self.mean), "a_bar": host(self.a_bar), "dsq_bar": host(self.dsq_bar),
            "d_last": host(self.d_last), "b_bar": host(self.b_bar), "sigma": host(self.sigma),
        }
        if self.init_loadings is not None:
            state.update(source="initial", init_loadings=host(self.init_loadings))
        elif self.h_inv is not None:
            state.update(source="stats", h_inv=host(self.h_inv))
        else:
            state["source"] = "whitened"
        if self.pending is not None:
            state.update(pending_rho=self.pending.rho, pending_m=host(self.pending.m))
            if self.pending.transform is not None:
                state["pending_transform"] = host(self.pending.transform)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "EMEngine":
        """The engine of a state map written by :meth:`get_state` or by the Rust core (validated there first)."""
        d, k = int(state["n_features"]), int(state["n_components"])
        settings = Settings(d, k, int(state["n_warmup"]), float(state["noise_floor"]), bool(state["whiten"]),
                            str(state["schedule"]), float(state["tau0"]), float(state["kappa"]),
                            float(state["rho"]), str(state["scaling"]), bool(state.get("shrink", False)))
        dtype = torch.float32 if np.asarray(state["a_bar"]).dtype == np.float32 else torch.float64
        init = state.get("init_loadings")
        engine = cls(settings, torch.zeros(d, k) if init is None else torch.as_tensor(init), dtype, device)
        engine.n_seen, engine.scale_sq = int(state["n_seen"]), float(state["scale_sq"])
        for name in ("mean", "a_bar", "dsq_bar", "d_last"):
            setattr(engine, name, torch.as_tensor(np.asarray(state[name])).to(dtype=dtype, device=device).clone())
        engine.b_bar = torch.as_tensor(np.asarray(state["b_bar"], dtype=np.float64)).clone()
        engine.sigma = torch.as_tensor(np.asarray(state["sigma"], dtype=np.float64)).clone()
        if state["source"] != "initial":
            engine.init_loadings = None
        if state["source"] == "stats":
            engine.h_inv = torch.as_tensor(np.asarray(state["h_inv"], dtype=np.float64)).clone()
        if "pending_m" in state:
            transform = state.get("pending_transform")
            engine.pending = Pending(float(state["pending_rho"]),
                                     torch.as_tensor(np.asarray(state["pending_m"], dtype=np.float64)).clone(),
                                     None if transform is None else
                                     torch.as_tensor(np.asarray(transform, dtype=np.float64)).clone())
        return engine
