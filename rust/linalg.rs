//! K×K linear algebra (nalgebra Cholesky) and latent-space rotations (`rotation`). Nothing here is ever
//! D-sized.

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};
use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::error::{FaError, Result};

mod rotation;
pub(crate) use rotation::symmetrise;
pub use rotation::Rotation;

fn to_na(m: ArrayView2<f64>) -> DMatrix<f64> {
    let (r, c) = m.dim();
    DMatrix::from_fn(r, c, |i, j| m[[i, j]])
}

fn from_na(m: &DMatrix<f64>) -> Array2<f64> {
    Array2::from_shape_fn((m.nrows(), m.ncols()), |(i, j)| m[(i, j)])
}

/// Cholesky factor L (lower, L Lᵀ = M) of a symmetric positive-definite K×K matrix.
pub struct SpdFactor {
    chol: Cholesky<f64, Dyn>,
}

impl SpdFactor {
    /// Factorise `m` (K×K, symmetric positive definite). `what` names it in the error.
    pub fn new(m: ArrayView2<f64>, what: &'static str) -> Result<Self> {
        if m.iter().any(|v| !v.is_finite()) {
            return Err(FaError::NotPositiveDefinite(what));
        }
        let sym = to_na(m);
        let sym = (&sym + sym.transpose()) * 0.5;
        Cholesky::new(sym)
            .map(|chol| Self { chol })
            .ok_or(FaError::NotPositiveDefinite(what))
    }

    /// Factorise a matrix that is symmetric positive definite in exact arithmetic (I + FᵀΨ⁻¹F, Σ + B̄) but
    /// may fail Cholesky by rounding when its entries span many orders of magnitude (extreme outliers).
    /// Adds the smallest jitter δ·I, δ = 1e-14·max|M_ii|·10^j (j = 0..12), that makes it factorise; for
    /// any well-conditioned input no jitter is added and the result is the plain Cholesky factor.
    pub fn new_jittered(m: ArrayView2<f64>, what: &'static str) -> Result<Self> {
        if let Ok(f) = Self::new(m, what) {
            return Ok(f);
        }
        let scale = m
            .diag()
            .iter()
            .fold(0.0f64, |acc, v| acc.max(v.abs()))
            .max(f64::MIN_POSITIVE);
        let mut jittered = m.to_owned();
        let mut delta = 1e-14 * scale;
        for _ in 0..13 {
            jittered.assign(&m);
            jittered.diag_mut().mapv_inplace(|v| v + delta);
            if let Ok(f) = Self::new(jittered.view(), what) {
                return Ok(f);
            }
            delta *= 10.0;
        }
        Err(FaError::NotPositiveDefinite(what))
    }

    /// M⁻¹ (K×K), computed from the factor.
    pub fn inverse(&self) -> Array2<f64> {
        let inv = self.chol.inverse();
        let inv = (&inv + inv.transpose()) * 0.5;
        from_na(&inv)
    }

    /// M⁻¹ b for a K-vector b.
    pub fn solve(&self, b: ArrayView1<f64>) -> Array1<f64> {
        let x = self.chol.solve(&DVector::from_iterator(b.len(), b.iter().copied()));
        Array1::from_iter(x.iter().copied())
    }

    /// The lower-triangular factor L (K×K).
    pub fn lower(&self) -> Array2<f64> {
        from_na(&self.chol.l())
    }

    /// log det M = 2 Σ log L_ii.
    pub fn log_det(&self) -> f64 {
        2.0 * self.chol.l_dirty().diagonal().iter().map(|v| v.ln()).sum::<f64>()
    }
}

/// Inverse of a lower-triangular K×K matrix.
pub fn lower_triangular_inverse(l: ArrayView2<f64>) -> Result<Array2<f64>> {
    let lm = to_na(l);
    let k = lm.nrows();
    let inv = lm
        .solve_lower_triangular(&DMatrix::identity(k, k))
        .ok_or(FaError::NotPositiveDefinite("triangular factor"))?;
    Ok(from_na(&inv))
}

/// Symmetric eigen-decomposition of a K×K matrix: (eigenvalues descending, eigenvectors as columns).
pub fn symmetric_eigen_desc(m: ArrayView2<f64>) -> (Array1<f64>, Array2<f64>) {
    let sym = to_na(m);
    let sym = (&sym + sym.transpose()) * 0.5;
    let eig = sym.symmetric_eigen();
    let mut order: Vec<usize> = (0..eig.eigenvalues.len()).collect();
    order.sort_by(|&a, &b| eig.eigenvalues[b].total_cmp(&eig.eigenvalues[a]));
    let values = Array1::from_iter(order.iter().map(|&i| eig.eigenvalues[i]));
    let k = m.nrows();
    let vectors = Array2::from_shape_fn((k, k), |(r, c)| eig.eigenvectors[(r, order[c])]);
    (values, vectors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn inverse_and_solve_match_closed_form() {
        let m = array![[4.0, 2.0], [2.0, 3.0]];
        let f = SpdFactor::new(m.view(), "m").expect("spd");
        let inv = f.inverse();
        let expected = array![[3.0, -2.0], [-2.0, 4.0]] / 8.0;
        for (a, b) in inv.iter().zip(expected.iter()) {
            assert!((a - b).abs() < 1e-14);
        }
        let x = f.solve(array![1.0, 1.0].view());
        assert!((x[0] - 0.125).abs() < 1e-14 && (x[1] - 0.25).abs() < 1e-14);
        assert!((f.log_det() - 8f64.ln()).abs() < 1e-14);
    }

    #[test]
    fn jitter_rescues_rounding_but_not_indefinite_matrices() {
        // Exactly PSD but singular: plain Cholesky fails, a tiny jitter fixes it.
        let singular = array![[1e36, 1e36], [1e36, 1e36]];
        assert!(SpdFactor::new(singular.view(), "m").is_err());
        let f = SpdFactor::new_jittered(singular.view(), "m").expect("jittered");
        assert!(f.log_det().is_finite());
        // Well-conditioned input: identical to the plain factor.
        let m = array![[4.0, 2.0], [2.0, 3.0]];
        let plain = SpdFactor::new(m.view(), "m").expect("spd").lower();
        assert_eq!(SpdFactor::new_jittered(m.view(), "m").expect("spd").lower(), plain);
        // Clearly indefinite: still an error.
        let indefinite = array![[1.0, 2.0], [2.0, 1.0]];
        assert!(SpdFactor::new_jittered(indefinite.view(), "m").is_err());
    }

    #[test]
    fn non_spd_is_an_error() {
        let m = array![[1.0, 2.0], [2.0, 1.0]];
        assert!(SpdFactor::new(m.view(), "m").is_err());
        let nan = array![[f64::NAN]];
        assert!(SpdFactor::new(nan.view(), "m").is_err());
    }

    #[test]
    fn eigen_is_sorted_descending() {
        let m = array![[1.0, 0.0], [0.0, 3.0]];
        let (vals, vecs) = symmetric_eigen_desc(m.view());
        assert_eq!(vals.to_vec(), vec![3.0, 1.0]);
        assert!((vecs[[1, 0]].abs() - 1.0).abs() < 1e-14);
    }
}
