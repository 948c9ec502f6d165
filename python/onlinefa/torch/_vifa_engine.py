"""VIFA (Brownlie 2021, §4.3 and Algorithm 3) in torch operations, on any device.

The same step as the Rust core's ``VIFA`` and the same state (c ``mean``, F ``loadings``, β = log ψ
``log_noise``, Adam's moments, the counters), so that checkpoints move between the two. With A = Ψ⁻¹ F,
B = Fᵀ Ψ⁻¹ F, C = A (I + B)⁻¹ and the L pending draws θ_l = F h_l + c + ψ^{1/2} ⊙ z_l with gradients g_l of the
full-data negative log-likelihood (ḡ, the means over l of g_l h_lᵀ and g_l ⊙ z_l)::

    ∇c = α c + ḡ                                             (4.42, 4.47, 4.51; line 9)
    ∇F = −C + α F + mean_l g_l h_lᵀ                          (4.55, 4.48, 4.52; lines 12–14)
    ∇β = −½ + ½ ψ ⊙ rowsum(C ⊙ A) + ½ α ψ + ½ ψ^{1/2} ⊙ mean_l g_l ⊙ z_l   (4.59–4.61; lines 15–16)

then, per group (c, F, β) with the optional clipping factor s = min(1, max/‖∇‖), SGD p ← p − η s ∇ or Adam
(β₁ = 0.9, β₂ = 0.999, ε = 1e-8, bias-corrected; moments rounded to the state's dtype), and (I + B)⁻¹ of the new
parameters for the next step. The draws' noise comes from torch generators on the state's device keyed by (seed,
draw index), so a model's random stream depends only on its seed and counters; it is not the Rust core's stream.

Arithmetic in float64 on the device, rounded to the state's dtype once per stored value; the K×K algebra in
float64 on the CPU. A step that fails (non-finite or |β| > 700 after it) changes nothing. On CUDA with Triton
importable (K ≤ 16) the step runs as fused kernels (``_vifa_triton``), the same arithmetic in the state's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import NumericalBreakdownError
from ._kk_algebra import ADAM_BETA1, ADAM_BETA2, ADAM_EPS, cpu64, eye64, spd_inverse
from ._vifa_triton import available as fused_available
from ._vifa_triton import fused_norms, fused_step

#: Largest |β| a step may produce (ψ = exp β within [1e-304, 1e304]).
LOG_NOISE_LIMIT = 700.0
GROUPS = ("mean", "loadings", "log_noise")


@dataclass
class VIFASettings:
    """The hyper-parameters of one model (the checkpoint's configuration entries)."""

    n_features: int
    n_components: int
    prior_precision: float
    lr: tuple[float, float, float]
    optimizer: str
    n_grad_samples: int
    clip_grad_norm: float | None


def _noise_seed(seed: int, draw: int, stream: int) -> int:
    """Seed of the generator of draw ``draw``: stream 0 gives h, stream 1 + r the z of rows from global row r."""
    return int(np.random.SeedSequence([seed, draw, stream]).generate_state(1, np.uint64)[0])


def precision_inverse(gram: torch.Tensor) -> torch.Tensor:
    """(I + B)⁻¹ (K×K, float64 on the CPU); NumericalBreakdownError if I + B does not factorise."""
    lower, info = torch.linalg.cholesky_ex(eye64(gram.shape[0]) + gram)
    if int(info) != 0 or not bool(torch.isfinite(gram).all()):
        raise NumericalBreakdownError("I + Fᵀ Ψ⁻¹ F is not positive definite (the VIFA parameters are no longer "
                                      "finite: lower the learning rates or set clip_grad_norm)")
    return spd_inverse(lower)


def _non_finite() -> NumericalBreakdownError:
    return NumericalBreakdownError("the VIFA step made a parameter non-finite (or |log ψ| > 700): lower the learning "
                                   "rates or set clip_grad_norm; the model is as before the step")


class VIFAEngine:
    """The state of one VIFA model and its step, in torch tensors on ``device``."""

    def __init__(self, settings: VIFASettings, seed: int, dtype: torch.dtype, device: torch.device) -> None:
        d, k = settings.n_features, settings.n_components
        self.settings, self.seed, self.dtype, self.device = settings, seed, dtype, device
        self.n_draws = self.n_steps = 0
        self.row_offset = 0
        self.params = {"mean": torch.zeros(d, dtype=dtype, device=device),
                       "loadings": torch.zeros(d, k, dtype=dtype, device=device),
                       "log_noise": torch.zeros(d, dtype=dtype, device=device)}
        self.moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        if settings.optimizer == "adam":
            self.moments = ({g: torch.zeros_like(v) for g, v in self.params.items()},
                            {g: torch.zeros_like(v) for g, v in self.params.items()})
        #: The pending draws' noise: h (K, float64 on the CPU) and z (D, float64 on the device).
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.m_inv = eye64(k)

    @property
    def n_pending(self) -> int:
        return len(self.pending)

    # -- the parameters --------------------------------------------------------------------------------
    def rows64(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(c, F, ψ^{1/2}, ψ) of the stored parameters in float64 on the device."""
        c = self.params["mean"].to(torch.float64)
        f = self.params["loadings"].to(torch.float64)
        sqrt_psi = torch.exp(0.5 * self.params["log_noise"].to(torch.float64))
        return c, f, sqrt_psi, sqrt_psi * sqrt_psi

    def gram(self) -> torch.Tensor:
        """B = Fᵀ Ψ⁻¹ F of the stored parameters (this engine's rows), float64 on the CPU (line 11)."""
        _, f, _, psi = self.rows64()
        return cpu64((f / psi[:, None]).T @ f)

    def refresh_m_inv(self) -> None:
        """(I + B)⁻¹ from the stored parameters (a single-process model's rows are all of B)."""
        self.m_inv = precision_inverse(self.gram())

    # -- draws -----------------------------------------------------------------------------------------
    def draw_noise(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, z) of the next training draw, from generators keyed by (seed, draw index, row offset)."""
        k, d = self.settings.n_components, self.settings.n_features
        h_gen = torch.Generator().manual_seed(_noise_seed(self.seed, self.n_draws, 0))
        z_gen = torch.Generator(device=self.device).manual_seed(
            _noise_seed(self.seed, self.n_draws, 1 + self.row_offset))
        h = torch.randn(k, dtype=torch.float64, generator=h_gen)
        return h, torch.randn(d, dtype=torch.float64, device=self.device, generator=z_gen)

    def draw(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """θ = F h + c + ψ^{1/2} ⊙ z (4.50) at the current parameters, remembered for the next step (float64)."""
        if self.n_pending >= self.settings.n_grad_samples:
            raise RuntimeError(f"{self.n_pending} draw(s) already wait for step() (n_grad_samples = "
                               f"{self.settings.n_grad_samples}); call step() first")
        c, f, sqrt_psi, _ = self.rows64()
        theta = f @ h.to(f.device) + c + sqrt_psi * z
        self.pending.append((h, z))
        self.n_draws += 1
        return theta

    # -- one step --------------------------------------------------------------------------------------
    def check_grads(self, grads: torch.Tensor) -> None:
        """RuntimeError unless L draws are pending (the caller checked the shape and values)."""
        if self.n_pending < self.settings.n_grad_samples:
            raise RuntimeError(f"step() needs gradients at n_grad_samples = {self.settings.n_grad_samples} "
                               f"draw(s) from sample(); {self.n_pending} pending — call sample() first")

    def gradients(self, grads: torch.Tensor) -> dict[str, torch.Tensor]:
        """∇ of the negative ELBO w.r.t. c, F and β at the pending draws (``grads``: L×D on the device)."""
        alpha = self.settings.prior_precision
        c, f, sqrt_psi, psi = self.rows64()
        g = grads.to(torch.float64)
        h = torch.stack([h for h, _ in self.pending]).to(g.device)  # L×K
        z = torch.stack([z for _, z in self.pending])  # L×D
        n_draws = g.shape[0]
        a = f / psi[:, None]
        cr = a @ self.m_inv.to(a.device)
        return {
            "mean": alpha * c + g.mean(dim=0),
            "loadings": -cr + alpha * f + (g.T @ h) / n_draws,
            "log_noise": -0.5 + 0.5 * psi * torch.linalg.vecdot(cr, a) + 0.5 * alpha * psi
            + 0.5 * sqrt_psi * (g * z).mean(dim=0),
        }

    def local_gradient_norms(self, grads: torch.Tensor) -> list[float] | None:
        """This engine's rows' share of ‖∇c‖², ‖∇F‖², ‖∇β‖² when clipping is on (else None); changes nothing."""
        self.check_grads(grads)
        if self.settings.clip_grad_norm is None:
            return None
        if self._fused():
            return fused_norms(self, grads)
        return [float((v * v).sum()) for v in self.gradients(grads).values()]

    def _fused(self) -> bool:
        """Whether the step runs as the fused Triton kernels (CUDA, Triton importable, K ≤ 16)."""
        return fused_available(self.device, self.settings.n_components)

    def local_step(self, grads: torch.Tensor, sq_norms: list[float] | None) -> tuple[dict[str, Any], torch.Tensor]:
        """The step of this engine's rows with the whole model's clipping norms: the new state (not yet adopted)
        and its share of B; NumericalBreakdownError (nothing changes) if a new value is not finite."""
        self.check_grads(grads)
        s, t = self.settings, self.n_steps + 1
        scale = [1.0, 1.0, 1.0]
        if s.clip_grad_norm is not None:
            assert sq_norms is not None
            scale = [s.clip_grad_norm / math.sqrt(sq) if math.sqrt(sq) > s.clip_grad_norm else 1.0
                     for sq in sq_norms]
        if self._fused():
            fused_state, gram, bad = fused_step(self, grads, scale)
            if bad:
                raise _non_finite()
            return fused_state, gram
        grad = self.gradients(grads)
        params, first, second = {}, {}, {}
        for i, name in enumerate(GROUPS):
            p = self.params[name].to(torch.float64)
            step = scale[i] * grad[name]
            if self.moments is None:
                new = p - s.lr[i] * step
            else:
                m = (ADAM_BETA1 * self.moments[0][name].to(torch.float64) + (1.0 - ADAM_BETA1) * step).to(self.dtype)
                v = (ADAM_BETA2 * self.moments[1][name].to(torch.float64)
                     + (1.0 - ADAM_BETA2) * step * step).to(self.dtype)
                first[name], second[name] = m, v
                adam_lr = s.lr[i] / (1.0 - ADAM_BETA1**t)
                inv_sqrt_bias2 = 1.0 / math.sqrt(1.0 - ADAM_BETA2**t)
                new = p - adam_lr * m.to(torch.float64) / (v.to(torch.float64).sqrt() * inv_sqrt_bias2 + ADAM_EPS)
            params[name] = new.to(self.dtype)
        beta = params["log_noise"].to(torch.float64)
        if not all(bool(torch.isfinite(v).all()) for v in params.values()) or bool((beta.abs() > LOG_NOISE_LIMIT).any()):
            raise _non_finite()
        state: dict[str, Any] = {"params": params, "moments": None if self.moments is None else (first, second)}
        f = params["loadings"].to(torch.float64)
        psi = torch.exp(0.5 * beta) ** 2
        return state, cpu64((f / psi[:, None]).T @ f)

    def finish_step(self, state: dict[str, Any], gram: torch.Tensor) -> None:
        """Adopt the new state of :meth:`local_step` with (I + B)⁻¹ from B of the whole model."""
        m_inv = precision_inverse(gram)
        self.params, self.moments, self.m_inv = state["params"], state["moments"], m_inv
        self.pending = []
        self.n_steps += 1

    def step(self, grads: torch.Tensor) -> None:
        """One optimiser step (lines 9–20) from the L×D gradients at the pending draws (validated)."""
        state, gram = self.local_step(grads, self.local_gradient_norms(grads))
        self.finish_step(state, gram)

    # -- checkpoints (the Rust core's state map) ------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The state map of the Rust core's ``VIFA``; refused while draws are pending (their noise is this
        engine's, which the Rust core would not regenerate)."""
        if self.pending:
            raise ValueError(f"{self.n_pending} training draw(s) are pending: call step() before saving or "
                             "converting the model")
        s = self.settings

        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = {
            "kind": "VIFA", "n_features": s.n_features, "n_components": s.n_components,
            "prior_precision": s.prior_precision, "lr_mean": s.lr[0], "lr_loadings": s.lr[1],
            "lr_log_noise": s.lr[2], "optimizer": s.optimizer, "n_grad_samples": s.n_grad_samples,
            "seed": self.seed, "n_draws": self.n_draws, "n_pending": 0, "n_steps": self.n_steps,
            "diverged": False,
        }
        if s.clip_grad_norm is not None:
            state["clip_grad_norm"] = s.clip_grad_norm
        if self.row_offset:
            state["row_offset"] = self.row_offset
        state.update({name: host(v) for name, v in self.params.items()})
        if self.moments is not None:
            for prefix, moment in zip(("adam_m_", "adam_v_"), self.moments):
                state.update({prefix + name: host(v) for name, v in moment.items()})
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "VIFAEngine":
        """The engine of a state map (validated by the Rust core first) with no pending draws."""
        if int(state["n_pending"]):
            raise ValueError("the checkpoint holds pending training draws, whose noise only the model that drew "
                             "them has: call step() on it before saving")
        clip = state.get("clip_grad_norm")
        settings = VIFASettings(int(state["n_features"]), int(state["n_components"]), float(state["prior_precision"]),
                                (float(state["lr_mean"]), float(state["lr_loadings"]), float(state["lr_log_noise"])),
                                str(state["optimizer"]), int(state["n_grad_samples"]),
                                None if clip is None else float(clip))
        dtype = torch.float32 if np.asarray(state["loadings"]).dtype == np.float32 else torch.float64
        engine = cls(settings, int(state["seed"]), dtype, device)
        engine.n_draws, engine.n_steps = int(state["n_draws"]), int(state["n_steps"])
        engine.row_offset = int(state.get("row_offset", 0))

        def tensor(key: str) -> torch.Tensor:
            return torch.as_tensor(np.asarray(state[key])).to(dtype=dtype, device=device).clone()

        engine.params = {name: tensor(name) for name in GROUPS}
        if engine.moments is not None:
            engine.moments = ({name: tensor("adam_m_" + name) for name in GROUPS},
                              {name: tensor("adam_v_" + name) for name in GROUPS})
        engine.refresh_m_inv()
        return engine
