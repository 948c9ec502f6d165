//! The checks of the sizes, the noise floor and an initial loading matrix that every streaming model
//! (online EM, online SGA, VIFA) makes at construction, before anything is allocated.

use ndarray::ArrayView2;

use crate::error::{checked_size, invalid, FaError, Result};
use crate::scalar::Real;

/// Check 1 <= K < D: the rank of a factor model of D features fitted by online EM, SGA or mini-batch EM.
pub(crate) fn check_components(n_features: usize, n_components: usize) -> Result<()> {
    if n_components < 1 {
        return Err(invalid("n_components", format!("must be >= 1, got {n_components}")));
    }
    if n_components >= n_features {
        return Err(invalid(
            "n_components",
            format!("must be < n_features = {n_features}, got {n_components}"),
        ));
    }
    Ok(())
}

/// Check (D, K) and the common hyper-parameters.
pub(crate) fn validate_dims(n_features: usize, n_components: usize, noise_floor: f64) -> Result<()> {
    check_components(n_features, n_components)?;
    if !(noise_floor.is_finite() && noise_floor > 0.0) {
        return Err(invalid(
            "noise_floor",
            format!("must be finite and > 0, got {noise_floor}"),
        ));
    }
    Ok(())
}

/// Check that the noise floor fits the storage type (ψ is kept within [floor, T::MAX_STATE]) and is
/// not so small that 1/ψ or F²/ψ overflow (a floor below `T::MIN_FLOOR`, e.g. a subnormal 5e-324,
/// made every later E-step break down).
pub(crate) fn check_floor_fits<T: Real>(noise_floor: f64) -> Result<()> {
    if noise_floor < T::MIN_FLOOR {
        return Err(invalid(
            "noise_floor",
            format!(
                "must be >= {:e} for {} state, got {noise_floor:e}",
                T::MIN_FLOOR,
                T::NAME
            ),
        ));
    }
    if noise_floor > T::MAX_STATE {
        return Err(invalid(
            "noise_floor",
            format!("must be <= {:e} for {} state, got {noise_floor}", T::MAX_STATE, T::NAME),
        ));
    }
    Ok(())
}

/// Check an initial loading matrix (D×K, finite) and convert it to storage.
pub(crate) fn checked_init<T: Real>(init: ArrayView2<f64>, d: usize, k: usize) -> Result<Vec<T>> {
    if init.dim() != (d, k) {
        return Err(FaError::Shape {
            what: "init",
            expected: format!("({d}, {k})"),
            got: init.shape().to_vec(),
        });
    }
    if init.iter().any(|v| !(v.abs() <= T::MAX_INPUT)) {
        return Err(invalid("init", "must contain only finite values"));
    }
    Ok(init.iter().map(|&v| T::from_f64(v)).collect())
}

/// `init` (D·K values of F₀ in the storage type, row-major) when it has that length and only finite values
/// within `T::MAX_INPUT`; the same checks as [`checked_init`] without a copy.
pub(crate) fn checked_rows<T: Real>(init: Vec<T>, d: usize, k: usize) -> Result<Vec<T>> {
    if init.len() != checked_size(d, k)? {
        return Err(FaError::Shape {
            what: "init",
            expected: format!("{} values for ({d}, {k})", d * k),
            got: vec![init.len()],
        });
    }
    if init.iter().any(|v| !(v.to_f64().abs() <= T::MAX_INPUT)) {
        return Err(invalid("init", "must contain only finite values"));
    }
    Ok(init)
}
