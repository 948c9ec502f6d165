//! Exact per-feature mean and variance of a data set's rows in one parallel read (the whole-data fit's
//! first pass), with the pairwise combination of Chan, Golub & LeVeque ("Algorithms for computing the sample
//! variance", 1983): rows are taken in chunks of [`CHUNK_ROWS`]; for each chunk the mean m_c and the sum of
//! squared deviations from it S_c (two sweeps of the chunk, which is in cache), then, with n rows so far,
//!
//! ```text
//!   δ = m_c − m,   m ← m + δ n_c / (n + n_c),   S ← S + S_c + δ² n n_c / (n + n_c)
//! ```
//!
//! so a large offset of the data costs no precision.
//!
//! **Layout.** Rows are split into fixed groups (of a size that depends only on N) handled in parallel, each
//! a sequence of chunks of [`CHUNK_ROWS`] rows swept in pieces of [`BLOCK_FEATURES`] contiguous features (a
//! chunk's piece stays in cache between its two sweeps, and every read is sequential); the groups' results
//! are then combined in order with the same formula. The partition does not depend on the thread count, and
//! neither do the results.

use rayon::prelude::*;

use super::checks::is_bad_input;
use crate::error::{FaError, Result};
use crate::scalar::Real;

/// Rows per chunk of the pairwise combination.
const CHUNK_ROWS: usize = 64;
/// Features per piece of a chunk (64 rows × 2048 f64 = 1 MiB).
const BLOCK_FEATURES: usize = 2048;

/// Running moments of some rows: their number, per-feature mean and sum of squared deviations S.
struct Moments {
    n: usize,
    mean: Vec<f64>,
    squares: Vec<f64>,
}

impl Moments {
    /// Add rows with count `n_c`, mean `mean_c` and S `squares_c` to features f0.. of this accumulator (the
    /// caller adds `n_c` to `n` once every piece of those rows is in).
    fn combine(&mut self, f0: usize, n_c: usize, mean_c: &[f64], squares_c: &[f64]) {
        let total = (self.n + n_c) as f64;
        let (w_new, w_cross) = (n_c as f64 / total, self.n as f64 * n_c as f64 / total);
        let mean = &mut self.mean[f0..f0 + mean_c.len()];
        let squares = &mut self.squares[f0..f0 + mean_c.len()];
        for (((m, s), &cm), &cs) in mean.iter_mut().zip(squares.iter_mut()).zip(mean_c).zip(squares_c) {
            let delta = cm - *m;
            *m += delta * w_new;
            *s += cs + delta * delta * w_cross;
        }
    }
}

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
    let group = rows.len().div_ceil(16).div_ceil(CHUNK_ROWS).clamp(1, 64) * CHUNK_ROWS;
    let groups: Vec<std::result::Result<Moments, usize>> = crate::fork::in_pool(|| {
        rows.par_chunks(group)
            .enumerate()
            .map(|(g, grp)| group_moments(grp).map_err(|row| g * group + row))
            .collect()
    });
    let mut total = Moments {
        n: 0,
        mean: vec![0.0; d],
        squares: vec![0.0; d],
    };
    for g in groups {
        match g {
            Ok(m) => {
                total.combine(0, m.n, &m.mean, &m.squares);
                total.n += m.n;
            }
            Err(row) => {
                return Err(FaError::BadValue {
                    row,
                    kind: format!("NaN, infinity or a value with magnitude above {:e}", X::MAX_INPUT),
                })
            }
        }
    }
    Ok((total.mean, total.squares))
}

/// Moments of one group of rows, or the index (within the group) of its first row with a bad value.
fn group_moments<X: Real>(rows: &[&[X]]) -> std::result::Result<Moments, usize> {
    let d = rows[0].len();
    let mut acc = Moments {
        n: 0,
        mean: vec![0.0; d],
        squares: vec![0.0; d],
    };
    let mut chunk_mean = vec![0.0; BLOCK_FEATURES.min(d)];
    let mut chunk_squares = vec![0.0; BLOCK_FEATURES.min(d)];
    for (c, chunk) in rows.chunks(CHUNK_ROWS).enumerate() {
        for f0 in (0..d).step_by(BLOCK_FEATURES) {
            let width = BLOCK_FEATURES.min(d - f0);
            let (cm, cs) = (&mut chunk_mean[..width], &mut chunk_squares[..width]);
            if !piece_moments(chunk, f0, cm, cs) {
                let bad = |r: &&[X]| r.iter().any(|v| is_bad_input::<X>(v.to_f64()));
                return Err(c * CHUNK_ROWS + chunk.iter().position(bad).unwrap_or(0));
            }
            acc.combine(f0, chunk.len(), cm, cs);
        }
        acc.n += chunk.len();
    }
    Ok(acc)
}

/// Mean and S of features f0..f0 + mean.len() over the rows of a chunk (two sweeps); false if a value is bad.
fn piece_moments<X: Real>(chunk: &[&[X]], f0: usize, mean: &mut [f64], squares: &mut [f64]) -> bool {
    let width = mean.len();
    mean.fill(0.0);
    let mut bad = false;
    for row in chunk {
        for (s, &v) in mean.iter_mut().zip(&row[f0..f0 + width]) {
            let v = v.to_f64();
            bad |= is_bad_input::<X>(v);
            *s += v;
        }
    }
    let n_c = chunk.len() as f64;
    mean.iter_mut().for_each(|s| *s /= n_c);
    squares.fill(0.0);
    for row in chunk {
        for ((s, &v), &m) in squares.iter_mut().zip(&row[f0..f0 + width]).zip(mean.iter()) {
            let dev = v.to_f64() - m;
            *s += dev * dev;
        }
    }
    !bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_match_two_pass_sums_and_ignore_an_offset() {
        // 16 groups of 64 rows; two pieces of features (2048 + 52).
        let (n, d) = (1000, 2100);
        let data: Vec<f64> = (0..n * d).map(|i| 1e8 + ((i * 7919) % 1013) as f64 / 101.0).collect();
        let rows: Vec<&[f64]> = data.chunks(d).collect();
        let (mean, squares) = column_moments(&rows).expect("moments");
        for j in (0..d).step_by(7) {
            let m: f64 = rows.iter().map(|r| r[j] - 1e8).sum::<f64>() / n as f64;
            let s: f64 = rows.iter().map(|r| (r[j] - 1e8 - m).powi(2)).sum();
            assert!((mean[j] - 1e8 - m).abs() < 1e-7, "mean {j}: {} vs {m}", mean[j] - 1e8);
            assert!((squares[j] - s).abs() < 1e-6 * s, "squares {j}: {} vs {s}", squares[j]);
        }
    }

    #[test]
    fn the_first_bad_row_is_named_whatever_block_holds_it() {
        let (n, d) = (3000, 2100);
        let mut data = vec![0.5f32; n * d];
        data[2517 * d + 3] = f32::NAN;
        data[1301 * d + 2099] = f32::INFINITY;
        let rows: Vec<&[f32]> = data.chunks(d).collect();
        match column_moments(&rows) {
            Err(FaError::BadValue { row, .. }) => assert_eq!(row, 1301),
            other => panic!("expected BadValue, got {other:?}"),
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let (n, d) = (5000, 300);
        let data: Vec<f64> = (0..n * d).map(|i| ((i * 2654435761) % 100003) as f64 / 977.0).collect();
        let rows: Vec<&[f64]> = data.chunks(d).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| column_moments(&rows).expect("moments"))
        };
        assert_eq!(run(1), run(3));
    }
}
