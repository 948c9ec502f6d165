//! The Python binding (`onlinefa._core`), one file per model family. Each method borrows the NumPy input,
//! releases the GIL, calls the pure-Rust core and converts the result back. All the documentation users read
//! lives in the Python wrappers (python/onlinefa/); these classes are their engines.

mod any_float;
#[macro_use]
mod common;
#[macro_use]
mod kk_step;
mod em_step;
mod exports;
mod gaussian;
mod gfa;
mod minibatch;
mod sga_step;
mod sharded;
mod state_arrays;
mod streaming;
mod update_pool;
mod vbfa;
mod vifa;
mod vifa_step;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::common::NumericalBreakdownError;
    #[pymodule_export]
    use super::em_step::OnlineEMStep;
    #[pymodule_export]
    use super::exports::storage_snapshot;
    #[pymodule_export]
    use super::gaussian::{
        effective_samples, gaussian_latent_mean, gaussian_log_prob, gaussian_precision_cholesky, spiked_transform,
    };
    #[pymodule_export]
    use super::gfa::{GFACore, OnlineGFACore};
    #[pymodule_export]
    use super::minibatch::{column_moments, MiniBatchEMCore};
    #[pymodule_export]
    use super::sga_step::OnlineSGAStep;
    #[pymodule_export]
    use super::sharded::{
        fill_sample_noise, latent_mean_from_sums, log_prob_from_sums, snapshot_max_elements, standard_normal_rows,
    };
    #[pymodule_export]
    use super::state_arrays::StateArray;
    #[pymodule_export]
    use super::streaming::{orthonormal_init, OnlineEMCore, OnlineSGACore};
    #[pymodule_export]
    use super::update_pool::limit_update_threads;
    #[pymodule_export]
    use super::vbfa::{vbfa_log_likelihood, OnlineVBFACore, VBFACore};
    #[pymodule_export]
    use super::vifa::VIFACore;
    #[pymodule_export]
    use super::vifa_step::VIFAStep;
}
