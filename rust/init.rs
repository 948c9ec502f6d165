//! Random initialisation (§4.4): F = Q of the reduced QR of a standard-normal D×K matrix.
//!
//! The Gaussian matrix is drawn in fixed blocks of rows, each from its own ChaCha8 stream of the seed,
//! so the result depends only on (seed, D, K) — not on the number of threads. The thin QR is computed as
//! CholeskyQR2 (two rounds of Q ← A R⁻¹ with Rᵀ R = AᵀA), which needs one K×K Gram matrix per round and
//! never holds more than the D×K matrix itself; for a Gaussian matrix it is orthonormal to rounding.

use ndarray::{Array2, ArrayViewMut2, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;

use crate::error::{checked_size, try_filled, Result};
use crate::linalg::{lower_triangular_inverse, SpdFactor};

/// Rows per independently seeded block of random draws.
const RNG_BLOCK_ROWS: usize = 4096;

/// Fill `out` (rows × cols) with N(0, 1) draws; row block `b` uses stream `b` of `seed` (on rayon when
/// there are several blocks and threads are usable, see `crate::fork`; the draws are the same either way).
pub fn fill_standard_normal(mut out: ArrayViewMut2<f64>, seed: u64) {
    let fill = |(block, mut chunk): (usize, ArrayViewMut2<f64>)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(block as u64);
        for v in chunk.iter_mut() {
            *v = rng.sample(StandardNormal);
        }
    };
    let blocks = out.axis_chunks_iter_mut(Axis(0), RNG_BLOCK_ROWS);
    if blocks.len() > 1 && crate::fork::parallel_allowed() {
        blocks.into_par_iter().enumerate().for_each(fill);
    } else {
        blocks.enumerate().for_each(fill);
    }
}

/// Rows `row0 … row0 + out.nrows() − 1` of the standard-normal matrix [`fill_standard_normal`] draws for
/// `seed` (same number of columns): the part of the initial draw held by one shard of a model whose rows
/// are split across processes. Each row block is regenerated from its start and its leading rows skipped.
pub fn fill_standard_normal_rows(mut out: ArrayViewMut2<f64>, seed: u64, row0: usize) {
    let cols = out.ncols();
    let mut done = 0;
    while done < out.nrows() {
        let row = row0 + done;
        let block = row / RNG_BLOCK_ROWS;
        let skip = row - block * RNG_BLOCK_ROWS;
        let take = (RNG_BLOCK_ROWS - skip).min(out.nrows() - done);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(block as u64);
        for _ in 0..skip * cols {
            let _: f64 = rng.sample(StandardNormal);
        }
        for v in out.slice_mut(ndarray::s![done..done + take, ..]).iter_mut() {
            *v = rng.sample(StandardNormal);
        }
        done += take;
    }
}

/// A fresh seed from the operating system (used when the caller gives none).
pub fn entropy_seed() -> u64 {
    rand::rng().random()
}

/// One CholeskyQR round: with G = AᵀA = L Lᵀ (L lower, so R = Lᵀ), A ← A R⁻¹ = A L⁻ᵀ.
fn cholesky_qr_round(a: &mut Array2<f64>) -> Result<()> {
    let gram = a.t().dot(a);
    let l = SpdFactor::new(gram.view(), "Gram matrix of the random initial loadings")?.lower();
    let l_inv_t = lower_triangular_inverse(l.view())?.reversed_axes();
    let q = a.dot(&l_inv_t);
    a.assign(&q);
    Ok(())
}

/// D×K matrix with orthonormal columns: Q of the thin QR of a seeded standard-normal matrix (§4.4).
pub fn orthonormal_loadings(n_features: usize, n_components: usize, seed: u64) -> Result<Array2<f64>> {
    let buffer = try_filled(checked_size(n_features, n_components)?, 0.0, "n_features")?;
    let mut a = Array2::from_shape_vec((n_features, n_components), buffer)
        .map_err(|e| crate::error::invalid("n_features", e.to_string()))?;
    fill_standard_normal(a.view_mut(), seed);
    cholesky_qr_round(&mut a)?;
    cholesky_qr_round(&mut a)?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadings_are_orthonormal_and_reproducible() {
        let q = orthonormal_loadings(10_000, 7, 42).expect("qr");
        let gram = q.t().dot(&q);
        for i in 0..7 {
            for j in 0..7 {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((gram[[i, j]] - want).abs() < 1e-12, "gram[{i},{j}] = {}", gram[[i, j]]);
            }
        }
        assert_eq!(q, orthonormal_loadings(10_000, 7, 42).expect("qr"));
        assert_ne!(q, orthonormal_loadings(10_000, 7, 43).expect("qr"));
    }

    #[test]
    fn rows_of_the_standard_normal_matrix_match_the_whole_draw() {
        let mut whole = Array2::zeros((2 * RNG_BLOCK_ROWS + 50, 3));
        fill_standard_normal(whole.view_mut(), 5);
        for (lo, hi) in [
            (0, 7),
            (7, RNG_BLOCK_ROWS + 3),
            (RNG_BLOCK_ROWS - 1, 2 * RNG_BLOCK_ROWS + 50),
        ] {
            let mut part = Array2::zeros((hi - lo, 3));
            fill_standard_normal_rows(part.view_mut(), 5, lo);
            assert_eq!(part, whole.slice(ndarray::s![lo..hi, ..]));
        }
    }

    #[test]
    fn draws_do_not_depend_on_thread_count() {
        let mut a = Array2::<f64>::zeros((9000, 3));
        fill_standard_normal(a.view_mut(), 5);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        let mut b = Array2::<f64>::zeros((9000, 3));
        pool.install(|| fill_standard_normal(b.view_mut(), 5));
        assert_eq!(a, b);
        let mean = a.mean().unwrap_or(f64::NAN);
        // 27000 N(0,1) draws: the sample mean has s.d. 1/sqrt(27000) ≈ 0.006; 0.03 is 5 s.d.
        assert!(mean.abs() < 0.03);
    }
}
