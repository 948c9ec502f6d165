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
//! Under the whitened rule (`SgaRule::Whitened`) α is a_F, the stepped rows are multiplied by L (F ← clip(F L),
//! one more tiled product) and ψ ← ψ + a (q − ψ) replaces the exp step.
//!
//! Shapes: a sub-block of nb ≤ 96 rows is held as nbp×kp row-major buffers (nbp = nb rounded up to the tile
//! height, kp = K padded to the tile width, padding zero) of the arithmetic type.
//!
//! **Arithmetic** follows the storage type, as in the row kernel. f64 state: everything in f64, in the order
//! above. f32 state: the sub-block buffers (F, G, Y) and both tiled products are f32, and the step uses the
//! residual form of the row kernel (with Σ = P − m mᵀ and r = d' − f·m: g = f Σ, q = r² + g·f, F step
//! r m − g), so no f32 term cancels: r (f·m summed in f64), 1/ψ, ∇β, the exp and the ψ step stay f64, as do
//! the running mean and d; u is accumulated in f64 from the f32 y, and the f32 S tiles of each sub-block are
//! added into the f64 totals. F and ψ are rounded to T after their step. The tiled products fuse
//! multiply-adds on the FMA path, so the two code paths agree to rounding, not bit for bit.

use super::isa::Isa;
use super::sga_kernel::{bounded_lane, exp_lanes, residual_form, SgaBlockIo, SgaConsts, SgaStep, Start};
use super::tiled::{padded_width, TileElem, Tiled, TILE_ROWS};
use crate::engine::sga_bounds::{bounded, loading_bound, log_psi_step, MAX_PSI_OVERSHOOT};
use crate::scalar::{stored, Real};

/// Largest sub-block (rows).
const MAX_SUB_ROWS: usize = 96;

/// Per-pass constants of the wide kernel: K, the pending step's matrix tiled (P, or Σ = P − m mᵀ for the
/// residual form) and the code path.
#[derive(Debug, Clone)]
pub(crate) struct SgaWide {
    pub(crate) k: usize,
    pub(crate) p: Option<Tiled>,
    /// The whitening factor L of the whitened rule, tiled.
    pub(crate) l: Option<Tiled>,
    pub(crate) isa: Isa,
}

impl SgaWide {
    /// For K = `k`, with the pending step if any, for state of type T (f32 state tiles Σ = P − m mᵀ, formed in
    /// f64; f64 state tiles P).
    pub(crate) fn new<T: Real>(k: usize, step: Option<&SgaStep<'_>>, isa: Isa) -> Self {
        let p = step.map(|st| {
            if residual_form::<T>() {
                let mut sigma = st.p[..k * k].to_vec();
                for (i, row) in sigma.chunks_exact_mut(k).enumerate() {
                    for (v, &mj) in row.iter_mut().zip(st.m) {
                        *v -= st.m[i] * mj;
                    }
                }
                Tiled::new(k, &sigma)
            } else {
                Tiled::new(k, st.p)
            }
        });
        let l = step.and_then(|st| st.whiten).map(|w| Tiled::new(k, &w[..k * k]));
        SgaWide { k, p, l, isa }
    }
}

/// Scratch of one task: three f64 buffers of equal use (a sub-block of F, G = F P and Y = F/ψ); for f32 state
/// they are used as f32 buffers of twice their length.
pub(crate) struct SgaWideScratch<'a> {
    pub(crate) f: &'a mut [f64],
    pub(crate) g: &'a mut [f64],
    pub(crate) y: &'a mut [f64],
}

/// The scratch of one task viewed in the arithmetic type E.
struct Bufs<'a, E> {
    f: &'a mut [E],
    g: &'a mut [E],
    y: &'a mut [E],
}

impl SgaWide {
    /// Run the pass over the rows of `io` in sub-blocks of as many rows as the scratch holds (at most
    /// [`MAX_SUB_ROWS`], a multiple of the tile height), in f32 arithmetic for f32 state and in f64 otherwise.
    pub(crate) fn run<T: Real>(&self, c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, sc: &mut SgaWideScratch<'_>) {
        if residual_form::<T>() {
            self.run_in::<T, f32>(c, io, sc)
        } else {
            self.run_in::<T, f64>(c, io, sc)
        }
    }

