//! Const-generic kernels for K ≤ 16, the common case (SWAG-style posteriors use a handful of factors).
//!
//! With K known at compile time the per-row loops unroll completely and vectorise across the K outputs;
//! an AVX2 copy of each kernel is selected at run time when the CPU has it (the default build targets
//! baseline x86-64, so wheels run anywhere). Outputs are accumulated in the same order in both copies,
//! so results do not depend on which one runs. Larger K falls back to matrixmultiply GEMMs.

/// out[r] = a[r] · M for each of `nb` rows (row-major, K wide); M is K×K row-major.
#[inline(always)]
fn rows_times<const K: usize>(a: &[f64], m: &[f64], out: &mut [f64], nb: usize) {
    let m = &m[..K * K];
    for (a_row, out_row) in a[..nb * K].chunks_exact(K).zip(out[..nb * K].chunks_exact_mut(K)) {
        let mut acc = [0.0f64; K];
        for i in 0..K {
            let ai = a_row[i];
            let m_row = &m[i * K..(i + 1) * K];
            for j in 0..K {
                acc[j] += ai * m_row[j];
            }
        }
        for j in 0..K {
            out_row[j] = acc[j];
        }
    }
}

/// S += Σ_r y_r f_rᵀ over `nb` rows (S K×K row-major): the block's part of Fᵀ Ψ⁻¹ F in (4.23).
/// One row of S at a time, so its K accumulators stay in registers while the block streams past.
#[inline(always)]
fn add_outer_products<const K: usize>(y: &[f64], f: &[f64], s: &mut [f64], nb: usize) {
    let (y, f) = (&y[..nb * K], &f[..nb * K]);
    for i in 0..K {
        let mut acc = [0.0f64; K];
        for (y_row, f_row) in y.chunks_exact(K).zip(f.chunks_exact(K)) {
            let yi = y_row[i];
            for j in 0..K {
                acc[j] += yi * f_row[j];
            }
        }
        for j in 0..K {
            s[i * K + j] += acc[j];
        }
    }
}

macro_rules! multiversion {
    ($name:ident, $avx:ident, $generic:ident, ($($arg:ident: $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        unsafe fn $avx<const K: usize>($($arg: $ty),*) {
            $generic::<K>($($arg),*)
        }

        fn $name<const K: usize>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { $avx::<K>($($arg),*) };
                }
            }
            $generic::<K>($($arg),*)
        }
    };
}

multiversion!(rows_times_dispatch, rows_times_avx2, rows_times, (a: &[f64], m: &[f64], out: &mut [f64], nb: usize));
multiversion!(add_outer_dispatch, add_outer_avx2, add_outer_products, (y: &[f64], f: &[f64], s: &mut [f64], nb: usize));

macro_rules! by_k {
    ($k:expr, $func:ident($($arg:expr),*)) => {
        match $k {
            1 => $func::<1>($($arg),*),
            2 => $func::<2>($($arg),*),
            3 => $func::<3>($($arg),*),
            4 => $func::<4>($($arg),*),
            5 => $func::<5>($($arg),*),
            6 => $func::<6>($($arg),*),
            7 => $func::<7>($($arg),*),
            8 => $func::<8>($($arg),*),
            9 => $func::<9>($($arg),*),
            10 => $func::<10>($($arg),*),
            11 => $func::<11>($($arg),*),
            12 => $func::<12>($($arg),*),
            13 => $func::<13>($($arg),*),
            14 => $func::<14>($($arg),*),
            15 => $func::<15>($($arg),*),
            16 => $func::<16>($($arg),*),
            _ => return false,
        }
    };
}

/// out = a · m for nb rows when K ≤ 16; returns false (doing nothing) for larger K.
pub(crate) fn try_rows_times(k: usize, a: &[f64], m: &[f64], out: &mut [f64], nb: usize) -> bool {
    by_k!(k, rows_times_dispatch(a, m, out, nb));
    true
}

/// s += Σ y fᵀ for nb rows when K ≤ 16; returns false (doing nothing) for larger K.
pub(crate) fn try_add_outer(k: usize, y: &[f64], f: &[f64], s: &mut [f64], nb: usize) -> bool {
    by_k!(k, add_outer_dispatch(y, f, s, nb));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn kernels_match_ndarray_products() {
        for k in [1usize, 3, 10, 16] {
            let nb = 37;
            let a = Array2::from_shape_fn((nb, k), |(i, j)| ((i * 7 + j * 3) % 11) as f64 - 5.0);
            let m = Array2::from_shape_fn((k, k), |(i, j)| ((i + 2 * j) % 5) as f64 * 0.5 - 1.0);
            let mut out = vec![0.0; nb * k];
            assert!(try_rows_times(k, a.as_slice().expect("c"), m.as_slice().expect("c"), &mut out, nb));
            assert_eq!(out, a.dot(&m).iter().copied().collect::<Vec<_>>());
            let mut s = vec![1.0; k * k];
            assert!(try_add_outer(k, a.as_slice().expect("c"), a.as_slice().expect("c"), &mut s, nb));
            let expected = a.t().dot(&a) + 1.0;
            for (x, y) in s.iter().zip(expected.iter()) {
                assert!((x - y).abs() < 1e-9);
            }
        }
        assert!(!try_rows_times(17, &[], &[], &mut [], 0));
    }
}
