//! The streaming engine: kernels that make one pass over the D-sized state per sample.
//!
//! `em_kernel` is the online-EM pass for K ≤ 16 after warm-up, vectorised across rows and accumulating the
//! E-step sums in the whitened latent space of Ā (see its module documentation).

pub(crate) mod em_kernel;
