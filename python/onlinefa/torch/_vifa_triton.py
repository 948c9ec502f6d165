"""The VIFA step as Triton kernels: one read of the parameters (and Adam's moments), the gradients and the noise of
the L pending draws, and one write of the new values.

For each block of rows (shapes: c, β, their Adam moments, are D; F and its moments D×K row-major; the gradients
g_l and the noise z_l are L×D; h_l is L×K and (I + B)⁻¹ is K×K, both padded to KP; K ≤ 16), with α the prior
precision, ψ = exp β, A = Ψ⁻¹ F and C = A (I + B)⁻¹ (Brownlie 2021, Algorithm 3, lines 9–20)::

    ∇c = α c + mean_l g_l
    ∇F = −C + α F + mean_l g_l h_lᵀ
    ∇β = −½ + ½ ψ ⊙ rowsum(C ⊙ A) + ½ α ψ + ½ ψ^{1/2} ⊙ mean_l g_l ⊙ z_l

* ``_vifa_norms``: this block's share of ‖∇c‖², ‖∇F‖², ‖∇β‖² (for the clipping factors s = min(1, max/‖∇‖));
* ``_vifa_step``: per group p ← p − η s ∇ (SGD) or Adam (β₁ = 0.9, β₂ = 0.999, ε = 1e-8, bias-corrected, the
  moments rounded to the state's dtype), written to separate buffers that the engine adopts only once the whole
  step has succeeded; whether a new value is not finite or |β| > 700; and this block's share of B = Fᵀ Ψ⁻¹ F of
  the new parameters.

The per-block partial sums are added by the caller in block order, so the result does not depend on how the
blocks are scheduled. The scalars travel as a tensor of the state's dtype. Selected on CUDA when Triton is
importable; tested on the CPU with ``TRITON_INTERPRET=1`` against the plain torch step.
"""

from __future__ import annotations

from typing import Any

import torch

from ._triton_common import BLOCK_ROWS, available, padded_components, scalar_table, triton

__all__ = ["available", "fused_norms", "fused_step"]

