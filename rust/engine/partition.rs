//! The one partition policy of the engine: rows of the D-sized state are processed in tasks of
//! [`TASK_ROWS`] rows (run on rayon when the state is large, see [`use_parallel`]) and, inside a task, in
//! blocks of [`BLOCK_ROWS`] rows that stay in L1/L2. The partition does not depend on the number of threads
//! and the per-task partial sums are added in task order, so results are bit-identical for any thread count.
//! Also here: input validation, done before any row is touched.

use std::ops::Range;

use ndarray::{s, ArrayView1, ArrayView2, Axis};
use rayon::prelude::*;

use super::model::StepSums;
use crate::error::{FaError, Result};
use crate::scalar::Real;

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

/// Whether a state of `d` rows × `k` columns is worth splitting across threads (and threads are usable:
/// never in a forked child that inherited a used pool, see `crate::fork`). Small states never touch the
/// pool, so they do not start it.
pub(crate) fn use_parallel(d: usize, k: usize) -> bool {
    d.saturating_mul(k.max(1)) >= PARALLEL_MIN_ELEMENTS && crate::fork::parallel_allowed()
}

/// The fixed ranges of at most `task_rows` rows covering 0..`n_rows`, in order (whatever the thread count).
pub(crate) fn task_ranges(n_rows: usize, task_rows: usize) -> Vec<Range<usize>> {
    (0..n_rows)
        .step_by(task_rows)
        .map(|lo| lo..(lo + task_rows).min(n_rows))
        .collect()
}

/// `kernel` on every task, on rayon when `parallel` (and there is more than one task), with the results in task
/// order: a caller that combines them in that order gets the same bits on any number of threads.
pub(crate) fn run_tasks<W: Send, R: Send>(tasks: Vec<W>, parallel: bool, kernel: impl Fn(W) -> R + Sync) -> Vec<R> {
    if parallel && tasks.len() > 1 {
        tasks.into_par_iter().map(&kernel).collect()
    } else {
        tasks.into_iter().map(&kernel).collect()
    }
}

/// Scratch of one `update` call: a partial sum per task (allocated once per call, not per sample, and reused by
/// every row of the batch). The block buffers are not here: each worker of a pass makes its own (one per
/// rayon job, one on the calling thread), so a call does not allocate — and the kernel zero — a block per
/// task (at D = 10⁷ that was 1,221 blocks, 80 MB at K = 10, on every call).
pub(crate) struct Scratch {
    partials: Vec<StepSums>,
}

impl Scratch {
    /// Partial sums for a state of `n_rows` rows and K = `k`.
    pub(crate) fn new(n_rows: usize, k: usize) -> Self {
        let n_tasks = n_rows.div_ceil(TASK_ROWS).max(1);
        Scratch {
            partials: (0..n_tasks).map(|_| StepSums::zeros(k)).collect(),
        }
    }
}

/// The buffers one worker of a pass reuses from task to task: a block and the block's sample as f64. A task
/// already reuses them from one block of rows to the next (the kernels write what they read of them first),
/// so carrying them on to the next task changes no result (tested: results do not depend on the thread
/// count).
struct WorkerBuffers {
    block: Block,
    sample: Vec<f64>,
}

impl WorkerBuffers {
    fn new(k: usize) -> Self {
        WorkerBuffers {
            block: Block::new(k),
            sample: vec![0.0; BLOCK_ROWS],
        }
    }
}

/// A streaming model's D-sized state, as the engine passes over it: per row, K values of a matrix (Ā for online
/// EM, F for online SGA; row-major) and three scalars: the running mean θ̄, a variance (d̄² for online EM, ψ
/// for online SGA) and the last deviation. All four cover the same rows.
pub(crate) struct StateRows<'a, T> {
    pub(crate) matrix: &'a mut [T],
    pub(crate) mean: &'a mut [T],
    pub(crate) var: &'a mut [T],
    pub(crate) d_last: &'a mut [T],
}

impl<T> StateRows<'_, T> {
    /// Rows `lo..lo + n` (matrix K wide), reborrowed.
    fn rows(&mut self, lo: usize, n: usize, k: usize) -> StateRows<'_, T> {
        StateRows {
            matrix: &mut self.matrix[lo * k..(lo + n) * k],
            mean: &mut self.mean[lo..lo + n],
            var: &mut self.var[lo..lo + n],
            d_last: &mut self.d_last[lo..lo + n],
        }
    }
}

