"""The per-sample pass of online SGA as one Triton kernel: one read of the D-sized state and one write of the new one.

For each block of rows (shapes: F is D×K row-major, ψ, θ̄, d_{t−1}, x_t are D; the pending P = Σ + m mᵀ is
K×K and m is K, both padded to KP; K ≤ 16), with α = ``lr`` and d' = d_{t−1} (Brownlie 2021, Algorithm 1,
lines 10–14, (4.24)–(4.26)):

* g = f P, ∇β = ½ ψ⁻¹ (d'² − 2 d' f·m + g·f) − ½, the log-ψ step α ∇β bounded as the library bounds it
  (±1 per sample under ``scaling="data"``, at most 700 under ``"unit"``);
* f ← clip(f + α s (d' m − g)) with s = 1 (preconditioned by ψ, ``"data"``) or ψ⁻¹ (``"unit"``),
  ψ ← clip(ψ · exp(α ∇β), floor, MAX_STATE), and whether a ψ grew more than 10⁶-fold past max(ψ, d'²);
* under the whitened rule (``lr="auto"``): α is a_F, then f ← clip(f L) with the pending whitening factor L
  (K×K, padded to KP), and ψ ← clip(ψ + a (q − ψ), floor, MAX_STATE) with q = 2ψ ∇β + ψ replaces the exp step
  (a step that cannot diverge, so no row is flagged);
* θ̄' = θ̄ + ρ' (x − θ̄), d = x − θ̄' (lines 5, 6);
* this block's share of the E-step sums (4.23): S = Σ f fᵀ/ψ (K×K) and u = Σ f d/ψ (K) of the new rows.

The new rows go to separate buffers that the engine adopts only once the K×K step has succeeded (a failed step
changes nothing). The per-block partial sums are added by the caller in block order, so the result does not depend
on how the blocks are scheduled. The scalars travel as a tensor of the state's dtype (a float64 state keeps them
exact). Selected on CUDA when Triton is importable; tested on the CPU with ``TRITON_INTERPRET=1`` against the
plain torch pass.
"""

from __future__ import annotations

from typing import Any

import torch

from ._kk_algebra import MAX_LOADING_RATIO
from ._triton_common import BLOCK_ROWS, available, padded_components, scalar_table, triton

__all__ = ["available", "fused_pass"]

