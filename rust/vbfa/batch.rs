//! Batch VB-FA: coordinate ascent over q(H), q(c), q(F), q(τ), q(α) on an N×D data matrix with missing
//! values (NaN), the full bound after every sweep, and the translation + rotation from a chosen sweep on.
//!
//! State: q(h_n) = N(h̄_n, Σ_{h_n}) (N×K, N×K×K), q(f_d) = N(f̄_d, Σ_{f_d}) (D×K, D×K×K), the global
//! factors of [`Globals`], and the column statistics of q(H) (kept consistent with q(H) through every
//! update and transformation). One sweep costs O(N·K³ + |O|·K + |M|·K²) with |M| missing entries
//! (complete data: one K×K factorisation serves every row).

use std::time::Instant;

use ndarray::{Array1, Array2, Array3, ArrayView2, Axis};

use super::elbo::{bound, BoundTerms};
use super::special::GammaQ;
use super::stats::{is_bad_entry, ColumnStats, LatentCovs, MissingPattern};
use super::transform::{mean_translation, optimal_rotation, TranslationSystem};
use super::updates::{
    ard_factors, bias_row, expected_squared_error, gaussian_from_natural, latent_row, loading_row, map_rows, noise_row,
    second_moment, ColumnMoments, GaussianRow,
};
use super::{usable_variances, AlphaFactor, Globals, Prior, Step, Translation, VbfaConfig};
use crate::error::{invalid, FaError, Result};
use crate::init::fill_standard_normal;
use crate::linalg::Rotation;
use crate::scalar::Real;

/// The bound and the wall-clock time after one sweep of [`VbfaBatch::fit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepRecord {
    /// L after the sweep (and its transformations).
    pub elbo: f64,
    /// Seconds since the start of the `fit` call.
    pub seconds: f64,
}

/// Batch variational Bayesian factor analysis of one data matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct VbfaBatch {
    pub(super) config: VbfaConfig,
    /// Data (N×D) with 0 where missing.
    pub(super) x: Array2<f64>,
    pub(super) missing: MissingPattern,
    pub(super) h_mean: Array2<f64>,
    pub(super) h_cov: LatentCovs,
    pub(super) globals: Globals,
    pub(super) f_cov: Array3<f64>,
    pub(super) f_log_det: Array1<f64>,
    pub(super) stats: ColumnStats,
    pub(super) n_sweeps: u64,
    pub(super) history: Vec<SweepRecord>,
    pub(super) converged: bool,
}

