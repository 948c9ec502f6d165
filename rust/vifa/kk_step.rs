//! The K×K part of VIFA (thesis Algorithm 3), written once for every row store: the hyper-parameters, the
//! counters of draws and steps, the random state's key, (I + B)⁻¹ with B = Fᵀ Ψ⁻¹ F (line 11), the rule of
//! each step (the optimiser's learning rates, Adam's bias corrections, the clipping factors) and the state
//! keys they own.
//!
//! The D-sized rows (c, F, β and Adam's moments) take a step with [`VifaKkStep::rule`]'s constants, return
//! their B, and [`VifaKkStep::finish`] turns the whole model's B into (I + B)⁻¹ for the next step. The Rust
//! rows of [`super::Vifa`] and the torch rows of the Python package (through the binding's `VIFAStep`) run
//! this same code.

use ndarray::{Array2, ArrayView2};

use super::config::validate_vifa_dims;
use super::update::{clip_scales, UpdateRule};
use super::{LearningRates, Optimizer, VifaConfig, DIVERGED};
use crate::error::{invalid, FaError, Result};
use crate::linalg::SpdFactor;
use crate::state::{StateReader, StateValue, StateWriter};

/// The K×K state of one VIFA model (K = `n_components`).
#[derive(Debug, Clone, PartialEq)]
pub struct VifaKkStep {
    pub(crate) n_components: usize,
    pub(crate) config: VifaConfig,
    /// Seed of the draw key; with `n_draws` the whole random state.
    pub(crate) seed: u64,
    /// Training draws made so far; draw j uses stream j.
    pub(crate) n_draws: u64,
    /// Draws made since the last step: n_draws − n_pending … n_draws − 1.
    pub(crate) n_pending: usize,
    /// Optimiser steps applied so far (Adam's t).
    pub(crate) n_steps: u64,
    /// (I + B)⁻¹ with B = Fᵀ Ψ⁻¹ F of the current parameters (K×K); None once the parameters diverged (or
    /// between a step's rows and its [`VifaKkStep::finish`]).
    pub(crate) m_inv: Option<Array2<f64>>,
    /// Index of the model's first row in the whole vector when the rows are split across processes (0
    /// otherwise): the noise z of row r is that of global feature `row_offset + r`.
    pub(crate) row_offset: usize,
}

impl VifaKkStep {
    /// A new step of K = `n_components` factors with no draws or steps yet; (I + B)⁻¹ comes with the first
    /// [`VifaKkStep::finish`] (the rows' B).
    pub fn new(n_components: usize, config: VifaConfig, seed: u64) -> Result<Self> {
        if n_components < 1 {
            return Err(invalid("n_components", format!("must be >= 1, got {n_components}")));
        }
        config.validate()?;
        Ok(VifaKkStep {
            n_components,
            config,
            seed,
            n_draws: 0,
            n_pending: 0,
            n_steps: 0,
            m_inv: None,
            row_offset: 0,
        })
    }

    /// (I + B)⁻¹ (K×K); error once the parameters diverged.
    pub fn m_inv(&self) -> Result<&Array2<f64>> {
        self.m_inv.as_ref().ok_or(FaError::NotPositiveDefinite(DIVERGED))
    }

    /// Count a new training draw and return its index (its noise's stream). Error while L = `n_grad_samples`
    /// draws wait for their step, or once the model diverged.
    pub fn begin_draw(&mut self) -> Result<u64> {
        self.m_inv()?;
        if self.n_pending >= self.config.n_grad_samples {
            return Err(FaError::CallOrder(format!(
                "{} draw(s) are already waiting for step() (n_grad_samples = {}); call step() with their \
                 gradients first",
                self.n_pending, self.config.n_grad_samples
            )));
        }
        let draw = self.n_draws;
        self.n_draws += 1;
        self.n_pending += 1;
        Ok(draw)
    }

    /// The first pending draw's index.
    pub fn first_pending(&self) -> u64 {
        self.n_draws - self.n_pending as u64
    }

    /// Error unless L draws wait for their gradients (a step needs them all).
    pub fn check_ready(&self) -> Result<()> {
        let l = self.config.n_grad_samples;
        if self.n_pending < l {
            return Err(FaError::CallOrder(format!(
                "step() needs gradients at n_grad_samples = {l} draw(s) from sample(); {} pending — call \
                 sample() first",
                self.n_pending
            )));
        }
        Ok(())
    }

    /// The rule of the next step t = n_steps + 1: the learning rates, Adam's bias corrections and, with
    /// gradient clipping, the per-group factors min(1, max / ‖g‖) of the whole model's squared gradient norms
    /// `sq_norms` (‖∇c‖², ‖∇F‖², ‖∇β‖²; required exactly when clipping is on).
    pub(crate) fn rule(&self, sq_norms: Option<[f64; 3]>) -> Result<UpdateRule> {
        let scale = match (self.config.clip_grad_norm, sq_norms) {
            (Some(max), Some(sq)) => clip_scales(sq, max),
            (None, _) => [1.0; 3],
            (Some(_), None) => return Err(invalid("sq_norms", "gradient clipping needs the gradient norms")),
        };
        Ok(UpdateRule::new(self.config.lr.as_array(), scale, self.n_steps + 1))
    }

    /// The rows took step n_steps + 1: count it, forget the pending draws and the old (I + B)⁻¹ (the rows
    /// changed; [`VifaKkStep::finish`] brings the new one).
    pub(crate) fn stepped(&mut self) {
        self.n_steps += 1;
        self.n_pending = 0;
        self.m_inv = None;
    }

