//! Step sizes ρ_t of the running averages (θ̄, Ā, B̄, d̄²).
//!
//! Every schedule is floored at 1/t: ρ_t = max(r(t), 1/t), so the first sample initialises the averages
//! (ρ_1 = 1) and the early averages are exact means instead of being dominated by the starting value.
//! With r(t) = 1/t this is exactly the thesis's running mean (Algorithm 2, lines 5, 10, 12, 14).

use crate::error::{invalid, Result};

/// How much weight the t-th sample gets in the running averages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepSize {
    /// ρ_t = 1/t: the plain running mean of the thesis (default).
    Harmonic,
    /// ρ_t = max((t + τ₀)^(−κ), 1/t), κ ∈ (0.5, 1], τ₀ ≥ 0: forgets old samples polynomially.
    Power {
        /// Delay τ₀ ≥ 0.
        tau0: f64,
        /// Forgetting rate κ ∈ (0.5, 1].
        kappa: f64,
    },
    /// ρ_t = max(ρ, 1/t), ρ ∈ (0, 1]: an exponential moving average once t > 1/ρ (drifting streams).
    Constant(f64),
}

impl StepSize {
    /// Check the schedule's parameters.
    pub fn validate(&self) -> Result<()> {
        match *self {
            StepSize::Harmonic => Ok(()),
            StepSize::Power { tau0, kappa } => {
                if !(tau0.is_finite() && tau0 >= 0.0) {
                    return Err(invalid("tau0", format!("must be finite and >= 0, got {tau0}")));
                }
                if !(kappa > 0.5 && kappa <= 1.0) {
                    return Err(invalid("kappa", format!("must lie in (0.5, 1], got {kappa}")));
                }
                Ok(())
            }
            StepSize::Constant(rho) => {
                if !(rho > 0.0 && rho <= 1.0) {
                    return Err(invalid("rho", format!("must lie in (0, 1], got {rho}")));
                }
                Ok(())
            }
        }
    }

    /// ρ_t for the t-th sample (t ≥ 1).
    pub fn rho(&self, t: u64) -> f64 {
        let harmonic = 1.0 / t as f64;
        match *self {
            StepSize::Harmonic => harmonic,
            StepSize::Power { tau0, kappa } => (t as f64 + tau0).powf(-kappa).max(harmonic),
            StepSize::Constant(rho) => rho.max(harmonic),
        }
    }
}

/// Store a schedule in a checkpoint.
pub(crate) fn write_schedule(w: &mut crate::state::StateWriter, s: &StepSize) {
    use crate::state::StateValue::{Float, Text};
    let (name, tau0, kappa, rho) = match *s {
        StepSize::Harmonic => ("harmonic", 0.0, 1.0, 1.0),
        StepSize::Power { tau0, kappa } => ("power", tau0, kappa, 1.0),
        StepSize::Constant(rho) => ("constant", 0.0, 1.0, rho),
    };
    w.put("schedule", Text(name.into()));
    w.put("tau0", Float(tau0));
    w.put("kappa", Float(kappa));
    w.put("rho", Float(rho));
}

/// Read a schedule from a checkpoint (validated).
pub(crate) fn read_schedule(r: &crate::state::StateReader) -> Result<StepSize> {
    let s = match r.text("schedule")? {
        "harmonic" => StepSize::Harmonic,
        "power" => StepSize::Power {
            tau0: r.float("tau0")?,
            kappa: r.float("kappa")?,
        },
        "constant" => StepSize::Constant(r.float("rho")?),
        other => {
            return Err(crate::error::FaError::InvalidState(format!(
                "unknown schedule {other:?}"
            )))
        }
    };
    s.validate()
        .map_err(|e| crate::error::FaError::InvalidState(e.to_string()))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_start_at_one_and_are_floored_by_harmonic() {
        let power = StepSize::Power { tau0: 10.0, kappa: 0.7 };
        for s in [StepSize::Harmonic, power, StepSize::Constant(0.01)] {
            s.validate().expect("valid");
            assert_eq!(s.rho(1), 1.0);
            for t in 1..1000 {
                assert!(s.rho(t) >= 1.0 / t as f64);
            }
        }
        assert_eq!(StepSize::Harmonic.rho(4), 0.25);
        assert!((power.rho(1000) - 1010f64.powf(-0.7)).abs() < 1e-15);
        assert_eq!(StepSize::Constant(0.01).rho(1000), 0.01);
    }

    #[test]
    fn invalid_schedules_are_rejected() {
        assert!(StepSize::Power { tau0: 0.0, kappa: 0.5 }.validate().is_err());
        assert!(StepSize::Power { tau0: -1.0, kappa: 0.7 }.validate().is_err());
        assert!(StepSize::Constant(0.0).validate().is_err());
        assert!(StepSize::Constant(1.5).validate().is_err());
    }
}
