//! Variational inference with a factor-analysis posterior (VIFA, thesis §4.3 and Algorithm 3).
//!
//! q(θ) = N(c, F Fᵀ + Ψ) with c (`mean`, D), F (`loadings`, D×K) and ψ = exp β (`log_noise` holds β, D).
//! The objective is the negative ELBO (4.37),
//!
//! ```text
//!   L(c, F, β) = E_q[log q(θ)] − E_q[log p(θ)] + E_q[NLL(θ)],   p(θ) = N(0, α⁻¹ I),
//! ```
//!
//! where NLL is the negative log-likelihood of the **whole** data set. Its gradient has a closed-form part
//! (entropy 4.42–4.45 in the Woodbury form 4.54–4.56, prior 4.47–4.49) and a reparameterised part
//! (4.50–4.53): with θ = F h + c + ψ^{1/2} ⊙ z and g = ∇θ NLL(θ), the likelihood contributes g, g hᵀ and
//! ½ g ⊙ ψ^{1/2} ⊙ z (4.51, 4.52, 4.61) to the gradients w.r.t. c, F and β.
//!
//! Protocol: [`Vifa::sample`] draws θ (4.50) and remembers the draw; after L = `n_grad_samples` draws,
//! [`Vifa::step`] takes the L gradients (an L×D matrix, row l the gradient at draw l), averages the L
//! reparameterised estimates and applies one SGD or Adam step to c, F and β (Algorithm 3, lines 9–20).
//! The caller's gradient must estimate ∇θ of the full-data NLL without bias (mini-batch mean × N; the
//! thesis's line 8 writes a plain mini-batch mean, which would weight the likelihood by 1/N); the prior
//! and entropy terms are not scaled.
//!
//! Noise is counter-based: draw j's h and z come from ChaCha8 stream j of a key derived from the seed, and
//! the z entries of row block b start at word (b + 1)·2³² of that stream. z can therefore be regenerated
//! for any block, in parallel, by the step: the state holds (seed, number of draws) instead of L·D noise
//! values, and results do not depend on the number of threads.
//!
//! One step is one pass over the D×K state (two with gradient clipping): the only cross-row quantity,
//! the K×K matrix B = Fᵀ Ψ⁻¹ F (line 11), is accumulated from the rows the pass has just written, ready
//! for the next step. Nothing D×D is ever formed.
//!
//! Layout, each file using only those before it (the layering test checks that no two files import each
//! other in a cycle): `config` (hyper-parameters, optimiser, learning rates), `params` (c, F, β and Adam's
//! moments), `products` (the K×K products of the gradients), `lanes` (the per-row arithmetic across W rows),
//! `gradient` (the blocked gradient kernels), `update` (the SGD and Adam rules and clipping), `kk_step` (the K×K
//! part, written once for every row store: counters, (I + B)⁻¹, each step's rule, their state keys), `fused`
//! (the vectorised code paths for K ≤ 16), `fused_tasks` (a task's pass through them), `draws` (sampling),
//! `step` (the step split into local gradient norms, local step and finish for models sharded across
//! processes), `checkpoint` (the saved state). The draws' noise keys live here; tasks run on the engine's partition.

mod checkpoint;
mod config;
mod draws;
mod fused;
mod fused_tasks;
mod gradient;
#[cfg(test)]
mod kernel_tests;
mod kk_step;
mod lanes;
mod params;
mod products;
mod rows;
mod step;
#[cfg(test)]
mod tests;
mod update;

use ndarray::{Array1, Array2};

use crate::engine::{BLOCK_ROWS, TASK_ROWS};
use crate::error::{invalid, Result};
use crate::noise;
use crate::scalar::Real;

pub(crate) use config::validate_vifa_dims;
pub use config::{LearningRates, Optimizer, VifaConfig, VifaInit, ADAM_BETA1, ADAM_BETA2, ADAM_EPS};
use fused::Kernel;
pub use kk_step::VifaKkStep;
use params::{checked_vector, sqrt_noise, Moments, Params};

// The engine's partition (`crate::engine::partition`): tasks of TASK_ROWS rows, on rayon past its size gate, in blocks
// of BLOCK_ROWS rows.
const _: () = assert!(
    TASK_ROWS.is_multiple_of(BLOCK_ROWS),
    "row blocks must align with task boundaries"
);

/// VIFA with the D-sized state stored in `T` (f32 or f64); all K×K algebra and all sums are f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Vifa<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    /// The K×K part: hyper-parameters, counters, the draws' key, (I + B)⁻¹, the row offset.
    pub(crate) kk_step: VifaKkStep,
    pub(crate) params: Params<T>,
    pub(crate) moments: Option<Moments<T>>,
    /// ψ^{1/2} = exp(β/2) of the stored β (D): derived from `params.beta` (never saved), kept so that a
    /// sample and a step need one exp per row between them instead of three.
    pub(crate) sqrt_psi: Vec<f64>,
    /// The kernels of the passes (fused for K ≤ 16; chosen once, never saved).
    pub(crate) kernel: Kernel,
}

