//! Row-major rows to lane-arrays and back by transposition in vector registers, for the 256-bit row kernels.
//!
//! A group of W rows of a row-major W×K block is held as K lane-arrays: `cols[j][l] = rows[l·K + j]`. Moved
//! value by value, each value costs a scalar load and a lane insert (or an extract and a scalar store on the way
//! back), and the inserts compete with the arithmetic for the vector shuffle unit; a vector gather per column is
//! slow on some CPUs (measured slower than the value-by-value moves on an AMD EPYC with AVX-512). Here, for one
//! 256-bit vector of lanes (8 float32 or 4 float64) and K ≥ W, each W×W tile of the block is read with W
//! contiguous loads and transposed in registers: 24 shuffles per 64 float32 values, 8 per 16 float64 values.
//! The K mod W columns after the last whole tile move value by value (a last tile overlapping the one before
//! it measured slower). It is a pure move: the lanes (and the rows written back)
//! hold the same numbers whichever way they were moved, so every code path computes bit-identical results.
//!
//! Shapes: `rows` is W×K row-major (at least W·K values), `cols` K lane-arrays of W.

use crate::scalar::Real;

/// Whether [`load_columns`] and [`store_columns`] transpose in registers for T, K and W (one 256-bit vector of
/// lanes and K ≥ W); otherwise they move value by value.
pub(crate) const fn transposes<T, const K: usize, const W: usize>() -> bool {
    cfg!(target_arch = "x86_64") && W * std::mem::size_of::<T>() == 32 && K >= W
}

/// `cols[j][l] = rows[l·K + j]` for j < K, l < W: transposed in registers when `AVX` and [`transposes`], else
/// value by value.
///
/// # Safety
/// With `AVX`, the CPU must support AVX (the caller runs on a code path compiled with AVX2).
#[inline(always)]
pub(crate) unsafe fn load_columns<T: Real, const K: usize, const W: usize, const AVX: bool>(
    rows: &[T],
    cols: &mut [[T; W]; K],
) {
    assert!(rows.len() >= W * K);
    #[cfg(target_arch = "x86_64")]
    #[cfg(target_arch = "x86_64")]
    if AVX && transposes::<T, K, W>() {
        for start in (0..K / W).map(|t| t * W) {
            if T::SINGLE {
                avx::load_tile_f32::<K>(
                    rows.as_ptr().cast::<f32>().add(start),
                    cols.as_mut_ptr().add(start).cast(),
                );
            } else {
                avx::load_tile_f64::<K>(
                    rows.as_ptr().cast::<f64>().add(start),
                    cols.as_mut_ptr().add(start).cast(),
                );
            }
        }
        for (j, col) in cols.iter_mut().enumerate().skip(K / W * W) {
            *col = std::array::from_fn(|l| rows[l * K + j]);
        }
        return;
    }
    for l in 0..W {
        for j in 0..K {
            cols[j][l] = rows[l * K + j];
        }
    }
}

