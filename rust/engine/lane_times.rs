//! A K×K map of rows held as lane-arrays, shared by the row kernels (online EM's whitening product, VIFA's
//! line 12).

use crate::scalar::Real;

/// out = a · M per lane (a: K lane-arrays of W rows; M: K×K row-major, at least K² values):
/// out_j = Σ_i a_i M[i][j], summed over i in order.
///
/// One output column at a time, its W lanes in one register across the sum. Written with i outer (every
/// output column updated per input column), LLVM vectorised it across j at K ≥ 16 with a gather and a scatter
/// of the output per multiply-add, 4–5× the time of the whole rest of the online-EM pass; the sums are the same
/// either way.
#[inline(always)]
pub(crate) fn lanes_times<T: Real, const K: usize, const W: usize>(a: &[[T; W]; K], m: &[T]) -> [[T; W]; K] {
    assert!(m.len() >= K * K);
    let mut out = [[T::default(); W]; K];
    for (j, out_j) in out.iter_mut().enumerate() {
        let mut acc = [T::default(); W];
        for (i, a_i) in a.iter().enumerate() {
            let mij = m[i * K + j];
            for l in 0..W {
                acc[l] = acc[l] + a_i[l] * mij;
            }
        }
        *out_j = acc;
    }
    out
}