    fn run_in<T: Real, E: TileElem>(&self, c: &SgaConsts<'_>, io: &mut SgaBlockIo<'_, T>, sc: &mut SgaWideScratch<'_>) {
        let mut bufs = Bufs {
            f: E::scratch(sc.f),
            g: E::scratch(sc.g),
            y: E::scratch(sc.y),
        };
        let len = bufs.f.len().min(bufs.g.len()).min(bufs.y.len());
        let step = (len / padded_width(self.k)).min(MAX_SUB_ROWS) / TILE_ROWS * TILE_ROWS;
        assert!(step > 0, "wide-kernel scratch too small");
        // The pending step's m in E, once for the block.
        let m: Vec<E> = c
            .step
            .as_ref()
            .map_or_else(Vec::new, |st| st.m.iter().map(|&v| E::from_f64(v)).collect());
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` and `Isa::Avx512` are constructed only after `is_x86_feature_detected!("avx2")`
            // (`Isa::available`). AVX-512 CPUs run the AVX2 build here too: enabling avx512f measured slower.
            Isa::Avx2 | Isa::Avx512 => unsafe { self.sub_blocks_avx2(c, io, &mut bufs, &m, step) },
            _ => self.sub_blocks(c, io, &mut bufs, &m, step),
        }
    }

    /// [`Self::sub_blocks`] compiled with AVX2 enabled: the row-local loops (over K within a row) run 256-bit
    /// vectors. No multiply-add is fused (Rust never contracts a·b + c), so the bits are those of the portable
    /// build.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sub_blocks_avx2<T: Real, E: TileElem>(
        &self,
        c: &SgaConsts<'_>,
        io: &mut SgaBlockIo<'_, T>,
        sc: &mut Bufs<'_, E>,
        m: &[E],
        step: usize,
    ) {
        self.sub_blocks(c, io, sc, m, step)
    }

    /// The pass over the rows of `io` in sub-blocks of `step` rows.
    #[inline(always)]
    fn sub_blocks<T: Real, E: TileElem>(
        &self,
        c: &SgaConsts<'_>,
        io: &mut SgaBlockIo<'_, T>,
        sc: &mut Bufs<'_, E>,
        m: &[E],
        step: usize,
    ) {
        let n = io.mean.len();
        for b0 in (0..n).step_by(step) {
            let nb = (n - b0).min(step);
            self.sub_block(c, io, sc, m, b0, nb);
        }
    }

    #[inline(always)]
    fn sub_block<T: Real, E: TileElem>(
        &self,
        c: &SgaConsts<'_>,
        io: &mut SgaBlockIo<'_, T>,
        sc: &mut Bufs<'_, E>,
        m: &[E],
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
                *d = E::from_f64(v.to_f64());
            }
            dst[k..].fill(E::default());
            psi[r] = io.psi[b0 + r].to_f64();
            d_prev[r] = io.d_last[b0 + r].to_f64();
        }
        sc.f[nb * kp..nbp * kp].fill(E::default());
        if let Some(start) = c.start {
            start_rows::<T, E>(&mut sc.f[..nb * kp], &mut psi[..nb], start, c.floor);
        }
        if let (Some(step), Some(p)) = (&c.step, &self.p) {
            E::rows_times(self.isa, sc.f, p, sc.g, nbp);
            let row_step = RowStep {
                m64: step.m,
                m,
                residual: residual_form::<T>(),
            };
            let rows = StepRows { kp, k };
            let mut overshoot = 0usize;
            for r0 in (0..nb).step_by(LANES) {
                let n = (nb - r0).min(LANES);
                let (f, g) = (&mut sc.f[r0 * kp..], &sc.g[r0 * kp..]);
                overshoot += row_step.apply::<T>(rows, f, g, &mut psi[r0..r0 + n], &d_prev[r0..r0 + n], c);
            }
            *io.overshoot += overshoot as f64;
            if let Some(l) = &self.l {
                whiten_rows::<T, E>(self.isa, sc, l, nb, nbp, kp, k);
            }
            bound_loadings::<T, E>(&mut sc.f[..nb * kp], &psi[..nb], kp, k);
        }
        if c.step.is_some() || c.start.is_some() {
            for r in 0..nb {
                let src = &sc.f[r * kp..r * kp + k];
                for (dst, &v) in io.f[(b0 + r) * k..(b0 + r + 1) * k].iter_mut().zip(src) {
                    *dst = T::from_f64(v.to_f64());
                }
                io.psi[b0 + r] = T::from_f64(psi[r]);
            }
        }
        // Lines 5, 6 and the sums' row-local part: y = f/ψ, u += y d.
        for r in 0..nbp {
            let y = &mut sc.y[r * kp..(r + 1) * kp];
            if r >= nb {
                y.fill(E::default());
                continue;
            }
            let i = b0 + r;
            let x = io.x[i];
            let m0 = io.mean[i].to_f64();
            let (mean_s, m1) = stored::<T>(m0 + c.rho * (x - m0));
            io.mean[i] = mean_s;
            let d = x - m1;
            io.d_last[i] = T::from_f64(d);
            let inv_psi = E::from_f64(1.0 / psi[r]);
            for ((yv, &fv), u) in y.iter_mut().zip(&sc.f[r * kp..r * kp + k]).zip(io.u.iter_mut()) {
                *yv = fv * inv_psi;
                *u += yv.to_f64() * d;
            }
            y[k..].fill(E::default());
        }
        E::syrk_upper_add(self.isa, sc.y, sc.f, nbp, k, io.s);
    }
}

/// F ← clip(F L) on the sub-block's rows (the whitened rule): G = F L by one tiled product, copied back
/// bounded (padding columns stay zero: L's padding is zero).
#[inline(always)]
fn whiten_rows<T: Real, E: TileElem>(
    isa: Isa,
    sc: &mut Bufs<'_, E>,
    l: &Tiled,
    nb: usize,
    nbp: usize,
    kp: usize,
    k: usize,
) {
    E::rows_times(isa, sc.f, l, sc.g, nbp);
    let (lo, hi) = (E::from_f64(-T::MAX_STATE), E::from_f64(T::MAX_STATE));
    for r in 0..nb {
        for (fv, &gv) in sc.f[r * kp..r * kp + k].iter_mut().zip(&sc.g[r * kp..r * kp + k]) {
            *fv = E::from_f64(stored::<T>(bounded_lane(gv, lo, hi).to_f64()).1);
        }
    }
}

/// f ← clip(f, ±√(MAX_LOADING_RATIO · ψ)) on each row (kp wide, k used) with its new ψ: Fᵀ Ψ⁻¹ F stays
/// finite (see `sga_bounds`). The bound is rounded to T, as the narrow kernel's.
#[inline(always)]
fn bound_loadings<T: Real, E: Real>(f: &mut [E], psi: &[f64], kp: usize, k: usize) {
    for (row, &p) in f.chunks_mut(kp).zip(psi) {
        let bound = loading_bound::<T>(p);
        let (lo, hi) = (
            E::from_f64(T::from_f64(-bound).to_f64()),
            E::from_f64(T::from_f64(bound).to_f64()),
        );
        for v in row[..k].iter_mut() {
            *v = bounded_lane(*v, lo, hi);
        }
    }
}

/// The data-scaled start on rows of F (padded rows, kp wide) and their ψ, rounded to T.
#[inline(always)]
fn start_rows<T: Real, E: Real>(f: &mut [E], psi: &mut [f64], start: Start, floor: f64) {
    if start.degenerate {
        psi.fill(1.0);
        return;
    }
    for v in f.iter_mut() {
        *v = E::from_f64(stored::<T>(v.to_f64() * start.sigma).1);
    }
    for v in psi.iter_mut() {
        *v = stored::<T>(v.max(floor)).1;
    }
}

/// Rows stepped together: their scalar work (the dots f·m and g·f, 1/ψ, the exp of the ψ step) runs as
/// LANES independent chains, each row's sums in the row's own order, so the results are those of one row at a
/// time while the chains overlap instead of waiting on each other's latency.
const LANES: usize = 8;

/// Row layout of a sub-block buffer: kp values per row, the first k used.
#[derive(Clone, Copy)]
struct StepRows {
    kp: usize,
    k: usize,
}

/// The pending step's m (f64 and in the arithmetic type E) and its form (residual for f32 arithmetic).
struct RowStep<'a, E> {
    m64: &'a [f64],
    m: &'a [E],
    residual: bool,
}

impl<E: Real> RowStep<'_, E> {
    /// Per row of a group (n ≤ LANES rows of f and g = f P or f Σ, laid out as `rows`; d' each): q and the
    /// coefficient of m in the F step. f64 form: q = d'² − 2 d' f·m + g·f, coefficient d'. Residual form (g =
    /// f Σ, see the module documentation): r = d' − f·m in f64, q = r² + g·f, coefficient r. Each row's dots
    /// are summed over j ascending, as one row alone would be.
    #[inline(always)]
    fn lane_terms(&self, rows: StepRows, f: &[E], g: &[E], d: &[f64]) -> ([f64; LANES], [f64; LANES]) {
        let n = d.len();
        let mut f_m = [0.0f64; LANES];
        let mut g_f = [0.0f64; LANES];
        let mut g_f_e = [E::default(); LANES];
        for (j, &mj) in self.m64.iter().enumerate().take(rows.k) {
            for l in 0..n {
                let (fv, gv) = (f[l * rows.kp + j], g[l * rows.kp + j]);
                f_m[l] += fv.to_f64() * mj;
                if self.residual {
                    g_f_e[l] = g_f_e[l] + gv * fv;
                } else {
                    g_f[l] += gv.to_f64() * fv.to_f64();
                }
            }
        }
        let (mut q, mut coef) = ([0.0f64; LANES], [0.0f64; LANES]);
        for l in 0..n {
            if self.residual {
                let r = d[l] - f_m[l];
                (q[l], coef[l]) = (r * r + g_f_e[l].to_f64(), r);
            } else {
                (q[l], coef[l]) = (d[l] * d[l] - 2.0 * d[l] * f_m[l] + g_f[l], d[l]);
            }
        }
        (q, coef)
    }

    /// Lines 10–14 of Algorithm 1 on a group of n = `psi.len()` ≤ LANES rows (f, g from the group's first row,
    /// laid out as `rows`; ψ and d' per row), rounded to T; returns how many rows' ψ step diverged. The exp
    /// of the log-ψ step runs on all lanes at once (`exp_lanes`, within a few ulp of libm's).
    #[inline(always)]
    fn apply<T: Real>(
        &self,
        rows: StepRows,
        f: &mut [E],
        g: &[E],
        psi: &mut [f64],
        d: &[f64],
        c: &SgaConsts<'_>,
    ) -> usize {
        let n = psi.len();
        let (q, coef) = self.lane_terms(rows, f, g, d);
        let mut inv_psi = [0.0f64; LANES];
        let mut log_step = [0.0f64; LANES];
        for l in 0..n {
            inv_psi[l] = 1.0 / psi[l];
            log_step[l] = log_psi_step(c.lr * (0.5 * inv_psi[l] * q[l] - 0.5), c.precondition);
        }
        let growth = match c.psi_rate {
            Some(_) => [1.0; LANES],
            None => exp_lanes(log_step),
        };
        let lr = E::from_f64(c.lr);
        let (lo, hi) = (E::from_f64(-T::MAX_STATE), E::from_f64(T::MAX_STATE));
        let mut overshoot = 0;
        for l in 0..n {
            let scale = E::from_f64(if c.precondition { 1.0 } else { inv_psi[l] });
            let coef = E::from_f64(coef[l]);
            let row = l * rows.kp..l * rows.kp + rows.k;
            for ((fv, &gv), &mj) in f[row.clone()].iter_mut().zip(&g[row]).zip(self.m) {
                let grad_f = scale * (coef * mj - gv);
                *fv = E::from_f64(stored::<T>(bounded_lane(*fv + lr * grad_f, lo, hi).to_f64()).1);
            }
            let old = psi[l];
            let stepped = match c.psi_rate {
                Some(a) => old + a * (q[l] - old),
                None => old * growth[l],
            };
            psi[l] = stored::<T>(bounded(stepped, c.floor, T::MAX_STATE)).1;
            // The natural step cannot diverge (it lies between ψ and q ≥ 0), so only the log step is checked.
            overshoot += usize::from(c.psi_rate.is_none() && psi[l] > MAX_PSI_OVERSHOOT * old.max(d[l] * d[l]));
        }
        overshoot
    }
}
