//! Random initialisation (§4.4): F = Q of the reduced QR of a standard-normal D×K matrix.
//!
//! The Gaussian matrix is drawn in fixed blocks of rows, each from its own ChaCha8 stream of the seed,
//! so the result depends only on (seed, D, K) — not on the number of threads. The thin QR is computed as
//! CholeskyQR2 (two rounds of Q ← A R⁻¹ with Rᵀ R = AᵀA), which needs one K×K Gram matrix per round; the
//! blocks of A are regenerated for each pass, so only the D×K result, in the model's storage type, is held;
//! for a Gaussian matrix it is orthonormal to rounding.

use ndarray::{Array2, ArrayViewMut2, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;

use crate::error::{checked_size, try_filled, Result};
use crate::linalg::{lower_triangular_inverse, SpdFactor};
use crate::scalar::Real;

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

/// The seeded standard-normal rows of RNG block `block` (rows `block·RNG_BLOCK_ROWS …`, at most `rows` of them),
/// K = `k` values per row, row-major: the values [`fill_standard_normal`] puts there.
fn normal_block(seed: u64, block: usize, rows: usize, k: usize) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(block as u64);
    (0..rows * k).map(|_| rng.sample(StandardNormal)).collect()
}

/// x ← x M for every row x of `rows` (row-major, K = `k` values each), M = `m` (K×K row-major, upper
/// triangular): x_j ← Σ_{i ≤ j} x_i M_ij, summed in order of i.
fn times_upper(rows: &mut [f64], m: &[f64], k: usize) {
    let mut product = vec![0.0; k];
    for x in rows.chunks_exact_mut(k) {
        for (j, out) in product.iter_mut().enumerate() {
            *out = (0..=j).fold(0.0, |sum, i| sum + x[i] * m[i * k + j]);
        }
        x.copy_from_slice(&product);
    }
}

/// Σ_r x_r x_rᵀ over the rows x_r of `rows` (K = `k` values each), K×K row-major, summed in row order.
fn gram_of(rows: &[f64], k: usize) -> Vec<f64> {
    let mut gram = vec![0.0; k * k];
    for x in rows.chunks_exact(k) {
        for (i, &xi) in x.iter().enumerate() {
            for (g, &xj) in gram[i * k..(i + 1) * k].iter_mut().zip(x) {
                *g += xi * xj;
            }
        }
    }
    gram
}

/// R⁻¹ = L⁻ᵀ (upper triangular, K×K row-major) for the Gram matrix G = AᵀA = L Lᵀ = Rᵀ R.
fn inverse_factor(gram: Vec<f64>, k: usize) -> Result<Vec<f64>> {
    let gram =
        Array2::from_shape_vec((k, k), gram).map_err(|e| crate::error::invalid("n_components", e.to_string()))?;
    let lower = SpdFactor::new(gram.view(), "Gram matrix of the random initial loadings")?.lower();
    Ok(lower_triangular_inverse(lower.view())?
        .reversed_axes()
        .iter()
        .copied()
        .collect())
}

/// `per_block(b, rows)` for every RNG block b of a D-row matrix (rows = the block's row count), on rayon
/// when allowed; the results in block order, so whatever runs them the caller sees the same sequence.
fn over_blocks<R: Send>(d: usize, per_block: impl Fn(usize, usize) -> R + Sync) -> Vec<R> {
    let rows = |b: usize| RNG_BLOCK_ROWS.min(d - b * RNG_BLOCK_ROWS);
    let n_blocks = d.div_ceil(RNG_BLOCK_ROWS);
    if n_blocks > 1 && crate::fork::parallel_allowed() {
        (0..n_blocks).into_par_iter().map(|b| per_block(b, rows(b))).collect()
    } else {
        (0..n_blocks).map(|b| per_block(b, rows(b))).collect()
    }
}

/// The Gram matrix of the rows `block(b)` over every block, summed block by block in block order.
fn summed_gram(d: usize, k: usize, block: impl Fn(usize, usize) -> Vec<f64> + Sync) -> Vec<f64> {
    over_blocks(d, |b, rows| gram_of(&block(b, rows), k))
        .into_iter()
        .fold(vec![0.0; k * k], |mut total, part| {
            total.iter_mut().zip(&part).for_each(|(t, p)| *t += p);
            total
        })
}

