//! Batch VB GFA: coordinate ascent over q(H), q(c), q(F), q(τ), q(α) on an N×D data matrix (NaN =
//! missing), the full bound after every sweep, factor dropping, and the translation + group rotation.
//!
//! State: q(h_n) = N(h̄_n, Σ_{h_n}) (N×K; one shared K×K covariance when nothing is missing),
//! q(f_d) = N(f̄_d, Σ_{f_d}) (D×K, D×K×K), q(c_d) = N(c̄_d, c̃_d), q(τ) (M or D Gamma factors),
//! q(α) (M×K Gamma factors), and VB-FA's column statistics of q(H) (kept consistent through every
//! update and transformation). One sweep costs O(N·K³ + |O|·K + |missing|·K² + L-BFGS on K² numbers).

use std::time::Instant;

use ndarray::{Array1, Array2, Array3, ArrayView2, Axis};

use super::lowrank::LowRankArd;
use super::rotation::{maximise_group_rotation, maximise_group_rotation_fixed};
use super::{GfaConfig, Groups, NoiseModel};
use crate::error::{invalid, FaError, Result};
use crate::init::fill_standard_normal;
use crate::linalg::Rotation;
use crate::scalar::Real;
use crate::vbfa::special::GammaQ;
use crate::vbfa::stats::{is_bad_entry, ColumnStats, LatentCovs, MissingPattern};
use crate::vbfa::updates::{
    bias_row, expected_squared_error, gaussian_from_natural, latent_row, loading_row, map_rows, second_moment,
    ColumnMoments, GaussianRow,
};
use crate::vbfa::{usable_variances, TranslationSystem};

/// The bound, the number of factors and the time after one sweep of [`GfaBatch::fit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GfaSweep {
    /// L after the sweep (and its transformations).
    pub elbo: f64,
    /// K during the sweep (after any dropping at its start).
    pub n_components: usize,
    /// Seconds since the start of the `fit` call.
    pub seconds: f64,
}

/// One coordinate update or transformation of GFA, addressable by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GfaStep {
    /// q(h_n) for every n.
    Latents,
    /// q(c_d) for every d.
    Bias,
    /// q(f_d) for every d.
    Loadings,
    /// q(τ) (per group or per feature).
    Noise,
    /// q(α_mk) for every group and factor.
    Ard,
    /// The exact translation.
    Translate,
    /// The group rotation (with the re-optimised q(α)).
    Rotate,
    /// Drop the inactive factors.
    Drop,
}

impl GfaStep {
    /// Parse "latents", "bias", "loadings", "noise", "ard", "translate", "rotate" or "drop".
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "latents" => GfaStep::Latents,
            "bias" => GfaStep::Bias,
            "loadings" => GfaStep::Loadings,
            "noise" => GfaStep::Noise,
            "ard" => GfaStep::Ard,
            "translate" => GfaStep::Translate,
            "rotate" => GfaStep::Rotate,
            "drop" => GfaStep::Drop,
            other => {
                return Err(invalid(
                    "step",
                    format!(
                        "must be one of latents, bias, loadings, noise, ard, translate, rotate, drop; got {other:?}"
                    ),
                ))
            }
        })
    }
}

/// Batch variational Bayesian group factor analysis of one data matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct GfaBatch {
    pub(super) config: GfaConfig,
    pub(super) groups: Groups,
    /// Data (N×D) with 0 where missing.
    pub(super) x: Array2<f64>,
    pub(super) missing: MissingPattern,
    pub(super) h_mean: Array2<f64>,
    pub(super) h_cov: LatentCovs,
    pub(super) c_mean: Array1<f64>,
    pub(super) c_var: Array1<f64>,
    pub(super) f_mean: Array2<f64>,
    pub(super) f_cov: Array3<f64>,
    pub(super) f_log_det: Array1<f64>,
    /// q(α_mk) (M×K).
    pub(super) alpha: Array2<GammaQ>,
    /// q(τ_m) (M) or q(τ_d) (D).
    pub(super) tau: Vec<GammaQ>,
    /// The low-rank ARD (then `alpha` is unused), or None for the full-rank q(α).
    pub(super) low_rank: Option<LowRankArd>,
    pub(super) stats: ColumnStats,
    /// Σ_{d∈m} (observed variance of feature d), the scale of the dropping rule (M).
    pub(super) group_variance: Vec<f64>,
    /// Original index (0..K at the start) of every factor still in the model.
    pub(super) kept: Vec<usize>,
    pub(super) n_sweeps: u64,
    pub(super) history: Vec<GfaSweep>,
    pub(super) converged: bool,
}

