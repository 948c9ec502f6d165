//! The two data-sized products of a mini-batch E-step, read straight from the caller's rows:
//!
//! ```text
//!   project:  M = (X_b − 1 θ̄ᵀ) W            M[i][j] = Σ_d (x_id − θ̄_d) W[d][j]      (B×K)
//!   cross:    A = (X_b − 1 θ̄ᵀ)ᵀ M           A[d][j] = Σ_i (x_id − θ̄_d) M[i][j]      (D×K)
//!             q[d] = Σ_i (x_id − θ̄_d)²                                                  (D)
//! ```
//!
//! The deviations are formed on the fly (never stored), so a batch is read twice and nothing D×B is
//! written, and the rows are a list of slices, so a shuffled batch is read where it lies (no gather copy).
//!
//! **Tiles.** `project` keeps a 4-row × C-column tile of M in registers for a whole sweep over d (C ≤ 12:
//! three 256-bit vectors per row), so each loaded row of W feeds four rows; `cross` keeps a 4-feature ×
//! C-column tile of A (one vector per column, lanes = features) plus the 4 squares, so each loaded 4-feature
//! piece of a row feeds C + 1 multiply-adds. W and M are stored with K padded to `kp` (a multiple of 4,
//! zero columns), and a column chunk is 12, 8 or 4 wide.
//!
//! **Arithmetic and order.** Every sum runs over its inner index in ascending order, in f64, whatever the
//! partition into parallel tasks, so results do not depend on the thread count. The FMA path (AVX2 + FMA,
//! detected once) fuses each multiply-add; the portable path rounds product and sum separately (on aarch64
//! both fuse), so the two agree to rounding.

use rayon::prelude::*;

use crate::engine::isa::Isa;
use crate::engine::tiled::{MulAdd, PortableMulAdd};
use crate::scalar::Real;

/// Rows of M per parallel task of `project` (a multiple of the 4-row tile).
const PROJECT_TASK_ROWS: usize = 32;
/// Features per parallel task of `cross` (a multiple of the 4-feature tile).
const CROSS_TASK_FEATURES: usize = 32;
/// Widest column chunk of a tile.
const CHUNK: usize = 12;

/// K rounded up to a multiple of 4: the row length of the padded W and M.
pub(crate) fn padded(k: usize) -> usize {
    k.div_ceil(4) * 4
}

/// Column chunks (start, width) covering kp columns: widths 12, then 8 or 4.
fn chunks(kp: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..kp).step_by(CHUNK).map(move |j0| (j0, (kp - j0).min(CHUNK)))
}

/// M = (X_b − 1 θ̄ᵀ) W. rows: B slices of D values; mean: θ̄ (D); w: D×kp row-major (columns ≥ K zero);
/// out: B×kp row-major, overwritten.
pub(crate) fn project<X: Real>(isa: Isa, rows: &[&[X]], mean: &[f64], w: &[f64], kp: usize, out: &mut [f64]) {
    let d = mean.len();
    assert!(w.len() == d * kp && out.len() == rows.len() * kp && kp.is_multiple_of(4));
    assert!(rows.iter().all(|r| r.len() == d));
    crate::fork::in_pool(|| {
        out.par_chunks_mut(PROJECT_TASK_ROWS * kp)
            .zip(rows.par_chunks(PROJECT_TASK_ROWS))
            .for_each(|(out, rows)| {
                for (tile_out, tile_rows) in out.chunks_mut(4 * kp).zip(rows.chunks(4)) {
                    // A short last tile repeats its last row; the extra outputs are dropped.
                    let last = tile_rows[tile_rows.len() - 1];
                    let four: [&[X]; 4] = std::array::from_fn(|r| tile_rows.get(r).copied().unwrap_or(last));
                    let mut tile = [[0.0f64; CHUNK]; 4];
                    for (j0, width) in chunks(kp) {
                        project_chunk(isa, &four, mean, w, kp, j0, width, &mut tile);
                        for (r, o) in tile_out.chunks_mut(kp).enumerate() {
                            o[j0..j0 + width].copy_from_slice(&tile[r][..width]);
                        }
                    }
                }
            })
    });
}

