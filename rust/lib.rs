//! onlinefa: online factor analysis N(c, F Fᵀ + Ψ) of very high-dimensional streams.
//!
//! The Rust core is pure ndarray/nalgebra/rayon; the Python binding lives in `python/` behind the
//! `python` feature. Thesis notation: D features, K factors, F (D×K) loadings, ψ (D) noise variances,
//! c = θ̄ the mean. Equation numbers refer to Brownlie (2021), "Extending the Bayesian Deep Learning
//! Method MultiSWAG".

mod config_checks;
mod engine;
pub mod error;
pub mod fork;
pub mod gfa;
pub mod init;
mod lane_math;
#[cfg(test)]
mod layering;
pub mod linalg;
mod m_step;
pub mod minibatch;
pub mod noise;
pub mod online_em;
pub mod online_sga;
pub mod query;
pub mod scalar;
pub mod scaling;
pub mod schedule;
pub mod shrinkage;
pub mod state;
pub mod state_checks;
#[cfg(test)]
mod trait_parts_tests;
pub mod vbfa;
pub mod vifa;

#[cfg(feature = "python")]
mod python;

pub use engine::{StepSums, StreamingModel};
pub use error::{FaError, Result};
pub use online_em::{EmConfig, OnlineEm};
pub use online_sga::{OnlineSga, SgaConfig, SgaRule};
pub use scalar::Real;
pub use scaling::Scaling;
pub use schedule::StepSize;

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        assert_send_sync::<crate::OnlineEm<f32>>();
        assert_send_sync::<crate::OnlineEm<f64>>();
        assert_send_sync::<crate::OnlineSga<f32>>();
        assert_send_sync::<crate::OnlineSga<f64>>();
        assert_send_sync::<crate::FaError>();
    }
}