/// Reject empty data, infinite or huge values, a group with no observed value, a feature with no
/// observed value, and K > min(N, D).
pub(super) fn validate(x: ArrayView2<f64>, groups: &Groups, k: usize) -> Result<()> {
    let (n, d) = x.dim();
    if n < 1 || d < 1 {
        return Err(FaError::Shape {
            what: "X",
            expected: "(n_samples >= 1, n_features >= 1)".into(),
            got: vec![n, d],
        });
    }
    if groups.n_features() != d {
        return Err(invalid(
            "groups",
            format!(
                "assign {} features to groups but X has {d} features",
                groups.n_features()
            ),
        ));
    }
    for (row, values) in x.rows().into_iter().enumerate() {
        if values.iter().any(|&v| is_bad_entry(v, true)) {
            return Err(FaError::BadValue {
                row,
                kind: format!(
                    "an infinite value or one with |x| > {:e} (NaN marks a missing value)",
                    f64::MAX_INPUT
                ),
            });
        }
    }
    for m in 0..groups.n_groups() {
        if groups
            .members(m)
            .iter()
            .all(|&j| x.column(j).iter().all(|v| v.is_nan()))
        {
            return Err(invalid("X", format!("group {m} has no observed (non-NaN) value")));
        }
    }
    if let Some(col) = x.columns().into_iter().position(|c| c.iter().all(|v| v.is_nan())) {
        return Err(invalid("X", format!("feature {col} has no observed (non-NaN) value")));
    }
    if k > n.min(d) {
        return Err(invalid(
            "n_components",
            format!(
                "{k} factors exceed what {n} samples of {d} features support (at most min(N, D) = {})",
                n.min(d)
            ),
        ));
    }
    Ok(())
}

/// Observed mean, variance and count of every column.
fn column_moments(x: ArrayView2<f64>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for col in x.columns() {
        let observed: Vec<f64> = col.iter().copied().filter(|v| !v.is_nan()).collect();
        let n = observed.len() as f64;
        let mean = observed.iter().sum::<f64>() / n;
        out.0.push(mean);
        out.1.push(observed.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n);
        out.2.push(n);
    }
    out
}