/// D×K matrix with orthonormal columns, row-major, in the storage type T: Q of the thin QR of the seeded
/// standard-normal matrix of [`fill_standard_normal`] (§4.4), by CholeskyQR2 streamed over its row blocks:
///
/// ```text
///   G₁ = Σ_b A_bᵀ A_b = R₁ᵀ R₁,   G₂ = Σ_b (A_b R₁⁻¹)ᵀ (A_b R₁⁻¹) = R₂ᵀ R₂,   Q_b = A_b R₁⁻¹ R₂⁻¹
/// ```
///
/// Each block A_b is regenerated from its random stream for each of the three passes, so besides the D×K
/// result (each value computed in f64 and rounded once to T) only a few blocks of 4096 rows are held: no
/// f64 D×K matrix for a float32 model. The Gram matrices are summed block by block in block order, so the
/// result does not depend on the number of threads.
pub fn orthonormal_rows<T: Real>(n_features: usize, n_components: usize, seed: u64) -> Result<Vec<T>> {
    let (d, k) = (n_features, n_components);
    let size = checked_size(d, k)?;
    // Reserved first: a size the machine cannot hold fails at once, before three passes of random draws.
    let mut out = try_filled(size, T::default(), "n_features")?;
    if size == 0 {
        return Ok(out);
    }
    let normal = |b: usize, rows: usize| normal_block(seed, b, rows, k);
    let first = inverse_factor(summed_gram(d, k, normal), k)?;
    let once = |b: usize, rows: usize| {
        let mut block = normal(b, rows);
        times_upper(&mut block, &first, k);
        block
    };
    let second = inverse_factor(summed_gram(d, k, once), k)?;
    let fill = |(b, chunk): (usize, &mut [T])| {
        let mut block = once(b, chunk.len() / k);
        times_upper(&mut block, &second, k);
        chunk.iter_mut().zip(&block).for_each(|(o, &v)| *o = T::from_f64(v));
    };
    if d > RNG_BLOCK_ROWS && crate::fork::parallel_allowed() {
        out.par_chunks_mut(RNG_BLOCK_ROWS * k).enumerate().for_each(fill);
    } else {
        out.chunks_mut(RNG_BLOCK_ROWS * k).enumerate().for_each(fill);
    }
    Ok(out)
}

/// D×K matrix with orthonormal columns as an f64 array: [`orthonormal_rows`] in f64 (§4.4).
pub fn orthonormal_loadings(n_features: usize, n_components: usize, seed: u64) -> Result<Array2<f64>> {
    let rows = orthonormal_rows::<f64>(n_features, n_components, seed)?;
    Array2::from_shape_vec((n_features, n_components), rows)
        .map_err(|e| crate::error::invalid("n_features", e.to_string()))
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
    fn streamed_rows_are_the_q_factor_of_the_seeded_normal_matrix() {
        // D spans three RNG blocks, the last one partial.
        let (d, k) = (2 * RNG_BLOCK_ROWS + 123, 5);
        let q = orthonormal_loadings(d, k, 11).expect("qr");
        let mut a = Array2::<f64>::zeros((d, k));
        fill_standard_normal(a.view_mut(), 11);
        // A = Q R with R upper triangular and a positive diagonal: Qᵀ A is R.
        let r = q.t().dot(&a);
        let scale = r.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
        for i in 0..k {
            assert!(r[[i, i]] > 0.0);
            for j in 0..i {
                assert!(r[[i, j]].abs() < 1e-12 * scale, "R[{i},{j}] = {}", r[[i, j]]);
            }
        }
        let rebuilt = q.dot(&r);
        assert!((&rebuilt - &a).iter().all(|v| v.abs() < 1e-10));
    }

    #[test]
    fn float32_rows_are_the_float64_rows_rounded_once_on_any_thread_count() {
        let (d, k) = (3 * RNG_BLOCK_ROWS + 7, 4);
        let q64 = orthonormal_rows::<f64>(d, k, 3).expect("qr");
        let q32 = orthonormal_rows::<f32>(d, k, 3).expect("qr");
        assert!(q64.iter().zip(&q32).all(|(&w, &n)| (w as f32).to_bits() == n.to_bits()));
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        assert_eq!(pool.install(|| orthonormal_rows::<f64>(d, k, 3)).expect("qr"), q64);
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
