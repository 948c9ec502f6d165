//! Small dense SPD kernels for the many per-row K×K systems of VB-FA (one per latent vector and per data
//! column each sweep): Cholesky, inverse and solve on row-major buffers, plain loops the compiler
//! vectorises, without the allocation of nalgebra's dynamic-size path. Everything else K×K uses `crate::linalg` (nalgebra).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::error::{FaError, Result};

/// A Cholesky factor L (lower, row-major K×K, L Lᵀ = A) of a symmetric positive-definite matrix.
pub(crate) struct SmallSpd {
    l: Vec<f64>,
    k: usize,
}

impl SmallSpd {
    /// Factorise A (K×K; only the lower triangle of (A + Aᵀ)/2 is read, i.e. a_ij with i ≥ j averaged
    /// with a_ji). `what` names A in the error.
    ///
    /// l_jj = √(a_jj − Σ_{p<j} l_jp²), l_ij = (a_ij − Σ_{p<j} l_ip l_jp)/l_jj for i > j.
    pub(crate) fn new(a: ArrayView2<f64>, what: &'static str) -> Result<Self> {
        let k = a.nrows();
        let mut l = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..=i {
                l[i * k + j] = 0.5 * (a[[i, j]] + a[[j, i]]);
            }
        }
        for j in 0..k {
            let diag = l[j * k + j] - l[j * k..j * k + j].iter().map(|v| v * v).sum::<f64>();
            if !(diag > 0.0 && diag.is_finite()) {
                return Err(FaError::NotPositiveDefinite(what));
            }
            let l_jj = diag.sqrt();
            l[j * k + j] = l_jj;
            for i in (j + 1)..k {
                let (upper, lower) = l.split_at_mut(i * k);
                let (row_j, row_i) = (&upper[j * k..j * k + j], &mut lower[..k]);
                let dot: f64 = row_i[..j].iter().zip(row_j).map(|(a, b)| a * b).sum();
                row_i[j] = (row_i[j] - dot) / l_jj;
            }
        }
        Ok(SmallSpd { l, k })
    }

    /// ln |A| = 2 Σ ln l_jj.
    pub(crate) fn log_det(&self) -> f64 {
        2.0 * (0..self.k).map(|j| self.l[j * self.k + j].ln()).sum::<f64>()
    }

    /// L⁻¹ (lower, row-major) by forward substitution on the columns of I.
    fn lower_inverse(&self) -> Vec<f64> {
        let k = self.k;
        let mut inv = vec![0.0; k * k];
        for i in 0..k {
            let l_row = &self.l[i * k..(i + 1) * k];
            inv[i * k + i] = 1.0 / l_row[i];
            for j in 0..i {
                // (L⁻¹)_ij = −(Σ_{p=j}^{i−1} l_ip (L⁻¹)_pj) / l_ii
                let mut acc = 0.0;
                for p in j..i {
                    acc += l_row[p] * inv[p * k + j];
                }
                inv[i * k + j] = -acc / l_row[i];
            }
        }
        inv
    }

    /// A⁻¹ = L⁻ᵀ L⁻¹ = Σ_p m_p m_pᵀ over the rows m_p of M = L⁻¹ (K×K, exactly symmetric).
    pub(crate) fn inverse(&self) -> Array2<f64> {
        let k = self.k;
        let m = self.lower_inverse();
        let mut out = vec![0.0; k * k];
        for p in 0..k {
            let row = &m[p * k..p * k + p + 1]; // m_pj = 0 for j > p
            for (i, &m_pi) in row.iter().enumerate() {
                for (o, &m_pj) in out[i * k..i * k + p + 1].iter_mut().zip(row) {
                    *o += m_pi * m_pj;
                }
            }
        }
        Array2::from_shape_fn((k, k), |(i, j)| out[i * k + j])
    }

    /// A⁻¹ b by forward and back substitution.
    pub(crate) fn solve(&self, b: ArrayView1<f64>) -> Array1<f64> {
        let k = self.k;
        let mut y = b.to_vec();
        for i in 0..k {
            let row = &self.l[i * k..(i + 1) * k];
            let dot: f64 = row[..i].iter().zip(&y[..i]).map(|(a, b)| a * b).sum();
            y[i] = (y[i] - dot) / row[i];
        }
        for i in (0..k).rev() {
            // Column i of L below the diagonal: l_pi for p > i.
            let below: f64 = ((i + 1)..k)
                .zip(&y[i + 1..])
                .map(|(p, y_p)| self.l[p * k + i] * y_p)
                .sum();
            y[i] = (y[i] - below) / self.l[i * k + i];
        }
        Array1::from(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::SpdFactor;
    use ndarray::Array2;

    #[test]
    fn matches_nalgebra_cholesky() {
        for k in [1, 2, 5, 13] {
            let mut a = Array2::zeros((k, k + 2));
            crate::init::fill_standard_normal(a.view_mut(), k as u64);
            let spd = a.dot(&a.t()) + Array2::<f64>::eye(k) * 0.5;
            let ours = SmallSpd::new(spd.view(), "test").expect("spd");
            let reference = SpdFactor::new(spd.view(), "test").expect("spd");
            assert!((ours.log_det() - reference.log_det()).abs() < 1e-12 * reference.log_det().abs().max(1.0));
            let inv = ours.inverse();
            assert!((&inv - &reference.inverse()).iter().all(|v| v.abs() < 1e-10));
            let b = Array1::from_iter((0..k).map(|i| i as f64 - 1.5));
            assert!((&ours.solve(b.view()) - &reference.solve(b.view()))
                .iter()
                .all(|v| v.abs() < 1e-10));
        }
    }

    #[test]
    fn rejects_indefinite_and_non_finite() {
        let a = ndarray::array![[1.0, 2.0], [2.0, 1.0]];
        assert!(SmallSpd::new(a.view(), "a").is_err());
        let b = ndarray::array![[f64::NAN, 0.0], [0.0, 1.0]];
        assert!(SmallSpd::new(b.view(), "b").is_err());
    }
}