impl GfaBatch {
    /// Set up q for `x` (N×D, NaN = missing) with feature groups `groups`, as VB-FA does: c̄ = observed
    /// means, ⟨τ⟩ = 1/(r·v) with r = `init_noise_ratio` and v the feature variance (per group: the mean
    /// over the group's features), f̄_dk ~ N(0, v_d/K) (seeded), Σ_{f_d} = r v_d/n_d · I, q(α) optimal for
    /// that q(F), q(h_n) = N(0, I).
    pub fn new(x: ArrayView2<f64>, groups: Groups, config: GfaConfig) -> Result<Self> {
        config.validate()?;
        let k = config.n_components;
        validate(x, &groups, k)?;
        let (n, d) = x.dim();
        let missing = MissingPattern::of(x);
        let x_zeroed = x.mapv(|v| if v.is_nan() { 0.0 } else { v });
        let (means, raw_vars, counts) = column_moments(x);
        let vars = usable_variances(&raw_vars, &counts);
        let (ratio, hyper) = (config.init_noise_ratio, config.hyper);
        let tau = match config.noise {
            NoiseModel::Feature => vars
                .iter()
                .zip(&counts)
                .map(|(&v, &count)| {
                    let shape = hyper.a_tau + 0.5 * count;
                    GammaQ {
                        shape,
                        rate: shape * ratio * v,
                    }
                })
                .collect(),
            NoiseModel::Group => (0..groups.n_groups())
                .map(|m| {
                    let members = groups.members(m);
                    let count: f64 = members.iter().map(|&j| counts[j]).sum();
                    let v = members.iter().map(|&j| vars[j]).sum::<f64>() / members.len() as f64;
                    let shape = hyper.a_tau + 0.5 * count;
                    GammaQ {
                        shape,
                        rate: shape * ratio * v,
                    }
                })
                .collect(),
        };
        let group_variance = (0..groups.n_groups())
            .map(|m| groups.members(m).iter().map(|&j| vars[j]).sum())
            .collect();
        let mut f_mean = Array2::zeros((d, k));
        fill_standard_normal(f_mean.view_mut(), config.seed);
        for (mut row, &v) in f_mean.rows_mut().into_iter().zip(&vars) {
            row *= (v / k as f64).sqrt();
        }
        let mut f_cov = Array3::zeros((d, k, k));
        let mut f_log_det = Array1::zeros(d);
        for j in 0..d {
            let var = ratio * vars[j] / counts[j];
            f_cov.index_axis_mut(Axis(0), j).diag_mut().fill(var);
            f_log_det[j] = k as f64 * var.ln();
        }
        let h_mean = Array2::zeros((n, k));
        let h_cov = if missing.any() {
            let mut cov = Array3::zeros((n, k, k));
            cov.outer_iter_mut().for_each(|mut c| c.diag_mut().fill(1.0));
            LatentCovs::PerRow {
                cov,
                log_det: Array1::zeros(n),
            }
        } else {
            LatentCovs::Shared {
                cov: Array2::eye(k),
                log_det: 0.0,
                n_rows: n,
            }
        };
        let stats = ColumnStats::from_latents(x_zeroed.view(), &missing, h_mean.view(), &h_cov);
        let alpha = Array2::from_elem((groups.n_groups(), k), GammaQ { shape: 1.0, rate: 1.0 });
        let low_rank = config.ard_rank.map(|r| {
            LowRankArd::new(
                groups.n_groups(),
                k,
                r,
                config.ard_lambda,
                config.seed ^ 0x9e37_79b9_7f4a_7c15,
            )
        });
        let mut model = GfaBatch {
            config,
            groups,
            x: x_zeroed,
            missing,
            h_mean,
            h_cov,
            c_mean: Array1::from(means),
            c_var: Array1::zeros(d),
            f_mean,
            f_cov,
            f_log_det,
            alpha,
            tau,
            low_rank,
            stats,
            group_variance,
            kept: (0..k).collect(),
            n_sweeps: 0,
            history: Vec::new(),
            converged: false,
        };
        let tau_d = model.tau_of_features();
        model.c_var = Array1::from_iter((0..d).map(|j| 1.0 / (hyper.beta + counts[j] * tau_d[j])));
        model.update_ard();
        Ok(model)
    }

    /// Apply one coordinate update or transformation.
    pub fn apply(&mut self, step: GfaStep) -> Result<()> {
        match step {
            GfaStep::Latents => self.update_latents(),
            GfaStep::Bias => {
                self.update_bias();
                Ok(())
            }
            GfaStep::Loadings => self.update_loadings(),
            GfaStep::Noise => {
                self.update_noise();
                Ok(())
            }
            GfaStep::Ard => {
                self.update_ard();
                Ok(())
            }
            GfaStep::Translate => self.translate().map(|_| ()),
            GfaStep::Rotate => self.rotate().map(|_| ()),
            GfaStep::Drop => self.drop_inactive().map(|_| ()),
        }
    }

