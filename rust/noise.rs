//! Counter-based standard-normal noise: the value for (key, draw j, feature d) depends on those three
//! numbers only, never on how the D features are split between threads or processes.
//!
//! Features 2p and 2p + 1 of draw j are the two normals ([`box_muller`]) of the 128 bits that Philox4x32-10
//! ([`philox`]) gives for the counter (p, j) (p in the low 64 bits, j in the high) under the key derived from
//! the seed. The K latent values h_j are the pairs of counters (2⁶³ + i, j). Any contiguous range of features
//! (a shard of a model split across processes) computes the pairs it touches, so it gets exactly the values
//! the whole vector would have there.

mod box_muller;
mod philox;

use ndarray::Array1;
use rayon::prelude::*;

use crate::engine::isa::Isa;
use crate::scalar::Real;

/// The name of this noise (the counter-based generator and the normal transform), kept in checkpoints of models
/// whose state refers to draws by number.
pub const GENERATOR: &str = "philox4x32-10-box-muller";

/// Salt of the key of [`crate::query`] draws (`sample`), separating them from every other stream of a seed.
pub const SAMPLE_SALT: u64 = 0x5341_4d50_4c45_5f7a;

/// Features per stack buffer of [`fill_noise`].
const NOISE_BLOCK_ROWS: usize = 256;
/// The first pair counter of the latent values (the features' pairs are below it).
const LATENT_PAIRS: u64 = 1 << 63;
/// Counters per group: 16 lanes, two AVX-512 vectors per 32-bit word and per output.
const LANES: usize = 16;

/// h of draw `draw`: K standard normals.
pub fn latent_draw(key: u64, draw: u64, k: usize) -> Array1<f64> {
    let mut values = vec![0.0; k.div_ceil(2) * 2];
    normal_pairs(Isa::detect(), key, draw, LATENT_PAIRS, &mut values);
    values.truncate(k);
    Array1::from(values)
}

/// z of draw `draw` for features `row0 … row0 + out.len() − 1` (any start, any length), each value computed in
/// f64 and rounded once to T.
pub fn fill_noise<T: Real>(key: u64, draw: u64, row0: usize, out: &mut [T]) {
    let isa = Isa::detect();
    let mut values = [0.0f64; NOISE_BLOCK_ROWS + 2];
    let mut row = row0;
    for part in out.chunks_mut(NOISE_BLOCK_ROWS) {
        // The pairs of features row … row + len − 1: an odd start or end computes one value more.
        let (first, skip) = (row / 2, row % 2);
        let pairs = (row + part.len()).div_ceil(2) - first;
        normal_pairs(isa, key, draw, first as u64, &mut values[..2 * pairs]);
        for (v, &z) in part.iter_mut().zip(&values[skip..]) {
            *v = T::from_f64(z);
        }
        row += part.len();
    }
}

/// out[2i], out[2i + 1] ← the normals of pair counter (first + i, draw) under `key`, on code path `isa` (the same
/// bits on every path); `out` has an even length.
fn normal_pairs(isa: Isa, key: u64, draw: u64, first: u64, out: &mut [f64]) {
    debug_assert!(out.len().is_multiple_of(2));
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: the AVX-512 path is chosen only on CPUs with AVX-512F and VL (`Isa::allowed`).
            return unsafe { normal_pairs_avx512(key, draw, first, out) };
        }
        if isa == Isa::Avx2 {
            // SAFETY: the AVX2 path is chosen only on CPUs with AVX2 (`Isa::allowed`).
            return unsafe { normal_pairs_avx2(key, draw, first, out) };
        }
    }
    let _ = isa;
    normal_pairs_loop(key, draw, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn normal_pairs_avx2(key: u64, draw: u64, first: u64, out: &mut [f64]) {
    normal_pairs_loop(key, draw, first, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
unsafe fn normal_pairs_avx512(key: u64, draw: u64, first: u64, out: &mut [f64]) {
    normal_pairs_loop(key, draw, first, out)
}

/// [`normal_pairs`]' loop: groups of [`LANES`] counters held in arrays (vectors); a last, shorter group computes
/// all lanes and keeps its own.
#[inline(always)]
fn normal_pairs_loop(key: u64, draw: u64, first: u64, out: &mut [f64]) {
    let key = [key as u32, (key >> 32) as u32];
    for (g, o) in out.chunks_mut(2 * LANES).enumerate() {
        let mut bits = [[0u64; LANES]; 4];
        for l in 0..LANES {
            let pair = first.wrapping_add((g * LANES + l) as u64);
            bits[0][l] = pair & 0xFFFF_FFFF;
            bits[1][l] = pair >> 32;
            bits[2][l] = draw & 0xFFFF_FFFF;
            bits[3][l] = draw >> 32;
        }
        philox::philox4x32(&mut bits, key);
        let (mut z0, mut z1) = ([0.0; LANES], [0.0; LANES]);
        for l in 0..LANES {
            let a = bits[0][l] | bits[1][l] << 32;
            let b = bits[2][l] | bits[3][l] << 32;
            (z0[l], z1[l]) = box_muller::pair(a, b);
        }
        for (l, slot) in o.chunks_exact_mut(2).enumerate() {
            (slot[0], slot[1]) = (z0[l], z1[l]);
        }
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

    /// The definition, one pair at a time: Philox4x32-10 of counter (pair, draw), then Box–Muller.
    fn pair_by_definition(key: u64, draw: u64, pair: u64) -> [f64; 2] {
        let mut bits = [[pair & 0xFFFF_FFFF], [pair >> 32], [draw & 0xFFFF_FFFF], [draw >> 32]];
        philox::philox4x32(&mut bits, [key as u32, (key >> 32) as u32]);
        let a = bits[0][0] | bits[1][0] << 32;
        let b = bits[2][0] | bits[3][0] << 32;
        box_muller::pair(a, b).into()
    }

    #[test]
    fn every_path_gives_the_definition_bit_for_bit() {
        let (key, draw) = (0x0123_4567_89ab_cdef, (1 << 40) + 3);
        for first in [0u64, 5, u32::MAX as u64 - 3, LATENT_PAIRS] {
            let expected: Vec<f64> = (0..40).flat_map(|i| pair_by_definition(key, draw, first + i)).collect();
            for isa in Isa::available() {
                for pairs in [0, 1, LANES - 1, LANES, LANES + 1, 40] {
                    let mut out = vec![0.0; 2 * pairs];
                    normal_pairs(isa, key, draw, first, &mut out);
                    assert_eq!(out, expected[..2 * pairs], "{isa:?}, first pair {first}, {pairs} pairs");
                }
            }
        }
        let h = latent_draw(key, draw, 3);
        assert_eq!(h.to_vec(), expected_latent(key, draw));
    }

    fn expected_latent(key: u64, draw: u64) -> Vec<f64> {
        let mut h: Vec<f64> = (0..2)
            .flat_map(|i| pair_by_definition(key, draw, LATENT_PAIRS + i))
            .collect();
        h.truncate(3);
        h
    }

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
