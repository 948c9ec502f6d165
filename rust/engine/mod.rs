//! The streaming engine: kernels that make one pass over the D-sized state per sample, the partition of the
//! rows they run on (`partition`), the block path for passes no fused kernel runs (`block`), and the interface
//! every streaming model offers on top of them (`model::StreamingModel`: local sums, then the K×K step).
//!
//! `em_kernel` is the online-EM pass for K ≤ 16 after warm-up, vectorised across rows and accumulating the
//! E-step sums in the whitened latent space of Ā (see its module documentation); `em_wide` is the same pass
//! for K > 16, built on the register-tiled products of `tiled`. `sga_kernel` and `sga_wide` are the same two
//! passes for online SGA (sums f fᵀ/ψ and f d/ψ of the stored F and ψ), chosen once per model by `sga`.

pub(crate) mod block;
pub(crate) mod driver;
pub(crate) mod em_kernel;
pub(crate) mod em_wide;
pub(crate) mod isa;
pub(crate) mod k_dispatch;
pub(crate) mod lane_gather;
pub(crate) mod lane_syrk;
pub(crate) mod lane_times;
pub(crate) mod lane_transpose;
pub(crate) mod model;
pub(crate) mod packed;
pub(crate) mod partition;
pub(crate) mod prefetch;
pub(crate) mod sga;
pub(crate) mod sga_bounds;
pub(crate) mod sga_kernel;
pub(crate) mod sga_wide;
pub(crate) mod tiled;

pub use model::{StepSums, StreamingModel};
pub(crate) use partition::{run_tasks, task_ranges, use_parallel, validate_batch, BLOCK_ROWS, TASK_ROWS};

use crate::scalar::{stored, Real};

/// One row's running moments after a sample, as stored (`T`) and as the f64 value of the stored number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Advanced<T> {
    pub(crate) mean: (T, f64),
    pub(crate) dsq: (T, f64),
    /// d_t = x_t − θ̄_t rounded to T (as f64): the value the next line-12 update uses.
    pub(crate) d: f64,
}

/// Lines 5, 6, 14 of Algorithm 2 for one row, from the innovation e = x_t − θ̄_{t−1}:
/// θ̄_t = θ̄_{t−1} + ρ' e, d_t = x_t − θ̄_t = e − ρ' e, d̄²_t = d̄²_{t−1} + ρ (d_t² − d̄²_{t−1})
/// (ρ' the running mean's step, ρ that of the other averages).
///
/// The pass that sees x_t stores only e (rounded to T) and uses the results in registers; the next pass
/// recomputes them from the stored e with this same function and writes θ̄_t and d̄²_t. Until then the
/// stored θ̄ and d̄² are those before x_t, so a step that fails after its pass leaves them untouched.
#[inline(always)]
pub(crate) fn advance<T: Real>(mean0: f64, dsq0: f64, e: f64, mean_rho: f64, rho: f64) -> Advanced<T> {
    let step = mean_rho * e;
    let mean = stored::<T>(mean0 + step);
    let d = e - step;
    let dsq = stored::<T>(dsq0 + rho * (d * d - dsq0));
    Advanced {
        mean,
        dsq,
        d: stored::<T>(d).1,
    }
}