#[allow(clippy::too_many_arguments)]
fn project_chunk<X: Real>(
    isa: Isa,
    rows: &[&[X]; 4],
    mean: &[f64],
    w: &[f64],
    kp: usize,
    j0: usize,
    width: usize,
    tile: &mut [[f64; CHUNK]; 4],
) {
    match (isa, width) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
        (Isa::Avx2 | Isa::Avx512, 12) => unsafe { project_fma::<X, 3>(rows, mean, w, kp, j0, tile) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx2 | Isa::Avx512, 8) => unsafe { project_fma::<X, 2>(rows, mean, w, kp, j0, tile) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx2 | Isa::Avx512, _) => unsafe { project_fma::<X, 1>(rows, mean, w, kp, j0, tile) },
        (_, 12) => project_with::<X, PortableMulAdd, 12>(rows, mean, w, kp, j0, tile),
        (_, 8) => project_with::<X, PortableMulAdd, 8>(rows, mean, w, kp, j0, tile),
        _ => project_with::<X, PortableMulAdd, 4>(rows, mean, w, kp, j0, tile),
    }
}

#[inline(always)]
fn project_with<X: Real, F: MulAdd, const C: usize>(
    rows: &[&[X]; 4],
    mean: &[f64],
    w: &[f64],
    kp: usize,
    j0: usize,
    tile: &mut [[f64; CHUNK]; 4],
) {
    let mut acc = [[0.0f64; C]; 4];
    for (dd, &c) in mean.iter().enumerate() {
        let wd = &w[dd * kp + j0..dd * kp + j0 + C];
        for (acc_r, row) in acc.iter_mut().zip(rows) {
            let dev = row[dd].to_f64() - c;
            for (a, &wv) in acc_r.iter_mut().zip(wd) {
                *a = F::mul_add(dev, wv, *a);
            }
        }
    }
    for (t, a) in tile.iter_mut().zip(&acc) {
        t[..C].copy_from_slice(a);
    }
}

/// `project_with` for NV 4-lane vectors of columns, with AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn project_fma<X: Real, const NV: usize>(
    rows: &[&[X]; 4],
    mean: &[f64],
    w: &[f64],
    kp: usize,
    j0: usize,
    tile: &mut [[f64; CHUNK]; 4],
) {
    use std::arch::x86_64::*;
    let d = mean.len();
    assert!(rows.iter().all(|r| r.len() == d) && w.len() >= d * kp && j0 + 4 * NV <= kp);
    let mut acc = [[_mm256_setzero_pd(); NV]; 4];
    for (dd, &c) in mean.iter().enumerate() {
        // SAFETY: dd < d and j0 + 4 NV <= kp: inside w (D×kp, checked above).
        let wp = w.as_ptr().add(dd * kp + j0);
        let wv: [__m256d; NV] = std::array::from_fn(|v| _mm256_loadu_pd(wp.add(4 * v)));
        for (acc_r, row) in acc.iter_mut().zip(rows) {
            // SAFETY: dd < d = row length (checked above).
            let dev = _mm256_set1_pd(row.get_unchecked(dd).to_f64() - c);
            for (a, &wj) in acc_r.iter_mut().zip(&wv) {
                *a = _mm256_fmadd_pd(dev, wj, *a);
            }
        }
    }
    for (t, acc_r) in tile.iter_mut().zip(&acc) {
        for (v, a) in acc_r.iter().enumerate() {
            _mm256_storeu_pd(t.as_mut_ptr().add(4 * v), *a);
        }
    }
}

