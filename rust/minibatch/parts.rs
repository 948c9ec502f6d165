//! The complete state of a [`MiniBatchEm`] as plain arrays, for exact checkpoints.

use ndarray::{Array1, Array2};

use super::average::StatAverage;
use super::{MiniBatchConfig, MiniBatchEm};
use crate::error::{FaError, Result};

/// Every field of a [`MiniBatchEm`], for exact checkpoints: mean θ̄ and d̄² (D), Ā and F (D×K), B̄ (K×K), ψ (D).
#[derive(Debug, Clone)]
pub struct MiniBatchParts {
    /// Hyper-parameters.
    pub config: MiniBatchConfig,
    /// Whether the mean is the data set's exact mean (kept fixed).
    pub fixed: bool,
    /// Whether the data-scaled start has been applied.
    pub started: bool,
    /// Rows applied.
    pub n_seen: u64,
    /// Mini-batches applied.
    pub n_batches: u64,
    /// θ̄ (D).
    pub mean: Array1<f64>,
    /// d̄² (D).
    pub dsq: Array1<f64>,
    /// Ā (D×K).
    pub a_bar: Array2<f64>,
    /// B̄ (K×K).
    pub b_bar: Array2<f64>,
    /// F (D×K).
    pub loadings: Array2<f64>,
    /// ψ (D).
    pub psi: Array1<f64>,
    /// The statistics' averages, while averaging (see [`super::average`]).
    pub average: Option<StatAverage>,
}

impl MiniBatchEm {
    /// The model's complete state.
    pub fn to_parts(&self) -> MiniBatchParts {
        MiniBatchParts {
            config: self.config,
            fixed: self.fixed,
            started: self.started,
            n_seen: self.n_seen,
            n_batches: self.n_batches,
            mean: self.mean.clone(),
            dsq: self.dsq.clone(),
            a_bar: self.a_bar.clone(),
            b_bar: self.b_bar.clone(),
            loadings: self.loadings.clone(),
            psi: self.psi.clone(),
            average: self.average.clone(),
        }
    }

    /// Rebuild a model from [`MiniBatchEm::to_parts`], checking every value the updates rely on: shapes,
    /// finiteness, d̄² >= 0, ψ > 0, a symmetric B̄, the hyper-parameters, n_batches <= n_seen.
    pub fn from_parts(p: MiniBatchParts) -> Result<Self> {
        let (d, k) = p.loadings.dim();
        let template = MiniBatchEm::new(Array2::<f64>::zeros((d, k)).view(), p.config, None)?;
        let bad = |what: &str| Err(FaError::InvalidState(format!("mini-batch EM state: {what}")));
        if p.mean.len() != d
            || p.dsq.len() != d
            || p.psi.len() != d
            || p.a_bar.dim() != (d, k)
            || p.b_bar.dim() != (k, k)
        {
            return bad("inconsistent shapes");
        }
        let vectors = p.mean.iter().chain(p.dsq.iter()).chain(p.psi.iter());
        let matrices = p.a_bar.iter().chain(p.b_bar.iter()).chain(p.loadings.iter());
        if vectors.chain(matrices).any(|v| !v.is_finite()) {
            return bad("non-finite values");
        }
        if p.dsq.iter().any(|&v| v < 0.0) || p.psi.iter().any(|&v| v <= 0.0) {
            return bad("negative d̄² or non-positive ψ");
        }
        if (&p.b_bar - &p.b_bar.t())
            .iter()
            .any(|v| v.abs() > 1e-9 * (1.0 + p.b_bar.iter().fold(0.0f64, |m, x| m.max(x.abs()))))
        {
            return bad("B̄ is not symmetric");
        }
        if p.average
            .as_ref()
            .is_some_and(|a| !a.is_valid(d, k) || a.count > p.n_batches)
        {
            return bad("invalid averages");
        }
        if p.n_batches > p.n_seen || (p.n_batches > 0 && !p.started) {
            return bad("counters are inconsistent");
        }
        Ok(MiniBatchEm {
            fixed: p.fixed,
            started: p.started,
            n_seen: p.n_seen,
            n_batches: p.n_batches,
            mean: p.mean,
            dsq: p.dsq,
            a_bar: p.a_bar,
            b_bar: p.b_bar,
            loadings: p.loadings,
            psi: p.psi,
            average: p.average,
            ..template
        })
    }
}
