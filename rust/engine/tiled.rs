//! Register-tiled products for the wide (K > 16) online-EM pass: a block of rows times a K×K matrix, and
//! the symmetric rank-nb update S += Yᵀ Z (upper triangle), both over row-major buffers whose rows are padded
//! to [`padded_width`] columns with zeros.
//!
//! Each output tile lives in registers for a whole sweep over the inner dimension (6 rows × 8 columns for
//! `rows_times`, 8 × 6 entries of S for `syrk_upper_add`: twelve 256-bit accumulators), so every loaded value
//! feeds several multiply-adds; that is what makes K = 50 run near the arithmetic limit rather than at the
//! load/store limit of a row-at-a-time loop.
//!
//! **Arithmetic.** The FMA path (the `Isa::Avx2` and `Isa::Avx512` paths of the row kernels: both need AVX2 and FMA) fuses
//! each multiply-add; the portable path rounds the product and the sum separately (except on aarch64, where
//! fused multiply-add is part of the base ISA and both paths fuse). The two therefore agree to rounding, not
//! bit for bit. Within one path the order of every sum is fixed by the shapes alone (inner index ascending),
//! so results do not depend on the thread count.
//!
//! **f32.** For f32 state the wide pass runs the f32 versions of both products (module `single`: the same
//! equations with eight f32 lanes per vector and 16-wide tiles); [`TileElem`] picks the version from the
//! scratch type.

mod single;

use crate::engine::isa::Isa;
use crate::scalar::Real;
pub(crate) use single::{rows_times32, syrk_upper_add32};

/// Rows of a `rows_times` tile.
pub(crate) const TILE_ROWS: usize = 6;
/// Columns of a `rows_times` tile and rows (i) of a `syrk_upper_add` tile.
const WIDE: usize = 8;
/// Columns (j) of a `syrk_upper_add` tile.
const NARROW: usize = 6;

/// Width of a padded row for K columns: a multiple of 8 that also covers the 6-column tiles of S.
pub(crate) fn padded_width(k: usize) -> usize {
    (k.div_ceil(NARROW) * NARROW).div_ceil(WIDE) * WIDE
}

/// A K×K matrix padded to kp×kp (row-major, zeros outside K×K) with, for each 8-column tile, the range of
/// rows that hold a non-zero in that tile (so triangular matrices cost half a full product).
#[derive(Debug, Clone)]
pub(crate) struct Tiled {
    pub(crate) m: Vec<f64>,
    /// `m` rounded to f32, for the f32 products.
    pub(crate) m32: Vec<f32>,
    pub(crate) kp: usize,
    pub(crate) rows: Vec<(usize, usize)>,
}

impl Tiled {
    /// From a K×K row-major matrix.
    pub(crate) fn new(k: usize, m: &[f64]) -> Self {
        let kp = padded_width(k);
        let mut padded = vec![0.0; kp * kp];
        for i in 0..k {
            padded[i * kp..i * kp + k].copy_from_slice(&m[i * k..(i + 1) * k]);
        }
        let rows = (0..kp)
            .step_by(WIDE)
            .map(|j0| {
                let nonzero = |i: &usize| padded[i * kp + j0..i * kp + j0 + WIDE].iter().any(|&v| v != 0.0);
                let lo = (0..kp).find(nonzero).unwrap_or(0);
                let hi = (0..kp).rev().find(nonzero).map_or(0, |i| i + 1);
                (lo, hi.max(lo))
            })
            .collect();
        let m32 = padded.iter().map(|&v| v as f32).collect();
        Tiled {
            m: padded,
            m32,
            kp,
            rows,
        }
    }

    /// The rows that hold a non-zero in columns j0..j0 + width (both multiples of 8): the union of the ranges
    /// of its 8-column tiles, (0, 0) when there is none.
    fn span(&self, j0: usize, width: usize) -> (usize, usize) {
        self.rows[j0 / WIDE..(j0 + width) / WIDE]
            .iter()
            .filter(|(lo, hi)| lo < hi)
            .fold(None, |acc: Option<(usize, usize)>, &(lo, hi)| {
                Some(acc.map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi))))
            })
            .unwrap_or((0, 0))
    }
}