/// A = (X_b − 1 θ̄ᵀ)ᵀ M and q = the per-feature sums of squared deviations. rows: B slices of D values;
/// mean: θ̄ (D); m: B×kp row-major (columns ≥ K zero); a: D×kp row-major and q (D), overwritten.
///
/// Each task first packs the deviations of its features from every row into a B×32 buffer (one sequential
/// read of each row's piece, prefetched a few rows ahead, so shuffled rows cost no more than contiguous ones),
/// then sweeps the buffer once per 4-feature tile. Packing also checks every value: the result is false if
/// some x is NaN, ±Inf or above `X::MAX_INPUT` in magnitude (then the outputs are meaningless).
#[must_use]
pub(crate) fn cross<X: Real>(
    isa: Isa,
    rows: &[&[X]],
    mean: &[f64],
    m: &[f64],
    kp: usize,
    a: &mut [f64],
    q: &mut [f64],
) -> bool {
    let d = mean.len();
    assert!(m.len() == rows.len() * kp && a.len() == d * kp && q.len() == d && kp.is_multiple_of(4));
    assert!(rows.iter().all(|r| r.len() == d));
    crate::fork::in_pool(|| {
        a.par_chunks_mut(CROSS_TASK_FEATURES * kp)
            .zip(q.par_chunks_mut(CROSS_TASK_FEATURES))
            .enumerate()
            .map_init(Vec::new, |packed, (task, (a, q))| {
                let f0 = task * CROSS_TASK_FEATURES;
                let valid = pack_deviations(rows, mean, f0, q.len(), packed);
                for (t, q4) in q.chunks_mut(4).enumerate() {
                    let a4 = &mut a[4 * t * kp..(4 * t + q4.len()) * kp];
                    cross_tile(isa, packed, 4 * t, m, kp, a4, q4);
                }
                valid
            })
            .reduce(|| true, |x, y| x && y)
    })
}

/// packed[i][l] = x_i[f0 + l] − θ̄[f0 + l] for l < width, 0 for width ≤ l < 32 (B×32 row-major); false if
/// some x_i[f0 + l] is NaN, ±Inf or above `X::MAX_INPUT` in magnitude.
fn pack_deviations<X: Real>(rows: &[&[X]], mean: &[f64], f0: usize, width: usize, packed: &mut Vec<f64>) -> bool {
    const AHEAD: usize = 8;
    packed.clear();
    packed.resize(rows.len() * CROSS_TASK_FEATURES, 0.0);
    let c = &mean[f0..f0 + width];
    let mut bad = false;
    for (i, (out, row)) in packed.chunks_mut(CROSS_TASK_FEATURES).zip(rows).enumerate() {
        if let Some(next) = rows.get(i + AHEAD) {
            prefetch(&next[f0..f0 + width]);
        }
        for ((o, &v), &cv) in out.iter_mut().zip(&row[f0..f0 + width]).zip(c) {
            let v = v.to_f64();
            bad |= super::checks::is_bad_input::<X>(v);
            *o = v - cv;
        }
    }
    !bad
}

