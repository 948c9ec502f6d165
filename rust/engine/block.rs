//! The block path: per-block helpers over row-major f64 buffers (rows of Ā or F, K wide) for the passes that no
//! fused kernel runs (online EM during warm-up, where F = F₀ σ; VIFA's passes) and for the explicit-F reference
//! the kernels are tested against. Products go through matrixmultiply's GEMM (its SIMD kernel is picked for
//! this CPU at run time), except [`block_times`]: a fully unrolled const-K loop where the online-EM row kernel
//! runs (f64 state: K ≤ 17, or K ≤ 24 on AVX-512), and otherwise the wide kernels' tiled product on the engine's
//! code path, so that the block path rounds as the pass that runs.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array1, Array2, ArrayView2, Axis};

use super::em_kernel::row_kernel_max;
use super::isa::Isa;
use super::k_dispatch::for_k;
use super::model::StepSums;
use super::partition::Block;
use super::tiled::{rows_times, Tiled, TILE_ROWS};
use crate::scalar::Real;

/// Copy stored rows (row-major, K wide) into `dst` as f64 (`dst.len() >= src.len()`).
#[inline]
pub(crate) fn load_rows<T: Real>(src: &[T], dst: &mut [f64]) {
    for (d, s) in dst.iter_mut().zip(src.iter()) {
        *d = s.to_f64();
    }
}

/// View the first `nb` rows of a row-major K-wide buffer as an nb×K matrix.
#[inline]
pub(crate) fn rows_view(buf: &[f64], nb: usize, k: usize) -> ArrayView2<'_, f64> {
    ArrayView2::from_shape((nb, k), &buf[..nb * k]).expect("buffer holds nb rows of K")
}

