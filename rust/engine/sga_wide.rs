//! The online-SGA pass over one block of rows for K > 16 (`sga_kernel` handles K ≤ 16) after warm-up, with
//! the K×K work done by the register-tiled products of `engine::tiled`.
//!
//! Per row, as in `sga_kernel` (P = Σ + m mᵀ and m of the previous sample, d' its deviation, α the rate):
//!
//! ```text
//!   g = f P                                                (a block: G = F P, one tiled product)
//!   ∇β = ½ ψ⁻¹ (d'² − 2 d' f·m + g·f) − ½,   f ← clip(f + α s (d' m − g)),   ψ ← clip(ψ exp(clip(α ∇β)))
//!   θ̄ ← θ̄ + ρ (x − θ̄),   d = x − θ̄
//!   y = f/ψ,   u += y d,   S += y fᵀ (upper triangle)     (a block: S += Yᵀ F, one tiled rank-nb update)
//! ```
//!
//! Shapes: a sub-block of nb ≤ 96 rows is held as nbp×kp row-major f64 buffers (nbp = nb rounded up to the
//! tile height, kp = K padded to the tile width, padding zero). Arithmetic is f64 for both storage types; F
//! and ψ are rounded to T after their step, as in the row kernel. The tiled products fuse multiply-adds on
//! the FMA path, so the two code paths agree to rounding, not bit for bit.

use super::sga_kernel::{SgaBlockIo, SgaConsts, Start};
use super::tiled::{padded_width, rows_times, syrk_upper_add, Tiled, TiledIsa, TILE_ROWS};
use crate::online_sga::{bounded, log_psi_step, MAX_PSI_OVERSHOOT};
use crate::scalar::{stored, Real};

/// Largest sub-block (rows).
const MAX_SUB_ROWS: usize = 96;

/// Per-pass constants of the wide kernel: K, P tiled (when a step is pending) and the code path.
#[derive(Debug, Clone)]
pub(crate) struct SgaWide {
    pub(crate) k: usize,
    pub(crate) p: Option<Tiled>,
    pub(crate) isa: TiledIsa,
}

impl SgaWide {
    /// For K = `k`, with the pending step's P (K×K row-major) if any.
    pub(crate) fn new(k: usize, p: Option<&[f64]>, isa: TiledIsa) -> Self {
        SgaWide {
            k,
            p: p.map(|p| Tiled::new(k, p)),
            isa,
        }
    }
}

/// Scratch of one task: three f64 buffers of equal use (a sub-block of F, G = F P and Y = F/ψ).
pub(crate) struct SgaWideScratch<'a> {
    pub(crate) f: &'a mut [f64],
    pub(crate) g: &'a mut [f64],
    pub(crate) y: &'a mut [f64],
}

impl SgaWide {
    /// Run the pass over the rows of `io` in sub-blocks of as many rows as the scratch holds (at most
    /// [`MAX_SUB_ROWS`], a multiple of the tile height).
    pub(crate) fn run<T: Real>(&self, c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, sc: &mut SgaWideScratch<'_>) {
        let n = io.mean.len();
        let len = sc.f.len().min(sc.g.len()).min(sc.y.len());
        let step = (len / padded_width(self.k)).min(MAX_SUB_ROWS) / TILE_ROWS * TILE_ROWS;
        assert!(step > 0, "wide-kernel scratch too small");
        for b0 in (0..n).step_by(step) {
            let nb = (n - b0).min(step);
            self.sub_block(c, io, sc, b0, nb);
        }
    }

