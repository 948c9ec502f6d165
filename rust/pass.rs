//! Plumbing shared by the one-pass kernels: fixed row partition, deterministic reduction of the K×K and
//! K sums, block scratch buffers, and input validation.
//!
//! Rows of the D×K state are processed in tasks of [`TASK_ROWS`] rows (run on rayon when the state is
//! large) and, inside a task, in blocks of [`BLOCK_ROWS`] rows that are small enough to stay in L1/L2 and
//! large enough for the per-block K×K GEMMs to vectorise. The partition does not depend on the number of
//! threads and the partial sums are added in task order, so results are bit-identical for any thread count.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};
use rayon::prelude::*;

use crate::error::{FaError, Result};
use crate::scalar::Real;
use crate::small_k::{try_estep_sums, try_rank_one, try_row_dots, try_rows_times};

/// Rows per rayon task.
pub(crate) const TASK_ROWS: usize = 8192;
/// Rows per GEMM block inside a task.
pub(crate) const BLOCK_ROWS: usize = 256;
/// Up to this many state elements (D·K) an update call keeps a copy of the state and restores it if a
/// numerical breakdown interrupts the batch, so a failed call never leaves a half-applied state. Larger
/// models skip the copy (it would double the memory traffic of an update); for them a breakdown — which
/// needs inputs many orders of magnitude outside the data seen so far — is reported with the rows before
/// the failing one applied (online EM leaves no part of the failing row applied: see `OnlineEm::step`).
/// Shape, NaN/Inf and magnitude errors are caught before any row, at every size.
pub(crate) const SNAPSHOT_MAX_ELEMENTS: usize = 1 << 18;
/// Below this many state elements (D·K) a pass runs on the calling thread only.
pub(crate) const PARALLEL_MIN_ELEMENTS: usize = 1 << 17;

/// The cross-row quantities of one E-step: S = Σ_d f_d f_dᵀ/ψ_d (= C F, K×K) and u = Σ_d f_d d_d/ψ_d (= C d, K),
/// plus `dsq` = Σ_d d̄²_d, the sum of the running squared deviations after the pass (the data's scale σ̂² = dsq/D).
pub(crate) struct Sums {
    pub(crate) s: Array2<f64>,
    pub(crate) u: Array1<f64>,
    pub(crate) dsq: f64,
}

impl Sums {
    pub(crate) fn zeros(k: usize) -> Self {
        Sums {
            s: Array2::zeros((k, k)),
            u: Array1::zeros(k),
            dsq: 0.0,
        }
    }
}

/// Whether a state of `d` rows × `k` columns is worth splitting across threads (and threads are usable:
/// never in a forked child that inherited a used pool, see `crate::fork`). Small states never touch the
/// pool, so they do not start it.
pub(crate) fn use_parallel(d: usize, k: usize) -> bool {
    d.saturating_mul(k.max(1)) >= PARALLEL_MIN_ELEMENTS && crate::fork::parallel_allowed()
}

/// Scratch buffers of one `update` call: a block and a partial sum per task, allocated once per call
/// (not per sample) and reused by every row of the batch.
pub(crate) struct Scratch {
    blocks: Vec<Block>,
    partials: Vec<Sums>,
}

impl Scratch {
    /// Buffers for a state of `n_rows` rows and K = `k`.
    pub(crate) fn new(n_rows: usize, k: usize) -> Self {
        let n_tasks = n_rows.div_ceil(TASK_ROWS).max(1);
        Scratch {
            blocks: (0..n_tasks).map(|_| Block::new(k)).collect(),
            partials: (0..n_tasks).map(|_| Sums::zeros(k)).collect(),
        }
    }
}

/// Run `kernel` on every task (with that task's block and zeroed partial sums) and add the partial sums
/// in task order into `total`.
pub(crate) fn reduce_tasks<W, F>(tasks: Vec<W>, scratch: &mut Scratch, parallel: bool, total: &mut Sums, kernel: F)
where
    W: Send,
    F: Fn(W, &mut Block, &mut Sums) + Sync + Send,
{
    let work = tasks
        .into_iter()
        .zip(scratch.blocks.iter_mut().zip(scratch.partials.iter_mut()));
    let run = |(task, (blk, sums)): (W, (&mut Block, &mut Sums))| {
        sums.s.fill(0.0);
        sums.u.fill(0.0);
        sums.dsq = 0.0;
        kernel(task, blk, sums);
    };
    if parallel {
        work.collect::<Vec<_>>().into_par_iter().for_each(run);
    } else {
        work.for_each(run);
    }
    total.s.fill(0.0);
    total.u.fill(0.0);
    total.dsq = 0.0;
    for part in &scratch.partials {
        total.s += &part.s;
        total.u += &part.u;
        total.dsq += part.dsq;
    }
}

