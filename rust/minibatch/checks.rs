//! The bad-input error and the running mean of a mini-batch model, over a batch given as row slices.

use ndarray::{Array1, Zip};

use crate::error::FaError;
use crate::scalar::Real;

/// Whether an input value is NaN, ±Inf or above `X::MAX_INPUT` in magnitude (written so NaN counts as bad).
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(super) fn is_bad_input<X: Real>(v: f64) -> bool {
    !(v.abs() <= X::MAX_INPUT)
}

/// The error for a batch known to hold a NaN, ±Inf or a magnitude above `X::MAX_INPUT`, naming its first
/// bad row (the kernels detect bad values while reading; only a failing batch is searched here).
pub(super) fn bad_value_error<X: Real>(rows: &[&[X]]) -> FaError {
    let is_bad = |v: &X| is_bad_input::<X>(v.to_f64());
    let row = rows.iter().position(|r| r.iter().any(is_bad)).unwrap_or(0);
    let v = rows
        .get(row)
        .and_then(|r| r.iter().find(|v| is_bad(v)))
        .map_or(f64::NAN, |v| v.to_f64());
    let kind = if v.is_finite() {
        format!("a value with |x| > {:e}", X::MAX_INPUT)
    } else {
        "NaN or infinity".into()
    };
    FaError::BadValue { row, kind }
}

/// θ̄ after `n_after` rows: θ̄ + (Σ_i x_i − B θ̄) / n_after, the exact running mean.
pub(super) fn running_mean<X: Real>(mean: &Array1<f64>, rows: &[&[X]], n_before: u64, n_after: u64) -> Array1<f64> {
    let mut sum = Array1::<f64>::zeros(mean.len());
    for row in rows {
        Zip::from(&mut sum).and(*row).for_each(|s, &v| *s += v.to_f64());
    }
    let b = (n_after - n_before) as f64;
    mean + &((sum - mean * b) / n_after as f64)
}

/// Σ_i (x_id − θ̄_d)² per feature (D), rows in order.
pub(super) fn column_squares<X: Real>(rows: &[&[X]], mean: &Array1<f64>) -> Vec<f64> {
    let mut squares = vec![0.0; mean.len()];
    for row in rows {
        for ((sq, &v), &c) in squares.iter_mut().zip(*row).zip(mean) {
            let dev = v.to_f64() - c;
            *sq += dev * dev;
        }
    }
    squares
}
