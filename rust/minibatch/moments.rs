//! Exact per-feature mean and variance of a data set's rows in one parallel read (the whole-data fit's
//! first pass), with the pairwise combination of Chan, Golub & LeVeque ("Algorithms for computing the sample
//! variance", 1983): rows are taken in chunks of [`CHUNK_ROWS`]; for each chunk the mean m_c and the sum of
//! squared deviations from it S_c (two sweeps of the chunk, which is in cache), then, with n rows so far,
//!
//! ```text
//!   δ = m_c − m,   m ← m + δ n_c / (n + n_c),   S ← S + S_c + δ² n n_c / (n + n_c)
//! ```
//!
//! so a large offset of the data costs no precision. Features are split into fixed blocks handled in
//! parallel and the chunks are fixed, so results do not depend on the thread count.

use rayon::prelude::*;

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// Rows per chunk of the pairwise combination.
const CHUNK_ROWS: usize = 256;
/// Features per parallel task.
const TASK_FEATURES: usize = 64;

/// Per-feature mean and sum of squared deviations S (D each) of `rows` (N >= 1 slices of D values); every
/// value must be finite with |x| <= `X::MAX_INPUT` (else [`FaError::BadValue`] naming the first bad row).
pub fn column_moments<X: Real>(rows: &[&[X]]) -> Result<(Vec<f64>, Vec<f64>)> {
    let d = rows.first().map_or(0, |r| r.len());
    if rows.is_empty() || rows.iter().any(|r| r.len() != d) {
        return Err(FaError::Shape {
            what: "X",
            expected: "(n_samples >= 1, n_features) with rows of equal length".into(),
            got: vec![rows.len(), d],
        });
    }
    let mut mean = vec![0.0; d];
    let mut squares = vec![0.0; d];
    let first_bad = mean
        .par_chunks_mut(TASK_FEATURES)
        .zip(squares.par_chunks_mut(TASK_FEATURES))
        .enumerate()
        .filter_map(|(task, (m, s))| block_moments(rows, task * TASK_FEATURES, m, s))
        .min();
    match first_bad {
        Some(row) => Err(FaError::BadValue {
            row,
            kind: format!("NaN, infinity or a value with magnitude above {:e}", X::MAX_INPUT),
        }),
        None => Ok((mean, squares)),
    }
}

/// Moments of the features f0..f0 + m.len(); returns the first row with a bad value among them, if any.
fn block_moments<X: Real>(rows: &[&[X]], f0: usize, mean: &mut [f64], squares: &mut [f64]) -> Option<usize> {
    let width = mean.len();
    let mut n = 0usize;
    let mut chunk_mean = vec![0.0; width];
    let mut chunk_squares = vec![0.0; width];
    for (c, chunk) in rows.chunks(CHUNK_ROWS).enumerate() {
        chunk_mean.fill(0.0);
        let mut bad = false;
        for row in chunk {
            for (s, &v) in chunk_mean.iter_mut().zip(&row[f0..f0 + width]) {
                let v = v.to_f64();
                bad |= !(v.abs() <= X::MAX_INPUT);
                *s += v;
            }
        }
        if bad {
            return chunk
                .iter()
                .position(|r| r[f0..f0 + width].iter().any(|v| !(v.to_f64().abs() <= X::MAX_INPUT)))
                .map(|i| c * CHUNK_ROWS + i);
        }
        let n_c = chunk.len() as f64;
        chunk_mean.iter_mut().for_each(|s| *s /= n_c);
        chunk_squares.fill(0.0);
        for row in chunk {
            for ((s, &v), &m) in chunk_squares.iter_mut().zip(&row[f0..f0 + width]).zip(&chunk_mean) {
                let dev = v.to_f64() - m;
                *s += dev * dev;
            }
        }
        let total = (n + chunk.len()) as f64;
        let (w_new, w_cross) = (n_c / total, n as f64 * n_c / total);
        for (((m, s), &cm), &cs) in mean
            .iter_mut()
            .zip(squares.iter_mut())
            .zip(&chunk_mean)
            .zip(&chunk_squares)
        {
            let delta = cm - *m;
            *m += delta * w_new;
            *s += cs + delta * delta * w_cross;
        }
        n += chunk.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_match_two_pass_sums_and_ignore_an_offset() {
        let (n, d) = (1000, 70);
        let data: Vec<f64> = (0..n * d).map(|i| 1e8 + ((i * 7919) % 1013) as f64 / 101.0).collect();
        let rows: Vec<&[f64]> = data.chunks(d).collect();
        let (mean, squares) = column_moments(&rows).expect("moments");
        for j in 0..d {
            let m: f64 = rows.iter().map(|r| r[j] - 1e8).sum::<f64>() / n as f64;
            let s: f64 = rows.iter().map(|r| (r[j] - 1e8 - m).powi(2)).sum();
            assert!((mean[j] - 1e8 - m).abs() < 1e-7, "mean {j}");
            assert!((squares[j] - s).abs() < 1e-6 * s, "squares {j}: {} vs {s}", squares[j]);
        }
    }

    #[test]
    fn the_first_bad_row_is_named_whatever_block_holds_it() {
        let (n, d) = (600, 130);
        let mut data = vec![0.5f32; n * d];
        data[517 * d + 3] = f32::NAN;
        data[301 * d + 129] = f32::INFINITY;
        let rows: Vec<&[f32]> = data.chunks(d).collect();
        match column_moments(&rows) {
            Err(FaError::BadValue { row, .. }) => assert_eq!(row, 301),
            other => panic!("expected BadValue, got {other:?}"),
        }
    }
}
