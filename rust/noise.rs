//! Counter-based standard-normal noise: the value for (key, draw j, feature d) depends on those three
//! numbers only, never on how the D features are split between threads or processes.
//!
//! Draw j uses ChaCha8 stream j of a key derived from the seed. Its first words give the K latent values h_j;
//! the noise z of feature block b (features b·B … b·B + B − 1, B = [`NOISE_BLOCK_ROWS`]) starts at word
//! (b + 1)·2³² of the same stream. A slice of features that starts inside a block regenerates that block
//! from its start and discards the leading values, so any contiguous range of features (a shard of a
//! model split across processes) gets exactly the values the whole vector would have there.

use ndarray::Array1;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;

use crate::scalar::Real;

/// Salt of the key of [`crate::query`] draws (`sample`), separating them from every other stream of a seed.
pub const SAMPLE_SALT: u64 = 0x5341_4d50_4c45_5f7a;

/// Features per noise block.
pub const NOISE_BLOCK_ROWS: usize = 256;
/// log₂ of the 32-bit-word stride between the noise blocks of one draw's stream.
const NOISE_BLOCK_WORDS_LOG2: u32 = 32;

/// A ChaCha8 generator on stream `draw` of `key`.
fn draw_rng(key: u64, draw: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    rng.set_stream(draw);
    rng
}

/// h of draw `draw`: K standard normals from the start of its stream.
pub fn latent_draw(key: u64, draw: u64, k: usize) -> Array1<f64> {
    let mut rng = draw_rng(key, draw);
    (0..k).map(|_| rng.sample::<f64, _>(StandardNormal)).collect()
}

/// z of draw `draw` for features `row0 … row0 + out.len() − 1` (any start, any length), each value drawn in
/// f64 and rounded once to T.
pub fn fill_noise<T: Real>(key: u64, draw: u64, row0: usize, out: &mut [T]) {
    let mut row = row0;
    let mut rest = out;
    while !rest.is_empty() {
        let block = row / NOISE_BLOCK_ROWS;
        let skip = row - block * NOISE_BLOCK_ROWS;
        let take = (NOISE_BLOCK_ROWS - skip).min(rest.len());
        let mut rng = draw_rng(key, draw);
        rng.set_word_pos(((block as u128) + 1) << NOISE_BLOCK_WORDS_LOG2);
        for _ in 0..skip {
            let _: f64 = rng.sample(StandardNormal);
        }
        let (head, tail) = rest.split_at_mut(take);
        for v in head.iter_mut() {
            *v = T::from_f64(rng.sample(StandardNormal));
        }
        rest = tail;
        row += take;
    }
}

/// Values per task of [`fill_noise_rows`]: a multiple of [`NOISE_BLOCK_ROWS`], so tasks of an aligned range
/// start on a block.
const NOISE_TASK_ROWS: usize = 64 * NOISE_BLOCK_ROWS;

/// z of draws `0 … n − 1` for features `row0 … row0 + D − 1` written into the rows of `out` (n×D, row-major),
/// rounded to `T`. Every value is the one [`fill_noise`] gives, whatever the split; large outputs are filled
/// by tasks of [`NOISE_TASK_ROWS`] values on the thread pool.
pub fn fill_noise_rows<T: Real>(key: u64, row0: usize, out: &mut [T], n_features: usize) {
    if n_features == 0 {
        return;
    }
    let large = out_is_large(out.len());
    let tasks = out.chunks_mut(n_features).enumerate().flat_map(|(draw, row)| {
        row.chunks_mut(NOISE_TASK_ROWS)
            .enumerate()
            .map(move |(c, part)| (draw, c, part))
    });
    let run =
        |(draw, c, part): (usize, usize, &mut [T])| fill_noise(key, draw as u64, row0 + c * NOISE_TASK_ROWS, part);
    if large {
        tasks.collect::<Vec<_>>().into_par_iter().for_each(run);
    } else {
        tasks.for_each(run);
    }
}

/// Whether a fill of `len` values is worth the thread pool (and the pool is usable: see `crate::fork`).
fn out_is_large(len: usize) -> bool {
    len >= NOISE_TASK_ROWS && crate::fork::parallel_allowed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_split_of_the_features_gives_the_same_values() {
        let d = 3 * NOISE_BLOCK_ROWS + 17;
        let mut whole = vec![0.0; d];
        fill_noise(7, 3, 0, &mut whole);
        for cuts in [[1usize, 300], [255, 256], [256, 700], [100, 101]] {
            let mut parts = vec![0.0; d];
            let (a, rest) = parts.split_at_mut(cuts[0]);
            let (b, c) = rest.split_at_mut(cuts[1] - cuts[0]);
            fill_noise(7, 3, 0, a);
            fill_noise(7, 3, cuts[0], b);
            fill_noise(7, 3, cuts[1], c);
            assert_eq!(whole, parts, "cuts {cuts:?}");
        }
        let mut other = vec![0.0; d];
        fill_noise(7, 4, 0, &mut other);
        assert_ne!(whole, other);
    }

    #[test]
    fn rows_filled_in_tasks_equal_fill_noise_on_any_thread_count() {
        let (n, d) = (3, 2 * NOISE_TASK_ROWS + 300);
        for row0 in [0usize, 5, NOISE_BLOCK_ROWS + 1] {
            let mut expected = vec![0.0; n * d];
            for (j, row) in expected.chunks_mut(d).enumerate() {
                fill_noise(11, j as u64, row0, row);
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("pool");
                let mut got = vec![0.0f64; n * d];
                pool.install(|| fill_noise_rows(11, row0, &mut got, d));
                assert_eq!(got, expected, "row0 = {row0}, {threads} threads");
                let mut got32 = vec![0.0f32; n * d];
                pool.install(|| fill_noise_rows(11, row0, &mut got32, d));
                assert!(got32.iter().zip(&expected).all(|(a, b)| *a == *b as f32));
            }
        }
    }
}
