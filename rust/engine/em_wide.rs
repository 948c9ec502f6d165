//! The online-EM pass over one block of rows for K > 16 (`em_kernel` handles K ≤ 16) after warm-up, with the
//! K×K work done by the register-tiled products of `engine::tiled`.
//!
//! Per row, as in `em_kernel` (Ā-space sums; U = Lᵀ with L the lower Cholesky factor of H̄⁻¹, so
//! H̄⁻¹ = Uᵀ U; U = I in the whitened basis):
//!
//! ```text
//!   a ← (a + ρ_{t−1} (d_{t−1} m_{t−1}ᵀ − a)) W     pending line 12 (+ whitening W = R⁻ᵀ, upper triangular)
//!   zᵀ = aᵀ L                                       (4.33) in Ā space: f = H̄⁻¹ a = Uᵀ z
//!   ψ = max(d̄² − |z|², floor)                       (4.35), since f·a = |z|²
//!   y = z/ψ,   u_z += y d,   S_z += y zᵀ (upper)    the sums of (4.23) in Ā space
//! ```
//!
//! and after the pass Fᵀ Ψ⁻¹ F = Uᵀ S_z U, Fᵀ Ψ⁻¹ d = Uᵀ u_z (`em_kernel::to_loadings_space`). A block of
//! nb rows is handled as matrices: A (nb×K) ← A W and Z = A L are two triangular products, S_z += Yᵀ Z a
//! symmetric rank-nb update, each register-tiled; that costs K² + O(K) multiply-adds per row (K²/2 per
//! triangular product, K²/2 for the upper triangle of S_z), against 2–3 K² for the explicit-F block path.
//!
//! **Arithmetic** follows the storage type. f64 state: everything in f64. f32 state: the scratch rows (Ā, Z,
//! Y) and both tiled products are f32 (twice the lanes per vector, half the bytes), while the row-local
//! moments, line 12 (computed in f64 and rounded to storage, as the block path does), |z|² (each z widened,
//! summed in f64: ψ = d̄² − |z|² cancels when the factors explain most of the variance, so its error must not
//! be relative to d̄²'s f32 rounding amplified by 1/ψ), u_z (accumulated in f64) and the f32 S_z tiles of each
//! sub-block are added into the f64 totals. Ā is rounded to T after its pending update, exactly as the block
//! path does.

use super::advance;
use super::isa::Isa;
use super::tiled::{padded_width, TileElem, Tiled, TILE_ROWS};
use crate::scalar::{stored, Real};

/// Largest sub-block (rows).
const MAX_SUB_ROWS: usize = 96;

/// Per-pass constants of the wide kernel.
#[derive(Debug, Clone)]
pub(crate) struct WideConsts {
    pub(crate) k: usize,
    /// Pending lines 5, 6, 14 of the previous sample (its ρ', ρ), applied from the innovation in d_last.
    pub(crate) moments: Option<(f64, f64)>,
    /// Pending line-12 update (ρ_{t−1}, m_{t−1}), if any.
    pub(crate) pending: Option<(f64, Vec<f64>)>,
    /// Whitening transform W (K×K) applied after the pending update, if any.
    pub(crate) transform: Option<Tiled>,
    /// L (K×K lower triangular) with L Lᵀ = H̄⁻¹; None in the whitened basis (L = I).
    pub(crate) factor: Option<Tiled>,
    /// ρ_t of this sample, the running mean's step and the noise floor.
    pub(crate) rho: f64,
    pub(crate) mean_rho: f64,
    pub(crate) floor: f64,
    pub(crate) isa: Isa,
}

/// Scratch of one task: three nbp×kp buffers and one nbp vector (nbp = [`WideScratch::rows`]); for f32 state
/// the three buffers are used as f32 buffers of twice their length.
pub(crate) struct WideScratch<'a> {
    pub(crate) a: &'a mut [f64],
    pub(crate) z: &'a mut [f64],
    pub(crate) y: &'a mut [f64],
    pub(crate) d_prev: &'a mut [f64],
}

impl WideScratch<'_> {
    /// Rows per sub-block that fit buffers of `len` elements each (for K = `k`), a multiple of the tile height and
    /// at most [`MAX_SUB_ROWS`] (so the three buffers of a sub-block stay in L2 next to the state stream).
    pub(crate) fn rows(k: usize, len: usize) -> usize {
        (len / padded_width(k)).min(MAX_SUB_ROWS) / TILE_ROWS * TILE_ROWS
    }
}