if triton is not None:
    import triton.language as tl

    from ._triton_common import block_layout

    @triton.jit
    def _bounded(values, lo, hi):  # pragma: no cover - compiled by Triton
        """``values`` kept in [lo, hi], NaN sent to ``hi`` (the plain pass's ``_bounded``)."""
        return tl.where(values != values, hi, tl.minimum(tl.maximum(values, lo), hi))

    @triton.jit
    def _sga_pass(f_ptr, psi_ptr, dprev_ptr, mean_ptr, x_ptr, p_ptr, m_ptr, l_ptr, scalar_ptr,
                  new_f_ptr, new_psi_ptr, new_mean_ptr, d_ptr, s_part_ptr, u_part_ptr, div_part_ptr,
                  n_rows, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                  PRECONDITION: tl.constexpr, WHITENED: tl.constexpr):  # pragma: no cover - compiled by Triton
        pid, rows, cols, row_ok, col_ok, mask, kk_mask = block_layout(n_rows, K, KP, BLOCK)
        lr = tl.load(scalar_ptr)
        mean_rho = tl.load(scalar_ptr + 1)
        floor = tl.load(scalar_ptr + 2)
        hi = tl.load(scalar_ptr + 3)
        log_lo = tl.load(scalar_ptr + 4)
        log_hi = tl.load(scalar_ptr + 5)
        f = tl.load(f_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
        psi = tl.load(psi_ptr + rows, mask=row_ok, other=1.0)
        d_prev = tl.load(dprev_ptr + rows, mask=row_ok, other=0.0)
        p = tl.load(p_ptr + cols[:, None] * KP + cols[None, :], mask=kk_mask, other=0.0)
        m = tl.load(m_ptr + cols, mask=col_ok, other=0.0)
        # the gradient step of the previous sample
        g = tl.sum(f[:, :, None] * p[None, :, :], axis=1)
        q = d_prev * d_prev - 2.0 * d_prev * tl.sum(f * m[None, :], axis=1) + tl.sum(g * f, axis=1)
        inv_psi = 1.0 / psi
        log_step = lr * (0.5 * inv_psi * q - 0.5)
        if PRECONDITION:
            log_step = tl.where(log_step != log_step, log_step, tl.minimum(tl.maximum(log_step, log_lo), log_hi))
        else:
            log_step = tl.where(log_step != log_step, log_hi, tl.minimum(log_step, log_hi))
        grad = d_prev[:, None] * m[None, :] - g
        if not PRECONDITION:
            grad = grad * inv_psi[:, None]
        if WHITENED:
            lower = tl.load(l_ptr + cols[:, None] * KP + cols[None, :], mask=kk_mask, other=0.0)
            stepped = _bounded(f + lr * grad, -hi, hi)
            new_f = _bounded(tl.sum(stepped[:, :, None] * lower[None, :, :], axis=1), -hi, hi).to(f.dtype)
            psi_rate = tl.load(scalar_ptr + 6)
            new_psi = _bounded(psi + psi_rate * (q - psi), floor, hi).to(psi.dtype)
            diverged = row_ok & False
        else:
            new_f = _bounded(f + lr * grad, -hi, hi).to(f.dtype)
            new_psi = _bounded(psi * tl.exp(log_step), floor, hi).to(psi.dtype)
            diverged = (new_psi > 1e6 * tl.maximum(psi, d_prev * d_prev)) & row_ok
        # f ← clip(f, ±min(MAX_STATE, √(MAX_LOADING_RATIO · ψ))) with the new ψ (Fᵀ Ψ⁻¹ F stays finite)
        ratio = tl.load(scalar_ptr + 7)
        bound = tl.minimum(tl.sqrt(ratio * new_psi), hi)
        new_f = tl.minimum(tl.maximum(new_f, -bound[:, None]), bound[:, None])
        tl.store(new_f_ptr + rows[:, None] * K + cols[None, :], new_f, mask=mask)
        tl.store(new_psi_ptr + rows, new_psi, mask=row_ok)
        # the running mean and this sample's deviation
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        x = tl.load(x_ptr + rows, mask=row_ok, other=0.0)
        new_mean = (mean + mean_rho * (x - mean)).to(mean.dtype)
        d = (x - new_mean).to(mean.dtype)
        tl.store(new_mean_ptr + rows, new_mean, mask=row_ok)
        tl.store(d_ptr + rows, d, mask=row_ok)
        # this block's E-step sums over the new rows
        y = tl.where(mask, new_f / new_psi[:, None], 0.0)
        s_part = tl.sum(y[:, :, None] * new_f[:, None, :], axis=0)
        u_part = tl.sum(y * d[:, None], axis=0)
        tl.store(s_part_ptr + pid * KP * KP + cols[:, None] * KP + cols[None, :], s_part)
        tl.store(u_part_ptr + pid * KP + cols, u_part)
        tl.store(div_part_ptr + pid, tl.max(diverged.to(tl.int32), axis=0))


def _padded(matrix: torch.Tensor, kp: int, like: torch.Tensor) -> torch.Tensor:
    """A K×K (or K) float64 CPU tensor zero-padded to KP×KP (or KP) in the state's dtype on its device."""
    out = torch.zeros((kp,) * matrix.dim(), dtype=like.dtype, device=like.device)
    k = matrix.shape[0]
    out[(slice(0, k),) * matrix.dim()] = matrix.to(dtype=like.dtype, device=like.device)
    return out


def fused_pass(engine: Any, x: torch.Tensor, mean_rho: float, floor: float, max_state: float,
               log_bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor, bool, dict[str, torch.Tensor]]:
    """The pass of ``engine`` (an ``SGAEngine`` with a pending step, past its start) for sample ``x``: returns
    (S, u, whether a ψ step diverged, the new rows {mean, d_last, loadings, psi}) with S, u float64 on the CPU."""
    d, k = engine.settings.n_features, engine.settings.n_components
    kp = padded_components(k)
    n_blocks = triton.cdiv(d, BLOCK_ROWS)
    f, psi = engine.loadings, engine.psi
    step = engine.pending
    whitened = step.whiten is not None
    psi_rate = step.psi_rate if step.psi_rate is not None else 0.0
    scalars = scalar_table([step.f_rate, mean_rho, floor, max_state, *log_bounds, psi_rate, MAX_LOADING_RATIO], f)
    lower = _padded(step.whiten if whitened else torch.zeros(k, k, dtype=torch.float64), kp, f)
    new = {"loadings": torch.empty_like(f), "psi": torch.empty_like(psi), "mean": torch.empty_like(engine.mean),
           "d_last": torch.empty_like(engine.d_last)}
    s_part = torch.empty(n_blocks, kp, kp, dtype=f.dtype, device=f.device)
    u_part = torch.empty(n_blocks, kp, dtype=f.dtype, device=f.device)
    div_part = torch.empty(n_blocks, dtype=torch.int32, device=f.device)
    _sga_pass[(n_blocks,)](
        f, psi, engine.d_last, engine.mean, x.to(f.dtype), _padded(step.p, kp, f),
        _padded(step.m, kp, f), lower, scalars, new["loadings"], new["psi"], new["mean"], new["d_last"],
        s_part, u_part, div_part, d,
        K=k, KP=kp, BLOCK=BLOCK_ROWS, PRECONDITION=engine.settings.scaling == "data", WHITENED=whitened,
    )
    s_sum = s_part.to(torch.float64).sum(dim=0)[:k, :k].cpu()
    u_sum = u_part.to(torch.float64).sum(dim=0)[:k].cpu()
    return s_sum, u_sum, bool(div_part.any()), new
