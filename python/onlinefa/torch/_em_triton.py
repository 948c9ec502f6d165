"""The per-sample pass of online EM as one Triton kernel: one read and one write of the D-sized state.

For each block of rows (shapes: Ā is D×K row-major, θ̄, d̄², d_{t−1}, x_t are D; the K×K matrices W and M are
row-major, padded to KP columns; K ≤ 16):

* the pending rank-one step, a ← (a + ρ_{t−1} (d_{t−1} m_{t−1}ᵀ − a)) W (line 12 of Algorithm 2 and the whitening
  map), rounded to the state's dtype and stored;
* f = a M with M = H̄⁻¹ (or I in the whitened basis) and ψ = max(d̄² − f·a, floor) (4.33, 4.35);
* e = x − θ̄ (rounded), θ̄' = θ̄ + ρ' e, d = e − ρ' e, d̄²' = d̄² + ρ (d² − d̄²) (lines 5, 6, 14), written to separate
  buffers that the engine adopts only once the K×K step has succeeded (a failed step changes nothing);
* this block's share of the E-step sums (4.23): S = Σ f fᵀ/ψ (K×K), u = Σ f d/ψ (K), and Σ d̄²'.

The per-block partial sums are added by the caller in block order, so the result does not depend on how the
blocks are scheduled. The scalars travel as a tensor of the state's dtype (a float64 state keeps them exact).
Selected on CUDA when Triton is importable; tested on the CPU with ``TRITON_INTERPRET=1`` against the plain torch
pass.
"""

from __future__ import annotations

from typing import Any

import torch

from ._triton_common import BLOCK_ROWS, available, padded_components, scalar_table, triton

__all__ = ["available", "fused_pass"]

if triton is not None:
    import triton.language as tl

    from ._triton_common import block_layout

    @triton.jit
    def _em_pass(a_ptr, mean_ptr, dsq_ptr, dprev_ptr, x_ptr, new_mean_ptr, new_dsq_ptr, d_ptr,
                 m_ptr, w_ptr, h_ptr, s_part_ptr, u_part_ptr, dsq_part_ptr, scalar_ptr, n_rows,
                 K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, HAS_PENDING: tl.constexpr,
                 HAS_W: tl.constexpr, HAS_H: tl.constexpr):  # pragma: no cover - compiled by Triton
        pid, rows, cols, row_ok, col_ok, mask, kk_mask = block_layout(n_rows, K, KP, BLOCK)
        rho_p = tl.load(scalar_ptr)
        rho = tl.load(scalar_ptr + 1)
        mean_rho = tl.load(scalar_ptr + 2)
        floor = tl.load(scalar_ptr + 3)
        a = tl.load(a_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
        dsq = tl.load(dsq_ptr + rows, mask=row_ok, other=0.0)
        if HAS_PENDING:
            d_prev = tl.load(dprev_ptr + rows, mask=row_ok, other=0.0)
            m = tl.load(m_ptr + cols, mask=col_ok, other=0.0)
            a = a + rho_p * (d_prev[:, None] * m[None, :] - a)
            if HAS_W:
                w = tl.load(w_ptr + cols[:, None] * KP + cols[None, :], mask=kk_mask, other=0.0)
                a = tl.sum(a[:, :, None] * w[None, :, :], axis=1)
            tl.store(a_ptr + rows[:, None] * K + cols[None, :], a, mask=mask)
        if HAS_H:
            h = tl.load(h_ptr + cols[:, None] * KP + cols[None, :], mask=kk_mask, other=0.0)
            f = tl.sum(a[:, :, None] * h[None, :, :], axis=1)
        else:
            f = a
        psi = tl.maximum(dsq - tl.sum(f * a, axis=1), floor)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        x = tl.load(x_ptr + rows, mask=row_ok, other=0.0)
        e = (x - mean).to(mean.dtype)
        step = mean_rho * e
        d_exact = e - step
        d = d_exact.to(mean.dtype)
        tl.store(new_mean_ptr + rows, (mean + step).to(mean.dtype), mask=row_ok)
        new_dsq = (dsq + rho * (d_exact * d_exact - dsq)).to(mean.dtype)
        tl.store(new_dsq_ptr + rows, new_dsq, mask=row_ok)
        tl.store(d_ptr + rows, d, mask=row_ok)
        y = tl.where(row_ok[:, None], f / psi[:, None], 0.0)
        s_part = tl.sum(y[:, :, None] * f[:, None, :], axis=0)
        u_part = tl.sum(y * d[:, None], axis=0)
        tl.store(s_part_ptr + pid * KP * KP + cols[:, None] * KP + cols[None, :], s_part)
        tl.store(u_part_ptr + pid * KP + cols, u_part)
        tl.store(dsq_part_ptr + pid, tl.sum(tl.where(row_ok, new_dsq, 0.0), axis=0))


def _padded(matrix: torch.Tensor | None, kp: int, like: torch.Tensor) -> torch.Tensor:
    """A K×K float64 CPU matrix as a KP×KP tensor in the state's dtype on its device (zeros if None)."""
    out = torch.zeros(kp, kp, dtype=like.dtype, device=like.device)
    if matrix is not None:
        k = matrix.shape[0]
        out[:k, :k] = matrix.to(dtype=like.dtype, device=like.device)
    return out


def fused_pass(engine: Any, x: torch.Tensor, rho: float, mean_rho: float) -> tuple[
        torch.Tensor, torch.Tensor, float, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The pass of ``engine`` (an ``EMEngine`` past warm-up) for sample ``x``: applies the pending step to Ā in
    place and returns (S, u, Σ d̄²', (θ̄', d̄²', d)) with S, u in float64 on the CPU."""
    d, k = engine.settings.n_features, engine.settings.n_components
    kp = padded_components(k)
    n_blocks = triton.cdiv(d, BLOCK_ROWS)
    state = engine.a_bar
    pending = engine.pending
    m = torch.zeros(kp, dtype=state.dtype, device=state.device)
    if pending is not None:
        m[:k] = pending.m.to(dtype=state.dtype, device=state.device)
    w = _padded(None if pending is None else pending.transform, kp, state)
    h = _padded(engine.h_inv, kp, state)
    new_mean, new_dsq, d_new = torch.empty_like(engine.mean), torch.empty_like(engine.dsq_bar), torch.empty_like(
        engine.d_last)
    s_part = torch.empty(n_blocks, kp, kp, dtype=state.dtype, device=state.device)
    u_part = torch.empty(n_blocks, kp, dtype=state.dtype, device=state.device)
    dsq_part = torch.empty(n_blocks, dtype=state.dtype, device=state.device)
    _em_pass[(n_blocks,)](
        state, engine.mean, engine.dsq_bar, engine.d_last, x.to(state.dtype), new_mean, new_dsq, d_new,
        m, w, h, s_part, u_part, dsq_part,
        scalar_table([0.0 if pending is None else pending.rho, rho, mean_rho, engine.floor()], state), d,
        K=k, KP=kp, BLOCK=BLOCK_ROWS, HAS_PENDING=pending is not None,
        HAS_W=pending is not None and pending.transform is not None, HAS_H=engine.h_inv is not None,
    )
    s_sum = s_part.to(torch.float64).sum(dim=0)[:k, :k].cpu()
    u_sum = u_part.to(torch.float64).sum(dim=0)[:k].cpu()
    return s_sum, u_sum, float(dsq_part.to(torch.float64).sum()), (new_mean, new_dsq, d_new)
