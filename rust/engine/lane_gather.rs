//! Row-major rows to lane-arrays by vector gathers, for the row kernels on CPUs with AVX-512.
//!
//! A group of W rows of a row-major W×K block is held as K lane-arrays: `cols[j][l] = rows[l·K + j]`. Built
//! element by element, that transposition compiles to one scalar load and one lane insert per value (or, for
//! some K, to a network of blends and shuffles), and the inserts compete with the arithmetic for the vector
//! shuffle unit. One gather per column (W values at stride K) moves the same values with K instructions per
//! group. It is a pure move: the lanes hold the same numbers whichever way they were loaded, so every code path
//! still computes bit-identical results.
//!
//! Only CPUs with AVX-512 gather (the online-EM row kernel's AVX-512 path, and online SGA's AVX2 code when it
//! runs on them at K < 8 float32 or K < 4 float64, where `lane_transpose` has no whole tile), where the gathers
//! beat the element-wise moves on an AVX-512 Xeon (docs/performance.md, "Why the kernels are
//! chosen as they are"). Online EM stores Ā packed wherever its kernel runs 8 lanes (`engine::packed`), so
//! there it gathers only the last D mod 8 rows, which stay row-major. CPUs with AVX2 alone include some whose
//! gathers are slow, so they keep the element-wise moves. The updated lanes go back by element-wise stores:
//! scattering them gains nothing.

use crate::scalar::Real;

/// `cols[j][l] = rows[l·K + j]` for j < K, l < W: by [`gather_columns`] when `GATHER`, else value by value
/// (every code path without gathers, and every target but x86-64).
///
/// # Safety
/// With `GATHER`, as for [`gather_columns`]; without, none.
#[inline(always)]
pub(crate) unsafe fn load_columns<T: Real, const K: usize, const W: usize, const GATHER: bool>(
    rows: &[T],
    cols: &mut [[T; W]; K],
) {
    #[cfg(target_arch = "x86_64")]
    if GATHER {
        return gather_columns::<T, K, W>(rows, cols);
    }
    for (j, col) in cols.iter_mut().enumerate() {
        *col = std::array::from_fn(|l| rows[l * K + j]);
    }
}

/// `cols[j][l] = rows[l·K + j]` for j < K, l < W (rows: W×K row-major, at least W·K values). One gather per
/// column for 256-bit lane-arrays (8 float32 or 4 float64 lanes) and 8 float64 lanes when K > 1; element-wise
/// otherwise.
///
/// # Safety
/// The CPU must support AVX2, and AVX-512F for 8 float64 lanes (the caller runs on the code path whose
/// features were detected).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn gather_columns<T: Real, const K: usize, const W: usize>(rows: &[T], cols: &mut [[T; W]; K]) {
    use std::arch::x86_64::*;
    assert!(rows.len() >= W * K && K <= i32::MAX as usize / 8);
    let base = rows.as_ptr();
    let stride = _mm256_set1_epi32(K as i32);
    // Lane l reads the value l·K after the column's first.
    let idx8 = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), stride);
    match (T::SINGLE, W) {
        // K = 1: the column is the rows themselves, one plain load.
        _ if K == 1 => cols[0] = std::array::from_fn(|l| rows[l]),
        (true, 8) => {
            for (j, col) in cols.iter_mut().enumerate() {
                let v = _mm256_i32gather_ps::<4>(base.add(j).cast::<f32>(), idx8);
                _mm256_storeu_ps(col.as_mut_ptr().cast::<f32>(), v);
            }
        }
        (false, 4) => {
            let idx4 = _mm256_castsi256_si128(idx8);
            for (j, col) in cols.iter_mut().enumerate() {
                let v = _mm256_i32gather_pd::<8>(base.add(j).cast::<f64>(), idx4);
                _mm256_storeu_pd(col.as_mut_ptr().cast::<f64>(), v);
            }
        }
        (false, 8) => {
            for (j, col) in cols.iter_mut().enumerate() {
                let v = _mm512_i32gather_pd::<8>(idx8, base.add(j).cast::<f64>());
                _mm512_storeu_pd(col.as_mut_ptr().cast::<f64>(), v);
            }
        }
        _ => {
            for (j, col) in cols.iter_mut().enumerate() {
                *col = std::array::from_fn(|l| rows[l * K + j]);
            }
        }
    }
}