/// The state rows of one block and its outputs.
pub(crate) struct WideIo<'a, T> {
    /// Ā rows, nb×K (row-major), updated in place.
    pub(crate) a: &'a mut [T],
    /// θ̄, d̄², d_last (nb each), as in `em_kernel::EmBlockIo`.
    pub(crate) mean: &'a mut [T],
    pub(crate) dsq: &'a mut [T],
    pub(crate) d_last: &'a mut [T],
    /// This sample's values for the block's rows (nb).
    pub(crate) x: &'a [f64],
    /// Outputs, accumulated: Σ d̄² after the update, u_z (K) and S_z (K×K row-major, upper triangle only).
    pub(crate) dsq_sum: &'a mut f64,
    pub(crate) u: &'a mut [f64],
    pub(crate) s: &'a mut [f64],
}

/// Run the pass over the rows of `io` in sub-blocks of `WideScratch::rows` rows, in f32 arithmetic for f32
/// state and in f64 otherwise.
pub(crate) fn em_wide_block<T: Real>(c: &WideConsts, io: &mut WideIo<'_, T>, scratch: &mut WideScratch<'_>) {
    if T::SINGLE {
        em_wide_block_in::<T, f32>(c, io, scratch)
    } else {
        em_wide_block_in::<T, f64>(c, io, scratch)
    }
}

/// [`em_wide_block`] with the scratch rows and the tiled products in E.
pub(crate) fn em_wide_block_in<T: Real, E: TileElem>(
    c: &WideConsts,
    io: &mut WideIo<'_, T>,
    scratch: &mut WideScratch<'_>,
) {
    let mut bufs = Bufs {
        a: E::scratch(scratch.a),
        z: E::scratch(scratch.z),
        y: E::scratch(scratch.y),
        d_prev: scratch.d_prev,
    };
    match c.isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { em_wide_block_fma(c, io, &mut bufs) },
        Isa::Portable => em_wide_block_with(c, io, &mut bufs),
    }
}

/// The scratch of one task viewed in the arithmetic type E.
struct Bufs<'a, E> {
    a: &'a mut [E],
    z: &'a mut [E],
    y: &'a mut [E],
    d_prev: &'a mut [f64],
}

/// The row-local loops compiled for AVX2 (the tiled products dispatch on their own).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn em_wide_block_fma<T: Real, E: TileElem>(c: &WideConsts, io: &mut WideIo<'_, T>, bufs: &mut Bufs<'_, E>) {
    em_wide_block_with(c, io, bufs)
}

#[inline(always)]
fn em_wide_block_with<T: Real, E: TileElem>(c: &WideConsts, io: &mut WideIo<'_, T>, bufs: &mut Bufs<'_, E>) {
    let k = c.k;
    let n = io.mean.len();
    let step = WideScratch::rows(k, bufs.a.len().min(bufs.z.len()).min(bufs.y.len()))
        .min(bufs.d_prev.len() / TILE_ROWS * TILE_ROWS);
    assert!(step > 0, "wide-kernel scratch too small");
    for b0 in (0..n).step_by(step) {
        let nb = (n - b0).min(step);
        sub_block(c, io, bufs, b0, nb);
    }
}

