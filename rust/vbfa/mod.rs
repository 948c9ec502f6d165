//! Variational Bayesian factor analysis (VB-FA) with the Luttinen–Ilin transformations, batch and online.
//!
//! Model (project notation; Luttinen & Ilin's names in brackets): data x_n ∈ R^D [y_n ∈ R^M], latents
//! h_n ∈ R^K [x_n ∈ R^D], loadings F (D×K, row f_d) [W, M×D, row w_m], bias c [μ], noise precisions
//! τ_d [τ_m] — the model's noise *variances* are ψ_d = 1/τ_d, reported as 1/⟨τ_d⟩ — ARD precisions α_k [α_d]:
//!
//! x_nd ~ N(f_dᵀ h_n + c_d, 1/τ_d) for observed (n, d) ∈ O,   h_n ~ N(0, I_K),   c_d ~ N(0, 1/β),
//! f_dk ~ N(0, 1/α_k),   α_k ~ G(a_α, b_α) (ARD) or α_k = α fixed ("broad"),   τ_d ~ G(a_τ, b_τ).
//!
//! Mean-field q = Π_n q(h_n) Π_d q(c_d) q(f_d) q(τ_d) Π_k q(α_k) with the paper's §2.1 updates
//! (`updates.rs`), the full bound of the README (`elbo.rs`), and the translation/rotation of §2.2
//! (`transform.rs`, reusable on its own). [`VbfaBatch`] fits a data matrix with missing values by
//! coordinate ascent; [`VbfaOnline`] is online VB (local q(h_n) per mini-batch, running averages of the
//! expected sufficient statistics, global q rebuilt from them) in O(D·K + K²) memory.

mod batch;
mod checkpoint;
pub(crate) mod dense;
pub(crate) mod elbo;
mod online;
mod predict;
pub mod special;
pub(crate) mod stats;
pub mod transform;
pub(crate) mod updates;

use ndarray::{Array1, Array2};

pub use batch::{SweepRecord, VbfaBatch};
pub use online::{OnlineConfig, VbfaOnline};
pub use predict::plugin_log_likelihood;
pub use transform::{mean_translation, optimal_rotation, rotation_objective, LoadingPrior, TranslationSystem};

/// The latent-space rotation lives in the linear-algebra layer (online EM's whitening uses it too).
pub use crate::linalg::Rotation;

use crate::error::{invalid, Result};
use special::GammaQ;

/// Prior of the loadings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// Hierarchical ARD prior: f_dk ~ N(0, 1/α_k), α_k ~ G(a_α, b_α) (the paper's §2.1).
    Ard,
    /// Fixed broad prior: f_dk ~ N(0, 1/α) with α = [`Hyper::broad_alpha`].
    Broad,
}

/// Which translation the transformation step applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// The paper's approximation b = (1/N) Σ_n h̄_n (used in its experiments): the latent means end
    /// centred, but the bound can drop slightly when values are missing.
    Mean,
    /// The exact maximiser of the bound, (18) plus the bias prior: never lowers the bound.
    Exact,
}

/// Hyper-parameters of the priors (all "small", giving broad priors).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// a_α (shape of the ARD prior).
    pub a_alpha: f64,
    /// b_α (rate of the ARD prior).
    pub b_alpha: f64,
    /// a_τ (shape of the noise-precision prior).
    pub a_tau: f64,
    /// b_τ (rate of the noise-precision prior).
    pub b_tau: f64,
    /// β, the precision of the bias prior.
    pub beta: f64,
    /// α of the fixed broad prior ([`Prior::Broad`]).
    pub broad_alpha: f64,
}

impl Default for Hyper {
    fn default() -> Self {
        Hyper {
            a_alpha: 1e-5,
            b_alpha: 1e-5,
            a_tau: 1e-5,
            b_tau: 1e-5,
            beta: 1e-5,
            broad_alpha: 1e-5,
        }
    }
}

/// Settings of a VB-FA model.
#[derive(Debug, Clone, PartialEq)]
pub struct VbfaConfig {
    /// K, the number of latent factors.
    pub n_components: usize,
    /// Prior of the loadings.
    pub prior: Prior,
    /// Prior hyper-parameters.
    pub hyper: Hyper,
    /// Apply the translation and rotation.
    pub transform: bool,
    /// First sweep (batch, counted from 1) or mini-batch (online) after which the transformations run.
    pub transform_start: u64,
    /// Translation variant.
    pub translation: Translation,
    /// Initial noise variance as a fraction of each column's variance (small = the paper's "τ large").
    pub init_noise_ratio: f64,
    /// Seed of the random initial loadings.
    pub seed: u64,
}

impl Default for VbfaConfig {
    fn default() -> Self {
        VbfaConfig {
            n_components: 2,
            prior: Prior::Ard,
            hyper: Hyper::default(),
            transform: true,
            transform_start: 5,
            translation: Translation::Mean,
            init_noise_ratio: 1e-2,
            seed: 0,
        }
    }
}

