//! Polyak–Ruppert averaging of the mini-batch statistics (Polyak & Juditsky, "Acceleration of stochastic
//! approximation by averaging", 1992), as proposed for online EM by Cappé & Moulines ("On-line
//! expectation–maximization algorithm for latent data models", 2009, section 2.3).
//!
//! While averaging is on, every batch t adds its statistics after the stepwise update, in the current
//! latent basis, to running means over the window:
//!
//! ```text
//!   Ā_avg ← Ā_avg + (Ā_t − Ā_avg) / n,   B̄_avg and d̄²_avg likewise
//! ```
//!
//! and a whitening step maps the means as it maps the statistics (Ā R⁻ᵀ, R⁻¹ B̄ R⁻ᵀ), so all of them stay in
//! one basis. The averaged model is the M-step of the means with the current posterior covariance
//! Σ = (I + Fᵀ Ψ⁻¹ F)⁻¹, as every stepwise M-step uses the latest Σ: H̄ = Σ + B̄_avg, F = Ā_avg H̄⁻¹ (or its
//! whitened form) and ψ = d̄²_avg − rowsum(F ⊙ Ā_avg). (Averaging Σ_t as well carries the early batches'
//! large posterior covariances into H̄ and measurably worsened the fit after one pass.) The iterate itself
//! runs on as without averaging; the whole-data fit averages over the last half of its passes. Stepwise EM with ρ_t ∝ t^−κ, κ < 1, forgets all but the last ~1/ρ_t
//! batches, so its iterate keeps the noise of that many rows; the average over a pass uses every row of it.

use ndarray::{Array1, Array2};

use crate::linalg::Rotation;

/// Running means of the statistics over the averaging window: Ā (D×K), B̄ (K×K), d̄² (D).
#[derive(Debug, Clone, PartialEq)]
pub struct StatAverage {
    /// Batches averaged so far.
    pub count: u64,
    /// Mean of Ā (D×K).
    pub a_bar: Array2<f64>,
    /// Mean of B̄ (K×K).
    pub b_bar: Array2<f64>,
    /// Mean of d̄² (D).
    pub dsq: Array1<f64>,
}

impl StatAverage {
    /// An empty window for D features and K factors.
    pub(super) fn new(d: usize, k: usize) -> Self {
        StatAverage {
            count: 0,
            a_bar: Array2::zeros((d, k)),
            b_bar: Array2::zeros((k, k)),
            dsq: Array1::zeros(d),
        }
    }

    /// Add one batch's statistics (after its stepwise update, before its whitening).
    pub(super) fn include(&mut self, a_bar: &Array2<f64>, b_bar: &Array2<f64>, dsq: &Array1<f64>) {
        self.count += 1;
        let w = 1.0 / self.count as f64;
        self.a_bar.zip_mut_with(a_bar, |m, &v| *m += w * (v - *m));
        self.b_bar.zip_mut_with(b_bar, |m, &v| *m += w * (v - *m));
        self.dsq.zip_mut_with(dsq, |m, &v| *m += w * (v - *m));
    }

    /// Follow a whitening step: Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ.
    pub(super) fn rotate(&mut self, rotation: &Rotation) {
        self.a_bar = self.a_bar.dot(&rotation.cross_moment_map());
        self.b_bar = rotation.latent_moment(self.b_bar.view());
    }

    /// Whether the shapes match D×K and every value is finite, d̄² >= 0 and B̄ is symmetric.
    pub(super) fn is_valid(&self, d: usize, k: usize) -> bool {
        let shapes = self.a_bar.dim() == (d, k) && self.b_bar.dim() == (k, k) && self.dsq.len() == d;
        let values = self.a_bar.iter().chain(&self.b_bar).chain(&self.dsq);
        let symmetric = |m: &Array2<f64>| {
            let scale = 1.0 + m.iter().fold(0.0f64, |s, v| s.max(v.abs()));
            (m - &m.t()).iter().all(|v| v.abs() <= 1e-9 * scale)
        };
        shapes
            && values.into_iter().all(|v| v.is_finite())
            && self.dsq.iter().all(|&v| v >= 0.0)
            && symmetric(&self.b_bar)
    }
}