/// Per-task scratch: one block of rows in f64, each matrix row-major BLOCK_ROWS×K.
pub(crate) struct Block {
    /// Block of the stored matrix (Ā for EM, F for SGA).
    pub(crate) a: Vec<f64>,
    /// Loadings rows used by the E-step.
    pub(crate) f: Vec<f64>,
    /// Temporary product.
    pub(crate) tmp: Vec<f64>,
    /// ψ of each row.
    pub(crate) psi: Vec<f64>,
    /// Centred sample d of each row.
    pub(crate) d: Vec<f64>,
    /// The previous sample's d of each row (for the pending update).
    pub(crate) d_prev: Vec<f64>,
    /// K.
    pub(crate) k: usize,
}

impl Block {
    pub(crate) fn new(k: usize) -> Self {
        Block {
            a: vec![0.0; BLOCK_ROWS * k],
            f: vec![0.0; BLOCK_ROWS * k],
            tmp: vec![0.0; BLOCK_ROWS * k],
            psi: vec![0.0; BLOCK_ROWS],
            d: vec![0.0; BLOCK_ROWS],
            d_prev: vec![0.0; BLOCK_ROWS],
            k,
        }
    }
}

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

/// out[..nb] = a[..nb] · m for a K×K matrix m (one small GEMM per block; matrixmultiply picks the
/// SIMD kernel for this CPU at run time).
pub(crate) fn block_times(a: &[f64], m: ArrayView2<f64>, out: &mut [f64], nb: usize) {
    let k = m.nrows();
    if let Some(m_flat) = m.as_slice() {
        if try_rows_times(k, a, m_flat, out, nb) {
            return;
        }
    }
    let a_blk = rows_view(a, nb, k);
    let mut out_blk = ArrayViewMut2::from_shape((nb, k), &mut out[..nb * k]).expect("buffer holds nb rows of K");
    general_mat_mul(1.0, &a_blk, &m, 0.0, &mut out_blk);
}

/// Add this block's contribution to S = Σ f fᵀ/ψ and u = Σ f d/ψ  (the E-step sums of (4.23)).
/// Overwrites `blk.tmp` with y = f/ψ.
pub(crate) fn accumulate_estep(blk: &mut Block, nb: usize, sums: &mut Sums) {
    let k = blk.k;
    if let (Some(u), Some(s)) = (sums.u.as_slice_mut(), sums.s.as_slice_mut()) {
        if try_estep_sums(k, &blk.f, &blk.psi, &blk.d, &mut blk.tmp, u, s, nb) {
            return;
        }
    }
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
    if try_rank_one(k, a, d, m, rho, nb) {
        return;
    }
    for (a_row, &di) in a[..nb * k].chunks_exact_mut(k).zip(d.iter()) {
        for (a, &m_j) in a_row.iter_mut().zip(m.iter()) {
            *a += rho * (di * m_j - *a);
        }
    }
}

/// Row-wise dot products: out[i] = Σ_j x[i,j] y[i,j] for nb rows of width k.
#[inline]
pub(crate) fn row_dots(x: &[f64], y: &[f64], k: usize, nb: usize, out: &mut [f64]) {
    if try_row_dots(k, x, y, out, nb) {
        return;
    }
    for ((o, xr), yr) in out[..nb].iter_mut().zip(x.chunks_exact(k)).zip(y.chunks_exact(k)) {
        *o = xr.iter().zip(yr.iter()).map(|(a, b)| a * b).sum();
    }
}

/// Check a batch before any row is applied: shape (n, D), every value finite and |x| ≤ T::MAX_INPUT.
pub(crate) fn validate_batch<T: Real, X: Real>(x: &ArrayView2<X>, n_features: usize) -> Result<()> {
    if x.ncols() != n_features {
        return Err(FaError::Shape {
            what: "X",
            expected: format!("(n_samples, {n_features}) or ({n_features},)"),
            got: x.shape().to_vec(),
        });
    }
    let bad = |row: ArrayView1<X>| row.iter().any(|v| !(v.to_f64().abs() <= T::MAX_INPUT));
    let first_bad = if x.len() >= PARALLEL_MIN_ELEMENTS && crate::fork::parallel_allowed() {
        x.axis_iter(Axis(0)).into_par_iter().position_first(bad)
    } else {
        x.axis_iter(Axis(0)).position(bad)
    };
    match first_bad {
        None => Ok(()),
        Some(row) => {
            let has_non_finite = x.row(row).iter().any(|v| !v.to_f64().is_finite());
            let kind = if has_non_finite {
                "NaN or infinity".to_string()
            } else {
                format!(
                    "a value with |x| > {:e} (the largest accepted with {} state)",
                    T::MAX_INPUT,
                    T::NAME
                )
            };
            Err(FaError::BadValue { row, kind })
        }
    }
}

/// Outer product v vᵀ.
pub(crate) fn outer(v: &Array1<f64>) -> Array2<f64> {
    let col = v.view().insert_axis(Axis(1));
    let row = v.view().insert_axis(Axis(0));
    col.dot(&row)
}