    fn sub_block<T: Real>(
        &self,
        c: &SgaConsts<'_>,
        io: &mut SgaBlockIo<'_, T>,
        sc: &mut SgaWideScratch<'_>,
        b0: usize,
        nb: usize,
    ) {
        let k = self.k;
        let kp = padded_width(k);
        let nbp = nb.div_ceil(TILE_ROWS) * TILE_ROWS;
        let mut psi = [1.0f64; MAX_SUB_ROWS];
        let mut d_prev = [0.0f64; MAX_SUB_ROWS];
        for r in 0..nb {
            let dst = &mut sc.f[r * kp..(r + 1) * kp];
            for (d, v) in dst[..k].iter_mut().zip(&io.f[(b0 + r) * k..(b0 + r + 1) * k]) {
                *d = v.to_f64();
            }
            dst[k..].fill(0.0);
            psi[r] = io.psi[b0 + r].to_f64();
            d_prev[r] = io.d_last[b0 + r].to_f64();
        }
        sc.f[nb * kp..nbp * kp].fill(0.0);
        if let Some(start) = c.start {
            start_rows::<T>(&mut sc.f[..nb * kp], &mut psi[..nb], start, c.floor);
        }
        if let (Some(step), Some(p)) = (&c.step, &self.p) {
            rows_times(self.isa, sc.f, p, sc.g, nbp);
            let mut overshoot = 0usize;
            for r in 0..nb {
                let f = &mut sc.f[r * kp..r * kp + k];
                let g = &sc.g[r * kp..r * kp + k];
                overshoot += step_row::<T>(f, g, &mut psi[r], d_prev[r], step.m, c);
            }
            *io.overshoot += overshoot as f64;
        }
        if c.step.is_some() || c.start.is_some() {
            for r in 0..nb {
                let src = &sc.f[r * kp..r * kp + k];
                for (dst, &v) in io.f[(b0 + r) * k..(b0 + r + 1) * k].iter_mut().zip(src) {
                    *dst = T::from_f64(v);
                }
                io.psi[b0 + r] = T::from_f64(psi[r]);
            }
        }
        // Lines 5, 6 and the sums' row-local part: y = f/ψ, u += y d.
        for r in 0..nbp {
            let y = &mut sc.y[r * kp..(r + 1) * kp];
            if r >= nb {
                y.fill(0.0);
                continue;
            }
            let i = b0 + r;
            let x = io.x[i];
            let m0 = io.mean[i].to_f64();
            let (mean_s, m1) = stored::<T>(m0 + c.rho * (x - m0));
            io.mean[i] = mean_s;
            let d = x - m1;
            io.d_last[i] = T::from_f64(d);
            let inv_psi = 1.0 / psi[r];
            for ((yv, &fv), u) in y.iter_mut().zip(&sc.f[r * kp..r * kp + k]).zip(io.u.iter_mut()) {
                *yv = fv * inv_psi;
                *u += *yv * d;
            }
            y[k..].fill(0.0);
        }
        syrk_upper_add(self.isa, sc.y, sc.f, nbp, k, io.s);
    }
}

/// The data-scaled start on rows of F (padded rows, kp wide) and their ψ, rounded to T.
fn start_rows<T: Real>(f: &mut [f64], psi: &mut [f64], start: Start, floor: f64) {
    if start.degenerate {
        psi.fill(1.0);
        return;
    }
    for v in f.iter_mut() {
        *v = stored::<T>(*v * start.sigma).1;
    }
    for v in psi.iter_mut() {
        *v = stored::<T>(v.max(floor)).1;
    }
}

/// Lines 10–14 of Algorithm 1 on one row (f, g = f P: K each), rounded to T; 1 if its ψ step diverged.
#[inline(always)]
fn step_row<T: Real>(f: &mut [f64], g: &[f64], psi: &mut f64, d: f64, m: &[f64], c: &SgaConsts<'_>) -> usize {
    let mut f_m = 0.0;
    let mut g_f = 0.0;
    for ((&fv, &gv), &mj) in f.iter().zip(g).zip(m) {
        f_m += fv * mj;
        g_f += gv * fv;
    }
    let inv_psi = 1.0 / *psi;
    let grad_beta = 0.5 * inv_psi * (d * d - 2.0 * d * f_m + g_f) - 0.5;
    let f_scale = if c.precondition { 1.0 } else { inv_psi };
    for ((fv, &gv), &mj) in f.iter_mut().zip(g).zip(m) {
        let grad_f = f_scale * (d * mj - gv);
        *fv = stored::<T>(bounded(*fv + c.lr * grad_f, -T::MAX_STATE, T::MAX_STATE)).1;
    }
    let old = *psi;
    let new = bounded(
        old * log_psi_step(c.lr * grad_beta, c.precondition).exp(),
        c.floor,
        T::MAX_STATE,
    );
    *psi = stored::<T>(new).1;
    usize::from(*psi > MAX_PSI_OVERSHOOT * old.max(d * d))
}
