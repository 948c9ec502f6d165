//! A K×K map of rows held as lane-arrays, shared by the row kernels (online EM's whitening product, online
//! SGA's g = f P and its whitening step f L, VIFA's line 12) and online EM's query rows.

use crate::scalar::Real;

/// out = a · M per lane (a: K lane-arrays of W rows; M: K×K row-major, at least K² values):
/// out_j = Σ_i a_i M[i][j], summed over i in order. [`lanes_times_blocked`], returning the product.
#[inline(always)]
pub(crate) fn lanes_times<T: Real, const K: usize, const W: usize>(a: &[[T; W]; K], m: &[T]) -> [[T; W]; K] {
    let mut out = [[T::default(); W]; K];
    lanes_times_blocked::<T, K, W>(a, m, &mut out);
    out
}

/// Output columns per pass of [`lanes_times_blocked`].
const COLUMNS: usize = 4;

/// out = a · M per lane, written into `out`: out_j = Σ_i a_i M[i][j], summed over i in order (a: K lane-arrays
/// of W rows; M: K×K row-major, at least K² values).
///
/// [`COLUMNS`] output columns are summed side by side, each in its own W-lane accumulator, so that each input
/// lane-array is loaded once per [`COLUMNS`] columns rather than once per column; every output column takes
/// the same terms in the same order as a product one column at a time, so the result is the same bits.
/// Written with i outer (every output column updated per input column), LLVM vectorised such a product
/// across j at K ≥ 16 with a gather and a scatter of the output per multiply-add.
#[inline(always)]
pub(crate) fn lanes_times_blocked<T: Real, const K: usize, const W: usize>(
    a: &[[T; W]; K],
    m: &[T],
    out: &mut [[T; W]; K],
) {
    column_blocks::<T, K, W, false>(a, m, out);
}

/// out = a · L per lane for L lower triangular (K×K row-major, at least K² values, **zero above the
/// diagonal**): out_j = Σ_{i ≥ j} a_i L[i][j], summed over i in order (a: K lane-arrays of W rows, finite).
///
/// As [`lanes_times_blocked`], [`COLUMNS`] columns side by side, each block's sums starting at its first
/// column's diagonal. The block's columns that start further down first add a_i · 0 = ±0 for the rows above
/// their diagonal, which leaves their +0 start unchanged (+0 + −0 = +0), so each column is the same bits as
/// its triangular sum one column at a time. Summed one column at a time, each column was one chain of
/// dependent additions, and online SGA's whitening step waited on their latency.
#[inline(always)]
pub(crate) fn lanes_times_lower<T: Real, const K: usize, const W: usize>(a: &[[T; W]; K], l: &[T]) -> [[T; W]; K] {
    let mut out = [[T::default(); W]; K];
    column_blocks::<T, K, W, true>(a, l, &mut out);
    out
}

/// The products of [`lanes_times_blocked`] (`LOWER` false: every i) and [`lanes_times_lower`] (`LOWER`
/// true: i from the block's first column), block by block of [`COLUMNS`] output columns.
#[inline(always)]
fn column_blocks<T: Real, const K: usize, const W: usize, const LOWER: bool>(
    a: &[[T; W]; K],
    m: &[T],
    out: &mut [[T; W]; K],
) {
    assert!(m.len() >= K * K);
    let full = K / COLUMNS * COLUMNS;
    for j0 in (0..full).step_by(COLUMNS) {
        let mut acc = [[T::default(); W]; COLUMNS];
        for (i, a_i) in a.iter().enumerate() {
            // A test of a constant where `LOWER` is false: that product compiles as if it were not there.
            if LOWER && i < j0 {
                continue;
            }
            let row = &m[i * K + j0..i * K + j0 + COLUMNS];
            for (acc_c, &mij) in acc.iter_mut().zip(row) {
                for l in 0..W {
                    acc_c[l] = acc_c[l] + a_i[l] * mij;
                }
            }
        }
        out[j0..j0 + COLUMNS].copy_from_slice(&acc);
    }
    if full == K {
        return;
    }
    // The last K − full < COLUMNS columns as one more block, M's missing columns taken as zero and their sums
    // dropped. Summed one column at a time, LLVM vectorised the tail across its 1–3 columns (they are
    // contiguous in M) and scattered each sum into the lane-arrays, whose reloads then waited on the scatters:
    // online EM took 1.3–1.4× (K = 3) and 1.6× (K = 7, float64) the time of this form.
    let rest = K - full;
    let mut tail = [[T::default(); COLUMNS]; K];
    for (i, row) in tail.iter_mut().enumerate() {
        row[..rest].copy_from_slice(&m[i * K + full..i * K + K]);
    }
    let mut acc = [[T::default(); W]; COLUMNS];
    for (i, (a_i, row)) in a.iter().zip(&tail).enumerate() {
        if LOWER && i < full {
            continue;
        }
        for (acc_c, &mij) in acc.iter_mut().zip(row) {
            for l in 0..W {
                acc_c[l] = acc_c[l] + a_i[l] * mij;
            }
        }
    }
    out[full..].copy_from_slice(&acc[..rest]);
}