/// Check a data matrix (NaN = missing; ±Inf or |x| > 1e100 rejected; every column observed at least once).
fn validate_data(x: ArrayView2<f64>) -> Result<()> {
    let (n, d) = x.dim();
    if n < 1 || d < 1 {
        return Err(FaError::Shape {
            what: "X",
            expected: "(n_samples >= 1, n_features >= 1)".into(),
            got: vec![n, d],
        });
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
    if let Some(col) = x.columns().into_iter().position(|c| c.iter().all(|v| v.is_nan())) {
        return Err(invalid("X", format!("column {col} has no observed (non-NaN) value")));
    }
    Ok(())
}

/// Observed mean, variance and count of every column.
fn column_moments(x: ArrayView2<f64>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut means = Vec::new();
    let mut vars = Vec::new();
    let mut counts = Vec::new();
    for col in x.columns() {
        let observed: Vec<f64> = col.iter().copied().filter(|v| !v.is_nan()).collect();
        let n = observed.len() as f64;
        let mean = observed.iter().sum::<f64>() / n;
        let var = observed.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        means.push(mean);
        vars.push(var);
        counts.push(n);
    }
    (means, vars, counts)
}

impl VbfaBatch {
    /// Set up q for the data `x` (N×D, NaN = missing): c̄ = observed column means, ⟨τ_d⟩ = 1/(r·v_d) with
    /// r = `init_noise_ratio` and v_d the column variance (the paper's "τ large"), f̄_dk ~ N(0, v_d/K)
    /// (seeded), Σ_{f_d} = r v_d/n_d · I, q(α) optimal for that q(F), q(h_n) = N(0, I) (the prior).
    pub fn new(x: ArrayView2<f64>, config: VbfaConfig) -> Result<Self> {
        config.validate()?;
        validate_data(x)?;
        let (n, d) = x.dim();
        let k = config.n_components;
        let missing = MissingPattern::of(x);
        let x_zeroed = x.mapv(|v| if v.is_nan() { 0.0 } else { v });
        let (means, raw_vars, counts) = column_moments(x);
        let vars = usable_variances(&raw_vars, &counts);
        let ratio = config.init_noise_ratio;
        let hyper = config.hyper;
        let tau: Vec<GammaQ> = vars
            .iter()
            .zip(&counts)
            .map(|(&v, &count)| {
                let shape = hyper.a_tau + 0.5 * count;
                GammaQ {
                    shape,
                    rate: shape * ratio * v,
                }
            })
            .collect();
        let c_var = Array1::from_iter(
            tau.iter()
                .zip(&counts)
                .map(|(t, &count)| 1.0 / (hyper.beta + count * t.mean())),
        );
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
        let alpha = match config.prior {
            Prior::Ard => AlphaFactor::Ard(Vec::new()),
            Prior::Broad => AlphaFactor::Fixed(hyper.broad_alpha, k),
        };
        let globals = Globals {
            c_mean: Array1::from(means),
            c_var,
            f_mean,
            alpha,
            tau,
        };
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
        let mut model = VbfaBatch {
            config,
            x: x_zeroed,
            missing,
            h_mean,
            h_cov,
            globals,
            f_cov,
            f_log_det,
            stats,
            n_sweeps: 0,
            history: Vec::new(),
            converged: false,
        };
        model.update_ard();
        Ok(model)
    }

    /// Apply one coordinate update or transformation.
    pub fn apply(&mut self, step: Step) -> Result<()> {
        match step {
            Step::Latents => self.update_latents(),
            Step::Bias => {
                self.update_bias();
                Ok(())
            }
            Step::Loadings => self.update_loadings(),
            Step::Noise => {
                self.update_noise();
                Ok(())
            }
            Step::Ard => {
                self.update_ard();
                Ok(())
            }
            Step::Translate => self.translate().map(|_| ()),
            Step::Rotate => self.rotate().map(|_| ()),
        }
    }

    /// One sweep: q(H), q(c), q(F), q(τ), q(α), then (from sweep `transform_start` on, if enabled) the
    /// translation and the rotation.
    pub fn sweep(&mut self) -> Result<()> {
        self.update_latents()?;
        self.update_bias();
        self.update_loadings()?;
        self.update_noise();
        self.update_ard();
        self.n_sweeps += 1;
        if self.config.transform && self.n_sweeps >= self.config.transform_start {
            self.translate()?;
            self.rotate()?;
        }
        Ok(())
    }

    /// Run up to `max_iter` sweeps, recording L and the elapsed time after each; stop once
    /// |L_t − L_{t−1}| ≤ tol·|L_t|. Returns the number of sweeps run.
    pub fn fit(&mut self, max_iter: usize, tol: f64) -> Result<usize> {
        if !(tol.is_finite() && tol >= 0.0) {
            return Err(invalid("tol", format!("must be finite and >= 0, got {tol}")));
        }
        let start = Instant::now();
        self.converged = false;
        let mut previous: Option<f64> = None;
        for sweep in 1..=max_iter {
            self.sweep()?;
            let elbo = self.elbo();
            if !elbo.is_finite() {
                return Err(FaError::NotPositiveDefinite(
                    "the model (its lower bound is not finite)",
                ));
            }
            self.history.push(SweepRecord {
                elbo,
                seconds: start.elapsed().as_secs_f64(),
            });
            if let Some(prev) = previous {
                if (elbo - prev).abs() <= tol * elbo.abs() {
                    self.converged = true;
                    return Ok(sweep);
                }
            }
            previous = Some(elbo);
        }
        Ok(max_iter)
    }

    /// q(h_n) for every row (see `updates::latent_row`), then the column statistics.
    pub fn update_latents(&mut self) -> Result<()> {
        let rows = self.latent_posteriors(self.x.view(), &self.missing)?;
        let n = self.h_mean.nrows();
        match rows {
            LatentPosteriors::Shared { means, cov } => {
                self.h_mean = means;
                self.h_cov = LatentCovs::Shared {
                    cov: cov.cov,
                    log_det: cov.log_det,
                    n_rows: n,
                };
            }
            LatentPosteriors::PerRow(rows) => {
                let k = self.h_mean.ncols();
                let mut cov = Array3::zeros((n, k, k));
                let mut log_det = Array1::zeros(n);
                for (i, row) in rows.into_iter().enumerate() {
                    self.h_mean.row_mut(i).assign(&row.mean);
                    cov.index_axis_mut(Axis(0), i).assign(&row.cov);
                    log_det[i] = row.log_det;
                }
                self.h_cov = LatentCovs::PerRow { cov, log_det };
            }
        }
        self.stats = ColumnStats::from_latents(self.x.view(), &self.missing, self.h_mean.view(), &self.h_cov);
        Ok(())
    }

    /// q(h_n) of the rows of `x_zeroed` (0 where missing) given the current global factors.
    fn latent_posteriors(&self, x_zeroed: ArrayView2<f64>, missing: &MissingPattern) -> Result<LatentPosteriors> {
        let (d, k) = self.globals.f_mean.dim();
        let tau = self.globals.tau_means();
        let mut weighted_rows = Array3::zeros((d, k, k));
        for (j, mut w) in weighted_rows.outer_iter_mut().enumerate() {
            w.assign(&(second_moment(self.globals.f_mean.row(j), self.f_cov.index_axis(Axis(0), j)) * tau[j]));
        }
        let total = weighted_rows.sum_axis(Axis(0));
        // u_n = Σ_{d∈O_n} ⟨τ_d⟩ f̄_d (x_nd − c̄_d): one GEMM over the centred data with missing entries zeroed.
        let mut centred = &x_zeroed - &self.globals.c_mean;
        for (i, cols) in missing.by_row.iter().enumerate() {
            cols.iter().for_each(|&j| centred[[i, j]] = 0.0);
        }
        centred *= &tau;
        let u = centred.dot(&self.globals.f_mean);
        if !missing.any() {
            let precision = &total + &Array2::<f64>::eye(k);
            let cov = gaussian_from_natural(precision.view(), Array1::zeros(k).view(), "latent precision")?;
            let means = u.dot(&cov.cov);
            return Ok(LatentPosteriors::Shared { means, cov });
        }
        let rows = map_rows(x_zeroed.nrows(), k, |i| {
            latent_row(total.view(), weighted_rows.view(), &missing.by_row[i], u.row(i))
        })?;
        Ok(LatentPosteriors::PerRow(rows))
    }

    /// q(c_d) for every column (see `updates::bias_row`).
    pub fn update_bias(&mut self) {
        let tau = self.globals.tau_means();
        for d in 0..self.stats.n_cols() {
            let (mean, var) = bias_row(
                self.stats.count[d],
                self.stats.sum_x[d],
                self.stats.sum_h.row(d),
                self.globals.f_mean.row(d),
                tau[d],
                self.config.hyper.beta,
            );
            self.globals.c_mean[d] = mean;
            self.globals.c_var[d] = var;
        }
    }

    /// q(f_d) for every column (see `updates::loading_row`).
    pub fn update_loadings(&mut self) -> Result<()> {
        let tau = self.globals.tau_means();
        let alpha = self.globals.alpha.means();
        let (stats, c_mean) = (&self.stats, &self.globals.c_mean);
        let rows = map_rows(stats.n_cols(), alpha.len(), |d| {
            loading_row(
                stats.gram.column(d),
                stats.sum_xh.row(d),
                stats.sum_h.row(d),
                c_mean[d],
                tau[d],
                alpha.view(),
            )
        })?;
        for (d, row) in rows.into_iter().enumerate() {
            self.globals.f_mean.row_mut(d).assign(&row.mean);
            self.f_cov.index_axis_mut(Axis(0), d).assign(&row.cov);
            self.f_log_det[d] = row.log_det;
        }
        Ok(())
    }

    /// q(τ_d) for every column (see `updates::noise_row`).
    pub fn update_noise(&mut self) {
        let hyper = self.config.hyper;
        for d in 0..self.stats.n_cols() {
            let e = expected_squared_error(
                &self.column_moments(d),
                self.globals.c_mean[d],
                self.globals.c_var[d],
                self.globals.f_mean.row(d),
                self.f_cov.index_axis(Axis(0), d),
            );
            self.globals.tau[d] = noise_row(self.stats.count[d], e, hyper.a_tau, hyper.b_tau);
        }
    }

    /// q(α_k) for every k (ARD prior; nothing to do for the broad prior).
    pub fn update_ard(&mut self) {
        if let AlphaFactor::Ard(_) = self.globals.alpha {
            let w = self.loading_gram();
            let d = self.globals.f_mean.nrows() as f64;
            self.globals.alpha = AlphaFactor::Ard(ard_factors(
                w.diag(),
                d,
                self.config.hyper.a_alpha,
                self.config.hyper.b_alpha,
            ));
        }
    }

    /// The translation (config `translation`): h̄_n ← h̄_n − b, c̄_d ← c̄_d + f̄_dᵀ b. Returns b (K).
    pub fn translate(&mut self) -> Result<Array1<f64>> {
        let b = match self.config.translation {
            Translation::Mean => mean_translation(self.stats.total_h.view(), self.stats.n_rows),
            Translation::Exact => self.translation_system().solve()?,
        };
        self.h_mean -= &b;
        self.globals.c_mean += &self.globals.f_mean.dot(&b);
        self.stats.translate(b.view());
        Ok(b)
    }

    /// The quadratic in b whose maximiser is the exact translation (see [`TranslationSystem`]):
    /// P = N I + Σ_d ⟨τ_d⟩ n_d Σ_{f_d} + β Σ_d f̄_d f̄_dᵀ, v = Σ_n h̄_n + Σ_d ⟨τ_d⟩ Σ_{f_d} m_d − β Σ_d c̄_d f̄_d.
    pub fn translation_system(&self) -> TranslationSystem {
        let k = self.globals.f_mean.ncols();
        let tau = self.globals.tau_means();
        let beta = self.config.hyper.beta;
        let f = &self.globals.f_mean;
        let mut precision = Array2::<f64>::eye(k) * self.stats.n_rows + f.t().dot(f) * beta;
        let mut rhs = &self.stats.total_h - &(f.t().dot(&self.globals.c_mean) * beta);
        for d in 0..f.nrows() {
            let cov = self.f_cov.index_axis(Axis(0), d);
            precision.scaled_add(tau[d] * self.stats.count[d], &cov);
            rhs += &(cov.dot(&self.stats.sum_h.row(d)) * tau[d]);
        }
        TranslationSystem { precision, rhs }
    }

    /// The optimal rotation ([`optimal_rotation`] with S = Σ_n⟨h_n h_nᵀ⟩, W = ⟨FᵀF⟩), applied to q(H),
    /// q(F) and the statistics, followed by the q(α) update (the paper's q*(α)). Returns R.
    pub fn rotate(&mut self) -> Result<Rotation> {
        let (n, d) = (self.stats.n_rows, self.globals.f_mean.nrows() as f64);
        let w = self.loading_gram();
        let rot = optimal_rotation(
            self.stats.total_gram.view(),
            n,
            w.view(),
            d,
            self.config.loading_prior(),
        )?;
        self.h_mean = rot.latents(self.h_mean.view());
        self.h_cov.rotate(&rot);
        self.globals.f_mean = rot.loadings(self.globals.f_mean.view());
        for mut c in self.f_cov.outer_iter_mut() {
            let new = rot.loading_moment(c.view());
            c.assign(&new);
        }
        self.f_log_det += 2.0 * rot.log_abs_det;
        self.stats.rotate(&rot);
        self.update_ard();
        Ok(rot)
    }

    /// ⟨FᵀF⟩ = Σ_d (f̄_d f̄_dᵀ + Σ_{f_d}) (K×K).
    pub fn loading_gram(&self) -> Array2<f64> {
        self.globals.f_mean.t().dot(&self.globals.f_mean) + self.f_cov.sum_axis(Axis(0))
    }

    fn column_moments(&self, d: usize) -> ColumnMoments<'_> {
        ColumnMoments {
            count: self.stats.count[d],
            sum_x: self.stats.sum_x[d],
            sum_xx: self.stats.sum_xx[d],
            sum_h: self.stats.sum_h.row(d),
            sum_xh: self.stats.sum_xh.row(d),
            gram: self.stats.gram.column(d),
        }
    }

    /// The bound L split by factor.
    pub fn bound_terms(&self) -> BoundTerms {
        bound(
            &self.stats,
            &self.globals,
            &self.f_cov,
            self.f_log_det.view(),
            self.h_cov.log_det_sum(),
            &self.config.hyper,
        )
    }

    /// The full lower bound L.
    pub fn elbo(&self) -> f64 {
        self.bound_terms().total()
    }

    /// Posterior means E_q[h_n] of new rows (M×D, NaN = missing) given the fitted global factors.
    pub fn latent_means(&self, x: ArrayView2<f64>) -> Result<Array2<f64>> {
        let d = self.globals.f_mean.nrows();
        if x.ncols() != d {
            return Err(FaError::Shape {
                what: "X",
                expected: format!("(n_samples, {d})"),
                got: x.shape().to_vec(),
            });
        }
        for (row, values) in x.rows().into_iter().enumerate() {
            if values.iter().any(|&v| is_bad_entry(v, true)) {
                return Err(FaError::BadValue {
                    row,
                    kind: "an infinite or huge value (NaN marks a missing value)".into(),
                });
            }
        }
        let missing = MissingPattern::of(x);
        let zeroed = x.mapv(|v| if v.is_nan() { 0.0 } else { v });
        Ok(match self.latent_posteriors(zeroed.view(), &missing)? {
            LatentPosteriors::Shared { means, .. } => means,
            LatentPosteriors::PerRow(rows) => {
                let mut means = Array2::zeros((x.nrows(), self.config.n_components));
                rows.iter()
                    .enumerate()
                    .for_each(|(i, r)| means.row_mut(i).assign(&r.mean));
                means
            }
        })
    }

    /// Settings.
    pub fn config(&self) -> &VbfaConfig {
        &self.config
    }
    /// h̄_n (N×K).
    pub fn latent_mean(&self) -> &Array2<f64> {
        &self.h_mean
    }
    /// Σ_{h_n} (N×K×K; complete data keeps one shared matrix internally).
    pub fn latent_cov(&self) -> Array3<f64> {
        self.h_cov.to_array()
    }
    /// c̄_d (D).
    pub fn bias_mean(&self) -> &Array1<f64> {
        &self.globals.c_mean
    }
    /// c̃_d (D).
    pub fn bias_var(&self) -> &Array1<f64> {
        &self.globals.c_var
    }
    /// f̄_d as rows (D×K).
    pub fn loading_mean(&self) -> &Array2<f64> {
        &self.globals.f_mean
    }
    /// Σ_{f_d} (D×K×K).
    pub fn loading_cov(&self) -> &Array3<f64> {
        &self.f_cov
    }
    /// q(α_k) as (shape, rate) per k, or `None` for the fixed broad prior.
    pub fn ard(&self) -> Option<Vec<GammaQ>> {
        match &self.globals.alpha {
            AlphaFactor::Ard(q) => Some(q.clone()),
            AlphaFactor::Fixed(..) => None,
        }
    }
    /// ⟨α_k⟩ (K).
    pub fn alpha_mean(&self) -> Array1<f64> {
        self.globals.alpha.means()
    }
    /// q(τ_d) (D).
    pub fn noise(&self) -> &[GammaQ] {
        &self.globals.tau
    }
    /// ψ_d = 1/⟨τ_d⟩ (D).
    pub fn noise_variance(&self) -> Array1<f64> {
        self.globals.noise_variance()
    }
    /// Sweeps run so far (over all `fit` calls).
    pub fn n_sweeps(&self) -> u64 {
        self.n_sweeps
    }
    /// L and time after each sweep of `fit`.
    pub fn history(&self) -> &[SweepRecord] {
        &self.history
    }
    /// Whether the last `fit` met its tolerance.
    pub fn converged(&self) -> bool {
        self.converged
    }
}