/// a·b + c, fused or not.
pub(crate) trait MulAdd {
    fn mul_add(a: f64, b: f64, c: f64) -> f64;
    fn mul_add32(a: f32, b: f32, c: f32) -> f32;
}

#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) struct Fused;
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
pub(crate) struct Separate;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn mul_add32(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f64, b: f64, c: f64) -> f64 {
        a * b + c
    }
    #[inline(always)]
    fn mul_add32(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// The multiply-add of the portable path: fused on aarch64 (part of its base ISA), separate elsewhere.
#[cfg(target_arch = "aarch64")]
pub(crate) type PortableMulAdd = Fused;
/// The multiply-add of the portable path: fused on aarch64 (part of its base ISA), separate elsewhere.
#[cfg(not(target_arch = "aarch64"))]
pub(crate) type PortableMulAdd = Separate;

/// out = a · M for `nbp` rows (a multiple of [`TILE_ROWS`]): out[r][j] = Σ_i a[r][i] M[i][j], i ascending over
/// the non-zero rows of M's column tile. a, out: nbp×kp row-major (padding columns of a must be zero).
pub(crate) fn rows_times(isa: Isa, a: &[f64], m: &Tiled, out: &mut [f64], nbp: usize) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { rows_times_fma(a, m, out, nbp) },
        Isa::Portable => rows_times_with::<PortableMulAdd>(a, m, out, nbp),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_times_fma(a: &[f64], m: &Tiled, out: &mut [f64], nbp: usize) {
    use std::arch::x86_64::*;
    let kp = m.kp;
    assert!(a.len() >= nbp * kp && out.len() >= nbp * kp && m.m.len() == kp * kp && nbp.is_multiple_of(TILE_ROWS));
    for r0 in (0..nbp).step_by(TILE_ROWS) {
        for (t, &(lo, hi)) in m.rows.iter().enumerate() {
            let j0 = t * WIDE;
            let mut acc = [[_mm256_setzero_pd(); 2]; TILE_ROWS];
            for i in lo..hi {
                // SAFETY: i < kp and j0 + 8 <= kp, so both loads are inside M (kp×kp, checked above).
                let mp = m.m.as_ptr().add(i * kp + j0);
                let (m0, m1) = (_mm256_loadu_pd(mp), _mm256_loadu_pd(mp.add(4)));
                for (rr, acc_r) in acc.iter_mut().enumerate() {
                    // SAFETY: r0 + rr < nbp and i < kp: inside a (nbp×kp, checked above).
                    let av = _mm256_broadcast_sd(&*a.as_ptr().add((r0 + rr) * kp + i));
                    acc_r[0] = _mm256_fmadd_pd(av, m0, acc_r[0]);
                    acc_r[1] = _mm256_fmadd_pd(av, m1, acc_r[1]);
                }
            }
            for (rr, acc_r) in acc.iter().enumerate() {
                // SAFETY: row r0 + rr < nbp, columns j0..j0 + 8 <= kp: inside out (checked above).
                let op = out.as_mut_ptr().add((r0 + rr) * kp + j0);
                _mm256_storeu_pd(op, acc_r[0]);
                _mm256_storeu_pd(op.add(4), acc_r[1]);
            }
        }
    }
}

#[inline(always)]
fn rows_times_with<F: MulAdd>(a: &[f64], m: &Tiled, out: &mut [f64], nbp: usize) {
    let kp = m.kp;
    for r0 in (0..nbp).step_by(TILE_ROWS) {
        let a_rows = &a[r0 * kp..(r0 + TILE_ROWS) * kp];
        for (t, &(lo, hi)) in m.rows.iter().enumerate() {
            let j0 = t * WIDE;
            let mut acc = [[0.0f64; WIDE]; TILE_ROWS];
            for i in lo..hi {
                let mut mi = [0.0f64; WIDE];
                mi.copy_from_slice(&m.m[i * kp + j0..i * kp + j0 + WIDE]);
                for (rr, acc_r) in acc.iter_mut().enumerate() {
                    let av = a_rows[rr * kp + i];
                    for jj in 0..WIDE {
                        acc_r[jj] = F::mul_add(av, mi[jj], acc_r[jj]);
                    }
                }
            }
            for (rr, acc_r) in acc.iter().enumerate() {
                out[(r0 + rr) * kp + j0..(r0 + rr) * kp + j0 + WIDE].copy_from_slice(acc_r);
            }
        }
    }
}

/// S += Yᵀ Z over `nbp` rows, upper triangle (i ≤ j < k) only: S[i][j] += Σ_r y[r][i] z[r][j], r ascending.
/// y, z: nbp×kp row-major (kp = [`padded_width`] of k); s: k×k row-major (entries below the diagonal untouched).
pub(crate) fn syrk_upper_add(isa: Isa, y: &[f64], z: &[f64], nbp: usize, k: usize, s: &mut [f64]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512 => unsafe { syrk_fma(y, z, nbp, k, s) },
        Isa::Portable => syrk_with::<PortableMulAdd>(y, z, nbp, k, s),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn syrk_fma(y: &[f64], z: &[f64], nbp: usize, k: usize, s: &mut [f64]) {
    use std::arch::x86_64::*;
    let kp = padded_width(k);
    assert!(y.len() >= nbp * kp && z.len() >= nbp * kp && s.len() >= k * k);
    for j0 in (0..k).step_by(NARROW) {
        for i0 in (0..(j0 + NARROW).min(k)).step_by(WIDE) {
            let mut acc = [[_mm256_setzero_pd(); 2]; NARROW];
            for r in 0..nbp {
                // SAFETY: r < nbp, i0 + 8 <= kp and j0 + 6 <= kp: inside y and z (nbp×kp, checked above).
                let yp = y.as_ptr().add(r * kp + i0);
                let (y0, y1) = (_mm256_loadu_pd(yp), _mm256_loadu_pd(yp.add(4)));
                let zp = z.as_ptr().add(r * kp + j0);
                for (jj, acc_j) in acc.iter_mut().enumerate() {
                    let zv = _mm256_broadcast_sd(&*zp.add(jj));
                    acc_j[0] = _mm256_fmadd_pd(y0, zv, acc_j[0]);
                    acc_j[1] = _mm256_fmadd_pd(y1, zv, acc_j[1]);
                }
            }
            let mut tile = [[0.0f64; WIDE]; NARROW];
            for (t, acc_j) in tile.iter_mut().zip(&acc) {
                _mm256_storeu_pd(t.as_mut_ptr(), acc_j[0]);
                _mm256_storeu_pd(t.as_mut_ptr().add(4), acc_j[1]);
            }
            add_tile(&tile, i0, j0, k, s);
        }
    }
}

/// s[i][j] += tile[j − j0][i − i0] for the tile's entries with i ≤ j < k.
#[inline(always)]
fn add_tile(tile: &[[f64; WIDE]; NARROW], i0: usize, j0: usize, k: usize, s: &mut [f64]) {
    for (jj, acc_j) in tile.iter().enumerate() {
        let j = j0 + jj;
        for (ii, &v) in acc_j.iter().enumerate() {
            let i = i0 + ii;
            if j < k && i <= j {
                s[i * k + j] += v;
            }
        }
    }
}

#[inline(always)]
fn syrk_with<F: MulAdd>(y: &[f64], z: &[f64], nbp: usize, k: usize, s: &mut [f64]) {
    let kp = padded_width(k);
    for j0 in (0..k).step_by(NARROW) {
        // Tiles with some i ≤ j: i0 ≤ j0 + NARROW − 1.
        for i0 in (0..(j0 + NARROW).min(k)).step_by(WIDE) {
            let mut acc = [[0.0f64; WIDE]; NARROW];
            for r in 0..nbp {
                let mut yr = [0.0f64; WIDE];
                yr.copy_from_slice(&y[r * kp + i0..r * kp + i0 + WIDE]);
                let zr = &z[r * kp + j0..r * kp + j0 + NARROW];
                for (acc_j, &zv) in acc.iter_mut().zip(zr) {
                    for ii in 0..WIDE {
                        acc_j[ii] = F::mul_add(yr[ii], zv, acc_j[ii]);
                    }
                }
            }
            add_tile(&acc, i0, j0, k, s);
        }
    }
}

/// The arithmetic type of a wide pass's scratch (f64 for f64 state, f32 for f32 state) and its tiled products.
pub(crate) trait TileElem: Real {
    /// An f64 scratch buffer viewed as a buffer of this type (its whole length).
    fn scratch(buf: &mut [f64]) -> &mut [Self];
    /// [`rows_times`] in this type.
    fn rows_times(isa: Isa, a: &[Self], m: &Tiled, out: &mut [Self], nbp: usize);
    /// [`syrk_upper_add`] in this type, added into f64 sums.
    fn syrk_upper_add(isa: Isa, y: &[Self], z: &[Self], nbp: usize, k: usize, s: &mut [f64]);
}

impl TileElem for f64 {
    #[inline(always)]
    fn scratch(buf: &mut [f64]) -> &mut [f64] {
        buf
    }
    #[inline(always)]
    fn rows_times(isa: Isa, a: &[f64], m: &Tiled, out: &mut [f64], nbp: usize) {
        rows_times(isa, a, m, out, nbp)
    }
    #[inline(always)]
    fn syrk_upper_add(isa: Isa, y: &[f64], z: &[f64], nbp: usize, k: usize, s: &mut [f64]) {
        syrk_upper_add(isa, y, z, nbp, k, s)
    }
}

impl TileElem for f32 {
    #[inline(always)]
    fn scratch(buf: &mut [f64]) -> &mut [f32] {
        let len = 2 * buf.len();
        // SAFETY: the f64 buffer spans exactly 2·len(buf) f32 of memory, its alignment (8) is a multiple of
        // f32's (4), every bit pattern is a valid f32, and the returned slice borrows `buf` mutably for its
        // whole lifetime, so nothing else can access that memory meanwhile.
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), len) }
    }
    #[inline(always)]
    fn rows_times(isa: Isa, a: &[f32], m: &Tiled, out: &mut [f32], nbp: usize) {
        rows_times32(isa, a, m, out, nbp)
    }
    #[inline(always)]
    fn syrk_upper_add(isa: Isa, y: &[f32], z: &[f32], nbp: usize, k: usize, s: &mut [f64]) {
        syrk_upper_add32(isa, y, z, nbp, k, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| (((i as u64 + 1) * 2654435761 + seed * 97) % 1000) as f64 / 500.0 - 0.9993)
            .collect()
    }

    fn padded_rows(nbp: usize, k: usize, seed: u64) -> Vec<f64> {
        let kp = padded_width(k);
        let v = filled(nbp * k, seed);
        let mut out = vec![0.0; nbp * kp];
        for r in 0..nbp {
            out[r * kp..r * kp + k].copy_from_slice(&v[r * k..(r + 1) * k]);
        }
        out
    }

    #[test]
    fn padded_width_covers_both_tile_shapes() {
        for k in 1..100 {
            let kp = padded_width(k);
            assert!(kp >= k && kp.is_multiple_of(WIDE) && kp >= k.div_ceil(NARROW) * NARROW);
        }
    }

    #[test]
    fn products_match_naive_sums_on_every_path() {
        for k in [17usize, 24, 50, 63] {
            let kp = padded_width(k);
            let nbp = 4 * TILE_ROWS;
            let a = padded_rows(nbp, k, 1);
            let mut upper = filled(k * k, 2);
            for i in 0..k {
                for j in 0..i {
                    upper[i * k + j] = 0.0;
                }
            }
            let full = filled(k * k, 3);
            let y = padded_rows(nbp, k, 4);
            for isa in [Isa::Portable, Isa::detect()] {
                for m in [&upper, &full] {
                    let tiled = Tiled::new(k, m);
                    let mut out = vec![f64::NAN; nbp * kp];
                    rows_times(isa, &a, &tiled, &mut out, nbp);
                    for r in 0..nbp {
                        for j in 0..k {
                            let want: f64 = (0..k).map(|i| a[r * kp + i] * m[i * k + j]).sum();
                            assert!((out[r * kp + j] - want).abs() < 1e-13 * (k as f64), "K = {k}");
                        }
                        assert!(out[r * kp + k..(r + 1) * kp].iter().all(|&v| v == 0.0));
                    }
                }
                let mut s = vec![7.0; k * k];
                syrk_upper_add(isa, &y, &a, nbp, k, &mut s);
                for i in 0..k {
                    for j in 0..k {
                        let want = if i <= j {
                            7.0 + (0..nbp).map(|r| y[r * kp + i] * a[r * kp + j]).sum::<f64>()
                        } else {
                            7.0
                        };
                        assert!((s[i * k + j] - want).abs() < 1e-13 * (nbp as f64), "K = {k}");
                    }
                }
            }
        }
    }

    /// Tolerance of an f32 sum of n products against its exact value: the recursive-summation bound
    /// |error| ≤ γ_n Σ|terms| with γ_n ≈ n·2⁻²⁴ (Higham, Accuracy and Stability of Numerical Algorithms, (3.5)),
    /// plus one rounding of each f32 input of M (relative 2⁻²⁴ per term), so (n + 1)·2⁻²⁴ Σ|terms|.
    fn f32_bound(n: usize, sum_abs: f64) -> f64 {
        (n as f64 + 1.0) * f64::from(f32::EPSILON) / 2.0 * sum_abs
    }

    #[test]
    fn f32_products_match_naive_sums_on_every_path() {
        // Inputs are f32 values; the reference sums their products exactly enough in f64. K = 17, 24 (one 16-wide
        // and one 8-wide tile of kp = 24 / 32), 50 (kp = 56: three 16-wide tiles and an 8-wide one) and 63.
        for k in [17usize, 24, 50, 63] {
            let kp = padded_width(k);
            let nbp = 4 * TILE_ROWS;
            let to32 = |v: Vec<f64>| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let a = to32(padded_rows(nbp, k, 1));
            let mut upper = filled(k * k, 2);
            for i in 0..k {
                for j in 0..i {
                    upper[i * k + j] = 0.0;
                }
            }
            let full = filled(k * k, 3);
            let y = to32(padded_rows(nbp, k, 4));
            for isa in [Isa::Portable, Isa::detect()] {
                for m in [&upper, &full] {
                    let tiled = Tiled::new(k, m);
                    let mut out = vec![f32::NAN; nbp * kp];
                    rows_times32(isa, &a, &tiled, &mut out, nbp);
                    for r in 0..nbp {
                        for j in 0..k {
                            let terms = (0..k).map(|i| f64::from(a[r * kp + i]) * m[i * k + j]);
                            let want: f64 = terms.clone().sum();
                            let sum_abs: f64 = terms.map(f64::abs).sum();
                            let got = f64::from(out[r * kp + j]);
                            assert!((got - want).abs() <= f32_bound(k, sum_abs), "K = {k}, {isa:?}");
                        }
                        assert!(out[r * kp + k..(r + 1) * kp].iter().all(|&v| v == 0.0));
                    }
                }
                let mut s = vec![7.0; k * k];
                syrk_upper_add32(isa, &y, &a, nbp, k, &mut s);
                for i in 0..k {
                    for j in 0..k {
                        if i > j {
                            assert_eq!(s[i * k + j], 7.0, "below the diagonal, K = {k}");
                            continue;
                        }
                        let terms = (0..nbp).map(|r| f64::from(y[r * kp + i]) * f64::from(a[r * kp + j]));
                        let want = 7.0 + terms.clone().sum::<f64>();
                        let sum_abs: f64 = terms.map(f64::abs).sum();
                        // One more rounding: the f32 tile total added to 7 in f64 (exact to 2⁻⁵³, negligible).
                        let bound = f32_bound(nbp, sum_abs) + 1e-15 * want.abs();
                        assert!((s[i * k + j] - want).abs() <= bound, "K = {k}, {isa:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn triangular_matrices_skip_their_zero_rows() {
        let k = 50;
        let mut lower = filled(k * k, 5);
        for i in 0..k {
            for j in i + 1..k {
                lower[i * k + j] = 0.0;
            }
        }
        let tiled = Tiled::new(k, &lower);
        for (t, &range) in tiled.rows.iter().enumerate() {
            let want = if t * WIDE < k { (t * WIDE, k) } else { (0, 0) };
            assert_eq!(range, want, "column tile {t}");
        }
        // The 16-column tiles of the f32 products take the union of their two 8-column tiles.
        assert_eq!(tiled.span(0, 2 * WIDE), (0, k));
        assert_eq!(tiled.span(48, WIDE), (48, k));
        assert_eq!(tiled.span(32, 2 * WIDE), (32, k));
    }
}