/// `rows[l·K + j] = cols[j][l]` for j < K, l < W (the inverse of [`load_columns`]), the same way.
///
/// # Safety
/// As for [`load_columns`].
#[inline(always)]
pub(crate) unsafe fn store_columns<T: Real, const K: usize, const W: usize, const AVX: bool>(
    cols: &[[T; W]; K],
    rows: &mut [T],
) {
    assert!(rows.len() >= W * K);
    #[cfg(target_arch = "x86_64")]
    let mut first_loose = 0;
    #[cfg(target_arch = "x86_64")]
    if AVX && transposes::<T, K, W>() {
        for start in (0..K / W).map(|t| t * W) {
            if T::SINGLE {
                avx::store_tile_f32::<K>(
                    cols.as_ptr().add(start).cast(),
                    rows.as_mut_ptr().cast::<f32>().add(start),
                );
            } else {
                avx::store_tile_f64::<K>(
                    cols.as_ptr().add(start).cast(),
                    rows.as_mut_ptr().cast::<f64>().add(start),
                );
            }
        }
        first_loose = K / W * W;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let first_loose = 0;
    for l in 0..W {
        for j in first_loose..K {
            rows[l * K + j] = cols[j][l];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// The 8×8 float32 transpose: `out[j][l] = r[l][j]` (unpack pairs, then quadruples, then 128-bit halves).
    #[inline(always)]
    unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// The 4×4 float64 transpose: `out[j][l] = r[l][j]`.
    #[inline(always)]
    unsafe fn transpose4(r: [__m256d; 4]) -> [__m256d; 4] {
        let t0 = _mm256_unpacklo_pd(r[0], r[1]);
        let t1 = _mm256_unpackhi_pd(r[0], r[1]);
        let t2 = _mm256_unpacklo_pd(r[2], r[3]);
        let t3 = _mm256_unpackhi_pd(r[2], r[3]);
        [
            _mm256_permute2f128_pd::<0x20>(t0, t2),
            _mm256_permute2f128_pd::<0x20>(t1, t3),
            _mm256_permute2f128_pd::<0x31>(t0, t2),
            _mm256_permute2f128_pd::<0x31>(t1, t3),
        ]
    }

    /// Columns j … j + 7 of 8 rows at stride K (`rows` points at row 0, column j) into 8 lane-arrays.
    #[inline(always)]
    pub(super) unsafe fn load_tile_f32<const K: usize>(rows: *const f32, cols: *mut [f32; 8]) {
        let r: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(rows.add(l * K)));
        for (j, v) in transpose8(r).into_iter().enumerate() {
            _mm256_storeu_ps(cols.add(j).cast::<f32>(), v);
        }
    }

    /// The inverse of [`load_tile_f32`].
    #[inline(always)]
    pub(super) unsafe fn store_tile_f32<const K: usize>(cols: *const [f32; 8], rows: *mut f32) {
        let c: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(cols.add(j).cast::<f32>()));
        for (l, v) in transpose8(c).into_iter().enumerate() {
            _mm256_storeu_ps(rows.add(l * K), v);
        }
    }

    /// Columns j … j + 3 of 4 rows at stride K into 4 lane-arrays.
    #[inline(always)]
    pub(super) unsafe fn load_tile_f64<const K: usize>(rows: *const f64, cols: *mut [f64; 4]) {
        let r: [__m256d; 4] = std::array::from_fn(|l| _mm256_loadu_pd(rows.add(l * K)));
        for (j, v) in transpose4(r).into_iter().enumerate() {
            _mm256_storeu_pd(cols.add(j).cast::<f64>(), v);
        }
    }

    /// The inverse of [`load_tile_f64`].
    #[inline(always)]
    pub(super) unsafe fn store_tile_f64<const K: usize>(cols: *const [f64; 4], rows: *mut f64) {
        let c: [__m256d; 4] = std::array::from_fn(|j| _mm256_loadu_pd(cols.add(j).cast::<f64>()));
        for (l, v) in transpose4(c).into_iter().enumerate() {
            _mm256_storeu_pd(rows.add(l * K), v);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn round_trip<T: Real, const K: usize, const W: usize>(values: &[f64]) {
        let rows: Vec<T> = values[..W * K].iter().map(|&v| T::from_f64(v)).collect();
        let mut cols = [[T::default(); W]; K];
        // SAFETY: run only after AVX2 was detected.
        unsafe { load_columns::<T, K, W, true>(&rows, &mut cols) };
        crate::engine::lane_gather::tests::assert_columns_are_rows(&rows, &cols);
        // Written back over other values, the rows are the same bits and nothing past W·K is touched.
        let mut back: Vec<T> = (0..W * K + 3).map(|i| T::from_f64(-(i as f64) - 0.5)).collect();
        // SAFETY: as above.
        unsafe { store_columns::<T, K, W, true>(&cols, &mut back) };
        for (i, (b, r)) in back.iter().zip(&rows).enumerate() {
            assert_eq!(b.to_f64().to_bits(), r.to_f64().to_bits(), "K = {K}, value {i}");
        }
        for (i, b) in back.iter().enumerate().skip(W * K) {
            assert_eq!(
                b.to_f64(),
                -(i as f64) - 0.5,
                "K = {K}: value {i} past the block was written"
            );
        }
    }

    /// Every lane of every column is the row-major value it stands for, and back, for both lane types and
    /// K from 1 to 24 (whole tiles, tiles with columns left over, and the value-by-value moves of K < W).
    #[test]
    fn transposed_lanes_are_the_rows() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("no AVX2 here: the transposition is not used on this CPU");
            return;
        }
        let values: Vec<f64> = (0..8 * 24).map(|i| i as f64 * 1.25 - 37.0).collect();
        macro_rules! each_k {
            ($($k:literal)*) => {$(
                round_trip::<f32, $k, 8>(&values);
                round_trip::<f64, $k, 4>(&values);
            )*};
        }
        each_k!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24);
        assert!(transposes::<f32, 8, 8>() && transposes::<f64, 4, 4>());
        assert!(!transposes::<f32, 7, 8>() && !transposes::<f64, 3, 4>() && !transposes::<f32, 16, 16>());
    }
}