/// One pass over `state` (K = `k`) for sample `x`: `block(first_row, rows, x_rows, scratch, partial)` runs on
/// consecutive blocks of at most [`BLOCK_ROWS`] rows, with `x_rows` the block's entries of x as f64 and
/// `partial` the sums of its task (zeroed at the task's start). Tasks of [`TASK_ROWS`] rows run on rayon when
/// [`use_parallel`] says so; their partial sums are added in task order into `total`, so the result does not
/// depend on the number of threads.
pub(crate) fn stream_pass<T, X, F>(
    state: StateRows<'_, T>,
    k: usize,
    x: &ArrayView1<X>,
    scratch: &mut Scratch,
    total: &mut StepSums,
    block: F,
) where
    T: Real,
    X: Real,
    F: Fn(usize, StateRows<'_, T>, &[f64], &mut Block, &mut StepSums) + Sync + Send,
{
    let n_rows = state.mean.len();
    let tasks = state
        .matrix
        .chunks_mut(TASK_ROWS * k)
        .zip(state.mean.chunks_mut(TASK_ROWS))
        .zip(state.var.chunks_mut(TASK_ROWS))
        .zip(state.d_last.chunks_mut(TASK_ROWS))
        .map(|(((matrix, mean), var), d_last)| StateRows {
            matrix,
            mean,
            var,
            d_last,
        });
    let work = tasks.enumerate().zip(scratch.partials.iter_mut());
    let run = |buf: &mut WorkerBuffers, ((task, mut rows), sums): ((usize, StateRows<'_, T>), &mut StepSums)| {
        sums.s.fill(0.0);
        sums.u.fill(0.0);
        sums.dsq_sum = 0.0;
        let (lo, n) = (task * TASK_ROWS, rows.mean.len());
        for b0 in (0..n).step_by(BLOCK_ROWS) {
            let nb = (n - b0).min(BLOCK_ROWS);
            let x_rows = block_as_f64(x, lo + b0, nb, &mut buf.sample);
            block(lo + b0, rows.rows(b0, nb, k), x_rows, &mut buf.block, sums);
        }
    };
    if use_parallel(n_rows, k) {
        work.collect::<Vec<_>>()
            .into_par_iter()
            .for_each_init(|| WorkerBuffers::new(k), run);
    } else {
        let mut buf = WorkerBuffers::new(k);
        work.for_each(|item| run(&mut buf, item));
    }
    total.s.fill(0.0);
    total.u.fill(0.0);
    total.dsq_sum = 0.0;
    for part in &scratch.partials {
        total.s += &part.s;
        total.u += &part.u;
        total.dsq_sum += part.dsq_sum;
    }
}

/// Entries `lo..lo + n` of the sample as f64: the sample itself when it is contiguous f64, else converted into
/// `buf` (a contiguous loop when the sample is contiguous, so it vectorises).
fn block_as_f64<'a, X: Real>(x: &'a ArrayView1<X>, lo: usize, n: usize, buf: &'a mut [f64]) -> &'a [f64] {
    match x.as_slice() {
        Some(all) => {
            let part = &all[lo..lo + n];
            if let Some(same) = X::as_f64_slice(part) {
                return same;
            }
            for (dst, xi) in buf.iter_mut().zip(part) {
                *dst = xi.to_f64();
            }
        }
        None => {
            for (dst, xi) in buf.iter_mut().zip(x.slice(s![lo..lo + n]).iter()) {
                *dst = xi.to_f64();
            }
        }
    }
    &buf[..n]
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

/// Values checked per step of [`row_has_bad`]: each chunk is one branch-free (vectorised) loop.
const CHECK_CHUNK: usize = 512;

/// Whether a row holds a NaN, an infinity or a value with |x| > T::MAX_INPUT (`parallel`: split it on rayon).
fn row_has_bad<T: Real, X: Real>(row: ArrayView1<X>, parallel: bool) -> bool {
    let chunk_bad = |chunk: &[X]| {
        chunk
            .iter()
            .fold(false, |bad, v| bad | !(v.to_f64().abs() <= T::MAX_INPUT))
    };
    match row.as_slice() {
        Some(values) if parallel => values
            .par_chunks(CHECK_CHUNK * 64)
            .any(|c| c.chunks(CHECK_CHUNK).any(chunk_bad)),
        Some(values) => values.chunks(CHECK_CHUNK).any(chunk_bad),
        None => row.iter().any(|v| !(v.to_f64().abs() <= T::MAX_INPUT)),
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
    let parallel = x.len() >= PARALLEL_MIN_ELEMENTS && crate::fork::parallel_allowed();
    let first_bad = if parallel && x.nrows() < 2 * rayon::current_num_threads() {
        // Few long rows: split each row instead.
        x.axis_iter(Axis(0)).position(|row| row_has_bad::<T, X>(row, true))
    } else if parallel {
        x.axis_iter(Axis(0))
            .into_par_iter()
            .position_first(|row| row_has_bad::<T, X>(row, false))
    } else {
        x.axis_iter(Axis(0)).position(|row| row_has_bad::<T, X>(row, false))
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