    /// One sweep: drop inactive factors (if enabled, from the second sweep on), q(H), q(c), q(F), q(τ),
    /// q(α), then (from sweep `rotate_start` on, if enabled) the translation and the rotation.
    pub fn sweep(&mut self) -> Result<()> {
        if self.config.drop_factors && self.n_sweeps >= 1 {
            self.drop_inactive()?;
        }
        self.update_latents()?;
        self.update_bias();
        self.update_loadings()?;
        self.update_noise();
        self.update_ard();
        self.n_sweeps += 1;
        if self.config.rotate && self.n_sweeps >= self.config.rotate_start {
            self.translate()?;
            self.rotate()?;
        }
        Ok(())
    }

    /// Up to `max_iter` sweeps, recording L after each; stop once |L_t − L_{t−1}| ≤ tol·|L_t| with K
    /// unchanged by the sweep. Returns the number of sweeps run.
    pub fn fit(&mut self, max_iter: usize, tol: f64) -> Result<usize> {
        if !(tol.is_finite() && tol >= 0.0) {
            return Err(invalid("tol", format!("must be finite and >= 0, got {tol}")));
        }
        let start = Instant::now();
        self.converged = false;
        let mut previous: Option<(f64, usize)> = None;
        for sweep in 1..=max_iter {
            self.sweep()?;
            let elbo = self.elbo();
            if !elbo.is_finite() {
                return Err(FaError::NotPositiveDefinite(
                    "the model (its lower bound is not finite)",
                ));
            }
            let k = self.f_mean.ncols();
            self.history.push(GfaSweep {
                elbo,
                n_components: k,
                seconds: start.elapsed().as_secs_f64(),
            });
            if let Some((prev, prev_k)) = previous {
                if prev_k == k && (elbo - prev).abs() <= tol * elbo.abs() {
                    self.converged = true;
                    return Ok(sweep);
                }
            }
            previous = Some((elbo, k));
        }
        Ok(max_iter)
    }

    /// ⟨τ⟩ of every feature's noise (D).
    pub fn tau_of_features(&self) -> Array1<f64> {
        Array1::from_iter((0..self.groups.n_features()).map(|d| self.tau[self.noise_index(d)].mean()))
    }

    /// Index into `tau` of feature d's precision.
    pub(super) fn noise_index(&self, d: usize) -> usize {
        match self.config.noise {
            NoiseModel::Group => self.groups.of(d),
            NoiseModel::Feature => d,
        }
    }

    /// ⟨α_mk⟩ (M×K); α itself for the low-rank ARD.
    pub fn alpha_means(&self) -> Array2<f64> {
        match &self.low_rank {
            Some(lr) => lr.log_alpha().mapv(f64::exp),
            None => self.alpha.mapv(|q| q.mean()),
        }
    }

    /// ⟨ln α_mk⟩ (M×K); ln α for the low-rank ARD.
    pub fn alpha_mean_logs(&self) -> Array2<f64> {
        match &self.low_rank {
            Some(lr) => lr.log_alpha(),
            None => self.alpha.mapv(|q| q.mean_log()),
        }
    }

    /// q(h_n) for every row, then the column statistics.
    pub fn update_latents(&mut self) -> Result<()> {
        let (means, covs) = self.latent_posteriors(self.x.view(), &self.missing)?;
        self.h_mean = means;
        self.h_cov = covs;
        self.stats = ColumnStats::from_latents(self.x.view(), &self.missing, self.h_mean.view(), &self.h_cov);
        Ok(())
    }