/// A vector read or written at any address (`repr(packed)`: alignment 1).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, packed)]
struct Unaligned<V: Copy>(V);

/// `cols[j] = stored[j·W..(j + 1)·W]` for a packed group of 8 float64 rows (see `engine::packed`): one 512-bit
/// move per column. Each move is volatile so that LLVM keeps it one instruction: plain copies of a group
/// above 768 bytes (K ≥ 13) were merged into a call of `memcpy`.
///
/// # Safety
/// The CPU must support AVX-512F; `stored` holds at least 8·K values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn load_packed_f64<const K: usize>(stored: &[f64], cols: &mut [[f64; 8]; K]) {
    use std::arch::x86_64::__m512d;
    assert!(stored.len() >= 8 * K);
    let columns = stored.as_ptr().cast::<Unaligned<__m512d>>();
    for (j, col) in cols.iter_mut().enumerate() {
        let v = std::ptr::read_volatile(columns.add(j)).0;
        *col = std::mem::transmute::<__m512d, [f64; 8]>(v);
    }
}

/// The inverse of [`load_packed_f64`]: `stored[j·8..(j + 1)·8] = cols[j]`, one volatile 512-bit move per column.
///
/// # Safety
/// As for [`load_packed_f64`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store_packed_f64<const K: usize>(cols: &[[f64; 8]; K], stored: &mut [f64]) {
    use std::arch::x86_64::__m512d;
    assert!(stored.len() >= 8 * K);
    let columns = stored.as_mut_ptr().cast::<Unaligned<__m512d>>();
    for (j, col) in cols.iter().enumerate() {
        let v = std::mem::transmute::<[f64; 8], __m512d>(*col);
        std::ptr::write_volatile(columns.add(j), Unaligned(v));
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) mod tests {
    use super::*;

    fn check<T: Real, const K: usize, const W: usize>(rows: &[T]) {
        let mut cols = [[T::default(); W]; K];
        // SAFETY: run only after AVX-512F was detected.
        unsafe { gather_columns::<T, K, W>(rows, &mut cols) };
        assert_columns_are_rows(rows, &cols);
    }

    /// `cols[j][l]` is `rows[l·K + j]`, bit for bit, for every j < K and l < W.
    pub(crate) fn assert_columns_are_rows<T: Real, const K: usize, const W: usize>(rows: &[T], cols: &[[T; W]; K]) {
        for (j, col) in cols.iter().enumerate() {
            for (l, v) in col.iter().enumerate() {
                assert_eq!(
                    v.to_f64().to_bits(),
                    rows[l * K + j].to_f64().to_bits(),
                    "K = {K}, row {l}, column {j}"
                );
            }
        }
    }

    /// Every lane of every column is the row-major value it stands for, for every lane count gathered (8
    /// float32, 4 and 8 float64) and K from 1 to 20,
    /// for a block with values past its end (a gather must not read them into the lanes).
    #[test]
    fn gathered_lanes_are_the_transposed_rows() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512F here: the gather path is not used on this CPU");
            return;
        }
        let values: Vec<f64> = (0..8 * 20 + 5).map(|i| i as f64 * 1.5 - 7.0).collect();
        let singles: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        check::<f64, 1, 8>(&values);
        check::<f64, 3, 8>(&values);
        check::<f64, 10, 8>(&values);
        check::<f64, 20, 8>(&values);
        check::<f64, 1, 4>(&values);
        check::<f64, 16, 4>(&values);
        check::<f32, 1, 8>(&singles);
        check::<f32, 7, 8>(&singles);
        check::<f32, 10, 8>(&singles);
        check::<f32, 16, 8>(&singles);
        check::<f32, 20, 8>(&singles);
    }
}