/// [`lanes_times`] for float32 lanes of 8, written with 256-bit vector operations. Left to itself, LLVM joins two
/// 8-lane float32 output columns into one 512-bit register on AVX-512 builds, paying a permute per pair of
/// columns and an insert per input column; on CPUs that run a 512-bit operation as two 256-bit halves that
/// saves no arithmetic. The same operations in the same order as [`lanes_times_blocked`] (a multiply, then an
/// add, never fused), so the same bits.
///
/// # Safety
/// The CPU must support AVX. Not a `#[target_feature]` function, so that it is inlined into its caller (as
/// a target-feature function LLVM kept it out of line, and the call and the returned array through memory
/// cost more than the product saves at K = 10); its AVX operations are inlined only into code compiled with
/// AVX, the AVX-512 entry point.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn lanes_times_f32x8<const K: usize>(a: &[[f32; 8]; K], m: &[f32]) -> [[f32; 8]; K] {
    use std::arch::x86_64::{__m256, _mm256_storeu_ps};
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps};
    assert!(m.len() >= K * K);
    let mut out = [[0.0f32; 8]; K];
    let full = K / COLUMNS * COLUMNS;
    for j0 in (0..full).step_by(COLUMNS) {
        let mut acc: [__m256; COLUMNS] = [unsafe { _mm256_setzero_ps() }; COLUMNS];
        for (i, a_i) in a.iter().enumerate() {
            // SAFETY: a_i holds 8 floats.
            let ai = unsafe { _mm256_loadu_ps(a_i.as_ptr()) };
            let row = &m[i * K + j0..i * K + j0 + COLUMNS];
            for (acc_c, &mij) in acc.iter_mut().zip(row) {
                *acc_c = unsafe { _mm256_add_ps(*acc_c, _mm256_mul_ps(ai, _mm256_set1_ps(mij))) };
            }
        }
        for (out_c, acc_c) in out[j0..j0 + COLUMNS].iter_mut().zip(&acc) {
            // SAFETY: out_c holds 8 floats.
            unsafe { _mm256_storeu_ps(out_c.as_mut_ptr(), *acc_c) };
        }
    }
    for (j, out_j) in out.iter_mut().enumerate().skip(full) {
        let mut acc = unsafe { _mm256_setzero_ps() };
        for (i, a_i) in a.iter().enumerate() {
            // SAFETY: a_i holds 8 floats.
            let ai = unsafe { _mm256_loadu_ps(a_i.as_ptr()) };
            acc = unsafe { _mm256_add_ps(acc, _mm256_mul_ps(ai, _mm256_set1_ps(m[i * K + j]))) };
        }
        // SAFETY: out_j holds 8 floats.
        unsafe { _mm256_storeu_ps(out_j.as_mut_ptr(), acc) };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `$check::<K>()` for the K the products are tested at: one and three (no full block of four columns),
    /// four, and sizes with a tail of one to three columns.
    macro_rules! each_k {
        ($check:ident) => {
            $check::<1>();
            $check::<3>();
            $check::<4>();
            $check::<10>();
            $check::<17>();
            $check::<24>();
        };
    }

    /// The product one output column at a time, its sum over i in order: the reference.
    fn column_product<const K: usize>(a: &[[f64; 8]; K], m: &[f64]) -> [[f64; 8]; K] {
        std::array::from_fn(|j| {
            let mut acc = [0.0; 8];
            for (i, a_i) in a.iter().enumerate() {
                for l in 0..8 {
                    acc[l] += a_i[l] * m[i * K + j];
                }
            }
            acc
        })
    }

    #[test]
    fn blocked_product_equals_the_column_product_bit_for_bit() {
        fn check<const K: usize>() {
            let a: [[f64; 8]; K] = std::array::from_fn(|i| std::array::from_fn(|l| ((i * 8 + l) as f64 * 0.37).sin()));
            let m: Vec<f64> = (0..K * K).map(|v| (v as f64 * 1.3).cos() / 3.0).collect();
            let mut blocked = [[0.0; 8]; K];
            lanes_times_blocked(&a, &m, &mut blocked);
            let bits = |x: &[[f64; 8]; K]| x.as_flattened().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&blocked), bits(&column_product(&a, &m)), "K = {K}");
            assert_eq!(bits(&lanes_times(&a, &m)), bits(&blocked), "K = {K}");
        }
        each_k!(check);
    }

    #[test]
    fn lower_product_equals_the_triangular_column_product_bit_for_bit() {
        fn check<const K: usize>() {
            // Lanes of both signs, so that the blocks' a_i · 0 terms include −0.
            let a: [[f64; 8]; K] = std::array::from_fn(|i| std::array::from_fn(|l| ((i * 8 + l) as f64 * 0.37).sin()));
            let l: Vec<f64> = (0..K * K)
                .map(|v| {
                    if v % K <= v / K {
                        (v as f64 * 1.3).cos() / 3.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let reference: [[f64; 8]; K] = std::array::from_fn(|j| {
                let mut acc = [0.0; 8];
                for (i, a_i) in a.iter().enumerate().skip(j) {
                    for v in 0..8 {
                        acc[v] += a_i[v] * l[i * K + j];
                    }
                }
                acc
            });
            let bits = |x: &[[f64; 8]; K]| x.as_flattened().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&lanes_times_lower(&a, &l)), bits(&reference), "K = {K}");
        }
        each_k!(check);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn float32_256_bit_product_equals_the_generic_one_bit_for_bit() {
        fn check<const K: usize>() {
            let a: [[f32; 8]; K] =
                std::array::from_fn(|i| std::array::from_fn(|l| ((i * 8 + l) as f32 * 0.37).sin() * 1e3));
            let m: Vec<f32> = (0..K * K).map(|v| (v as f32 * 1.3).cos() / 3.0).collect();
            let mut generic = [[0.0f32; 8]; K];
            lanes_times_blocked(&a, &m, &mut generic);
            // SAFETY: `check` runs only on CPUs with AVX (tested below).
            let wide = unsafe { lanes_times_f32x8(&a, &m) };
            let bits = |x: &[[f32; 8]; K]| x.as_flattened().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&wide), bits(&generic), "K = {K}");
        }
        if !std::arch::is_x86_feature_detected!("avx") {
            return;
        }
        each_k!(check);
    }
}
