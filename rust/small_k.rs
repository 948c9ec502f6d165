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

/// out[r] = Σ_j x[r,j] y[r,j] for `nb` rows (sequential sum over j, the same order as the generic path).
#[inline(always)]
fn row_dots<const K: usize>(x: &[f64], y: &[f64], out: &mut [f64], nb: usize) {
    for ((o, xr), yr) in out[..nb]
        .iter_mut()
        .zip(x[..nb * K].chunks_exact(K))
        .zip(y[..nb * K].chunks_exact(K))
    {
        let mut prod = [0.0f64; K];
        for j in 0..K {
            prod[j] = xr[j] * yr[j];
        }
        let mut acc = 0.0;
        for p in prod {
            acc += p;
        }
        *o = acc;
    }
}

/// Line 12 of Algorithm 2 on `nb` rows: Ā ← Ā + ρ (d mᵀ − Ā), with d the previous sample's deviations.
#[inline(always)]
fn rank_one_update<const K: usize>(a: &mut [f64], d: &[f64], m: &[f64], rho: f64, nb: usize) {
    let mut mm = [0.0f64; K];
    mm.copy_from_slice(&m[..K]);
    for (row, &di) in a[..nb * K].chunks_exact_mut(K).zip(d[..nb].iter()) {
        for j in 0..K {
            row[j] += rho * (di * mm[j] - row[j]);
        }
    }
}

/// The E-step sums of (4.23) over `nb` rows: y = f/ψ (written to `y`), u += Σ y d, S += Σ y fᵀ.
#[inline(always)]
fn estep_sums<const K: usize>(
    f: &[f64],
    psi: &[f64],
    d: &[f64],
    y: &mut [f64],
    u: &mut [f64],
    s: &mut [f64],
    nb: usize,
) {
    let mut uu = [0.0f64; K];
    for (((f_row, y_row), &p), &di) in f[..nb * K]
        .chunks_exact(K)
        .zip(y[..nb * K].chunks_exact_mut(K))
        .zip(psi[..nb].iter())
        .zip(d[..nb].iter())
    {
        let inv_psi = 1.0 / p;
        for j in 0..K {
            let yj = f_row[j] * inv_psi;
            y_row[j] = yj;
            uu[j] += yj * di;
        }
    }
    for j in 0..K {
        u[j] += uu[j];
    }
    add_outer_products::<K>(y, f, s, nb);
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
multiversion!(row_dots_dispatch, row_dots_avx2, row_dots, (x: &[f64], y: &[f64], out: &mut [f64], nb: usize));
multiversion!(rank_one_dispatch, rank_one_avx2, rank_one_update, (a: &mut [f64], d: &[f64], m: &[f64], rho: f64, nb: usize));
multiversion!(estep_sums_dispatch, estep_sums_avx2, estep_sums,
    (f: &[f64], psi: &[f64], d: &[f64], y: &mut [f64], u: &mut [f64], s: &mut [f64], nb: usize));

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

/// out[r] = x[r]·y[r] for nb rows when K ≤ 16; returns false (doing nothing) for larger K.
pub(crate) fn try_row_dots(k: usize, x: &[f64], y: &[f64], out: &mut [f64], nb: usize) -> bool {
    by_k!(k, row_dots_dispatch(x, y, out, nb));
    true
}

/// a ← a + ρ (d mᵀ − a) for nb rows when K ≤ 16; returns false (doing nothing) for larger K.
pub(crate) fn try_rank_one(k: usize, a: &mut [f64], d: &[f64], m: &[f64], rho: f64, nb: usize) -> bool {
    by_k!(k, rank_one_dispatch(a, d, m, rho, nb));
    true
}

/// y = f/ψ, u += Σ y d, S += Σ y fᵀ for nb rows when K ≤ 16; returns false (doing nothing) otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_estep_sums(
    k: usize,
    f: &[f64],
    psi: &[f64],
    d: &[f64],
    y: &mut [f64],
    u: &mut [f64],
    s: &mut [f64],
    nb: usize,
) -> bool {
    by_k!(k, estep_sums_dispatch(f, psi, d, y, u, s, nb));
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
            assert!(try_rows_times(
                k,
                a.as_slice().expect("c"),
                m.as_slice().expect("c"),
                &mut out,
                nb
            ));
            assert_eq!(out, a.dot(&m).iter().copied().collect::<Vec<_>>());
            let (psi, d) = (vec![2.0; nb], vec![0.5; nb]);
            let (mut y, mut u, mut s) = (vec![0.0; nb * k], vec![1.0; k], vec![1.0; k * k]);
            let a_flat = a.as_slice().expect("c");
            assert!(try_estep_sums(k, a_flat, &psi, &d, &mut y, &mut u, &mut s, nb));
            let expected_s = a.t().dot(&a) / 2.0 + 1.0;
            let expected_u = a.sum_axis(ndarray::Axis(0)) * 0.25 + 1.0;
            for (x, e) in s.iter().zip(expected_s.iter()).chain(u.iter().zip(expected_u.iter())) {
                assert!((x - e).abs() < 1e-9);
            }
            let mut dots = vec![0.0; nb];
            assert!(try_row_dots(k, a_flat, a_flat, &mut dots, nb));
            for (dot, row) in dots.iter().zip(a.rows()) {
                assert_eq!(*dot, row.iter().fold(0.0, |acc, v| acc + v * v));
            }
            let mut b = a_flat.to_vec();
            let m: Vec<f64> = (0..k).map(|j| j as f64).collect();
            assert!(try_rank_one(k, &mut b, &d, &m, 0.25, nb));
            for (i, row) in b.chunks(k).enumerate() {
                for j in 0..k {
                    let want = a[[i, j]] + 0.25 * (0.5 * m[j] - a[[i, j]]);
                    assert_eq!(row[j], want);
                }
            }
        }
        assert!(!try_rows_times(17, &[], &[], &mut [], 0));
    }
}