/// Hint the cache lines of `piece` into the cache (a no-op off x86-64).
#[inline(always)]
fn prefetch<X>(piece: &[X]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(piece);
        let p = piece.as_ptr().cast::<i8>();
        for offset in (0..bytes).step_by(64) {
            // SAFETY: prefetching is a hint that never faults; offset < the slice's length in bytes.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = piece;
}

/// The 4 features at columns c0..c0 + 4 of the packed deviations: their rows of A (a4, up to 4 rows of kp)
/// and their sums of squares (q4).
fn cross_tile(isa: Isa, packed: &[f64], c0: usize, m: &[f64], kp: usize, a4: &mut [f64], q4: &mut [f64]) {
    let mut squares = [0.0f64; 4];
    for (j0, width) in chunks(kp) {
        let mut tile = [[0.0f64; 4]; CHUNK];
        let args = (packed, c0, m, kp, j0);
        match (isa, width) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only constructed after detecting AVX2 and FMA.
            (Isa::Avx2 | Isa::Avx512, 12) => unsafe { cross_fma::<12>(args, &mut tile, &mut squares) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Isa::Avx2 | Isa::Avx512, 8) => unsafe { cross_fma::<8>(args, &mut tile, &mut squares) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (Isa::Avx2 | Isa::Avx512, _) => unsafe { cross_fma::<4>(args, &mut tile, &mut squares) },
            (_, 12) => cross_with::<PortableMulAdd, 12>(args, &mut tile, &mut squares),
            (_, 8) => cross_with::<PortableMulAdd, 8>(args, &mut tile, &mut squares),
            _ => cross_with::<PortableMulAdd, 4>(args, &mut tile, &mut squares),
        }
        for (l, out) in a4.chunks_mut(kp).enumerate() {
            for (jj, t) in tile[..width].iter().enumerate() {
                out[j0 + jj] = t[l];
            }
        }
    }
    q4.copy_from_slice(&squares[..q4.len()]);
}

/// (packed deviations, first packed column c0, M, kp, first column j0 of the chunk).
type CrossArgs<'a> = (&'a [f64], usize, &'a [f64], usize, usize);

#[inline(always)]
fn cross_with<F: MulAdd, const C: usize>(
    (packed, c0, m, kp, j0): CrossArgs<'_>,
    tile: &mut [[f64; 4]; CHUNK],
    squares: &mut [f64; 4],
) {
    let mut acc = [[0.0f64; 4]; C];
    let mut sq = [0.0f64; 4];
    for (row, mi) in packed.chunks(CROSS_TASK_FEATURES).zip(m.chunks(kp)) {
        let dev = &row[c0..c0 + 4];
        for l in 0..4 {
            sq[l] = F::mul_add(dev[l], dev[l], sq[l]);
        }
        for (acc_j, &mv) in acc.iter_mut().zip(&mi[j0..j0 + C]) {
            for l in 0..4 {
                acc_j[l] = F::mul_add(dev[l], mv, acc_j[l]);
            }
        }
    }
    tile[..C].copy_from_slice(&acc);
    *squares = sq;
}

/// `cross_with` for C columns (a multiple of 4) with AVX2 + FMA: lanes are the 4 features c0..c0 + 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn cross_fma<const C: usize>(
    (packed, c0, m, kp, j0): CrossArgs<'_>,
    tile: &mut [[f64; 4]; CHUNK],
    squares: &mut [f64; 4],
) {
    use std::arch::x86_64::*;
    let b = packed.len() / CROSS_TASK_FEATURES;
    assert!(c0 + 4 <= CROSS_TASK_FEATURES && m.len() >= b * kp && j0 + C <= kp);
    let mut acc = [_mm256_setzero_pd(); C];
    let mut sq = _mm256_setzero_pd();
    for i in 0..b {
        // SAFETY: i < B, c0 + 4 <= 32 and j0 + C <= kp: inside packed (B×32) and m (B×kp), checked above.
        let dev = _mm256_loadu_pd(packed.as_ptr().add(i * CROSS_TASK_FEATURES + c0));
        sq = _mm256_fmadd_pd(dev, dev, sq);
        let mp = m.as_ptr().add(i * kp + j0);
        for (jj, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_pd(dev, _mm256_broadcast_sd(&*mp.add(jj)), *a);
        }
    }
    for (t, a) in tile.iter_mut().zip(&acc) {
        _mm256_storeu_pd(t.as_mut_ptr(), *a);
    }
    _mm256_storeu_pd(squares.as_mut_ptr(), sq);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize, seed: u64) -> Vec<f64> {
        (0..n)
            .map(|i| (((i as u64 + 7) * 2654435761 + seed * 97) % 1000) as f64 / 250.0 - 1.9)
            .collect()
    }

    fn padded_matrix(rows: usize, k: usize, kp: usize, seed: u64) -> Vec<f64> {
        let v = filled(rows * k, seed);
        let mut out = vec![0.0; rows * kp];
        for r in 0..rows {
            out[r * kp..r * kp + k].copy_from_slice(&v[r * k..(r + 1) * k]);
        }
        out
    }

    fn isas() -> Vec<Isa> {
        let mut out = vec![Isa::Portable];
        if Isa::detect() != Isa::Portable {
            out.push(Isa::detect());
        }
        out
    }

    /// Both products against plain triple loops, for every path, K around the chunk widths, B and D not
    /// multiples of the tiles, f32 and f64 rows.
    fn check<X: Real>(b: usize, d: usize, k: usize) {
        let kp = padded(k);
        let data: Vec<X> = filled(b * d, 1).into_iter().map(X::from_f64).collect();
        let rows: Vec<&[X]> = data.chunks(d).collect();
        let mean = filled(d, 2);
        let w = padded_matrix(d, k, kp, 3);
        let m_in = padded_matrix(b, k, kp, 4);
        for isa in isas() {
            let mut m = vec![0.0; b * kp];
            project(isa, &rows, &mean, &w, kp, &mut m);
            let (mut a, mut q) = (vec![0.0; d * kp], vec![0.0; d]);
            assert!(cross(isa, &rows, &mean, &m_in, kp, &mut a, &mut q));
            for i in 0..b {
                for j in 0..kp {
                    let want: f64 = (0..d)
                        .map(|dd| (rows[i][dd].to_f64() - mean[dd]) * w[dd * kp + j])
                        .sum();
                    assert!(
                        (m[i * kp + j] - want).abs() <= 1e-12 * (1.0 + want.abs()),
                        "{isa:?} M {i} {j}"
                    );
                }
            }
            for dd in 0..d {
                let dev: Vec<f64> = (0..b).map(|i| rows[i][dd].to_f64() - mean[dd]).collect();
                let want_q: f64 = dev.iter().map(|v| v * v).sum();
                assert!((q[dd] - want_q).abs() <= 1e-12 * (1.0 + want_q), "{isa:?} q {dd}");
                for j in 0..kp {
                    let want: f64 = (0..b).map(|i| dev[i] * m_in[i * kp + j]).sum();
                    assert!(
                        (a[dd * kp + j] - want).abs() <= 1e-12 * (1.0 + want.abs()),
                        "{isa:?} A {dd} {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn products_match_plain_sums_on_every_path() {
        for (b, d, k) in [
            (1, 5, 1),
            (7, 13, 3),
            (33, 70, 10),
            (9, 41, 12),
            (10, 38, 13),
            (6, 67, 25),
        ] {
            check::<f64>(b, d, k);
            check::<f32>(b, d, k);
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let (b, d, k) = (301, 203, 10);
        let kp = padded(k);
        let data = filled(b * d, 5);
        let rows: Vec<&[f64]> = data.chunks(d).collect();
        let mean = filled(d, 6);
        let w = padded_matrix(d, k, kp, 7);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| {
                let mut m = vec![0.0; b * kp];
                project(Isa::detect(), &rows, &mean, &w, kp, &mut m);
                let (mut a, mut q) = (vec![0.0; d * kp], vec![0.0; d]);
                assert!(cross(Isa::detect(), &rows, &mean, &m, kp, &mut a, &mut q));
                (m, a, q)
            })
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn cross_reports_bad_values_in_any_task() {
        let (b, d, k) = (9, 70, 3);
        let kp = padded(k);
        let mean = vec![0.0; d];
        let m = padded_matrix(b, k, kp, 1);
        for (row, col, v) in [
            (0, 0, f64::NAN),
            (8, 69, f64::INFINITY),
            (4, 33, 2e100),
            (5, 40, -1e101),
        ] {
            let mut data = filled(b * d, 2);
            data[row * d + col] = v;
            let rows: Vec<&[f64]> = data.chunks(d).collect();
            for isa in isas() {
                let (mut a, mut q) = (vec![0.0; d * kp], vec![0.0; d]);
                assert!(!cross(isa, &rows, &mean, &m, kp, &mut a, &mut q), "{row} {col} {v}");
            }
        }
    }
}
