//! The K×K part of online SGA (thesis Algorithm 1): the E-step (4.23) from the pass's sums, the step sizes of
//! the rule, the warm-up and the data-scaled start, written once for every row store.
//!
//! The pass over the D-sized rows applies the pending gradient step (lines 10–14) and returns the sums
//! S = Fᵀ Ψ⁻¹ F and u = Fᵀ Ψ⁻¹ d; [`SgaKkStep::finish`] turns them into the next pending step. The Rust rows of
//! [`super::OnlineSga`] and the torch rows of the Python package (through the binding's `OnlineSGAStep`) run
//! this same code.

use ndarray::{Array1, Array2};

use super::{SgaConfig, SgaRule};
use crate::config_checks::{check_floor_fits, validate_dims};
use crate::engine::block::outer;
use crate::engine::sga_kernel::{SgaStep, Start};
use crate::engine::StepSums;
use crate::error::{invalid, FaError, Result};
use crate::linalg::SpdFactor;
use crate::scalar::Real;
use crate::scaling::{read_scaling, write_scaling, Scaling};
use crate::schedule::{read_schedule, write_schedule};
use crate::state::{StateReader, StateValue, StateWriter};
use crate::state_checks::{bounded_symmetric, positive_diagonal, sample_count};

/// The gradient step of the last sample, not yet applied: needs m_t and P_t = Σ_t + m_t m_tᵀ, and the step
/// sizes and whitening factor of the rule (a function of m_t, P_t, t and the configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub m: Array1<f64>,
    pub p: Array2<f64>,
    pub rates: StepRates,
}

/// Step sizes of one pending step: the F step's, the natural ψ step's (`None`: the log-ψ step with the F
/// step's rate) and the whitening factor L (K×K row-major, lower triangular).
#[derive(Debug, Clone, PartialEq)]
pub struct StepRates {
    pub f: f64,
    pub psi: Option<f64>,
    pub whiten: Option<Array2<f64>>,
}

impl StepRates {
    /// The rates of sample t's step (m, P its latent posterior) under `config`'s rule.
    pub(crate) fn new(config: &SgaConfig, m: &Array1<f64>, p: &Array2<f64>, t: u64) -> Result<Self> {
        match config.rule {
            SgaRule::Gradient => Ok(StepRates {
                f: config.lr,
                psi: None,
                whiten: None,
            }),
            SgaRule::Whitened => {
                let a = 1.0 / t as f64;
                let a_f = a.min(1.0 / (1.0 + m.dot(m)));
                // (1 − a_F) I + a_F P: positive definite for a_F ≤ 1 (P is).
                let mut target = p * a_f;
                target.diag_mut().mapv_inplace(|v| v + (1.0 - a_f));
                let lower = SpdFactor::new_jittered(target.view(), "the whitening step (1 − a) I + a P")?.lower();
                Ok(StepRates {
                    f: a_f,
                    psi: Some(a),
                    whiten: Some(lower),
                })
            }
        }
    }
}

impl Pending {
    /// The step as the engine's kernels read it (m, P and L as flat slices).
    pub(crate) fn step(&self) -> SgaStep<'_> {
        SgaStep {
            m: self.m.as_slice().expect("m is allocated contiguous"),
            p: self.p.as_slice().expect("P is allocated contiguous"),
            whiten: self
                .rates
                .whiten
                .as_ref()
                .map(|l| l.as_slice().expect("L is allocated contiguous")),
        }
    }
}

/// What the pass of the next sample t = n_seen + 1 does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassPlan {
    pub t: u64,
    /// Step of the running mean ρ'_t.
    pub mean_rho: f64,
    /// Past warm-up: the pass applies the pending step and accumulates the E-step sums (else it only moves
    /// the running mean, and under `Scaling::Data` the running d̄² kept in ψ's storage).
    pub active: bool,
    /// The data-scaled start F ← σ̂ F₀, ψ ← max(d̄², floor) runs first (the first sample after a data-scaled
    /// warm-up).
    pub start: bool,
    /// The F step's rate of the pending step (`lr` when none is pending).
    pub lr: f64,
    /// The natural ψ step's rate of the pending step (None: the log-ψ step).
    pub psi_rate: Option<f64>,
}

/// The K×K state of one online-SGA model (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct SgaKkStep {
    pub(crate) n_components: usize,
    pub(crate) config: SgaConfig,
    pub(crate) n_seen: u64,
    pub(crate) pending: Option<Pending>,
    /// σ̂² = (1/D) Σ_d d̄²_d over the warm-up samples (`Scaling::Data`; frozen once warm-up ends).
    pub(crate) scale_sq: f64,
}

