//! The average log-likelihood of rows under the model, computed with the E-step kernel (the whole-data
//! fit scores a sample of rows after every pass, and this is the cheap way to do it):
//!
//! ```text
//!   P = I + Fᵀ Ψ⁻¹ F = L Lᵀ,  u_i = Fᵀ Ψ⁻¹ d_i  (the project kernel with W = Ψ⁻¹ F),  z_i = L⁻¹ u_i
//!   log p(x_i) = −½ (D log 2π + Σ_d log ψ_d + log|P| + Σ_d d_id² / ψ_d − |z_i|²)
//! ```
//!
//! (Woodbury and the matrix determinant lemma for C = F Fᵀ + Ψ.) The triangular solve, not the product
//! with Σ = P⁻¹, keeps the difference of the last two terms accurate when some ψ are tiny and P is
//! ill-conditioned.

use ndarray::{Array2, ArrayView1};
use rayon::prelude::*;

use super::checks::bad_value_error;
use super::{kernel, padded_weights, MiniBatchEm};
use crate::engine::isa::Isa;
use crate::error::Result;
use crate::linalg::{lower_triangular_inverse, SpdFactor};
use crate::scalar::Real;

impl MiniBatchEm {
    /// Mean over `rows` (B >= 1 slices of D values) of log N(x; θ̄, F Fᵀ + Ψ), of this model or, with
    /// `averaged`, of the model [`MiniBatchEm::apply_average`] would make. Nothing changes.
    pub fn mean_log_prob<X: Real>(&self, rows: &[&[X]], averaged: bool) -> Result<f64> {
        self.check_rows_shape(rows)?;
        if averaged {
            return self.with_average_applied()?.mean_log_prob(rows, false);
        }
        let (d, k) = self.loadings.dim();
        let kp = kernel::padded(k);
        let precision = Array2::<f64>::eye(k) + super::scaled_gram(&self.loadings, &self.psi);
        let factor = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
        let l_inv = lower_triangular_inverse(factor.lower().view())?;
        let w = padded_weights(&self.loadings, &self.psi, &Array2::eye(k), kp);
        let mean = self.mean.to_vec();
        let mut m = vec![0.0; rows.len() * kp];
        kernel::project(Isa::detect(), rows, &mean, &w, kp, &mut m);
        let inv_psi: Vec<f64> = self.psi.iter().map(|p| 1.0 / p).collect();
        let quad = weighted_squares(rows, &mean, &inv_psi);
        if quad.iter().any(|q| !q.is_finite()) {
            return Err(bad_value_error(rows));
        }
        let log_det = self.psi.iter().map(|p| p.ln()).sum::<f64>() + factor.log_det();
        let constant = d as f64 * (2.0 * std::f64::consts::PI).ln() + log_det;
        let total: f64 = m
            .chunks(kp)
            .zip(&quad)
            .map(|(ui, &q)| {
                let z = l_inv.dot(&ArrayView1::from(&ui[..k]));
                -0.5 * (constant + q - z.dot(&z))
            })
            .sum();
        Ok(total / rows.len() as f64)
    }
}

/// Σ_d (x_id − θ̄_d)² / ψ_d for each row (rows in parallel, each sum in feature order).
fn weighted_squares<X: Real>(rows: &[&[X]], mean: &[f64], inv_psi: &[f64]) -> Vec<f64> {
    crate::fork::in_pool(|| {
        rows.par_iter()
            .map(|row| {
                row.iter()
                    .zip(mean)
                    .zip(inv_psi)
                    .map(|((&v, &c), &w)| {
                        let r = v.to_f64() - c;
                        r * r * w
                    })
                    .sum()
            })
            .collect()
    })
}
