//! The f32 versions of the tiled products, for f32 state: same equations, shapes and summation order as the
//! f64 ones in the parent module, with eight f32 lanes per 256-bit vector.
//!
//! Tile shapes: `rows_times32` holds 6 rows × 16 columns of the output in twelve accumulators (two vectors per
//! row), `syrk_upper_add32` 16 × 6 entries of S (two vectors per column j); where the padded width kp (a
//! multiple of 8) leaves only 8 columns or rows, the last tile is one vector wide. Per inner step a tile
//! loads two vectors and broadcasts six scalars for twelve multiply-adds, as the f64 tiles do, but each
//! multiply-add now covers eight entries instead of four.
//!
//! S is accumulated in f32 over the rows of one call (a sub-block of at most a few hundred rows) and each
//! tile is then added into the caller's f64 sums, so the f32 rounding does not grow with the number of rows
//! of the pass.

use super::{padded_width, MulAdd, PortableMulAdd, Tiled, NARROW, TILE_ROWS, WIDE};
use crate::engine::isa::Isa;

/// Columns of an f32 `rows_times32` tile and rows (i) of an f32 `syrk_upper_add32` tile.
const WIDE32: usize = 2 * WIDE;

/// out = a · M for `nbp` rows (a multiple of [`TILE_ROWS`]): out[r][j] = Σ_i a[r][i] M[i][j] in f32 (M rounded
/// to f32), i ascending over the non-zero rows of M's column tile. a, out: nbp×kp row-major (padding columns
/// of a must be zero).
pub(crate) fn rows_times32(isa: Isa, a: &[f32], m: &Tiled, out: &mut [f32], nbp: usize) {
    let kp = m.kp;
    assert!(a.len() >= nbp * kp && out.len() >= nbp * kp && m.m32.len() == kp * kp && nbp.is_multiple_of(TILE_ROWS));
    for r0 in (0..nbp).step_by(TILE_ROWS) {
        let mut j0 = 0;
        while j0 < kp {
            let wide = j0 + WIDE32 <= kp;
            match (isa, wide) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA; the bounds hold by
                // the assertion above and j0 + width <= kp.
                (Isa::Avx2 | Isa::Avx512, true) => unsafe { rows_tile_fma::<2>(a, m, out, r0, j0) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                (Isa::Avx2 | Isa::Avx512, false) => unsafe { rows_tile_fma::<1>(a, m, out, r0, j0) },
                (Isa::Portable, true) => rows_tile_with::<PortableMulAdd, WIDE32>(a, m, out, r0, j0),
                (Isa::Portable, false) => rows_tile_with::<PortableMulAdd, WIDE>(a, m, out, r0, j0),
            }
            j0 += if wide { WIDE32 } else { WIDE };
        }
    }
}

/// One 6 × 8·NV output tile of `rows_times32` at rows r0.., columns j0...
///
/// # Safety
/// The CPU has AVX2 and FMA; r0 + 6 <= nbp, j0 + 8·NV <= kp, a and out hold nbp×kp, M holds kp×kp.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn rows_tile_fma<const NV: usize>(a: &[f32], m: &Tiled, out: &mut [f32], r0: usize, j0: usize) {
    use std::arch::x86_64::*;
    let kp = m.kp;
    let (lo, hi) = m.span(j0, NV * WIDE);
    let mut acc = [[_mm256_setzero_ps(); NV]; TILE_ROWS];
    for i in lo..hi {
        // SAFETY (all pointer reads here): i < kp, j0 + 8·NV <= kp, r0 + rr < nbp (the caller's contract).
        let mp = m.m32.as_ptr().add(i * kp + j0);
        let mut mv = [_mm256_setzero_ps(); NV];
        for (v, mvv) in mv.iter_mut().enumerate() {
            *mvv = _mm256_loadu_ps(mp.add(WIDE * v));
        }
        for (rr, acc_r) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.as_ptr().add((r0 + rr) * kp + i));
            for (acc_v, &mvv) in acc_r.iter_mut().zip(&mv) {
                *acc_v = _mm256_fmadd_ps(av, mvv, *acc_v);
            }
        }
    }
    for (rr, acc_r) in acc.iter().enumerate() {
        // SAFETY: row r0 + rr < nbp, columns j0..j0 + 8·NV <= kp: inside out.
        let op = out.as_mut_ptr().add((r0 + rr) * kp + j0);
        for (v, &acc_v) in acc_r.iter().enumerate() {
            _mm256_storeu_ps(op.add(WIDE * v), acc_v);
        }
    }
}

/// The portable version of [`rows_tile_fma`], CW = 8·NV columns.
#[inline(always)]
fn rows_tile_with<F: MulAdd, const CW: usize>(a: &[f32], m: &Tiled, out: &mut [f32], r0: usize, j0: usize) {
    let kp = m.kp;
    let (lo, hi) = m.span(j0, CW);
    let a_rows = &a[r0 * kp..(r0 + TILE_ROWS) * kp];
    let mut acc = [[0.0f32; CW]; TILE_ROWS];
    for i in lo..hi {
        let mut mi = [0.0f32; CW];
        mi.copy_from_slice(&m.m32[i * kp + j0..i * kp + j0 + CW]);
        for (rr, acc_r) in acc.iter_mut().enumerate() {
            let av = a_rows[rr * kp + i];
            for jj in 0..CW {
                acc_r[jj] = F::mul_add32(av, mi[jj], acc_r[jj]);
            }
        }
    }
    for (rr, acc_r) in acc.iter().enumerate() {
        out[(r0 + rr) * kp + j0..(r0 + rr) * kp + j0 + CW].copy_from_slice(acc_r);
    }
}