if triton is not None:
    import triton.language as tl

    from ._triton_common import block_layout

    @triton.jit
    def _gradients(c_ptr, f_ptr, beta_ptr, g_ptr, z_ptr, h_ptr, minv_ptr, alpha, n_rows, rows, cols, row_ok, mask,
                   kk_mask, K: tl.constexpr, KP: tl.constexpr, L: tl.constexpr):  # pragma: no cover - Triton
        """(c, F, β, ∇c, ∇F, ∇β) of one block of rows."""
        c = tl.load(c_ptr + rows, mask=row_ok, other=0.0)
        f = tl.load(f_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
        beta = tl.load(beta_ptr + rows, mask=row_ok, other=0.0)
        sqrt_psi = tl.exp(0.5 * beta)
        psi = sqrt_psi * sqrt_psi
        a = f / psi[:, None]
        minv = tl.load(minv_ptr + cols[:, None] * KP + cols[None, :], mask=kk_mask, other=0.0)
        cr = tl.sum(a[:, :, None] * minv[None, :, :], axis=1)
        g_sum = tl.zeros_like(c)
        gh_sum = tl.zeros_like(f)
        gz_sum = tl.zeros_like(c)
        for draw in tl.static_range(L):
            g = tl.load(g_ptr + draw * n_rows + rows, mask=row_ok, other=0.0)
            z = tl.load(z_ptr + draw * n_rows + rows, mask=row_ok, other=0.0)
            h = tl.load(h_ptr + draw * KP + cols, mask=cols < K, other=0.0)
            g_sum += g
            gh_sum += g[:, None] * h[None, :]
            gz_sum += g * z
        grad_c = alpha * c + g_sum / L
        grad_f = tl.where(mask, -cr + alpha * f + gh_sum / L, 0.0)
        grad_beta = -0.5 + 0.5 * psi * tl.sum(cr * a, axis=1) + 0.5 * alpha * psi + 0.5 * sqrt_psi * (gz_sum / L)
        grad_c = tl.where(row_ok, grad_c, 0.0)
        grad_beta = tl.where(row_ok, grad_beta, 0.0)
        return c, f, beta, grad_c, grad_f, grad_beta

    @triton.jit
    def _vifa_norms(c_ptr, f_ptr, beta_ptr, g_ptr, z_ptr, h_ptr, minv_ptr, scalar_ptr, norm_part_ptr, n_rows,
                    K: tl.constexpr, KP: tl.constexpr, L: tl.constexpr,
                    BLOCK: tl.constexpr):  # pragma: no cover - compiled by Triton
        pid, rows, cols, row_ok, _, mask, kk_mask = block_layout(n_rows, K, KP, BLOCK)
        alpha = tl.load(scalar_ptr)
        _, _, _, grad_c, grad_f, grad_beta = _gradients(c_ptr, f_ptr, beta_ptr, g_ptr, z_ptr, h_ptr, minv_ptr, alpha,
                                                        n_rows, rows, cols, row_ok, mask, kk_mask, K, KP, L)
        tl.store(norm_part_ptr + pid * 3, tl.sum(grad_c * grad_c, axis=0))
        tl.store(norm_part_ptr + pid * 3 + 1, tl.sum(tl.sum(grad_f * grad_f, axis=1), axis=0))
        tl.store(norm_part_ptr + pid * 3 + 2, tl.sum(grad_beta * grad_beta, axis=0))

    @triton.jit
    def _updated(p, grad, m_ptr, v_ptr, new_m_ptr, new_v_ptr, offsets, valid, scalar_ptr, group,
                 ADAM: tl.constexpr):  # pragma: no cover - compiled by Triton
        """p − η s ∇ (SGD), or Adam's step with the new moments stored; the scalars of ``group``."""
        lr = tl.load(scalar_ptr + 1 + 2 * group)
        scale = tl.load(scalar_ptr + 2 + 2 * group)
        step = scale * grad
        if ADAM:
            inv_sqrt_bias2 = tl.load(scalar_ptr + 7)
            m = tl.load(m_ptr + offsets, mask=valid, other=0.0)
            v = tl.load(v_ptr + offsets, mask=valid, other=0.0)
            m = (tl.load(scalar_ptr + 8) * m + tl.load(scalar_ptr + 9) * step).to(p.dtype)
            v = (tl.load(scalar_ptr + 10) * v + tl.load(scalar_ptr + 11) * step * step).to(p.dtype)
            tl.store(new_m_ptr + offsets, m, mask=valid)
            tl.store(new_v_ptr + offsets, v, mask=valid)
            adam_lr = tl.load(scalar_ptr + 13 + group)  # η / (1 − β₁ᵗ)
            new = p - adam_lr * m / (tl.sqrt(v) * inv_sqrt_bias2 + tl.load(scalar_ptr + 12))
        else:
            new = p - lr * step
        return new.to(p.dtype)

    @triton.jit
    def _vifa_step(c_ptr, f_ptr, beta_ptr, g_ptr, z_ptr, h_ptr, minv_ptr, scalar_ptr,
                   mc_ptr, vc_ptr, mf_ptr, vf_ptr, mb_ptr, vb_ptr,
                   new_c_ptr, new_f_ptr, new_beta_ptr, new_mc_ptr, new_vc_ptr, new_mf_ptr, new_vf_ptr,
                   new_mb_ptr, new_vb_ptr, gram_part_ptr, bad_part_ptr, n_rows,
                   K: tl.constexpr, KP: tl.constexpr, L: tl.constexpr, BLOCK: tl.constexpr,
                   ADAM: tl.constexpr):  # pragma: no cover - compiled by Triton
        pid, rows, cols, row_ok, _, mask, kk_mask = block_layout(n_rows, K, KP, BLOCK)
        alpha = tl.load(scalar_ptr)
        c, f, beta, grad_c, grad_f, grad_beta = _gradients(c_ptr, f_ptr, beta_ptr, g_ptr, z_ptr, h_ptr, minv_ptr,
                                                           alpha, n_rows, rows, cols, row_ok, mask, kk_mask, K, KP, L)
        f_offsets = rows[:, None] * K + cols[None, :]
        new_c = _updated(c, grad_c, mc_ptr, vc_ptr, new_mc_ptr, new_vc_ptr, rows, row_ok, scalar_ptr, 0, ADAM)
        new_f = _updated(f, grad_f, mf_ptr, vf_ptr, new_mf_ptr, new_vf_ptr, f_offsets, mask, scalar_ptr, 1, ADAM)
        new_beta = _updated(beta, grad_beta, mb_ptr, vb_ptr, new_mb_ptr, new_vb_ptr, rows, row_ok, scalar_ptr, 2,
                            ADAM)
        tl.store(new_c_ptr + rows, new_c, mask=row_ok)
        tl.store(new_f_ptr + f_offsets, new_f, mask=mask)
        tl.store(new_beta_ptr + rows, new_beta, mask=row_ok)
        # x − x is 0 exactly for finite x (NaN for ±Inf and NaN); |β| ≤ 700 is false for NaN too
        f_bad = tl.sum(tl.where(mask & ~((new_f - new_f) == 0.0), 1, 0), axis=1) > 0
        bad = row_ok & (~((new_c - new_c) == 0.0) | f_bad | ~(tl.abs(new_beta) <= 700.0))
        tl.store(bad_part_ptr + pid, tl.max(bad.to(tl.int32), axis=0))
        sqrt_psi = tl.exp(0.5 * new_beta)
        psi = sqrt_psi * sqrt_psi
        y = tl.where(mask, new_f / psi[:, None], 0.0)
        gram = tl.sum(y[:, :, None] * tl.where(mask, new_f, 0.0)[:, None, :], axis=0)
        tl.store(gram_part_ptr + pid * KP * KP + cols[:, None] * KP + cols[None, :], gram)


def _padded(matrix: torch.Tensor, rows: int, kp: int, like: torch.Tensor) -> torch.Tensor:
    """An r×K float64 CPU matrix zero-padded to rows×KP in the state's dtype on its device."""
    out = torch.zeros(rows, kp, dtype=like.dtype, device=like.device)
    out[: matrix.shape[0], : matrix.shape[1]] = matrix.to(dtype=like.dtype, device=like.device)
    return out


def _inputs(engine: Any, grads: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
    """The kernels' shared inputs (c, F, β, g, z, h, (I + B)⁻¹) in the state's dtype, KP and the block count."""
    kp = padded_components(engine.settings.n_components)
    params = engine.params
    like = params["loadings"]
    h = torch.stack([h for h, _ in engine.pending])
    z = torch.stack([z for _, z in engine.pending])
    tensors = [params["mean"], like, params["log_noise"], grads.to(like.dtype).contiguous(), z.to(like.dtype),
               _padded(h, h.shape[0], kp, like), _padded(engine.m_inv, kp, kp, like)]
    return tensors, kp, triton.cdiv(engine.settings.n_features, BLOCK_ROWS)


def fused_norms(engine: Any, grads: torch.Tensor) -> list[float]:
    """This engine's rows' share of ‖∇c‖², ‖∇F‖², ‖∇β‖² at the pending draws (``grads``: L×D)."""
    tensors, kp, n_blocks = _inputs(engine, grads)
    like = tensors[1]
    scalars = scalar_table([engine.settings.prior_precision], like)
    parts = torch.empty(n_blocks, 3, dtype=like.dtype, device=like.device)
    _vifa_norms[(n_blocks,)](*tensors, scalars, parts, engine.settings.n_features,
                             K=engine.settings.n_components, KP=kp, L=grads.shape[0], BLOCK=BLOCK_ROWS)
    return [float(v) for v in parts.to(torch.float64).sum(dim=0).cpu()]


def fused_step(engine: Any, grads: torch.Tensor, rule: tuple[Any, ...]) -> tuple[dict[str, Any], torch.Tensor, bool]:
    """The step of this engine's rows with the Rust step's ``rule`` (learning rates, clipping factors, Adam's
    corrected rates and 1 / √(1 − β₂ᵗ), (β₁, β₂, ε)): the new state (not yet adopted), its share of B (K×K float64
    on the CPU), and whether a new value is not finite or |β| > 700."""
    s = engine.settings
    lr, scale, adam_lr, inv_sqrt_bias2, (beta1, beta2, eps) = rule
    tensors, kp, n_blocks = _inputs(engine, grads)
    like = tensors[1]
    adam = engine.moments is not None
    scalars = scalar_table([s.prior_precision, lr[0], scale[0], lr[1], scale[1], lr[2], scale[2],
                            inv_sqrt_bias2, beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps, *adam_lr], like)
    names = ("mean", "loadings", "log_noise")
    params = {name: torch.empty_like(engine.params[name]) for name in names}
    if adam:
        first = {name: torch.empty_like(engine.params[name]) for name in names}
        second = {name: torch.empty_like(engine.params[name]) for name in names}
        old = [engine.moments[i][name] for name in names for i in (0, 1)]
        new_moments = [moment[name] for name in names for moment in (first, second)]
    else:
        old = new_moments = [like] * 6  # not read without Adam
    gram_part = torch.empty(n_blocks, kp, kp, dtype=like.dtype, device=like.device)
    bad_part = torch.empty(n_blocks, dtype=torch.int32, device=like.device)
    _vifa_step[(n_blocks,)](*tensors, scalars, *old, params["mean"], params["loadings"], params["log_noise"],
                            *new_moments, gram_part, bad_part, s.n_features,
                            K=s.n_components, KP=kp, L=grads.shape[0], BLOCK=BLOCK_ROWS, ADAM=adam)
    state: dict[str, Any] = {"params": params, "moments": (first, second) if adam else None}
    gram = gram_part.to(torch.float64).sum(dim=0)[: s.n_components, : s.n_components].cpu()
    return state, gram, bool(bad_part.any())
