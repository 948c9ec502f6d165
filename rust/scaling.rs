//! How a streaming model relates its starting Gaussian, its noise floor and its mean to the data's scale.
//!
//! [`Scaling::Unit`] is the thesis (Brownlie 2021, §4.4 and Algorithms 1–2): F₀ = Q (orthonormal), ψ₀ = 1,
//! an absolute noise floor, and the running mean on the same step sizes as the other averages. Fitting c·θ
//! then does not give c² times the covariance: at weight scale (variances ~1e-4) the warm-up E-steps see
//! ψ = 1 and produce latents m ≈ 0, and the fit collapses.
//!
//! [`Scaling::Data`] makes every default scale-equivariant. With σ̂² = (1/D) Σ_d d̄²_d, the mean over
//! features of the running squared deviations (a scalar summed in the same pass that updates d̄²):
//! - warm-up E-steps use F₀ = σ̂ Q and ψ₀ = σ̂² (the thesis's start, measured in the data's units; when
//!   σ̂ = 0, i.e. every sample so far was identical, the sample's latent mean is taken to be 0);
//! - the noise floor is relative: ψ_d ≥ max(floor · σ̂², `Real::MIN_FLOOR`);
//! - the running mean is the exact average θ̄_t = θ̄_{t−1} + (θ_t − θ̄_{t−1})/t (θ_SWA) whatever schedule the
//!   other statistics use;
//! - online SGA starts from F₀ = σ̂ Q, ψ₀ = d̄² of its warm-up samples, and its F step is preconditioned by
//!   ψ (ΔF = α ψ ⊙ ∇F = α (d mᵀ − F P)), so α is free of units.
//!
//! Under c·θ every quantity above scales by c (F, θ̄, d) or c² (ψ, σ̂², d̄²) while the latents m, Σ, B̄ do not
//! change, so the fitted covariance is c² times the original, to rounding.

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// Scaling convention of a streaming model (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scaling {
    /// The thesis: F₀ = Q, ψ₀ = 1, absolute floor, mean on the schedule.
    Unit,
    /// Scale-equivariant: F₀ = σ̂ Q, ψ₀ = σ̂², relative floor, exact running mean.
    Data,
}

impl Scaling {
    /// Name stored in checkpoints and accepted by the Python constructors.
    pub fn name(self) -> &'static str {
        match self {
            Scaling::Unit => "unit",
            Scaling::Data => "data",
        }
    }

    /// Parse [`Scaling::name`].
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "unit" => Ok(Scaling::Unit),
            "data" => Ok(Scaling::Data),
            other => Err(crate::error::invalid(
                "scaling",
                format!("must be 'data' or 'unit', got {other:?}"),
            )),
        }
    }

    /// σ used for the warm-up start F₀·σ, ψ₀ = σ²: 1 for `Unit`, σ̂ = √scale_sq for `Data` (1 when σ̂ = 0, in
    /// which case the caller discards the latent mean, see [`Scaling::degenerate`]).
    pub fn warmup_scale(self, scale_sq: f64) -> f64 {
        match self {
            Scaling::Data if scale_sq > 0.0 => scale_sq.sqrt(),
            _ => 1.0,
        }
    }

    /// True when a `Data` model has no scale yet (σ̂ = 0): its warm-up latents carry no information.
    pub fn degenerate(self, scale_sq: f64) -> bool {
        self == Scaling::Data && scale_sq <= 0.0
    }

    /// The noise floor of a pass: `noise_floor` (absolute) for `Unit`; max(noise_floor · σ̂², T::MIN_FLOOR)
    /// for `Data`, capped at `T::MAX_STATE` (ψ is kept within [floor, T::MAX_STATE], so a data scale
    /// near the largest accepted input must not push the floor above that ceiling).
    pub fn floor<T: Real>(self, noise_floor: f64, scale_sq: f64) -> f64 {
        match self {
            Scaling::Unit => noise_floor,
            Scaling::Data => (noise_floor * scale_sq).max(T::MIN_FLOOR).min(T::MAX_STATE),
        }
    }

    /// Step size of the running mean for the t-th sample: the schedule's ρ_t for `Unit`, 1/t for `Data`.
    pub fn mean_rho(self, rho: f64, t: u64) -> f64 {
        match self {
            Scaling::Unit => rho,
            Scaling::Data => 1.0 / t as f64,
        }
    }
}

/// Read the scaling entries of a checkpoint; checkpoints written before they existed are `Unit` models.
pub(crate) fn read_scaling(r: &crate::state::StateReader) -> Result<(Scaling, f64)> {
    if !r.has("scaling") {
        return Ok((Scaling::Unit, 0.0));
    }
    let scaling = Scaling::parse(r.text("scaling")?).map_err(|e| FaError::InvalidState(e.to_string()))?;
    let scale_sq = r.float("scale_sq")?;
    if scale_sq < 0.0 {
        return Err(FaError::InvalidState(format!(
            "entry `scale_sq` must be >= 0, got {scale_sq}"
        )));
    }
    Ok((scaling, scale_sq))
}

/// Write the scaling entries of a checkpoint.
pub(crate) fn write_scaling(w: &mut crate::state::StateWriter, scaling: Scaling, scale_sq: f64) {
    w.put("scaling", crate::state::StateValue::Text(scaling.name().into()));
    w.put("scale_sq", crate::state::StateValue::Float(scale_sq));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_is_the_thesis_and_data_scales() {
        assert_eq!(Scaling::Unit.warmup_scale(4.0), 1.0);
        assert_eq!(Scaling::Data.warmup_scale(4.0), 2.0);
        assert_eq!(Scaling::Data.warmup_scale(0.0), 1.0);
        assert!(Scaling::Data.degenerate(0.0) && !Scaling::Unit.degenerate(0.0));
        assert_eq!(Scaling::Unit.floor::<f64>(1e-10, 1e-8), 1e-10);
        assert_eq!(Scaling::Data.floor::<f64>(1e-10, 1e-8), 1e-18);
        assert_eq!(Scaling::Data.floor::<f64>(1e-10, 0.0), <f64 as Real>::MIN_FLOOR);
        // A data scale near the largest accepted input (1e100² for f64) keeps the floor under the ceiling.
        assert_eq!(Scaling::Data.floor::<f64>(1e-6, 1e200), <f64 as Real>::MAX_STATE);
        assert_eq!(Scaling::Data.floor::<f32>(1e-6, 1e36), <f32 as Real>::MAX_STATE);
        assert_eq!(Scaling::Unit.mean_rho(0.3, 10), 0.3);
        assert_eq!(Scaling::Data.mean_rho(0.3, 10), 0.1);
        for s in [Scaling::Unit, Scaling::Data] {
            assert_eq!(Scaling::parse(s.name()).expect("parse"), s);
        }
        assert!(Scaling::parse("other").is_err());
    }
}
