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

Arithmetic in float64 on the device, rounded to the state's dtype once per stored value. The K×K part (the
hyper-parameters, the counters of draws and steps, (I + B)⁻¹, each step's rule: learning rates, Adam's bias
corrections, clipping factors, and the state keys they own) is the Rust core's own code (``_core.VIFAStep``,
run in float64 on the CPU). A step that fails (non-finite or |β| > 700 after it) changes nothing. On CUDA with Triton
importable (K ≤ 16) the step runs as fused kernels (``_vifa_triton``), the same arithmetic in the state's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _core
from ..errors import NumericalBreakdownError
from ._kk_algebra import cpu64
from ._row_store import copy_with_step
from ._vifa_triton import available as fused_available
from ._vifa_triton import fused_norms, fused_step

#: Largest |β| a step may produce (ψ = exp β within [1e-304, 1e304]).
LOG_NOISE_LIMIT = 700.0
GROUPS = ("mean", "loadings", "log_noise")


@dataclass(frozen=True)
class VIFASettings:
    """The hyper-parameters of one model (the checkpoint's configuration entries), a read-only view of the K×K
    step's (change them through ``kk_step``)."""

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


def _non_finite() -> NumericalBreakdownError:
    return NumericalBreakdownError("the VIFA step made a parameter non-finite (or |log ψ| > 700): lower the learning "
                                   "rates or set clip_grad_norm; the model is as before the step")


class VIFAEngine:
    """The rows of one VIFA model (c, F, β and Adam's moments) in torch tensors on ``device``, driven by the
    Rust K×K step ``kk_step`` (a ``_core.VIFAStep``)."""

    def __init__(self, kk_step: Any, n_features: int, dtype: torch.dtype, device: torch.device) -> None:
        d, k = n_features, int(kk_step.n_components)
        self.kk_step, self.n_features, self.dtype, self.device = kk_step, d, dtype, device
        self.params = {"mean": torch.zeros(d, dtype=dtype, device=device),
                       "loadings": torch.zeros(d, k, dtype=dtype, device=device),
                       "log_noise": torch.zeros(d, dtype=dtype, device=device)}
        self.moments: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        if kk_step.optimizer == "adam":
            self.moments = ({g: torch.zeros_like(v) for g, v in self.params.items()},
                            {g: torch.zeros_like(v) for g, v in self.params.items()})
        #: The pending draws' noise: h (K, float64 on the CPU) and z (D, float64 on the device).
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    # -- the K×K step's copies (a Rust object neither deep-copies nor pickles) ---------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> "VIFAEngine":
        return copy_with_step(self, memo)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["kk_step"] = (self.kk_step.get_state(), self.kk_step.m_inv())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        kk_state, m_inv = state.pop("kk_step")
        self.__dict__.update(state)
        self.kk_step = _core.VIFAStep.from_state(kk_state, self.n_features)
        self.kk_step.set_m_inv(m_inv)

    # -- what the K×K step holds ---------------------------------------------------------------------
    @property
    def settings(self) -> VIFASettings:
        """The hyper-parameters (the checkpoint's configuration entries), read from the step."""
        kk = self.kk_step
        return VIFASettings(self.n_features, int(kk.n_components), float(kk.prior_precision), tuple(kk.lr),
                            str(kk.optimizer), int(kk.n_grad_samples), kk.clip_grad_norm)

    @property
    def seed(self) -> int:
        return int(self.kk_step.seed)

    @property
    def n_draws(self) -> int:
        return int(self.kk_step.n_draws)

    @property
    def n_steps(self) -> int:
        return int(self.kk_step.n_steps)

    @property
    def row_offset(self) -> int:
        return int(self.kk_step.row_offset)

    @property
    def m_inv(self) -> torch.Tensor:
        """(I + B)⁻¹ (K×K float64 on the CPU); NumericalBreakdownError once the model diverged."""
        return torch.from_numpy(self.kk_step.m_inv())

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

    def refresh_m_inv(self, gram: torch.Tensor | None = None) -> None:
        """(I + B)⁻¹ from B of the whole model (default: this engine's rows, all of a single-process model's)."""
        whole = self.gram() if gram is None else gram
        self.kk_step.refresh(np.ascontiguousarray(whole.numpy(), dtype=np.float64))

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
        kk_step = self.kk_step.copy()
        kk_step.begin_draw()  # RuntimeError while L draws wait for their step; nothing changes then
        c, f, sqrt_psi, _ = self.rows64()
        theta = f @ h.to(f.device) + c + sqrt_psi * z
        self.pending.append((h, z))
        self.kk_step = kk_step
        return theta

    # -- one step --------------------------------------------------------------------------------------
    def check_grads(self, grads: torch.Tensor) -> None:
        """RuntimeError unless L draws are pending (the caller checked the shape and values)."""
        self.kk_step.check_ready()

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
        rule = self.kk_step.rule(sq_norms)
        if self._fused():
            fused_state, gram, bad = fused_step(self, grads, rule)
            if bad:
                raise _non_finite()
            return fused_state, gram
        grad = self.gradients(grads)
        lr, scale, adam_lr, inv_sqrt_bias2, (beta1, beta2, eps) = rule
        params, first, second = {}, {}, {}
        for i, name in enumerate(GROUPS):
            p = self.params[name].to(torch.float64)
            step = scale[i] * grad[name]
            if self.moments is None:
                new = p - lr[i] * step
            else:
                m = (beta1 * self.moments[0][name].to(torch.float64) + (1.0 - beta1) * step).to(self.dtype)
                v = (beta2 * self.moments[1][name].to(torch.float64) + (1.0 - beta2) * step * step).to(self.dtype)
                first[name], second[name] = m, v
                new = p - adam_lr[i] * m.to(torch.float64) / (v.to(torch.float64).sqrt() * inv_sqrt_bias2 + eps)
            params[name] = new.to(self.dtype)
        beta = params["log_noise"].to(torch.float64)
        if not all(bool(torch.isfinite(v).all()) for v in params.values()) or bool((beta.abs() > LOG_NOISE_LIMIT).any()):
            raise _non_finite()
        state: dict[str, Any] = {"params": params, "moments": None if self.moments is None else (first, second)}
        f = params["loadings"].to(torch.float64)
        psi = torch.exp(0.5 * beta) ** 2
        return state, cpu64((f / psi[:, None]).T @ f)

    def finish_step(self, state: dict[str, Any], gram: torch.Tensor) -> None:
        """Adopt the new state of :meth:`local_step` with (I + B)⁻¹ from B of the whole model (the Rust step counts
        the step; NumericalBreakdownError and nothing changes if I + B does not factorise)."""
        self.kk_step.apply(np.ascontiguousarray(gram.numpy(), dtype=np.float64))
        self.params, self.moments = state["params"], state["moments"]
        self.pending = []

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
        def host(tensor: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(tensor.detach().cpu().numpy())

        state: dict[str, Any] = {"n_features": self.n_features, **self.kk_step.get_state()}
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
        n_features = int(state["n_features"])
        dtype = torch.float32 if np.asarray(state["loadings"]).dtype == np.float32 else torch.float64
        engine = cls(_core.VIFAStep.from_state(dict(state), n_features), n_features, dtype, device)

        def tensor(key: str) -> torch.Tensor:
            return torch.as_tensor(np.asarray(state[key])).to(dtype=dtype, device=device).clone()

        engine.params = {name: tensor(name) for name in GROUPS}
        if engine.moments is not None:
            engine.moments = ({name: tensor("adam_m_" + name) for name in GROUPS},
                              {name: tensor("adam_v_" + name) for name in GROUPS})
        engine.refresh_m_inv()
        return engine
