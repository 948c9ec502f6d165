//! The full variational lower bound of VB-FA (README "Full ELBO of VB-FA", in project notation), from the
//! column statistics of q(H) and the global factors. Every term is O(D·K²) given the statistics.

use ndarray::{Array3, ArrayView1, Axis};

use super::stats::ColumnStats;
use super::updates::{expected_squared_error, ColumnMoments};
use super::{AlphaFactor, Globals, Hyper};

/// ½ ln 2π.
pub(crate) const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// The bound split by factor; [`BoundTerms::total`] is L.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundTerms {
    /// Σ_{(n,d)∈O} [−½ ln 2π + ½⟨ln τ_d⟩ − ½⟨τ_d⟩ e_nd].
    pub likelihood: f64,
    /// −KL(q(H)‖p(H)) = −½ Σ_n [tr Σ_{h_n} + h̄_nᵀh̄_n − K − ln|Σ_{h_n}|].
    pub latents: f64,
    /// −KL(q(c)‖p(c)) = −½ Σ_d [β(c̄_d² + c̃_d) − 1 − ln(β c̃_d)].
    pub bias: f64,
    /// E[ln p(F|α)] + H[q(F)] = Σ_d [½ Σ_k ⟨ln α_k⟩ − ½ Σ_k ⟨α_k⟩⟨f_dk²⟩ + ½ ln|Σ_{f_d}| + K/2].
    pub loadings: f64,
    /// Σ_k [E ln G(α_k | a_α, b_α) + H[q(α_k)]] (0 for the broad prior).
    pub ard: f64,
    /// Σ_d [E ln G(τ_d | a_τ, b_τ) + H[q(τ_d)]].
    pub noise: f64,
}

impl BoundTerms {
    /// L, the sum of the terms.
    pub fn total(&self) -> f64 {
        self.likelihood + self.latents + self.bias + self.loadings + self.ard + self.noise
    }
}

/// The bound for q(H) summarised by `stats` (plus Σ_n ln|Σ_{h_n}|), the global factors, and q(F)'s
/// covariances `f_cov` (D×K×K) with their log-determinants.
pub(crate) fn bound(
    stats: &ColumnStats,
    globals: &Globals,
    f_cov: &Array3<f64>,
    f_log_det: ArrayView1<f64>,
    h_log_det_sum: f64,
    hyper: &Hyper,
) -> BoundTerms {
    let k = globals.f_mean.ncols() as f64;
    let alpha_means = globals.alpha.means();
    let alpha_logs_sum = globals.alpha.mean_logs().sum();
    let mut likelihood = 0.0;
    let mut bias = 0.0;
    let mut loadings = 0.0;
    for d in 0..stats.n_cols() {
        let (sum_h, sum_xh) = stats.column_latents(d);
        let col = ColumnMoments {
            count: stats.count[d],
            sum_x: stats.sum_x[d],
            sum_xx: stats.sum_xx[d],
            sum_h,
            sum_xh,
            gram: stats.gram.column(d),
        };
        let (c_mean, c_var) = (globals.c_mean[d], globals.c_var[d]);
        let f_mean = globals.f_mean.row(d);
        let cov = f_cov.index_axis(Axis(0), d);
        let e = expected_squared_error(&col, c_mean, c_var, f_mean, cov);
        let tau = globals.tau[d];
        likelihood += col.count * (-HALF_LN_2PI + 0.5 * tau.mean_log()) - 0.5 * tau.mean() * e;
        bias -= 0.5 * (hyper.beta * (c_mean * c_mean + c_var) - 1.0 - (hyper.beta * c_var).ln());
        let weighted_sq: f64 = f_mean
            .iter()
            .zip(cov.diag())
            .zip(alpha_means.iter())
            .map(|((f, v), a)| a * (f * f + v))
            .sum();
        loadings += 0.5 * alpha_logs_sum - 0.5 * weighted_sq + 0.5 * f_log_det[d] + 0.5 * k;
    }
    let latents = -0.5 * (stats.total_gram.diag().sum() - stats.n_rows * k - h_log_det_sum);
    let ard = match &globals.alpha {
        AlphaFactor::Ard(q) => q
            .iter()
            .map(|a| a.prior_plus_entropy(hyper.a_alpha, hyper.b_alpha))
            .sum(),
        AlphaFactor::Fixed(..) => 0.0,
    };
    let noise = globals
        .tau
        .iter()
        .map(|t| t.prior_plus_entropy(hyper.a_tau, hyper.b_tau))
        .sum();
    BoundTerms {
        likelihood,
        latents,
        bias,
        loadings,
        ard,
        noise,
    }
}