    /// q(h_n) of the rows of `x_zeroed` (0 where missing) given the global factors (the GFA notes' q(z_i)
    /// with the sum over groups): Λ_n = I + Σ_{d∈O_n} ⟨τ_{g(d)}⟩⟨f_d f_dᵀ⟩,
    /// h̄_n = Λ_n⁻¹ Σ_{d∈O_n} ⟨τ_{g(d)}⟩ f̄_d (x_nd − c̄_d). Returns (means N×K, covariances).
    pub(super) fn latent_posteriors(
        &self,
        x_zeroed: ArrayView2<f64>,
        missing: &MissingPattern,
    ) -> Result<(Array2<f64>, LatentCovs)> {
        let (d, k) = self.f_mean.dim();
        let n = x_zeroed.nrows();
        let tau = self.tau_of_features();
        let mut weighted_rows = Array3::zeros((d, k, k));
        for (j, mut w) in weighted_rows.outer_iter_mut().enumerate() {
            w.assign(&(second_moment(self.f_mean.row(j), self.f_cov.index_axis(Axis(0), j)) * tau[j]));
        }
        let total = weighted_rows.sum_axis(Axis(0));
        let mut centred = &x_zeroed - &self.c_mean;
        for (i, cols) in missing.by_row.iter().enumerate() {
            cols.iter().for_each(|&j| centred[[i, j]] = 0.0);
        }
        centred *= &tau;
        let u = centred.dot(&self.f_mean);
        if !missing.any() {
            let precision = &total + &Array2::<f64>::eye(k);
            let q = gaussian_from_natural(precision.view(), Array1::zeros(k).view(), "latent precision")?;
            let means = u.dot(&q.cov);
            let covs = LatentCovs::Shared {
                cov: q.cov,
                log_det: q.log_det,
                n_rows: n,
            };
            return Ok((means, covs));
        }
        let rows: Vec<GaussianRow> = map_rows(n, k, |i| {
            latent_row(total.view(), weighted_rows.view(), &missing.by_row[i], u.row(i))
        })?;
        let mut means = Array2::zeros((n, k));
        let mut cov = Array3::zeros((n, k, k));
        let mut log_det = Array1::zeros(n);
        for (i, row) in rows.into_iter().enumerate() {
            means.row_mut(i).assign(&row.mean);
            cov.index_axis_mut(Axis(0), i).assign(&row.cov);
            log_det[i] = row.log_det;
        }
        Ok((means, LatentCovs::PerRow { cov, log_det }))
    }

    /// q(c_d) for every feature (VB-FA's `bias_row` with τ of the feature's group).
    pub fn update_bias(&mut self) {
        let tau = self.tau_of_features();
        for d in 0..self.groups.n_features() {
            let (mean, var) = bias_row(
                self.stats.count[d],
                self.stats.sum_x[d],
                self.stats.sum_h.row(d),
                self.f_mean.row(d),
                tau[d],
                self.config.hyper.beta,
            );
            self.c_mean[d] = mean;
            self.c_var[d] = var;
        }
    }

    /// q(f_d) for every feature (the GFA notes' q(W) column update, with the bias): Λ_d = diag⟨α_{g(d)}⟩ +
    /// ⟨τ_{g(d)}⟩ G_d, f̄_d = Λ_d⁻¹ ⟨τ_{g(d)}⟩ (p_d − c̄_d m_d).
    pub fn update_loadings(&mut self) -> Result<()> {
        let tau = self.tau_of_features();
        let alpha = self.alpha_means();
        let (stats, c_mean, groups) = (&self.stats, &self.c_mean, &self.groups);
        let rows = map_rows(groups.n_features(), alpha.ncols(), |d| {
            loading_row(
                stats.gram.column(d),
                stats.sum_xh.row(d),
                stats.sum_h.row(d),
                c_mean[d],
                tau[d],
                alpha.row(groups.of(d)),
            )
        })?;
        for (d, row) in rows.into_iter().enumerate() {
            self.f_mean.row_mut(d).assign(&row.mean);
            self.f_cov.index_axis_mut(Axis(0), d).assign(&row.cov);
            self.f_log_det[d] = row.log_det;
        }
        Ok(())
    }

    /// q(τ): per group G(a_τ + ½ Σ_{d∈m} n_d, b_τ + ½ Σ_{d∈m} E_d) (the notes' q(τ_m) with the missing ½),
    /// per feature G(a_τ + ½ n_d, b_τ + ½ E_d), E_d = Σ_{n∈O_d} ⟨(x_nd − f_dᵀh_n − c_d)²⟩.
    pub fn update_noise(&mut self) {
        let hyper = self.config.hyper;
        let errors: Vec<f64> = (0..self.groups.n_features())
            .map(|d| {
                expected_squared_error(
                    &self.column_moments(d),
                    self.c_mean[d],
                    self.c_var[d],
                    self.f_mean.row(d),
                    self.f_cov.index_axis(Axis(0), d),
                )
            })
            .collect();
        for q in self.tau.iter_mut() {
            *q = GammaQ {
                shape: hyper.a_tau,
                rate: hyper.b_tau,
            };
        }
        for (d, e) in errors.into_iter().enumerate() {
            let q = &mut self.tau[match self.config.noise {
                NoiseModel::Group => self.groups.of(d),
                NoiseModel::Feature => d,
            }];
            q.shape += 0.5 * self.stats.count[d];
            q.rate += 0.5 * e;
        }
    }

