//! The K×K part of online EM (thesis Algorithm 2, lines 8–11 and 13), written once for every row store.
//!
//! A step of a sample is a pass over the D-sized rows, which returns the cross-row sums S = Fᵀ Ψ⁻¹ F,
//! u = Fᵀ Ψ⁻¹ d and Σ d̄² (`StepSums`), and then [`EmStep::finish`] on those sums. This type holds everything
//! but the rows: the configuration, the sample count, B̄ and Σ, the basis the rows' F is read in, the pending
//! step the next pass applies, and σ̂². The Rust rows of [`super::OnlineEm`] and the torch rows of the Python
//! package (through the binding's `OnlineEMStep`) both run this code, so the two cannot part ways.

use ndarray::{Array1, Array2};

use super::EmConfig;
use crate::config_checks::check_floor_fits;
use crate::engine::block::outer;
use crate::engine::StepSums;
use crate::error::{FaError, Result};
use crate::linalg::SpdFactor;
use crate::m_step::{loadings_map, LoadingsMap};
use crate::scalar::Real;
use crate::scaling::{read_scaling, write_scaling};
use crate::schedule::{read_schedule, write_schedule};
use crate::state::{StateReader, StateValue, StateWriter};
use crate::state_checks::{bounded_symmetric, positive_diagonal, sample_count, step_size};

/// Where the E-step of the next sample takes F and ψ from.
#[derive(Debug, Clone, PartialEq)]
pub enum Basis {
    /// Still within warm-up (+1): the initial loadings F₀ held by the rows, with ψ = 1, both scaled by
    /// [`crate::scaling::Scaling::warmup_scale`] (F₀ σ, ψ = σ²).
    Initial,
    /// F = Ā H̄⁻¹ with this H̄⁻¹ (K×K).
    Stats(Array2<f64>),
    /// Whitened basis: H̄ = I, so F = Ā.
    Whitened,
}

/// The not-yet-applied row-local part of the last sample: its running moments θ̄, d̄² (lines 5, 6, 14, from
/// the innovation e stored in `d_last`, see `engine::advance`) and the update Ā ← ((1−ρ) Ā + ρ d mᵀ) W.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// (ρ', ρ) of the pending moments; None when θ̄, d̄² are already applied and `d_last` holds d (checkpoints,
    /// and row stores that apply the moments with the sample's pass).
    pub moments: Option<(f64, f64)>,
    pub rho: f64,
    pub m: Array1<f64>,
    /// Whitening transform W = R⁻ᵀ (K×K), if the last M-step whitened.
    pub transform: Option<Array2<f64>>,
}

/// The step sizes of the next sample t = n_seen + 1: ρ_t of the averages and ρ'_t of the running mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub t: u64,
    pub rho: f64,
    pub mean_rho: f64,
}

/// The K×K state of one online-EM model (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct EmStep {
    pub(crate) n_components: usize,
    pub(crate) config: EmConfig,
    pub(crate) n_seen: u64,
    pub(crate) b_bar: Array2<f64>,
    /// Σ of the last E-step.
    pub(crate) sigma: Array2<f64>,
    pub(crate) basis: Basis,
    pub(crate) pending: Option<Pending>,
    /// σ̂² = (1/D) Σ_d d̄²_d after the last pass (the data's scale, used by `Scaling::Data`).
    pub(crate) scale_sq: f64,
}

impl EmStep {
    /// The step of a new model of K = `n_components` (B̄ = 0, Σ = I, warm-up basis), its configuration
    /// checked by [`EmStep::checked`].
    fn new(n_components: usize, config: EmConfig) -> Self {
        EmStep {
            n_components,
            config,
            n_seen: 0,
            b_bar: Array2::zeros((n_components, n_components)),
            sigma: Array2::eye(n_components),
            basis: Basis::Initial,
            pending: None,
            scale_sq: 0.0,
        }
    }

    /// A new step of a model of D = `n_features` rows stored in `T`, with the configuration checked
    /// (1 <= K < D, floor, schedule).
    pub fn checked<T: Real>(n_features: usize, n_components: usize, config: EmConfig) -> Result<Self> {
        crate::config_checks::validate_dims(n_features, n_components, config.noise_floor)?;
        check_floor_fits::<T>(config.noise_floor)?;
        config.step_size.validate()?;
        Ok(EmStep::new(n_components, config))
    }

