//! The interface every streaming model offers on top of the engine: one step of a sample is split into the
//! row-local pass ([`StreamingModel::local_sums`]) and the K×K step from the cross-row sums
//! ([`StreamingModel::apply`]). Rows of D are independent except for those sums, so a model whose rows are
//! split across processes (or threads) runs each part's `local_sums`, adds the sums, and every part `apply`s
//! the total: the same model as one process, exactly.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// The cross-row sums of one sample over a set of rows: S = Fᵀ Ψ⁻¹ F (K×K), u = Fᵀ Ψ⁻¹ d (K), and `dsq_sum`,
/// Σ d̄² over those rows after the sample (the data's scale σ̂² = Σ d̄² / D; online SGA tracks it during a
/// data-scaled warm-up only, and after warm-up counts there the rows whose ψ step diverged, which fails the
/// step). Sums over disjoint sets of rows add.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSums {
    pub s: Array2<f64>,
    pub u: Array1<f64>,
    pub dsq_sum: f64,
}

impl StepSums {
    /// All zero, for K = `k`.
    pub fn zeros(k: usize) -> Self {
        StepSums {
            s: Array2::zeros((k, k)),
            u: Array1::zeros(k),
            dsq_sum: 0.0,
        }
    }

    /// Check the shapes against a part of `n_features` rows of a K-factor model of `n_features_total` rows.
    pub(crate) fn check(&self, k: usize, n_features: usize, n_features_total: usize) -> Result<()> {
        if self.s.dim() != (k, k) || self.u.len() != k || n_features_total < n_features {
            return Err(FaError::Shape {
                what: "sums",
                expected: format!("S ({k}, {k}), u ({k},), n_features_total >= {n_features}"),
                got: vec![self.s.nrows(), self.s.ncols(), self.u.len(), n_features_total],
            });
        }
        Ok(())
    }
}

/// The engine's hooks into a model. Public (so it can bound [`StreamingModel`]) but in a private module, so only
/// this crate implements it.
pub(crate) mod hooks {
    use super::StepSums;
    use crate::error::Result;
    use crate::scalar::Real;
    use ndarray::{ArrayView1, ArrayView2};

    pub trait Pass {
        /// (rows held, K).
        fn dims(&self) -> (usize, usize);
        /// Check a batch (n × rows held): shape, NaN/Inf and magnitude for the model's storage type.
        fn validate<X: Real>(&self, x: ArrayView2<X>) -> Result<()>;
        /// The pass of the next sample over every row held (pending row-local step applied), returning its sums.
        fn pass_sums<X: Real>(&mut self, x: ArrayView1<X>) -> StepSums;
        /// Forget the pending row-local step (after a pass applied it).
        fn drop_pending(&mut self);
        /// The K×K step of the next sample from the sums over all `n_total` rows.
        fn finish(&mut self, sums: &StepSums, n_total: usize) -> Result<()>;
    }
}

/// A streaming model whose step splits into a row-local pass and a K×K step (online EM, online SGA).
pub trait StreamingModel: hooks::Pass {
    /// Number of rows (features) this model holds.
    fn n_features(&self) -> usize {
        self.dims().0
    }

    /// K.
    fn n_components(&self) -> usize {
        self.dims().1
    }

    /// Validate a batch `x` (n × D) as `update` does, applying nothing.
    fn check_batch<X: Real>(&self, x: ArrayView2<X>) -> Result<()> {
        self.validate(x)
    }

    /// First half of one step: apply the previous sample's pending row-local update to the rows this model
    /// holds and return their part of the cross-row sums for sample `x` (this model's D entries). Until
    /// [`StreamingModel::apply`] the model answers queries as before `x`.
    fn local_sums<X: Real>(&mut self, x: ArrayView1<X>) -> Result<StepSums> {
        self.validate(x.insert_axis(Axis(0)))?;
        let sums = self.pass_sums(x);
        self.drop_pending();
        Ok(sums)
    }

    /// Second half: finish the step from `sums`, the sum of every part's [`StreamingModel::local_sums`] for the
    /// same sample (`n_features_total` rows in all). Every part must apply the same sums; a failed `apply`
    /// leaves the model as before the sample.
    fn apply(&mut self, sums: &StepSums, n_features_total: usize) -> Result<()> {
        let (d, k) = self.dims();
        sums.check(k, d, n_features_total)?;
        self.finish(sums, n_features_total)
    }
}