    /// q(α_mk) = G(a_α + D_m/2, b_α + ½ Σ_{d∈m} ⟨f_dk²⟩) (the notes' full-rank q(α)), or for the low-rank
    /// ARD the L-BFGS re-fit of (U, V, μ_u, μ_v) to B_mk = Σ_{d∈m} ⟨f_dk²⟩ from their current values.
    pub fn update_ard(&mut self) {
        let hyper = self.config.hyper;
        let k = self.f_mean.ncols();
        if self.low_rank.is_some() {
            let b = Array2::from_shape_fn((self.groups.n_groups(), k), |(m, j)| {
                self.groups
                    .members(m)
                    .iter()
                    .map(|&d| self.f_mean[[d, j]].powi(2) + self.f_cov[[d, j, j]])
                    .sum::<f64>()
            });
            let sizes = self.groups.sizes();
            if let Some(lr) = self.low_rank.as_mut() {
                lr.fit(b.view(), &sizes);
            }
            return;
        }
        let mut alpha = Array2::from_elem((self.groups.n_groups(), k), GammaQ { shape: 1.0, rate: 1.0 });
        for m in 0..self.groups.n_groups() {
            let members = self.groups.members(m);
            for j in 0..k {
                let sq: f64 = members
                    .iter()
                    .map(|&d| self.f_mean[[d, j]].powi(2) + self.f_cov[[d, j, j]])
                    .sum();
                alpha[[m, j]] = GammaQ {
                    shape: hyper.a_alpha + 0.5 * members.len() as f64,
                    rate: hyper.b_alpha + 0.5 * sq,
                };
            }
        }
        self.alpha = alpha;
    }

    /// The exact translation h̄_n ← h̄_n − b, c̄_d ← c̄_d + f̄_dᵀ b with b the maximiser of the bound
    /// (VB-FA's [`TranslationSystem`] with the features' τ): P = N I + Σ_d ⟨τ_d⟩ n_d Σ_{f_d} + β F̄ᵀF̄,
    /// v = Σ_n h̄_n + Σ_d ⟨τ_d⟩ Σ_{f_d} m_d − β F̄ᵀ c̄. Returns b (K).
    pub fn translate(&mut self) -> Result<Array1<f64>> {
        let k = self.f_mean.ncols();
        let tau = self.tau_of_features();
        let beta = self.config.hyper.beta;
        let f = &self.f_mean;
        let mut precision = Array2::<f64>::eye(k) * self.stats.n_rows + f.t().dot(f) * beta;
        let mut rhs = &self.stats.total_h - &(f.t().dot(&self.c_mean) * beta);
        for d in 0..f.nrows() {
            let cov = self.f_cov.index_axis(Axis(0), d);
            precision.scaled_add(tau[d] * self.stats.count[d], &cov);
            rhs += &(cov.dot(&self.stats.sum_h.row(d)) * tau[d]);
        }
        let b = TranslationSystem { precision, rhs }.solve()?;
        self.h_mean -= &b;
        self.c_mean += &self.f_mean.dot(&b);
        self.stats.translate(b.view());
        Ok(b)
    }

    /// W_m = Σ_{d∈m} ⟨f_d f_dᵀ⟩ for every group (M of K×K).
    pub fn group_loading_grams(&self) -> Vec<Array2<f64>> {
        (0..self.groups.n_groups())
            .map(|m| {
                let members = self.groups.members(m);
                let f = self.f_mean.select(Axis(0), members);
                let cov_sum = members
                    .iter()
                    .fold(Array2::zeros((f.ncols(), f.ncols())), |acc: Array2<f64>, &d| {
                        acc + self.f_cov.index_axis(Axis(0), d)
                    });
                f.t().dot(&f) + cov_sum
            })
            .collect()
    }