/// S += Yᵀ Z over `nbp` rows, upper triangle (i ≤ j < k) only: each tile Σ_r y[r][i] z[r][j] (r ascending) is
/// summed in f32 and then added to S in f64. y, z: nbp×kp f32 row-major (kp = [`padded_width`] of k); s: k×k
/// f64 row-major (entries below the diagonal untouched).
pub(crate) fn syrk_upper_add32(isa: Isa, y: &[f32], z: &[f32], nbp: usize, k: usize, s: &mut [f64]) {
    let kp = padded_width(k);
    assert!(y.len() >= nbp * kp && z.len() >= nbp * kp && s.len() >= k * k);
    for j0 in (0..k).step_by(NARROW) {
        // Tiles with some i ≤ j: i0 ≤ j0 + NARROW − 1.
        let mut i0 = 0;
        while i0 < (j0 + NARROW).min(k) {
            let wide = i0 + WIDE32 <= kp;
            let mut tile = [[0.0f32; WIDE32]; NARROW];
            match (isa, wide) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA; i0 + width <= kp,
                // j0 + 6 <= kp (kp covers the 6-column tiles) and the assertion above bound every read.
                (Isa::Avx2 | Isa::Avx512, true) => unsafe { syrk_tile_fma::<2>(y, z, nbp, kp, i0, j0, &mut tile) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above.
                (Isa::Avx2 | Isa::Avx512, false) => unsafe { syrk_tile_fma::<1>(y, z, nbp, kp, i0, j0, &mut tile) },
                (Isa::Portable, true) => syrk_tile_with::<PortableMulAdd, WIDE32>(y, z, nbp, kp, i0, j0, &mut tile),
                (Isa::Portable, false) => syrk_tile_with::<PortableMulAdd, WIDE>(y, z, nbp, kp, i0, j0, &mut tile),
            }
            let width = if wide { WIDE32 } else { WIDE };
            add_tile32(&tile, width, i0, j0, k, s);
            i0 += width;
        }
    }
}

/// tile[jj][ii] = Σ_r y[r][i0 + ii] z[r][j0 + jj] for ii < 8·NV, jj < 6.
///
/// # Safety
/// The CPU has AVX2 and FMA; i0 + 8·NV <= kp, j0 + 6 <= kp, y and z hold nbp×kp.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn syrk_tile_fma<const NV: usize>(
    y: &[f32],
    z: &[f32],
    nbp: usize,
    kp: usize,
    i0: usize,
    j0: usize,
    tile: &mut [[f32; WIDE32]; NARROW],
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); NV]; NARROW];
    for r in 0..nbp {
        // SAFETY (all pointer reads here): r < nbp, i0 + 8·NV <= kp, j0 + 6 <= kp (the caller's contract).
        let yp = y.as_ptr().add(r * kp + i0);
        let mut yv = [_mm256_setzero_ps(); NV];
        for (v, yvv) in yv.iter_mut().enumerate() {
            *yvv = _mm256_loadu_ps(yp.add(WIDE * v));
        }
        let zp = z.as_ptr().add(r * kp + j0);
        for (jj, acc_j) in acc.iter_mut().enumerate() {
            let zv = _mm256_broadcast_ss(&*zp.add(jj));
            for (acc_v, &yvv) in acc_j.iter_mut().zip(&yv) {
                *acc_v = _mm256_fmadd_ps(yvv, zv, *acc_v);
            }
        }
    }
    for (t, acc_j) in tile.iter_mut().zip(&acc) {
        for (v, &acc_v) in acc_j.iter().enumerate() {
            // SAFETY: WIDE · (v + 1) <= WIDE32: inside the tile row.
            _mm256_storeu_ps(t.as_mut_ptr().add(WIDE * v), acc_v);
        }
    }
}

/// The portable version of [`syrk_tile_fma`], CW = 8·NV rows of S.
#[inline(always)]
fn syrk_tile_with<F: MulAdd, const CW: usize>(
    y: &[f32],
    z: &[f32],
    nbp: usize,
    kp: usize,
    i0: usize,
    j0: usize,
    tile: &mut [[f32; WIDE32]; NARROW],
) {
    let mut acc = [[0.0f32; CW]; NARROW];
    for r in 0..nbp {
        let mut yr = [0.0f32; CW];
        yr.copy_from_slice(&y[r * kp + i0..r * kp + i0 + CW]);
        let zr = &z[r * kp + j0..r * kp + j0 + NARROW];
        for (acc_j, &zv) in acc.iter_mut().zip(zr) {
            for ii in 0..CW {
                acc_j[ii] = F::mul_add32(yr[ii], zv, acc_j[ii]);
            }
        }
    }
    for (t, acc_j) in tile.iter_mut().zip(&acc) {
        t[..CW].copy_from_slice(acc_j);
    }
}

/// s[i][j] += tile[j − j0][i − i0] (widened to f64) for the tile's first `width` rows i with i ≤ j < k.
#[inline(always)]
fn add_tile32(tile: &[[f32; WIDE32]; NARROW], width: usize, i0: usize, j0: usize, k: usize, s: &mut [f64]) {
    for (jj, acc_j) in tile.iter().enumerate() {
        let j = j0 + jj;
        for (ii, &v) in acc_j[..width].iter().enumerate() {
            let i = i0 + ii;
            if j < k && i <= j {
                s[i * k + j] += f64::from(v);
            }
        }
    }
}
