//! The K×K part of the M-step shared by online EM (thesis Algorithm 2, lines 11 and 13) and mini-batch EM.
//!
//! From H̄ = Σ + B̄ (K×K) the loadings are F = Ā H̄⁻¹ (4.33) and ψ = d̄² − rowsum(F ⊙ Ā) (4.35 with F H̄ = Ā).
//! With whitening (parameter-expanded EM, Liu, Rubin & Wu, "Parameter expansion to accelerate EM", 1998) the
//! latent basis is rotated so that H̄ = I: R Rᵀ = H̄ (Cholesky), Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ, Σ ← R⁻¹ Σ R⁻ᵀ, and
//! then F = Ā. F Āᵀ and F H̄ Fᵀ are unchanged by the rotation, so the Gaussian and ψ are the same.
//! The D×K work (forming F, applying Ā ← Ā R⁻ᵀ) belongs to each model: online EM defers it to the next pass.

use ndarray::{Array2, ArrayView2};

use crate::error::Result;
use crate::linalg::{Rotation, SpdFactor};

/// How the D×K statistics give the loadings after an M-step.
pub(crate) enum LoadingsMap {
    /// F = Ā H̄⁻¹ (4.33) with this H̄⁻¹ (K×K).
    Inverse(Array2<f64>),
    /// Whitening: rotate every statistic by this R (Ā ← Ā R⁻ᵀ and the K×K moments by R⁻¹ · R⁻ᵀ); then F = Ā.
    Whiten(Rotation),
}

/// The M-step's K×K algebra on H̄ = Σ + B̄ (K×K, symmetric positive definite up to rounding; the smallest
/// jitter that factorises it is added when rounding alone breaks it). Errors when H̄ cannot be factorised.
pub(crate) fn loadings_map(h_bar: ArrayView2<f64>, whiten: bool) -> Result<LoadingsMap> {
    let h_factor = SpdFactor::new_jittered(h_bar, "H̄ = Σ + B̄")?;
    if whiten {
        Ok(LoadingsMap::Whiten(Rotation::whitening(h_factor.lower().view())?))
    } else {
        Ok(LoadingsMap::Inverse(h_factor.inverse()))
    }
}