#[inline(always)]
fn sub_block<T: Real, E: TileElem>(c: &WideConsts, io: &mut WideIo<'_, T>, sc: &mut Bufs<'_, E>, b0: usize, nb: usize) {
    let k = c.k;
    let kp = padded_width(k);
    let nbp = nb.div_ceil(TILE_ROWS) * TILE_ROWS;
    // The pending moments (lines 5, 6, 14): θ̄_{t−1}, d̄²_{t−1} written back, d_{t−1} for line 12.
    let mut m0 = [0.0f64; MAX_SUB_ROWS];
    let mut dsq0 = [0.0f64; MAX_SUB_ROWS];
    for r in 0..nb {
        let i = b0 + r;
        m0[r] = io.mean[i].to_f64();
        dsq0[r] = io.dsq[i].to_f64();
        sc.d_prev[r] = io.d_last[i].to_f64();
        if let Some((mean_rho, rho)) = c.moments {
            let adv = advance::<T>(m0[r], dsq0[r], sc.d_prev[r], mean_rho, rho);
            (io.mean[i], m0[r]) = adv.mean;
            (io.dsq[i], dsq0[r]) = adv.dsq;
            sc.d_prev[r] = adv.d;
        }
    }
    // Ā rows into the padded buffer (padding rows and columns zero) with line 12, a ← a + ρ (d mᵀ − a), applied
    // on the way (in f64); without whitening they are rounded to storage and written back in the same sweep.
    let store_now = c.transform.is_none();
    let rows = sc.a[..nb * kp]
        .chunks_exact_mut(kp)
        .zip(io.a[b0 * k..(b0 + nb) * k].chunks_exact_mut(k));
    for (r, (dst, src)) in rows.enumerate() {
        match &c.pending {
            Some((rho_p, m)) => {
                let dp = sc.d_prev[r];
                for ((d, v), &mj) in dst[..k].iter_mut().zip(src.iter_mut()).zip(m) {
                    let a = v.to_f64();
                    let mut next = a + rho_p * (dp * mj - a);
                    if store_now {
                        (*v, next) = stored::<T>(next);
                    }
                    *d = E::from_f64(next);
                }
            }
            None => {
                for (d, v) in dst[..k].iter_mut().zip(src.iter()) {
                    *d = E::from_f64(v.to_f64());
                }
            }
        }
        dst[k..].fill(E::default());
    }
    sc.a[nb * kp..nbp * kp].fill(E::default());
    if let (Some(w), Some(_)) = (&c.transform, &c.pending) {
        // Whitening: a ← a W, then rounded to storage and written back.
        E::rows_times(c.isa, sc.a, w, sc.z, nbp);
        std::mem::swap(&mut sc.a, &mut sc.z);
        for r in 0..nb {
            let row = &mut sc.a[r * kp..r * kp + k];
            for (dst, v) in io.a[(b0 + r) * k..(b0 + r + 1) * k].iter_mut().zip(row.iter_mut()) {
                let (s, rounded) = stored::<T>(v.to_f64());
                *dst = s;
                *v = E::from_f64(rounded);
            }
        }
    }
    prefetch_rows(&io.a[((b0 + nb) * k).min(io.a.len())..((b0 + 2 * nb) * k).min(io.a.len())]);
    // Z = A L (or A in the whitened basis).
    let z: &[E] = match &c.factor {
        Some(l) => {
            E::rows_times(c.isa, sc.a, l, sc.z, nbp);
            sc.z
        }
        None => sc.a,
    };
    // This sample: innovation e (stored), d_t and d̄²_t in registers; ψ from d̄²_{t−1}; y = z/ψ, u_z += y d.
    let mut dsq_sum = 0.0;
    for r in 0..nbp {
        let zr = &z[r * kp..(r + 1) * kp];
        let yr = &mut sc.y[r * kp..(r + 1) * kp];
        if r >= nb {
            yr.fill(E::default());
            continue;
        }
        let i = b0 + r;
        let fa = squared_norm(zr);
        let inv_psi = 1.0 / (dsq0[r] - fa).max(c.floor);
        let inv_psi_e = E::from_f64(inv_psi);
        let (e_s, e) = stored::<T>(io.x[i] - m0[r]);
        let adv = advance::<T>(m0[r], dsq0[r], e, c.mean_rho, c.rho);
        dsq_sum += adv.dsq.1;
        io.d_last[i] = e_s;
        for ((y, &zv), u) in yr.iter_mut().zip(zr).zip(io.u.iter_mut()) {
            *y = zv * inv_psi_e;
            *u += y.to_f64() * adv.d;
        }
        yr[k..].fill(E::default());
    }
    *io.dsq_sum += dsq_sum;
    E::syrk_upper_add(c.isa, sc.y, z, nbp, k, io.s);
}

/// |z|² of a padded row (kp a multiple of 4): four partial sums over the lanes j ≡ 0, 1, 2, 3 (mod 4), added in
/// that order at the end, so the loop vectorises and the order is fixed.
/// Each z is widened to f64 first.
#[inline(always)]
fn squared_norm<E: Real>(z: &[E]) -> f64 {
    let mut acc = [0.0f64; 4];
    for c in 0..z.len() / 4 {
        for (l, a) in acc.iter_mut().enumerate() {
            let v = z[4 * c + l].to_f64();
            *a += v * v;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// Ask for the next sub-block's Ā rows while this one computes (a hint; no effect on results).
#[inline(always)]
fn prefetch_rows<T>(rows: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(rows);
        let base = rows.as_ptr() as *const i8;
        for offset in (0..bytes).step_by(64) {
            // SAFETY: offset < size_of_val(rows), so the address is inside `rows`; prefetch never faults.
            unsafe { _mm_prefetch(base.add(offset), _MM_HINT_T0) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}