    /// (I + B)⁻¹ from B = Fᵀ Ψ⁻¹ F of the whole model's rows (K×K) and whether every row's new parameters are
    /// finite; error (the model is then diverged) if they are not or I + B does not factorise.
    pub fn finish(&mut self, gram: ArrayView2<f64>, finite: bool) -> Result<()> {
        let k = self.n_components;
        if gram.dim() != (k, k) {
            return Err(FaError::Shape {
                what: "gram",
                expected: format!("({k}, {k})"),
                got: gram.shape().to_vec(),
            });
        }
        self.m_inv = if finite && gram.iter().all(|v| v.is_finite()) {
            precision_inverse(k, vec![gram.to_owned()]).ok()
        } else {
            None
        };
        self.m_inv().map(|_| ())
    }

    /// Replace the learning rates (for schedules); takes effect at the next step.
    pub fn set_learning_rates(&mut self, lr: LearningRates) -> Result<()> {
        lr.validate()?;
        self.config.lr = lr;
        Ok(())
    }

    /// Replace the prior precision α of p(θ) = N(0, α⁻¹ I) (finite, >= 0); takes effect at the next step.
    pub fn set_prior_precision(&mut self, alpha: f64) -> Result<()> {
        let config = VifaConfig {
            prior_precision: alpha,
            ..self.config.clone()
        };
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// The step's entries of the model's state map (every key but the rows and `n_features`).
    pub(crate) fn write_state(&self, w: &mut StateWriter) {
        w.put("n_components", StateValue::Int(self.n_components as u64));
        w.put("prior_precision", StateValue::Float(self.config.prior_precision));
        w.put("lr_mean", StateValue::Float(self.config.lr.mean));
        w.put("lr_loadings", StateValue::Float(self.config.lr.loadings));
        w.put("lr_log_noise", StateValue::Float(self.config.lr.log_noise));
        w.put("optimizer", StateValue::Text(self.config.optimizer.name().into()));
        w.put("n_grad_samples", StateValue::Int(self.config.n_grad_samples as u64));
        if let Some(max) = self.config.clip_grad_norm {
            w.put("clip_grad_norm", StateValue::Float(max));
        }
        w.put("seed", StateValue::Int(self.seed));
        w.put("n_draws", StateValue::Int(self.n_draws));
        w.put("n_pending", StateValue::Int(self.n_pending as u64));
        w.put("noise", StateValue::Text(crate::noise::GENERATOR.into()));
        w.put("n_steps", StateValue::Int(self.n_steps));
        w.put("diverged", StateValue::Bool(self.m_inv.is_none()));
        if self.row_offset != 0 {
            w.put("row_offset", StateValue::Int(self.row_offset as u64));
        }
    }

    /// The step of a checkpoint's entries for D = `n_features` rows, checked; (I + B)⁻¹ comes from the rows
    /// (the caller's [`VifaKkStep::finish`]).
    pub(crate) fn read_state(r: &StateReader<'_>, n_features: usize) -> Result<Self> {
        let bad = |e: FaError| FaError::InvalidState(e.to_string());
        let k = r.usize("n_components")?;
        validate_vifa_dims(n_features, k).map_err(bad)?;
        let config = VifaConfig {
            prior_precision: r.float("prior_precision")?,
            lr: LearningRates {
                mean: r.float("lr_mean")?,
                loadings: r.float("lr_loadings")?,
                log_noise: r.float("lr_log_noise")?,
            },
            optimizer: Optimizer::parse(r.text("optimizer")?).map_err(bad)?,
            n_grad_samples: r.usize("n_grad_samples")?,
            clip_grad_norm: if r.has("clip_grad_norm") {
                Some(r.float("clip_grad_norm")?)
            } else {
                None
            },
        };
        config.validate().map_err(bad)?;
        let (n_draws, n_pending) = (r.int("n_draws")?, r.usize("n_pending")?);
        if n_pending > config.n_grad_samples || n_pending as u64 > n_draws {
            return Err(FaError::InvalidState(format!(
                "n_pending = {n_pending} exceeds n_grad_samples or n_draws = {n_draws}"
            )));
        }
        // A checkpoint without the entry predates the counter-based generator of `crate::noise`: its pending draws
        // were made with other noise, which the step would regenerate wrongly.
        let generator = if r.has("noise") {
            r.text("noise")?
        } else {
            "chacha8-ziggurat"
        };
        if generator != crate::noise::GENERATOR && n_pending > 0 {
            return Err(FaError::InvalidState(format!(
                "the checkpoint holds {n_pending} pending draw(s) made with the noise generator `{generator}`, which \
                 this version of onlinefa does not regenerate (it uses `{}`); resume from a checkpoint saved with no \
                 draw pending (after `step`)",
                crate::noise::GENERATOR
            )));
        }
        if r.bool("diverged")? {
            return Err(FaError::InvalidState("the checkpointed VIFA had diverged".into()));
        }
        Ok(VifaKkStep {
            n_components: k,
            config,
            seed: r.int("seed")?,
            n_draws,
            n_pending,
            n_steps: r.int("n_steps")?,
            m_inv: None,
            row_offset: if r.has("row_offset") { r.usize("row_offset")? } else { 0 },
        })
    }
}

/// (I + B)⁻¹ with B the sum of the per-task partial Gram matrices (line 11), added in task order (so the result
/// does not depend on the thread count).
pub(crate) fn precision_inverse(k: usize, partials: Vec<Array2<f64>>) -> Result<Array2<f64>> {
    let gram = partials
        .into_iter()
        .fold(Array2::<f64>::zeros((k, k)), |acc, g| acc + g);
    let precision = Array2::<f64>::eye(k) + &gram;
    Ok(SpdFactor::new(precision.view(), DIVERGED)?.inverse())
}
