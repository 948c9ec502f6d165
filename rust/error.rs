//! The one error type of the crate.

use thiserror::Error;

/// Everything that can go wrong in onlinefa's core. Every variant is a user-facing condition; the Python
/// binding maps a numerical breakdown to `NumericalBreakdownError` (an `ArithmeticError`), an allocation
/// failure to `MemoryError`, a call out of order to `RuntimeError` and everything else to `ValueError`.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FaError {
    /// A hyper-parameter is out of its valid range (checked at construction).
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParameter {
        /// Parameter name as the user spells it.
        name: &'static str,
        /// What was wrong and what is allowed.
        reason: String,
    },
    /// An array has the wrong shape.
    #[error("{what} has shape {got:?}, expected {expected}")]
    Shape {
        /// Which argument.
        what: &'static str,
        /// Expected shape, in words (e.g. "(n_samples, 1000)").
        expected: String,
        /// Actual shape.
        got: Vec<usize>,
    },
    /// A sample contains NaN or ±Inf (or a value too large for the state's dtype).
    #[error("row {row} of the batch contains {kind}; no row of this batch was applied")]
    BadValue {
        /// Index of the first offending row in the batch.
        row: usize,
        /// Description of the problem ("NaN or infinity", "a value with |x| > 1e100", ...).
        kind: String,
    },
    /// A K×K matrix that must be symmetric positive definite is not (numerical breakdown).
    #[error("numerical breakdown: {0} is not positive definite")]
    NotPositiveDefinite(&'static str),
    /// An iterative method left every scale of the data behind (numerical breakdown).
    #[error("numerical breakdown: {0}")]
    Diverged(&'static str),
    /// Memory for an array of the state could not be allocated.
    #[error("cannot allocate {len} elements for {what}; reduce n_features or n_components")]
    Allocation {
        /// Which size the array follows (e.g. "n_features").
        what: &'static str,
        /// Number of elements requested.
        len: usize,
    },
    /// A method was called out of order (e.g. a VIFA step before its draws); nothing changed.
    #[error("{0}")]
    CallOrder(String),
    /// A serialized state is inconsistent (wrong lengths, non-finite values, unknown version).
    #[error("invalid state: {0}")]
    InvalidState(String),
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, FaError>;

/// Build an [`FaError::InvalidParameter`].
pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> FaError {
    FaError::InvalidParameter {
        name,
        reason: reason.into(),
    }
}

/// A vector of `len` copies of `value`, or an error (never an abort) when it cannot be allocated.
pub(crate) fn try_filled<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| FaError::Allocation { what, len })?;
    v.resize(len, value);
    Ok(v)
}

/// D·K without overflow.
pub(crate) fn checked_size(n_features: usize, n_components: usize) -> Result<usize> {
    n_features.checked_mul(n_components).ok_or_else(|| {
        invalid(
            "n_features",
            format!("n_features × n_components = {n_features} × {n_components} overflows"),
        )
    })
}