/// out[r] = a[r] · M for each of `nb` rows (row-major, K wide); M is K×K row-major:
/// out[r][j] = Σ_i a[r][i] M[i][j], i ascending.
#[inline(always)]
fn rows_times_k<const K: usize>(a: &[f64], m: &[f64], out: &mut [f64], nb: usize) {
    let m = &m[..K * K];
    for (a_row, out_row) in a[..nb * K].chunks_exact(K).zip(out[..nb * K].chunks_exact_mut(K)) {
        let mut acc = [0.0f64; K];
        for i in 0..K {
            let ai = a_row[i];
            let m_row = &m[i * K..(i + 1) * K];
            for j in 0..K {
                acc[j] += ai * m_row[j];
            }
        }
        out_row.copy_from_slice(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_times_avx2<const K: usize>(a: &[f64], m: &[f64], out: &mut [f64], nb: usize) {
    rows_times_k::<K>(a, m, out, nb)
}

/// `rows_times_k` on the best code path of this CPU (the same operations in the same order on both).
fn rows_times_dispatch<const K: usize>(a: &[f64], m: &[f64], out: &mut [f64], nb: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { rows_times_avx2::<K>(a, m, out, nb) };
        }
    }
    rows_times_k::<K>(a, m, out, nb)
}

/// out = a · M for `nb` rows (shapes as [`rows_times_k`]).
type RowsTimes = fn(&[f64], &[f64], &mut [f64], usize);

/// The unrolled product for K = `k` where the f64 online-EM row kernel runs on this CPU's code path (it rounds
/// the whitening product as this loop does), or None where the wide pass runs (K > `row_kernel_max`).
fn rows_times_for(k: usize) -> Option<RowsTimes> {
    if k > row_kernel_max::<f64>(Isa::detect()) {
        return None;
    }
    for_k!(extended k, K => Some(rows_times_dispatch::<K> as RowsTimes), _ => None)
}

/// out[..nb] = a[..nb] · m for a K×K matrix m (a, out: nb×K row-major).
pub(crate) fn block_times(a: &[f64], m: ArrayView2<f64>, out: &mut [f64], nb: usize) {
    let k = m.nrows();
    if let (Some(product), Some(m_flat)) = (rows_times_for(k), m.as_slice()) {
        product(a, m_flat, out, nb);
        return;
    }
    tiled_block_times(a, m, out, nb);
}

/// [`block_times`] where the wide pass runs through the wide kernels' tiled product on this CPU's code path, so that the block
/// path and the queries round a row's product exactly as the wide pass does (on every code path, the portable
/// one included). Copies the rows into and out of the product's padded layout (nbp×kp, nbp a multiple of
/// `TILE_ROWS`).
fn tiled_block_times(a: &[f64], m: ArrayView2<f64>, out: &mut [f64], nb: usize) {
    let k = m.nrows();
    let tiled = Tiled::new(k, &m.iter().copied().collect::<Vec<f64>>());
    let (kp, nbp) = (tiled.kp, nb.div_ceil(TILE_ROWS) * TILE_ROWS);
    let mut padded = vec![0.0; nbp * kp];
    for (dst, src) in padded.chunks_exact_mut(kp).zip(a[..nb * k].chunks_exact(k)) {
        dst[..k].copy_from_slice(src);
    }
    let mut product = vec![0.0; nbp * kp];
    rows_times(Isa::detect(), &padded, &tiled, &mut product, nbp);
    for (dst, src) in out[..nb * k].chunks_exact_mut(k).zip(product.chunks_exact(kp)) {
        dst.copy_from_slice(&src[..k]);
    }
}

/// Add this block's contribution to S = Σ f fᵀ/ψ and u = Σ f d/ψ (the E-step sums of (4.23)) from blk.f (nb×K),
/// blk.psi and blk.d (nb). Overwrites `blk.tmp` with y = f/ψ.
pub(crate) fn accumulate_estep(blk: &mut Block, nb: usize, sums: &mut StepSums) {
    let k = blk.k;
    let u = sums.u.as_slice_mut().expect("u is contiguous");
    let rows = blk.f[..nb * k]
        .chunks_exact(k)
        .zip(blk.tmp[..nb * k].chunks_exact_mut(k));
    for ((f_row, y_row), (&psi, &d)) in rows.zip(blk.psi.iter().zip(blk.d.iter())) {
        let inv_psi = 1.0 / psi;
        for ((y, &f), u_j) in y_row.iter_mut().zip(f_row.iter()).zip(u.iter_mut()) {
            *y = f * inv_psi;
            *u_j += *y * d;
        }
    }
    let y = rows_view(&blk.tmp, nb, k);
    let f = rows_view(&blk.f, nb, k);
    general_mat_mul(1.0, &y.t(), &f, 1.0, &mut sums.s);
}

/// Line 12 of Algorithm 2 on a block: a ← a + ρ (d mᵀ − a) (a nb×K, d nb, m K).
pub(crate) fn rank_one_update(a: &mut [f64], d: &[f64], m: &[f64], rho: f64, nb: usize) {
    let k = m.len();
    for (a_row, &di) in a[..nb * k].chunks_exact_mut(k).zip(d.iter()) {
        for (a, &m_j) in a_row.iter_mut().zip(m.iter()) {
            *a += rho * (di * m_j - *a);
        }
    }
}

/// Row-wise dot products: out[i] = Σ_j x[i,j] y[i,j] for nb rows of width k (j ascending).
#[inline]
pub(crate) fn row_dots(x: &[f64], y: &[f64], k: usize, nb: usize, out: &mut [f64]) {
    for ((o, xr), yr) in out[..nb].iter_mut().zip(x.chunks_exact(k)).zip(y.chunks_exact(k)) {
        *o = xr.iter().zip(yr.iter()).fold(0.0, |acc, (a, b)| acc + a * b);
    }
}

/// Outer product v vᵀ.
pub(crate) fn outer(v: &Array1<f64>) -> Array2<f64> {
    let col = v.view().insert_axis(Axis(1));
    let row = v.view().insert_axis(Axis(0));
    col.dot(&row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrolled_product_equals_ndarray_product() {
        for k in [1usize, 3, 10, 16, 17] {
            let nb = 37;
            let a = Array2::from_shape_fn((nb, k), |(i, j)| ((i * 7 + j * 3) % 11) as f64 - 5.0);
            let m = Array2::from_shape_fn((k, k), |(i, j)| ((i + 2 * j) % 5) as f64 * 0.5 - 1.0);
            let mut out = vec![0.0; nb * k];
            block_times(a.as_slice().expect("c"), m.view(), &mut out, nb);
            assert_eq!(out, a.dot(&m).iter().copied().collect::<Vec<_>>(), "K = {k}");
        }
    }
}
