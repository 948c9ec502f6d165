//! Prediction from a fitted GFA: the latents of new rows from their observed entries, and the predictive
//! mean and variance of every entry (a missing group = its columns left NaN).

use ndarray::{Array2, ArrayView2, Axis};

use super::batch::GfaBatch;
use crate::error::{FaError, Result};
use crate::vbfa::stats::{is_bad_entry, MissingPattern};
use crate::vbfa::updates::second_moment;

impl GfaBatch {
    /// Predictive mean and variance of every entry of new rows `x` (N×D, NaN = unobserved) given the
    /// observed entries of each row: q(h_n) from the observed entries only, then
    /// E[x_nd] = c̄_d + f̄_dᵀ h̄_n and
    /// Var[x_nd] = c̃_d + f̄_dᵀ Σ_{h_n} f̄_d + h̄_nᵀ Σ_{f_d} h̄_n + tr(Σ_{f_d} Σ_{h_n}) + 1/⟨τ_{g(d)}⟩.
    /// Predicting a whole group = leaving its columns NaN. Returns (means N×D, variances N×D).
    pub fn predict(&self, x: ArrayView2<f64>) -> Result<(Array2<f64>, Array2<f64>)> {
        let (n, d) = x.dim();
        if d != self.groups.n_features() {
            return Err(FaError::Shape {
                what: "X",
                expected: format!("(n_samples, {})", self.groups.n_features()),
                got: vec![n, d],
            });
        }
        if let Some(row) = x
            .rows()
            .into_iter()
            .position(|r| r.iter().any(|&v| is_bad_entry(v, true)))
        {
            return Err(FaError::BadValue {
                row,
                kind: "an infinite or huge value (NaN marks an unobserved value)".into(),
            });
        }
        let missing = MissingPattern::of(x);
        let zeroed = x.mapv(|v| if v.is_nan() { 0.0 } else { v });
        let (h, covs) = self.latent_posteriors(zeroed.view(), &missing)?;
        let means = h.dot(&self.f_mean.t()) + &self.c_mean;
        let noise = self.tau_of_features().mapv(|t| 1.0 / t);
        let mut vars = Array2::zeros((n, d));
        for i in 0..n {
            let sigma = covs.row(i);
            let hi = h.row(i);
            let moment = second_moment(hi, sigma);
            let fs = self.f_mean.dot(&sigma); // D×K rows f̄_dᵀ Σ_h
            for j in 0..d {
                let f = self.f_mean.row(j);
                let cov_f = self.f_cov.index_axis(Axis(0), j);
                // h̄ᵀΣ_f h̄ + tr(Σ_f Σ_h) = tr(Σ_f ⟨h hᵀ⟩)
                let loading_part: f64 = (&cov_f * &moment).sum();
                vars[[i, j]] = self.c_var[j] + fs.row(j).dot(&f) + loading_part + noise[j];
            }
        }
        Ok((means, vars))
    }

    /// Posterior means E_q[h_n] of new rows (N×D, NaN = unobserved) given the fitted global factors.
    pub fn latent_means(&self, x: ArrayView2<f64>) -> Result<Array2<f64>> {
        self.check_query(x)?;
        let missing = MissingPattern::of(x);
        let zeroed = x.mapv(|v| if v.is_nan() { 0.0 } else { v });
        Ok(self.latent_posteriors(zeroed.view(), &missing)?.0)
    }

    /// Shape (·, D) and no infinite or huge value.
    fn check_query(&self, x: ArrayView2<f64>) -> Result<()> {
        let (n, d) = x.dim();
        if d != self.groups.n_features() {
            return Err(FaError::Shape {
                what: "X",
                expected: format!("(n_samples, {})", self.groups.n_features()),
                got: vec![n, d],
            });
        }
        if let Some(row) = x
            .rows()
            .into_iter()
            .position(|r| r.iter().any(|&v| is_bad_entry(v, true)))
        {
            return Err(FaError::BadValue {
                row,
                kind: "an infinite or huge value (NaN marks an unobserved value)".into(),
            });
        }
        Ok(())
    }
}