    /// Samples applied so far.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }

    /// K.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &EmConfig {
        &self.config
    }

    /// σ̂² after the last sample.
    pub fn scale_sq(&self) -> f64 {
        self.scale_sq
    }

    /// Where the next pass reads F from.
    pub fn basis(&self) -> &Basis {
        &self.basis
    }

    /// The step the next pass applies to the rows, if any.
    pub fn pending(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }

    /// B̄ (K×K).
    pub fn b_bar(&self) -> &Array2<f64> {
        &self.b_bar
    }

    /// Σ of the last E-step (K×K).
    pub fn sigma(&self) -> &Array2<f64> {
        &self.sigma
    }

    /// Whether warm-up is over.
    pub fn is_fitted(&self) -> bool {
        !matches!(self.basis, Basis::Initial)
    }

    /// ρ_t and ρ'_t of the next sample.
    pub fn rates(&self) -> Rates {
        let t = self.n_seen + 1;
        let rho = self.config.step_size.rho(t);
        Rates {
            t,
            rho,
            mean_rho: self.config.scaling.mean_rho(rho, t),
        }
    }

    /// The noise floor the next pass applies to rows stored in `T`.
    pub fn floor<T: Real>(&self) -> f64 {
        self.config.scaling.floor::<T>(self.config.noise_floor, self.scale_sq)
    }

    /// σ of the warm-up start F₀ σ, ψ₀ = σ².
    pub fn warmup_scale(&self) -> f64 {
        self.config.scaling.warmup_scale(self.scale_sq)
    }

    /// Effective number of samples behind the running averages (crate::shrinkage::effective_samples).
    pub fn effective_samples(&self) -> f64 {
        crate::shrinkage::effective_samples(&self.config.step_size, self.n_seen)
    }

    /// Forget the pending step (a pass applied it).
    pub fn drop_pending(&mut self) {
        self.pending = None;
    }

    /// Mark the pending step's moments as applied (a row store that adopts θ̄_t, d̄²_t and d_t with the pass).
    pub fn moments_applied(&mut self) {
        if let Some(pending) = self.pending.as_mut() {
            pending.moments = None;
        }
    }

    /// The K×K part of the step of sample t = n_seen + 1 from the sums of its pass over all `n_total` rows, for
    /// rows stored in `T`. Nothing is stored unless it succeeds.
    pub fn finish<T: Real>(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        let k = self.n_components;
        sums.check(k, 0, n_total)?;
        if n_total == 0 {
            return Err(crate::error::invalid(
                "n_total",
                "must be >= 1 (the rows the sums are over)",
            ));
        }
        let Rates { t, rho, mean_rho } = self.rates();
        // (4.23): Σ = (I + C F)⁻¹, m = Σ C d — by Cholesky of the K×K matrix I + C F.
        let precision = Array2::<f64>::eye(k) + &sums.s;
        let factor = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
        let sigma = factor.inverse();
        let mut m = factor.solve(sums.u.view());
        if matches!(self.basis, Basis::Initial) && self.config.scaling.degenerate(self.scale_sq) {
            // No scale yet (every earlier sample identical): the latent mean of this sample is not defined
            // in the data's units, so it contributes m = 0 (as d₁ = 0 does for the first sample).
            m.fill(0.0);
        }
        // The pending rank-one step Ā ← (1 − ρ) Ā + ρ d mᵀ is applied by the next pass in the storage type. Every
        // |d_d| <= 2 MAX_INPUT (|x|, |θ̄| <= MAX_INPUT), so a step whose |m| could make some d_d m_j overflow that
        // type is refused here, before anything is committed: otherwise a non-finite Ā would be stored by a pass
        // that does not read it (warm-up), and the model could neither answer queries nor be saved and loaded.
        // (A sample this far outside the model — e.g. 1e18 after data of scale 1e-40 in float32 — is a
        // numerical breakdown; the caller gets the model as it was before the batch.)
        let limit = max_latent_mean::<T>();
        if !m.iter().all(|v| v.abs() <= limit) {
            return Err(FaError::Diverged(
                "the latent mean of this sample is too large for the state's dtype (the running averages \
                 would overflow); the sample lies far outside the scale of the data seen so far",
            ));
        }
        // Finite: every d̄²_d <= MAX_INPUT² (1e200 for f64 input), so the sum over D rows is too.
        let scale_sq = sums.dsq_sum / n_total as f64;
        // Line 10: B̄_t = B̄_{t−1} + ρ_t (m mᵀ − B̄_{t−1}).
        let b_bar = &self.b_bar + &((outer(&m) - &self.b_bar) * rho);
        let transform = if t > self.config.n_warmup {
            self.m_step(sigma, b_bar)?
        } else {
            self.b_bar = b_bar;
            self.sigma = sigma;
            None
        };
        self.pending = Some(Pending {
            moments: Some((mean_rho, rho)),
            rho,
            m,
            transform,
        });
        self.n_seen = t;
        self.scale_sq = scale_sq;
        Ok(())
    }

    /// Lines 11 and 13 of Algorithm 2 on this step's Σ and B̄: H̄ = Σ + B̄, F = Ā H̄⁻¹ (applied lazily
    /// through `Basis`), or under whitening (PX-EM) the rotation of every statistic to the basis where
    /// H̄ = I. Stores Σ, B̄ and the new basis; returns the whitening transform W = R⁻ᵀ (K×K) that the
    /// pending step applies to Ā, if any. Nothing is stored when H̄ cannot be factorised.
    fn m_step(&mut self, sigma: Array2<f64>, b_bar: Array2<f64>) -> Result<Option<Array2<f64>>> {
        let h_bar = &sigma + &b_bar;
        // Under whitening every statistic moves to the basis where H̄ = I (see `crate::m_step`); rotating B̄
        // (rather than resetting it to I − Σ_old) keeps each row's averaged moment matrix of (d, m) PSD, hence
        // ψ ≥ 0. Row-major W = R⁻ᵀ: the fused kernel and `block_times` read it as a flat slice, so the update
        // pass, the queries and a restored checkpoint (always row-major) round identically.
        match loadings_map(h_bar.view(), self.config.whiten)? {
            LoadingsMap::Inverse(h_inv) => {
                self.basis = Basis::Stats(h_inv);
                self.sigma = sigma;
                self.b_bar = b_bar;
                Ok(None)
            }
            LoadingsMap::Whiten(rotation) => {
                self.sigma = rotation.latent_moment(sigma.view());
                self.b_bar = rotation.latent_moment(b_bar.view());
                self.basis = Basis::Whitened;
                Ok(Some(rotation.cross_moment_map()))
            }
        }
    }

    /// The step as it would be had its warm-up ended with the last sample: the first M-step (lines 11 and 13)
    /// applied to the statistics gathered so far, without changing `self`; the same step as one configured with
    /// `n_warmup = n_seen − 1` and fed the same samples.
    ///
    /// Errors with [`FaError::CallOrder`] when warm-up is already over, fewer than two samples were seen, or
    /// every sample so far was identical (no scale to fit).
    pub fn ended_warmup(&self) -> Result<Self> {
        let not_yet = |why: &str| Err(FaError::CallOrder(why.to_string()));
        if self.is_fitted() {
            return not_yet("warm-up is already over");
        }
        if self.n_seen < 2 || self.config.scaling.degenerate(self.scale_sq) || self.pending.is_none() {
            return not_yet("at least two distinct samples are needed for a first fit");
        }
        let mut ended = self.clone();
        ended.config.n_warmup = self.n_seen - 1;
        let transform = ended.m_step(self.sigma.clone(), self.b_bar.clone())?;
        if let Some(pending) = ended.pending.as_mut() {
            pending.transform = transform;
        }
        Ok(ended)
    }

    /// Write the step's entries of a checkpoint (every key but the rows and the F₀ of a warm-up basis).
    pub(crate) fn write_state(&self, w: &mut StateWriter) {
        w.put("n_components", StateValue::Int(self.n_components as u64));
        w.put("n_warmup", StateValue::Int(self.config.n_warmup));
        w.put("noise_floor", StateValue::Float(self.config.noise_floor));
        w.put("whiten", StateValue::Bool(self.config.whiten));
        w.put("shrink", StateValue::Bool(self.config.shrink));
        write_schedule(w, &self.config.step_size);
        write_scaling(w, self.config.scaling, self.scale_sq);
        w.put("n_seen", StateValue::Int(self.n_seen));
        w.matrix("b_bar", &self.b_bar);
        w.matrix("sigma", &self.sigma);
        match &self.basis {
            Basis::Initial => w.put("source", StateValue::Text("initial".into())),
            Basis::Stats(h_inv) => {
                w.put("source", StateValue::Text("stats".into()));
                w.matrix("h_inv", h_inv);
            }
            Basis::Whitened => w.put("source", StateValue::Text("whitened".into())),
        }
        if let Some(p) = &self.pending {
            w.put("pending_rho", StateValue::Float(p.rho));
            w.vector("pending_m", &p.m);
            if let Some(t) = &p.transform {
                w.matrix("pending_transform", t);
            }
        }
    }

    /// The step of a checkpoint's entries for rows of D = `n_features` stored in `T`, checked (its moments
    /// applied: checkpoints store the logical state).
    pub(crate) fn read_state<T: Real>(r: &StateReader<'_>, n_features: usize) -> Result<Self> {
        let k = r.usize("n_components")?;
        let (scaling, scale_sq) = read_scaling(r)?;
        let config = EmConfig {
            n_warmup: r.int("n_warmup")?,
            noise_floor: r.float("noise_floor")?,
            step_size: read_schedule(r)?,
            whiten: r.bool("whiten")?,
            scaling,
            // Checkpoints written before the option existed report the rows as stored.
            shrink: r.has("shrink") && r.bool("shrink")?,
        };
        crate::config_checks::validate_dims(n_features, k, config.noise_floor)
            .and_then(|_| check_floor_fits::<T>(config.noise_floor))
            .map_err(|e| FaError::InvalidState(e.to_string()))?;
        let basis = match r.text("source")? {
            "initial" => Basis::Initial,
            "stats" => Basis::Stats(r.matrix("h_inv", k, k)?),
            "whitened" => Basis::Whitened,
            other => return Err(FaError::InvalidState(format!("unknown source {other:?}"))),
        };
        let pending = if r.has("pending_rho") {
            let transform = if r.has("pending_transform") {
                Some(r.matrix("pending_transform", k, k)?)
            } else {
                None
            };
            Some(Pending {
                moments: None,
                rho: r.float("pending_rho")?,
                m: r.vector("pending_m", k)?,
                transform,
            })
        } else {
            None
        };
        let step = EmStep {
            n_components: k,
            config,
            n_seen: r.int("n_seen")?,
            b_bar: r.matrix("b_bar", k, k)?,
            sigma: r.matrix("sigma", k, k)?,
            basis,
            pending,
            scale_sq,
        };
        step.check()?;
        Ok(step)
    }

    /// Every value of a restored step that Algorithm 2 relies on.
    fn check(&self) -> Result<()> {
        sample_count("n_seen", self.n_seen)?;
        bounded_symmetric("b_bar", self.b_bar.view())?;
        bounded_symmetric("sigma", self.sigma.view())?;
        positive_diagonal("sigma", self.sigma.view())?;
        if let Basis::Stats(h_inv) = &self.basis {
            bounded_symmetric("h_inv", h_inv.view())?;
            positive_diagonal("h_inv", h_inv.view())?;
        }
        if let Some(pending) = &self.pending {
            step_size("pending_rho", pending.rho)?;
        }
        Ok(())
    }
}

/// Largest |m_j| of a step: |d m_j| <= 2 MAX_INPUT |m_j| stays below a quarter of the storage type's largest
/// finite value (room for the (1 − ρ) Ā term and the rounding of the kernels, which may form d m_j first).
fn max_latent_mean<T: Real>() -> f64 {
    T::MAX_FINITE / 4.0 / (2.0 * T::MAX_INPUT)
}