/// The hint carried by the error of a diverged model.
const DIVERGED: &str =
    "I + Fᵀ Ψ⁻¹ F (the VIFA parameters are no longer finite: lower the learning rates or set clip_grad_norm)";

impl<T: Real> Vifa<T> {
    /// New model at `init` (F₀, c₀ = 0 and ψ₀ = 1 unless given); `seed` keys the training draws.
    pub fn new(
        n_features: usize,
        n_components: usize,
        init: VifaInit<'_>,
        seed: u64,
        config: VifaConfig,
    ) -> Result<Self> {
        validate_vifa_dims(n_features, n_components)?;
        config.validate()?;
        let (d, k) = (n_features, n_components);
        let f = crate::config_checks::checked_init::<T>(init.loadings, d, k)?;
        let c = match init.mean {
            Some(m) => checked_vector::<T>(m, d, "init_mean", false)?,
            None => vec![T::default(); d],
        };
        let beta = match init.noise_variance {
            Some(psi) => {
                checked_vector::<f64>(psi, d, "init_noise_variance", true)?;
                let beta: Vec<T> = psi.iter().map(|p| T::from_f64(p.ln())).collect();
                if beta
                    .iter()
                    .any(|b| !b.to_f64().exp().is_finite() || b.to_f64().exp() <= 0.0)
                {
                    return Err(invalid(
                        "init_noise_variance",
                        "must be representable in the state dtype",
                    ));
                }
                beta
            }
            None => vec![T::default(); d],
        };
        let moments = match config.optimizer {
            Optimizer::Sgd => None,
            Optimizer::Adam => Some(Moments {
                first: Params::zeros(d, k),
                second: Params::zeros(d, k),
            }),
        };
        let mut model = Vifa {
            n_features: d,
            n_components: k,
            kk_step: VifaKkStep::new(k, config, seed)?,
            sqrt_psi: sqrt_noise(&beta),
            kernel: Kernel::choose(k),
            params: Params { c, f, beta },
            moments,
        };
        model.kk_step.m_inv = Some(model.recompute_m_inv()?);
        Ok(model)
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// K.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &VifaConfig {
        &self.kk_step.config
    }

    /// Seed of the training draws.
    pub fn seed(&self) -> u64 {
        self.kk_step.seed
    }

    /// Optimiser steps applied so far.
    pub fn n_steps(&self) -> u64 {
        self.kk_step.n_steps
    }

    /// Training draws made so far.
    pub fn n_draws(&self) -> u64 {
        self.kk_step.n_draws
    }

    /// Draws waiting for their gradients.
    pub fn n_pending(&self) -> usize {
        self.kk_step.n_pending
    }

    /// The K×K part of the model.
    pub fn kk_step(&self) -> &VifaKkStep {
        &self.kk_step
    }

    /// Replace the learning rates (for schedules); takes effect at the next step.
    pub fn set_learning_rates(&mut self, lr: LearningRates) -> Result<()> {
        self.kk_step.set_learning_rates(lr)
    }

    /// Replace the prior precision α of p(θ) = N(0, α⁻¹ I) (finite, >= 0); takes effect at the next step.
    pub fn set_prior_precision(&mut self, alpha: f64) -> Result<()> {
        self.kk_step.set_prior_precision(alpha)
    }

    /// Mean c (D).
    pub fn mean(&self) -> Array1<f64> {
        self.params.c.iter().map(|v| v.to_f64()).collect()
    }

    /// Loadings F (D×K).
    pub fn loadings(&self) -> Array2<f64> {
        let k = self.n_components;
        Array2::from_shape_fn((self.n_features, k), |(i, j)| self.params.f[i * k + j].to_f64())
    }

    /// Noise variances ψ = exp β (D).
    pub fn noise_variance(&self) -> Array1<f64> {
        self.params.beta.iter().map(|b| b.to_f64().exp()).collect()
    }

    /// β = log ψ (D), the parameter the optimiser updates.
    pub fn log_noise_variance(&self) -> Array1<f64> {
        self.params.beta.iter().map(|b| b.to_f64()).collect()
    }

    /// Place this model's rows at `row_offset` in a vector split across processes (its noise then equals
    /// that of the whole model's rows there).
    pub fn set_row_offset(&mut self, row_offset: usize) {
        self.kk_step.row_offset = row_offset;
    }

    /// Index of this model's first row in the whole vector.
    pub fn row_offset(&self) -> usize {
        self.kk_step.row_offset
    }
}

/// Salt that separates the draw key from the key of the seeded initial loadings (`init.rs`).
const DRAW_SALT: u64 = 0x5649_4641_5f64_7261;

/// The key of the training draws of `seed` (counter-based noise, `crate::noise`).
fn draw_key(seed: u64) -> u64 {
    seed ^ DRAW_SALT
}

/// h of draw `draw` (K standard normals).
fn latent_draw(seed: u64, draw: u64, k: usize) -> Array1<f64> {
    noise::latent_draw(draw_key(seed), draw, k)
}

/// z of draw `draw` for the global features starting at `row0`, `out.len()` values.
fn fill_noise(seed: u64, draw: u64, row0: usize, out: &mut [f64]) {
    noise::fill_noise(draw_key(seed), draw, row0, out)
}
