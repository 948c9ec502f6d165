//! Exact (batch) EM steps for a data set read in batches: the E-step of every row with one F and Ψ, the
//! sums added over the batches, then one M-step from the totals:
//!
//! ```text
//!   A = Σ_i d_i m_iᵀ (D×K),  B = Σ_i m_i m_iᵀ (K×K),  q = Σ_i d_i ⊙ d_i (D),  n rows
//!   Ā = A / n,  B̄ = B / n,  d̄² = q / n,  H̄ = Σ + B̄,  then F, ψ as every M-step (with the whitening step)
//! ```
//!
//! This is the EM algorithm of Rubin & Thayer ("EM algorithms for ML factor analysis", 1982) in its
//! parameter-expanded form (Liu, Rubin & Wu 1998): each step cannot lower the likelihood of the rows, and it
//! has no step-size noise, so it finishes what the stochastic passes leave on ill-conditioned data.

use ndarray::{Array1, Array2};

use super::MiniBatchEm;
use crate::error::{FaError, Result};
use crate::scalar::Real;

/// The sums of an exact E-step over some rows, with the F and Ψ they were computed with.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactSums {
    /// Σ_i d_i m_iᵀ (D×K).
    pub a: Array2<f64>,
    /// Σ_i m_i m_iᵀ (K×K).
    pub b: Array2<f64>,
    /// Σ_i d_i ⊙ d_i (D).
    pub squares: Array1<f64>,
    /// Rows summed.
    pub n: u64,
}

impl MiniBatchEm {
    /// The sums of the E-step (4.23) of `rows` (B >= 1 slices of D values) with the current F, Ψ and θ̄.
    /// Nothing changes; bad values give [`FaError::BadValue`].
    pub fn exact_sums<X: Real>(&self, rows: &[&[X]]) -> Result<ExactSums> {
        self.check_rows_shape(rows)?;
        if !self.is_fitted() {
            return Err(FaError::CallOrder(
                "exact EM steps need a fitted model (apply a batch first)".into(),
            ));
        }
        let stats = self.estep(rows)?;
        Ok(ExactSums {
            a: stats.a,
            b: stats.b,
            squares: Array1::from(stats.squares),
            n: stats.n as u64,
        })
    }

    /// One exact M-step from the sums of every row of the data set (added over batches, all computed with
    /// the current F, Ψ): Ā, B̄, d̄² become the averages, H̄ = Σ + B̄ with the current Σ, then F, ψ (and the
    /// whitening step). Stops any averaging; the step counters do not change. Atomic.
    pub fn apply_exact(&mut self, sums: &ExactSums) -> Result<()> {
        let (d, k) = self.loadings.dim();
        let shapes = sums.a.dim() == (d, k) && sums.b.dim() == (k, k) && sums.squares.len() == d;
        let finite = sums.a.iter().chain(&sums.b).chain(&sums.squares).all(|v| v.is_finite());
        if !shapes || !finite || sums.n == 0 || sums.squares.iter().any(|&v| v < 0.0) {
            return Err(FaError::InvalidState(
                "exact EM sums: wrong shapes, non-finite or negative values, or no rows".into(),
            ));
        }
        if !self.is_fitted() {
            return Err(FaError::CallOrder(
                "exact EM steps need a fitted model (apply a batch first)".into(),
            ));
        }
        let n = sums.n as f64;
        let sigma = self.posterior_covariance()?;
        let mut next = self.clone();
        next.average = None;
        next.a_bar = &sums.a / n;
        let b_bar = &sums.b / n;
        next.b_bar = (&b_bar + &b_bar.t()) * 0.5;
        next.dsq = &sums.squares / n;
        next.finish_mstep(&(sigma + &next.b_bar))?;
        *self = next;
        Ok(())
    }
}
