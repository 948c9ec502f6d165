//! The plug-in predictive density of a fitted factor model: log N(x_O | c_O, F_O F_Oᵀ + diag ψ_O) for the
//! observed entries O of each row, by the Woodbury/determinant identities (never a D×D matrix):
//!
//! ln p(x_O) = −½ [ |O| ln 2π + Σ_O ln ψ_d + ln|A| + Σ_O r_d²/ψ_d − uᵀ A⁻¹ u ],
//! A = I + Σ_{d∈O} f_d f_dᵀ/ψ_d (K×K), u = Σ_{d∈O} f_d r_d/ψ_d, r = x − c.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};

use super::dense::SmallSpd;
use super::stats::{is_bad_entry, MissingPattern};
use super::updates::map_rows;
use crate::error::{FaError, Result};

/// ½ ln 2π.
const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// Log density of every row of `x` (M×D, NaN = missing, marginalised out) under N(c, F Fᵀ + diag ψ);
/// shapes c: D, F: D×K, ψ: D (all ψ_d > 0). A row with nothing observed has log density 0.
pub fn plugin_log_likelihood(
    x: ArrayView2<f64>,
    mean: ArrayView1<f64>,
    loadings: ArrayView2<f64>,
    noise_variance: ArrayView1<f64>,
) -> Result<Array1<f64>> {
    let (d, k) = loadings.dim();
    if x.ncols() != d || mean.len() != d || noise_variance.len() != d {
        return Err(FaError::Shape {
            what: "X",
            expected: format!("(n_samples, {d})"),
            got: x.shape().to_vec(),
        });
    }
    if noise_variance.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return Err(FaError::InvalidState("noise variances must be finite and > 0".into()));
    }
    for (row, values) in x.rows().into_iter().enumerate() {
        if values.iter().any(|&v| is_bad_entry(v, true)) {
            return Err(FaError::BadValue {
                row,
                kind: "an infinite or huge value (NaN marks a missing value)".into(),
            });
        }
    }
    let scaled = &loadings / &noise_variance.insert_axis(Axis(1)); // rows f_d/ψ_d
    let full = Array2::<f64>::eye(k) + loadings.t().dot(&scaled);
    let missing = MissingPattern::of(x);
    let log_psi = noise_variance.mapv(f64::ln);
    map_rows(x.nrows(), k, |i| {
        let mut precision = full.clone();
        let mut u = Array1::<f64>::zeros(k);
        let (mut n_obs, mut log_psi_sum, mut quad) = (0.0, 0.0, 0.0);
        let missing_row = &missing.by_row[i];
        for &j in missing_row {
            let f = loadings.row(j).insert_axis(Axis(1));
            precision -= &(f.dot(&f.t()) / noise_variance[j]);
        }
        for (j, &v) in x.row(i).iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            let r = v - mean[j];
            u.scaled_add(r, &scaled.row(j));
            n_obs += 1.0;
            log_psi_sum += log_psi[j];
            quad += r * r / noise_variance[j];
        }
        if n_obs == 0.0 {
            return Ok(0.0);
        }
        let factor = SmallSpd::new(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
        let reduction = u.dot(&factor.solve(u.view()));
        Ok(-(n_obs * HALF_LN_2PI) - 0.5 * (log_psi_sum + factor.log_det() + quad - reduction))
    })
    .map(Array1::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// Dense reference: −½ [n ln 2π + ln|C| + rᵀ C⁻¹ r] with C = F Fᵀ + diag ψ restricted to `obs`.
    fn dense(x: &[f64], c: &[f64], f: &Array2<f64>, psi: &[f64], obs: &[usize]) -> f64 {
        let n = obs.len();
        let cov = nalgebra::DMatrix::from_fn(n, n, |a, b| {
            let (i, j) = (obs[a], obs[b]);
            f.row(i).dot(&f.row(j)) + if a == b { psi[i] } else { 0.0 }
        });
        let r = nalgebra::DVector::from_fn(n, |a, _| x[obs[a]] - c[obs[a]]);
        let chol = cov.cholesky().expect("spd");
        let log_det = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
        -0.5 * (n as f64 * (2.0 * std::f64::consts::PI).ln() + log_det + r.dot(&chol.solve(&r)))
    }

    #[test]
    fn matches_dense_gaussian_with_and_without_missing_values() {
        let f = array![[1.0, 0.2], [0.3, -0.7], [0.5, 0.5], [-1.2, 0.1]];
        let c = [0.1, -0.2, 0.3, 0.0];
        let psi = [0.5, 0.2, 1.5, 0.8];
        let x = array![[0.3, 1.0, -0.5, 2.0], [f64::NAN, 0.4, 1.1, f64::NAN]];
        let got = plugin_log_likelihood(
            x.view(),
            array![0.1, -0.2, 0.3, 0.0].view(),
            f.view(),
            array![0.5, 0.2, 1.5, 0.8].view(),
        )
        .expect("loglik");
        let row0: Vec<f64> = x.row(0).to_vec();
        let row1: Vec<f64> = x.row(1).to_vec();
        assert!((got[0] - dense(&row0, &c, &f, &psi, &[0, 1, 2, 3])).abs() < 1e-12);
        assert!((got[1] - dense(&row1, &c, &f, &psi, &[1, 2])).abs() < 1e-12);
    }
}
