//! The full lower bound of GFA: VB-FA's bound (`crate::vbfa::elbo`) with the noise precision of each
//! feature's group and the ARD precision of each feature's group and factor:
//!
//! L = Σ_{(n,d)∈O} [−½ ln 2π + ½⟨ln τ_{g(d)}⟩ − ½⟨τ_{g(d)}⟩ e_nd]                       (likelihood)
//!   − ½ Σ_n [tr⟨h_n h_nᵀ⟩ − K − ln|Σ_{h_n}|]                                          (latents)
//!   − ½ Σ_d [β(c̄_d² + c̃_d) − 1 − ln(β c̃_d)]                                          (bias)
//!   + Σ_d [½ Σ_k ⟨ln α_{g(d)k}⟩ − ½ Σ_k ⟨α_{g(d)k}⟩⟨f_dk²⟩ + ½ ln|Σ_{f_d}| + K/2]      (loadings)
//!   + Σ_{m,k} [E ln G(α_mk | a_α, b_α) + H q(α_mk)] + Σ_τ [E ln G(τ | a_τ, b_τ) + H q(τ)].
//!
//! For the low-rank ARD (α a point estimate) ⟨ln α⟩ = ln α, ⟨α⟩ = α, and the α term is ln p(U) + ln p(V)
//! (the bound of ln p(X, U, V), maximised over U, V).

use super::batch::GfaBatch;
use crate::vbfa::elbo::HALF_LN_2PI;
use crate::vbfa::updates::expected_squared_error;

/// The GFA bound split by factor; [`GfaBoundTerms::total`] is L.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GfaBoundTerms {
    /// Expected log-likelihood of the observed entries.
    pub likelihood: f64,
    /// −KL(q(H)‖p(H)).
    pub latents: f64,
    /// −KL(q(c)‖p(c)).
    pub bias: f64,
    /// E[ln p(F|α)] + H[q(F)].
    pub loadings: f64,
    /// −KL(q(α)‖p(α)) over the M×K precisions (low-rank ARD: ln p(U) + ln p(V)).
    pub ard: f64,
    /// −KL(q(τ)‖p(τ)) over the M (or D) precisions.
    pub noise: f64,
}

impl GfaBoundTerms {
    /// L, the sum of the terms.
    pub fn total(&self) -> f64 {
        self.likelihood + self.latents + self.bias + self.loadings + self.ard + self.noise
    }
}

impl GfaBatch {
    /// The bound L of the current q, split by factor. O(D·K²) given the column statistics.
    pub fn bound_terms(&self) -> GfaBoundTerms {
        let hyper = self.config.hyper;
        let k = self.f_mean.ncols();
        let alpha_means = self.alpha_means();
        let alpha_logs = self.alpha_mean_logs();
        let (mut likelihood, mut bias, mut loadings) = (0.0, 0.0, 0.0);
        for d in 0..self.groups.n_features() {
            let m = self.groups.of(d);
            let col = self.column_moments(d);
            let (c_mean, c_var) = (self.c_mean[d], self.c_var[d]);
            let f = self.f_mean.row(d);
            let cov = self.f_cov.index_axis(ndarray::Axis(0), d);
            let e = expected_squared_error(&col, c_mean, c_var, f, cov);
            let tau = self.tau[self.noise_index(d)];
            likelihood += col.count * (-HALF_LN_2PI + 0.5 * tau.mean_log()) - 0.5 * tau.mean() * e;
            bias -= 0.5 * (hyper.beta * (c_mean * c_mean + c_var) - 1.0 - (hyper.beta * c_var).ln());
            let weighted_sq: f64 = (0..k).map(|j| alpha_means[[m, j]] * (f[j] * f[j] + cov[[j, j]])).sum();
            loadings += 0.5 * alpha_logs.row(m).sum() - 0.5 * weighted_sq + 0.5 * self.f_log_det[d] + 0.5 * k as f64;
        }
        let latents =
            -0.5 * (self.stats.total_gram.diag().sum() - self.stats.n_rows * k as f64 - self.h_cov.log_det_sum());
        let ard = match &self.low_rank {
            Some(lr) => lr.log_prior(),
            None => self
                .alpha
                .iter()
                .map(|q| q.prior_plus_entropy(hyper.a_alpha, hyper.b_alpha))
                .sum(),
        };
        let noise = self
            .tau
            .iter()
            .map(|q| q.prior_plus_entropy(hyper.a_tau, hyper.b_tau))
            .sum();
        GfaBoundTerms {
            likelihood,
            latents,
            bias,
            loadings,
            ard,
            noise,
        }
    }

    /// The full lower bound L.
    pub fn elbo(&self) -> f64 {
        self.bound_terms().total()
    }
}