    /// The group rotation (see `rotation.rs`) applied to q(H), q(F) and the statistics, then q(α).
    /// Returns R and the gain of the bound f(R) − f(I) ≥ 0 (before the q(α) update; for the low-rank ARD
    /// α is held fixed during the rotation and re-fitted after it, which can only add to the gain).
    pub fn rotate(&mut self) -> Result<(Rotation, f64)> {
        let hyper = self.config.hyper;
        let (grams, sizes) = (self.group_loading_grams(), self.groups.sizes());
        let (s, n) = (self.stats.total_gram.view(), self.stats.n_rows);
        let (rot, gain) = match &self.low_rank {
            Some(_) => maximise_group_rotation_fixed(s, n, &grams, &sizes, self.alpha_means().view())?,
            None => maximise_group_rotation(s, n, &grams, &sizes, hyper.a_alpha, hyper.b_alpha)?,
        };
        self.h_mean = rot.latents(self.h_mean.view());
        self.h_cov.rotate(&rot);
        self.f_mean = rot.loadings(self.f_mean.view());
        for mut c in self.f_cov.outer_iter_mut() {
            let new = rot.loading_moment(c.view());
            c.assign(&new);
        }
        self.f_log_det += 2.0 * rot.log_abs_det;
        self.stats.rotate(&rot);
        self.update_ard();
        Ok((rot, gain))
    }

    pub(super) fn column_moments(&self, d: usize) -> ColumnMoments<'_> {
        ColumnMoments {
            count: self.stats.count[d],
            sum_x: self.stats.sum_x[d],
            sum_xx: self.stats.sum_xx[d],
            sum_h: self.stats.sum_h.row(d),
            sum_xh: self.stats.sum_xh.row(d),
            gram: self.stats.gram.column(d),
        }
    }

    /// Settings.
    pub fn config(&self) -> &GfaConfig {
        &self.config
    }
    /// The groups.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }
    /// h̄_n (N×K).
    pub fn latent_mean(&self) -> &Array2<f64> {
        &self.h_mean
    }
    /// Σ_{h_n} (N×K×K).
    pub fn latent_cov(&self) -> Array3<f64> {
        self.h_cov.to_array()
    }
    /// c̄_d (D).
    pub fn bias_mean(&self) -> &Array1<f64> {
        &self.c_mean
    }
    /// c̃_d (D).
    pub fn bias_var(&self) -> &Array1<f64> {
        &self.c_var
    }
    /// f̄_d as rows (D×K).
    pub fn loading_mean(&self) -> &Array2<f64> {
        &self.f_mean
    }
    /// Σ_{f_d} (D×K×K).
    pub fn loading_cov(&self) -> &Array3<f64> {
        &self.f_cov
    }
    /// q(α_mk) (M×K).
    pub fn ard(&self) -> &Array2<GammaQ> {
        &self.alpha
    }
    /// q(τ) (M per group, or D per feature).
    pub fn noise(&self) -> &[GammaQ] {
        &self.tau
    }
    /// 1/⟨τ⟩ of every feature's noise (D).
    pub fn noise_variance(&self) -> Array1<f64> {
        self.tau_of_features().mapv(|t| 1.0 / t)
    }
    /// Original indices (0..K at construction) of the factors still in the model.
    pub fn kept_components(&self) -> &[usize] {
        &self.kept
    }
    /// Sweeps run so far.
    pub fn n_sweeps(&self) -> u64 {
        self.n_sweeps
    }
    /// L, K and time after each sweep of `fit`.
    pub fn history(&self) -> &[GfaSweep] {
        &self.history
    }
    /// Whether the last `fit` met its tolerance.
    pub fn converged(&self) -> bool {
        self.converged
    }
}
