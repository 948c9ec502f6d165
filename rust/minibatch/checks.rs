//! Per-batch input checks and the running mean of a mini-batch model, over a batch given as row slices.

use ndarray::{Array1, Zip};
use rayon::prelude::*;

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// Reject NaN, ±Inf and magnitudes above `X::MAX_INPUT`, naming the first bad row. The common case (all
/// good) is one branch-free sweep per row, rows in parallel; only a failing batch is searched for its first bad value.
pub(super) fn check_rows<X: Real>(rows: &[&[X]]) -> Result<()> {
    let bad_row = rows
        .par_iter()
        .position_first(|r| r.iter().fold(false, |bad, v| bad | !(v.to_f64().abs() <= X::MAX_INPUT)));
    let Some(row) = bad_row else {
        return Ok(());
    };
    let v = rows[row]
        .iter()
        .map(|v| v.to_f64())
        .find(|v| !(v.abs() <= X::MAX_INPUT))
        .unwrap_or(f64::NAN);
    let kind = if v.is_finite() {
        format!("a value with |x| > {:e}", X::MAX_INPUT)
    } else {
        "NaN or infinity".into()
    };
    Err(FaError::BadValue { row, kind })
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