/// q(h_n) for a set of rows: shared by all rows (complete data) or one per row.
enum LatentPosteriors {
    Shared { means: Array2<f64>, cov: GaussianRow },
    PerRow(Vec<GaussianRow>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vbfa::{rotation_objective, Hyper};

    /// N×D data from 3 factors plus noise, with every 7th entry missing.
    fn data(n: usize, d: usize, missing: bool) -> Array2<f64> {
        let mut h = Array2::zeros((n, 3));
        let mut f = Array2::zeros((d, 3));
        let mut e = Array2::zeros((n, d));
        fill_standard_normal(h.view_mut(), 11);
        fill_standard_normal(f.view_mut(), 12);
        fill_standard_normal(e.view_mut(), 13);
        let mut x = h.dot(&(f.t().to_owned() * 2.0)) + e * 0.5 + 1.0;
        if missing {
            for (i, v) in x.iter_mut().enumerate() {
                if i % 7 == 3 {
                    *v = f64::NAN;
                }
            }
        }
        x
    }

    fn config(k: usize) -> VbfaConfig {
        VbfaConfig {
            n_components: k,
            seed: 5,
            ..VbfaConfig::default()
        }
    }

    #[test]
    fn every_update_and_the_rotation_raise_the_bound() {
        for prior in [Prior::Ard, Prior::Broad] {
            let x = data(60, 12, true);
            let mut m = VbfaBatch::new(x.view(), VbfaConfig { prior, ..config(5) }).expect("model");
            let mut last = m.elbo();
            for _ in 0..6 {
                for step in [
                    Step::Latents,
                    Step::Bias,
                    Step::Loadings,
                    Step::Noise,
                    Step::Ard,
                    Step::Rotate,
                ] {
                    m.apply(step).expect("step");
                    let now = m.elbo();
                    assert!(now >= last - 1e-10 * last.abs(), "{prior:?} {step:?}: {last} -> {now}");
                    last = now;
                }
            }
        }
    }

    #[test]
    fn exact_translation_raises_the_bound_by_its_gain() {
        let x = data(50, 10, true);
        let cfg = VbfaConfig {
            translation: Translation::Exact,
            ..config(4)
        };
        let mut m = VbfaBatch::new(x.view(), cfg).expect("model");
        for _ in 0..3 {
            m.sweep().expect("sweep");
        }
        let before = m.elbo();
        let system = m.translation_system();
        let b = m.translate().expect("translate");
        let gain = system.gain(b.view());
        assert!(gain >= 0.0);
        assert!((m.elbo() - before - gain).abs() < 1e-8 * before.abs());
    }

    #[test]
    fn rotation_gain_equals_the_change_of_the_bound() {
        let x = data(40, 10, true);
        let hyper = Hyper {
            a_alpha: 0.5,
            b_alpha: 2.0,
            ..Hyper::default()
        };
        let mut m = VbfaBatch::new(x.view(), VbfaConfig { hyper, ..config(4) }).expect("model");
        for _ in 0..2 {
            m.sweep().expect("sweep");
        }
        let s = m.stats.total_gram.clone();
        let w = m.loading_gram();
        let prior = m.config.loading_prior();
        let (n, d) = (40.0, 10.0);
        let at_identity = rotation_objective(Array2::eye(4).view(), s.view(), n, w.view(), d, prior).expect("g");
        let before = m.elbo();
        let rot = m.rotate().expect("rotate");
        let at_optimum = rotation_objective(rot.r.view(), s.view(), n, w.view(), d, prior).expect("g");
        assert!(((m.elbo() - before) - (at_optimum - at_identity)).abs() < 1e-8 * before.abs());
    }

    #[test]
    fn complete_data_fast_path_equals_the_per_row_path() {
        let x = data(30, 8, false);
        let mut m = VbfaBatch::new(x.view(), config(3)).expect("model");
        m.sweep().expect("sweep");
        m.update_latents().expect("latents");
        let shared = m.h_mean.clone();
        let tau = m.globals.tau_means();
        let (d, k) = m.globals.f_mean.dim();
        let mut weighted = Array3::zeros((d, k, k));
        for j in 0..d {
            weighted
                .index_axis_mut(Axis(0), j)
                .assign(&(second_moment(m.globals.f_mean.row(j), m.f_cov.index_axis(Axis(0), j)) * tau[j]));
        }
        let total = weighted.sum_axis(Axis(0));
        let centred = (&m.x - &m.globals.c_mean) * &tau;
        let u = centred.dot(&m.globals.f_mean);
        for i in 0..30 {
            let row = latent_row(total.view(), weighted.view(), &[], u.row(i)).expect("row");
            assert!((&row.mean - &shared.row(i)).iter().all(|v| v.abs() < 1e-10));
        }
    }

    #[test]
    fn bad_input_is_rejected() {
        let mut x = data(10, 4, false);
        x[[2, 1]] = f64::INFINITY;
        assert!(matches!(
            VbfaBatch::new(x.view(), config(2)),
            Err(FaError::BadValue { row: 2, .. })
        ));
        let mut y = data(10, 4, false);
        y.column_mut(3).fill(f64::NAN);
        assert!(VbfaBatch::new(y.view(), config(2)).is_err());
        assert!(VbfaBatch::new(data(10, 4, false).view(), config(0)).is_err());
    }
}
