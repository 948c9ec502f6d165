//! Hyper-parameters of [`super::Vifa`]: optimiser, learning rates, prior precision, number of gradient
//! samples, clipping, and the starting point.

use ndarray::{ArrayView1, ArrayView2};

use crate::error::{invalid, Result};

/// Adam's first-moment decay β₁ (PyTorch/Kingma & Ba default).
pub const ADAM_BETA1: f64 = 0.9;
/// Adam's second-moment decay β₂.
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's ε, added to √v̂.
pub const ADAM_EPS: f64 = 1e-8;

/// How the gradient of the negative ELBO is turned into a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    /// p ← p − η g (Algorithm 3, lines 17–19).
    Sgd,
    /// Adam with bias correction and the defaults [`ADAM_BETA1`], [`ADAM_BETA2`], [`ADAM_EPS`].
    Adam,
}

impl Optimizer {
    /// Parse "sgd" / "adam".
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "sgd" => Ok(Optimizer::Sgd),
            "adam" => Ok(Optimizer::Adam),
            other => Err(invalid("optimizer", format!("must be 'sgd' or 'adam', got {other:?}"))),
        }
    }

    /// The name [`Optimizer::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adam => "adam",
        }
    }
}

/// Learning rates η_c, η_F, η_β of the three parameter groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningRates {
    /// η_c (mean c).
    pub mean: f64,
    /// η_F (loadings F).
    pub loadings: f64,
    /// η_β (β = log ψ).
    pub log_noise: f64,
}

impl LearningRates {
    /// Each rate must be finite and ≥ 0 (0 freezes that group).
    pub fn validate(&self) -> Result<()> {
        for (name, lr) in [
            ("lr_mean", self.mean),
            ("lr_loadings", self.loadings),
            ("lr_log_noise", self.log_noise),
        ] {
            if !(lr.is_finite() && lr >= 0.0) {
                return Err(invalid(name, format!("must be finite and >= 0, got {lr}")));
            }
        }
        Ok(())
    }

    pub(super) fn as_array(&self) -> [f64; 3] {
        [self.mean, self.loadings, self.log_noise]
    }
}

/// Hyper-parameters of [`Vifa`].
#[derive(Debug, Clone, PartialEq)]
pub struct VifaConfig {
    /// α ≥ 0, precision of the prior N(0, α⁻¹ I) (α = 0: flat prior).
    pub prior_precision: f64,
    /// η_c, η_F, η_β.
    pub lr: LearningRates,
    /// SGD or Adam.
    pub optimizer: Optimizer,
    /// L ≥ 1: draws (and gradients) averaged per step.
    pub n_grad_samples: usize,
    /// If set, each group's gradient (c, F, β separately) is rescaled to at most this Euclidean norm.
    pub clip_grad_norm: Option<f64>,
}

impl VifaConfig {
    /// Check every hyper-parameter.
    pub fn validate(&self) -> Result<()> {
        let alpha = self.prior_precision;
        if !(alpha.is_finite() && alpha >= 0.0) {
            return Err(invalid(
                "prior_precision",
                format!("must be finite and >= 0, got {alpha}"),
            ));
        }
        self.lr.validate()?;
        if self.n_grad_samples < 1 {
            return Err(invalid(
                "n_grad_samples",
                format!("must be >= 1, got {}", self.n_grad_samples),
            ));
        }
        if let Some(max) = self.clip_grad_norm {
            if !(max.is_finite() && max > 0.0) {
                return Err(invalid("clip_grad_norm", format!("must be finite and > 0, got {max}")));
            }
        }
        Ok(())
    }
}

/// Starting point of the variational parameters.
#[derive(Debug, Clone, Copy)]
pub struct VifaInit<'a> {
    /// F₀ (D×K), e.g. [`crate::init::orthonormal_loadings`] (§4.4).
    pub loadings: ArrayView2<'a, f64>,
    /// c₀ (D); None: 0 (Algorithm 3, line 1).
    pub mean: Option<ArrayView1<'a, f64>>,
    /// ψ₀ (D, > 0); None: 1 (line 1).
    pub noise_variance: Option<ArrayView1<'a, f64>>,
}

/// Check (D, K): 1 ≤ K ≤ D (VI has no identifiability limit on K, but K > D adds nothing).
pub(crate) fn validate_vifa_dims(n_features: usize, n_components: usize) -> Result<()> {
    if n_features < 1 {
        return Err(invalid("n_features", format!("must be >= 1, got {n_features}")));
    }
    if n_components < 1 || n_components > n_features {
        return Err(invalid(
            "n_components",
            format!("must satisfy 1 <= n_components <= n_features = {n_features}, got {n_components}"),
        ));
    }
    Ok(())
}