impl SgaKkStep {
    /// The step of a new model (nothing seen), its configuration checked by [`SgaKkStep::checked`].
    fn new(n_components: usize, config: SgaConfig) -> Self {
        SgaKkStep {
            n_components,
            config,
            n_seen: 0,
            pending: None,
            scale_sq: 0.0,
        }
    }

    /// A new step of a model of D = `n_features` rows stored in `T`, with the configuration checked
    /// (1 <= K < D, floor, schedule, lr, rule).
    pub fn checked<T: Real>(n_features: usize, n_components: usize, config: SgaConfig) -> Result<Self> {
        validate_dims(n_features, n_components, config.noise_floor)?;
        check_floor_fits::<T>(config.noise_floor)?;
        config.step_size.validate()?;
        if !(config.lr.is_finite() && config.lr > 0.0) {
            return Err(invalid("lr", format!("must be finite and > 0, got {}", config.lr)));
        }
        check_rule(&config)?;
        Ok(SgaKkStep::new(n_components, config))
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
    pub fn config(&self) -> &SgaConfig {
        &self.config
    }

    /// σ̂² of the warm-up.
    pub fn scale_sq(&self) -> f64 {
        self.scale_sq
    }

    /// The step the next pass applies to the rows, if any.
    pub fn pending(&self) -> Option<&Pending> {
        self.pending.as_ref()
    }

    /// Whether warm-up is over.
    pub fn is_fitted(&self) -> bool {
        self.n_seen > self.config.n_warmup
    }

    /// The noise floor for rows stored in `T` (absolute, or relative to σ̂² under `Scaling::Data`).
    pub fn floor<T: Real>(&self) -> f64 {
        self.config.scaling.floor::<T>(self.config.noise_floor, self.scale_sq)
    }

    /// The data-scaled start's scale σ̂ and whether there is no scale at all (F₀ and ψ = 1 kept).
    pub(crate) fn start(&self) -> Start {
        Start {
            sigma: self.config.scaling.warmup_scale(self.scale_sq),
            degenerate: self.config.scaling.degenerate(self.scale_sq),
        }
    }

    /// Whether the next pass applies the data-scaled start (the first sample after warm-up).
    pub fn starts_next(&self) -> bool {
        self.config.scaling == Scaling::Data && self.n_seen == self.config.n_warmup
    }

    /// What the pass of the next sample does.
    pub fn plan(&self) -> PassPlan {
        let t = self.n_seen + 1;
        PassPlan {
            t,
            mean_rho: self.config.scaling.mean_rho(self.config.step_size.rho(t), t),
            active: t > self.config.n_warmup,
            start: self.starts_next(),
            lr: self.pending.as_ref().map_or(self.config.lr, |p| p.rates.f),
            psi_rate: self.pending.as_ref().and_then(|p| p.rates.psi),
        }
    }

    /// Forget the pending step (a pass applied it).
    pub fn drop_pending(&mut self) {
        self.pending = None;
    }

    /// The K×K part of the step of sample t = n_seen + 1 from the sums of its pass over all `n_total` rows:
    /// (4.23) after warm-up, σ̂² = Σ d̄² / `n_total` during a data-scaled warm-up. A pass that counted diverged ψ
    /// steps (`sums.dsq_sum` > 0 after warm-up) is refused. Nothing is stored unless it succeeds.
    pub fn finish(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        sums.check(self.n_components, 0, n_total)?;
        if n_total == 0 {
            return Err(invalid("n_total", "must be >= 1 (the rows the sums are over)"));
        }
        let plan = self.plan();
        let pending = if plan.active {
            Some(estep(sums, self.n_components, &self.config, plan.t)?)
        } else {
            None
        };
        if self.config.scaling == Scaling::Data && !plan.active {
            self.scale_sq = sums.dsq_sum / n_total as f64;
        }
        self.pending = pending;
        self.n_seen = plan.t;
        Ok(())
    }

    /// Write the step's entries of a checkpoint (every key but the rows).
    pub(crate) fn write_state(&self, w: &mut StateWriter) {
        w.put("n_components", StateValue::Int(self.n_components as u64));
        w.put("n_warmup", StateValue::Int(self.config.n_warmup));
        w.put("noise_floor", StateValue::Float(self.config.noise_floor));
        w.put("lr", StateValue::Float(self.config.lr));
        w.put("rule", StateValue::Text(self.config.rule.name().into()));
        write_schedule(w, &self.config.step_size);
        write_scaling(w, self.config.scaling, self.scale_sq);
        w.put("n_seen", StateValue::Int(self.n_seen));
        if let Some(p) = &self.pending {
            w.vector("pending_m", &p.m);
            w.matrix("pending_p", &p.p);
        }
    }

    /// The step of a checkpoint's entries for D = `n_features` rows stored in `T`, checked.
    pub(crate) fn read_state<T: Real>(r: &StateReader<'_>, n_features: usize) -> Result<Self> {
        let k = r.usize("n_components")?;
        let (scaling, scale_sq) = read_scaling(r)?;
        let config = SgaConfig {
            lr: r.float("lr")?,
            rule: read_rule(r)?,
            n_warmup: r.int("n_warmup")?,
            noise_floor: r.float("noise_floor")?,
            step_size: read_schedule(r)?,
            scaling,
        };
        validate_dims(n_features, k, config.noise_floor)
            .and_then(|_| check_floor_fits::<T>(config.noise_floor))
            .map_err(|e| FaError::InvalidState(e.to_string()))?;
        if config.lr <= 0.0 {
            return Err(FaError::InvalidState("lr must be > 0".into()));
        }
        check_rule(&config).map_err(|e| FaError::InvalidState(e.to_string()))?;
        let n_seen = r.int("n_seen")?;
        sample_count("n_seen", n_seen)?;
        let pending = if r.has("pending_m") {
            let (m, p) = (r.vector("pending_m", k)?, r.matrix("pending_p", k, k)?);
            bounded_symmetric("pending_p", p.view())?;
            positive_diagonal("pending_p", p.view())?;
            let rates = StepRates::new(&config, &m, &p, n_seen).map_err(|e| FaError::InvalidState(e.to_string()))?;
            Some(Pending { m, p, rates })
        } else {
            None
        };
        Ok(SgaKkStep {
            n_components: k,
            config,
            n_seen,
            pending,
            scale_sq,
        })
    }
}

/// The step rule; checkpoints written before the whitened rule existed have no entry and are the gradient rule.
fn read_rule(r: &StateReader) -> Result<SgaRule> {
    if !r.has("rule") {
        return Ok(SgaRule::Gradient);
    }
    SgaRule::parse(r.text("rule")?).map_err(|e| FaError::InvalidState(e.to_string()))
}

/// (4.23) from the sums: Σ = (I + C F)⁻¹, m = Σ C d, and P = Σ + m mᵀ for the gradients. A pass that
/// counted diverged ψ steps (`sums.dsq_sum` > 0 while active) is refused as a breakdown (and rolled back).
fn estep(sums: &StepSums, k: usize, config: &SgaConfig, t: u64) -> Result<Pending> {
    if sums.dsq_sum > 0.0 {
        return Err(FaError::Diverged(
            "the SGA step diverged (a noise variance grew more than 10^6-fold past the data's scale in one \
             step); lower lr or use scaling='data'",
        ));
    }
    let precision = Array2::<f64>::eye(k) + &sums.s;
    let factor = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
    let sigma = factor.inverse();
    let m = factor.solve(sums.u.view());
    let p = sigma + outer(&m);
    // A sample many orders of magnitude outside the data seen so far (relative to ψ) gives a latent mean
    // whose outer product overflows: the gradient step would be ∞ − ∞. Refuse it as a breakdown (the
    // update is then rolled back) rather than storing a state that poisons every later step.
    if m.iter()
        .chain(p.iter())
        .any(|v| !v.is_finite() || v.abs() > MAX_LATENT_MOMENT)
    {
        return Err(FaError::NotPositiveDefinite(
            "the latent second moment Σ + m mᵀ (a divergent SGA step)",
        ));
    }
    let rates = StepRates::new(config, &m, &p, t)?;
    Ok(Pending { m, p, rates })
}

/// The whitened rule preconditions the F step by ψ, which only `Scaling::Data` does.
fn check_rule(config: &SgaConfig) -> Result<()> {
    if config.rule == SgaRule::Whitened && config.scaling != Scaling::Data {
        return Err(invalid(
            "rule",
            "the whitened steps (lr='auto') need scaling='data'; give a float lr for scaling='unit'".to_string(),
        ));
    }
    Ok(())
}

/// Largest latent second moment an SGA step accepts: the gradient multiplies it by loadings of up to
/// `MAX_STATE`, so its products stay far from overflow in f64.
const MAX_LATENT_MOMENT: f64 = 1e150;