impl VbfaConfig {
    /// Check the settings (K ≥ 1, transform_start ≥ 1, positive finite hyper-parameters and ratio).
    pub fn validate(&self) -> Result<()> {
        if self.n_components < 1 {
            return Err(invalid(
                "n_components",
                format!("must be >= 1, got {}", self.n_components),
            ));
        }
        if self.transform_start < 1 {
            return Err(invalid("transform_start", "must be >= 1 (1 = after the first sweep)"));
        }
        let h = &self.hyper;
        let named = [
            ("a_alpha", h.a_alpha),
            ("b_alpha", h.b_alpha),
            ("a_tau", h.a_tau),
            ("b_tau", h.b_tau),
            ("beta", h.beta),
            ("broad_alpha", h.broad_alpha),
            ("init_noise_ratio", self.init_noise_ratio),
        ];
        for (name, value) in named {
            if !(value.is_finite() && value > 0.0) {
                return Err(invalid(name, format!("must be finite and > 0, got {value}")));
            }
        }
        Ok(())
    }

    /// The loading prior as the rotation sees it.
    pub(crate) fn loading_prior(&self) -> LoadingPrior {
        match self.prior {
            Prior::Ard => LoadingPrior::Ard {
                shape: self.hyper.a_alpha,
                rate: self.hyper.b_alpha,
            },
            Prior::Broad => LoadingPrior::Fixed {
                alpha: self.hyper.broad_alpha,
            },
        }
    }
}

/// One coordinate update or transformation, addressable by name (for step-by-step use and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// q(h_n) for every n.
    Latents,
    /// q(c_d) for every d.
    Bias,
    /// q(f_d) for every d.
    Loadings,
    /// q(τ_d) for every d.
    Noise,
    /// q(α_k) for every k (no-op for the broad prior).
    Ard,
    /// The translation.
    Translate,
    /// The rotation (with the re-optimised q(α)).
    Rotate,
}

impl Step {
    /// Parse "latents", "bias", "loadings", "noise", "ard", "translate" or "rotate".
    pub fn parse(name: &str) -> Result<Step> {
        Ok(match name {
            "latents" => Step::Latents,
            "bias" => Step::Bias,
            "loadings" => Step::Loadings,
            "noise" => Step::Noise,
            "ard" => Step::Ard,
            "translate" => Step::Translate,
            "rotate" => Step::Rotate,
            other => {
                return Err(invalid(
                    "step",
                    format!("must be one of latents, bias, loadings, noise, ard, translate, rotate; got {other:?}"),
                ))
            }
        })
    }
}

/// q(α): Gamma factors (ARD) or the fixed broad precision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AlphaFactor {
    /// q(α_k) = G(shape_k, rate_k).
    Ard(Vec<GammaQ>),
    /// α_k = α for every k (no factor).
    Fixed(f64, usize),
}

impl AlphaFactor {
    /// ⟨α_k⟩ (K).
    pub(crate) fn means(&self) -> Array1<f64> {
        match self {
            AlphaFactor::Ard(q) => q.iter().map(GammaQ::mean).collect(),
            AlphaFactor::Fixed(alpha, k) => Array1::from_elem(*k, *alpha),
        }
    }

    /// ⟨ln α_k⟩ (K).
    pub(crate) fn mean_logs(&self) -> Array1<f64> {
        match self {
            AlphaFactor::Ard(q) => q.iter().map(GammaQ::mean_log).collect(),
            AlphaFactor::Fixed(alpha, k) => Array1::from_elem(*k, alpha.ln()),
        }
    }
}

/// The global factors shared by batch and online VB-FA (q(F)'s covariances are kept by each model).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Globals {
    /// c̄_d (D).
    pub(crate) c_mean: Array1<f64>,
    /// c̃_d (D).
    pub(crate) c_var: Array1<f64>,
    /// f̄_d as rows (D×K).
    pub(crate) f_mean: Array2<f64>,
    /// q(α).
    pub(crate) alpha: AlphaFactor,
    /// q(τ_d) (D).
    pub(crate) tau: Vec<GammaQ>,
}

impl Globals {
    /// ⟨τ_d⟩ (D).
    pub(crate) fn tau_means(&self) -> Array1<f64> {
        self.tau.iter().map(GammaQ::mean).collect()
    }

    /// Posterior-mean noise variances ψ_d = 1/⟨τ_d⟩ (D).
    pub(crate) fn noise_variance(&self) -> Array1<f64> {
        self.tau.iter().map(|q| 1.0 / q.mean()).collect()
    }
}

/// Per-column variance used to scale the initialisation: the observed variance, or (fewer than two
/// observations / constant column) the mean of the usable ones, or 1.
pub(crate) fn usable_variances(raw: &[f64], counts: &[f64]) -> Vec<f64> {
    let usable: Vec<f64> = raw
        .iter()
        .zip(counts)
        .filter(|(v, &n)| n >= 2.0 && v.is_finite() && **v > 0.0)
        .map(|(v, _)| *v)
        .collect();
    let fallback = if usable.is_empty() {
        1.0
    } else {
        usable.iter().sum::<f64>() / usable.len() as f64
    };
    raw.iter()
        .zip(counts)
        .map(|(&v, &n)| {
            if n >= 2.0 && v.is_finite() && v > 0.0 {
                v
            } else {
                fallback
            }
        })
        .collect()
}

#[cfg(test)]
mod send_sync {
    #[test]
    fn models_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::VbfaBatch>();
        assert_send_sync::<super::VbfaOnline>();
        assert_send_sync::<super::Rotation>();
    }
}
