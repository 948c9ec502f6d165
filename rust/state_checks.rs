//! Semantic checks of a restored state: every value an algorithm relies on is in the range the algorithm
//! can produce, so a checkpoint that passes them continues like the model that wrote it. The reader
//! ([`crate::state::StateReader`]) already checks shapes and finiteness; these check the meaning.
//!
//! What the online EM and SGA updates rely on (thesis Algorithms 1–2 and the E-step 4.23):
//! - t = `n_seen` < 2⁵³, so t + 1 and 1/t are exact in f64;
//! - a step size ρ ∈ (0, 1] (ρ_t ≥ 1/t > 0, and a running average never extrapolates);
//! - running averages of squares d̄² ≥ 0; the K×K statistics B̄, Σ, H̄⁻¹ and P = Σ + m mᵀ symmetric and
//!   with every |entry| <= 1e250 (products of two stay finite), and a positive diagonal for the
//!   covariance-like ones (Σ, H̄⁻¹, P = Σ + m mᵀ). Positive
//!   definiteness itself is not required: whitening and float32 rounding legitimately leave B̄ with
//!   negative eigenvalues, and a breakdown of the next E-step is reported by the update as usual;
//! - means within the accepted input range, variances ψ within [0, `MAX_STATE`].
//!
//! VB-FA's checkpoint module adds [`positive`] (Gamma shapes and rates, variances) and
//! [`positive_definite`] (the covariances Σ_{h_n}, Σ_{f_d} whose log-determinants enter the bound).

use ndarray::ArrayView2;

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// Largest sample count a state may hold: t + 1 and 1/t stay exact in f64 (2⁵³).
pub const MAX_SAMPLES: u64 = 1 << 53;

/// Largest |entry| accepted in a K×K statistic (their products with state values must stay finite).
const MAX_STATISTIC: f64 = 1e250;

/// Relative tolerance of the symmetry and eigenvalue checks (rounding of K×K algebra, far above 1e-16).
const RELATIVE_TOLERANCE: f64 = 1e-8;

fn bad(key: &str, reason: impl std::fmt::Display) -> FaError {
    FaError::InvalidState(format!("entry `{key}` {reason}"))
}

/// t = `n_seen` <= 2⁵³.
pub fn sample_count(key: &str, n_seen: u64) -> Result<()> {
    if n_seen > MAX_SAMPLES {
        return Err(bad(key, format!("must be <= 2^53, got {n_seen}")));
    }
    Ok(())
}

/// A step size ρ ∈ (0, 1].
pub fn step_size(key: &str, rho: f64) -> Result<()> {
    if !(rho > 0.0 && rho <= 1.0) {
        return Err(bad(key, format!("must be a step size in (0, 1], got {rho:e}")));
    }
    Ok(())
}

/// Every value within [lower, upper].
pub fn within<T: Real>(key: &str, values: &[T], lower: f64, upper: f64) -> Result<()> {
    match values
        .iter()
        .map(|v| v.to_f64())
        .find(|v| !(*v >= lower && *v <= upper))
    {
        Some(v) => Err(bad(key, format!("holds {v:e}, outside [{lower:e}, {upper:e}]"))),
        None => Ok(()),
    }
}

/// Largest |entry| of a K×K matrix (at least the smallest positive f64, so tolerances are never 0).
fn magnitude(m: ArrayView2<f64>) -> f64 {
    m.iter().fold(f64::MIN_POSITIVE, |acc, v| acc.max(v.abs()))
}

fn symmetric(key: &str, m: ArrayView2<f64>) -> Result<()> {
    let tolerance = RELATIVE_TOLERANCE * magnitude(m);
    for ((i, j), v) in m.indexed_iter() {
        if (v - m[[j, i]]).abs() > tolerance {
            return Err(bad(
                key,
                format!(
                    "must be symmetric, but [{i},{j}] = {v:e} and [{j},{i}] = {:e}",
                    m[[j, i]]
                ),
            ));
        }
    }
    Ok(())
}

/// Symmetric (to rounding) with every |entry| <= 1e250: a K×K statistic of the algorithm.
pub fn bounded_symmetric(key: &str, m: ArrayView2<f64>) -> Result<()> {
    if magnitude(m) > MAX_STATISTIC {
        return Err(bad(
            key,
            format!("has an entry of magnitude {:e} > {MAX_STATISTIC:e}", magnitude(m)),
        ));
    }
    symmetric(key, m)
}

/// Every diagonal entry > 0 (a covariance-like K×K matrix: Σ, H̄ = Σ + B̄, H̄⁻¹, P = Σ + m mᵀ).
pub fn positive_diagonal(key: &str, m: ArrayView2<f64>) -> Result<()> {
    match m.diag().iter().find(|v| !(**v > 0.0)) {
        Some(v) => Err(bad(key, format!("must have a positive diagonal, has {v:e}"))),
        None => Ok(()),
    }
}

/// Every value > 0 (a Gamma shape or rate, a variance, a precision; the state reader already checked
/// finiteness).
pub fn positive(key: &str, values: &[f64]) -> Result<()> {
    match values.iter().find(|v| !(**v > 0.0)) {
        Some(v) => Err(bad(key, format!("must be > 0, holds {v:e}"))),
        None => Ok(()),
    }
}

/// Symmetric and positive definite (a covariance the algorithm factorises or takes the log-determinant
/// of): bounded and symmetric as [`bounded_symmetric`], and its Cholesky factorisation succeeds.
pub fn positive_definite(key: &str, m: ArrayView2<f64>) -> Result<()> {
    bounded_symmetric(key, m)?;
    match crate::linalg::SpdFactor::new(m, "restored covariance") {
        Ok(_) => Ok(()),
        Err(_) => Err(bad(key, "must be positive definite")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn accepts_what_the_algorithms_produce() {
        assert!(sample_count("n", MAX_SAMPLES).is_ok());
        assert!(step_size("rho", 1.0).is_ok());
        assert!(step_size("rho", 1e-300).is_ok());
        assert!(within::<f64>("x", &[0.0, 1.0], 0.0, 1.0).is_ok());
        assert!(bounded_symmetric("b", array![[1.0, 0.5], [0.5, -1.0]].view()).is_ok());
        assert!(positive_diagonal("s", array![[1.0, 2.0], [2.0, 0.25]].view()).is_ok());
        assert!(positive("p", &[1e-300, 1.0]).is_ok());
        assert!(positive_definite("s", array![[2.0, 1.0], [1.0, 2.0]].view()).is_ok());
    }

    #[test]
    fn rejects_values_no_run_can_reach() {
        assert!(sample_count("n", u64::MAX).is_err());
        for rho in [0.0, -1.0, 1.0 + 1e-12, 1e300] {
            assert!(step_size("rho", rho).is_err());
        }
        assert!(within::<f32>("x", &[-1.0], 0.0, 1.0).is_err());
        assert!(bounded_symmetric("b", array![[1.0, 2.0], [0.0, 1.0]].view()).is_err());
        assert!(bounded_symmetric("b", array![[-1e300, 0.0], [0.0, -1e300]].view()).is_err());
        assert!(positive_diagonal("b", array![[-1e300, 0.0], [0.0, 1.0]].view()).is_err());
        assert!(positive_diagonal("b", array![[1.0, 0.0], [0.0, 0.0]].view()).is_err());
        assert!(positive("p", &[1.0, 0.0]).is_err());
        assert!(positive("p", &[-1.0]).is_err());
        // Positive diagonal, symmetric, but indefinite (eigenvalues 3 and -1).
        assert!(positive_definite("s", array![[1.0, 2.0], [2.0, 1.0]].view()).is_err());
    }
}
