//! Online VB-FA (README "Online VB-FA"): for each mini-batch, the local q(h_n) with the current global
//! factors; running averages of the expected sufficient statistics (x̄, mean x², mean h̄, mean x h̄ᵀ, mean
//! ⟨h hᵀ⟩) with step ρ_t; the global q(c), q(F), q(τ), q(α) rebuilt from the averages scaled by the
//! effective sample size N_eff; then the translation and rotation applied to q(F), q(c) *and* the averages.
//!
//! Memory is O(D·K + K²): q(F) is kept as its means f̄_d (D×K) and three K×K sums over d —
//! T = Σ_d ⟨τ_d⟩⟨f_d f_dᵀ⟩ (the next E-step's precision), W = Σ_d ⟨f_d f_dᵀ⟩ = ⟨FᵀF⟩ (q(α) and the rotation)
//! and V = Σ_d ⟨τ_d⟩ Σ_{f_d} (the exact translation). The per-column Σ_{f_d} are formed one at a time
//! while rebuilding and never stored; every transformation maps the three sums exactly
//! (Σ_{f_d} ← Rᵀ Σ_{f_d} R). Rows must be complete (no missing values).

use ndarray::{Array1, Array2, ArrayView2, Axis};
use rayon::prelude::*;

use super::special::GammaQ;
use super::stats::{is_bad_entry, ColumnStats};
use super::transform::{mean_translation, optimal_rotation, TranslationSystem};
use super::updates::{
    ard_factors, bias_row, expected_squared_error, gaussian_from_natural, loading_row, noise_row, second_moment,
    ColumnMoments,
};
use super::{usable_variances, AlphaFactor, Globals, Prior, Translation, VbfaConfig};
use crate::error::{invalid, FaError, Result};
use crate::init::fill_standard_normal;
use crate::linalg::Rotation;
use crate::schedule::StepSize;

/// Columns per task of the rebuild loop (fixed, so results do not depend on the thread count).
const COLUMN_CHUNK: usize = 256;

/// Settings of online VB-FA.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineConfig {
    /// Model settings; `transform_start` counts mini-batches.
    pub model: VbfaConfig,
    /// Step sizes ρ_t (t = mini-batch index). `Harmonic` uses ρ_t = B_t / (samples seen), the exact
    /// running mean even for unequal batch sizes.
    pub step_size: StepSize,
    /// N_eff, the sample size the averages stand for; `None` = the number of samples seen so far.
    pub n_effective: Option<f64>,
}

/// The K×K sums over d that stand for q(F)'s covariances.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LoadingSums {
    /// T = Σ_d ⟨τ_d⟩ (f̄_d f̄_dᵀ + Σ_{f_d}).
    pub(super) weighted_gram: Array2<f64>,
    /// W = Σ_d (f̄_d f̄_dᵀ + Σ_{f_d}).
    pub(super) gram: Array2<f64>,
    /// V = Σ_d ⟨τ_d⟩ Σ_{f_d}.
    pub(super) weighted_cov: Array2<f64>,
}

impl LoadingSums {
    pub(super) fn zeros(k: usize) -> Self {
        LoadingSums {
            weighted_gram: Array2::zeros((k, k)),
            gram: Array2::zeros((k, k)),
            weighted_cov: Array2::zeros((k, k)),
        }
    }

    fn add_row(&mut self, mean: ndarray::ArrayView1<f64>, cov: ArrayView2<f64>, tau: f64) {
        let moment = second_moment(mean, cov);
        self.weighted_gram.scaled_add(tau, &moment);
        self.gram += &moment;
        self.weighted_cov.scaled_add(tau, &cov);
    }

    fn add(mut self, other: &LoadingSums) -> Self {
        self.weighted_gram += &other.weighted_gram;
        self.gram += &other.gram;
        self.weighted_cov += &other.weighted_cov;
        self
    }

    fn rotate(&mut self, rot: &Rotation) {
        self.weighted_gram = rot.loading_moment(self.weighted_gram.view());
        self.gram = rot.loading_moment(self.gram.view());
        self.weighted_cov = rot.loading_moment(self.weighted_cov.view());
    }
}

/// Everything that exists once the first mini-batch has been seen.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OnlineState {
    /// Per-sample averages of the sufficient statistics.
    pub(super) averages: ColumnStats,
    pub(super) globals: Globals,
    pub(super) sums: LoadingSums,
}

/// Online variational Bayesian factor analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct VbfaOnline {
    pub(super) config: OnlineConfig,
    pub(super) n_features: usize,
    pub(super) n_seen: u64,
    pub(super) n_batches: u64,
    pub(super) state: Option<OnlineState>,
}

/// One column's rebuilt q(f_d) and q(τ_d).
struct ColumnUpdate {
    f_mean: Array1<f64>,
    tau: GammaQ,
}

impl VbfaOnline {
    /// New model for D = `n_features` (the global factors are initialised from the first mini-batch).
    pub fn new(n_features: usize, config: OnlineConfig) -> Result<Self> {
        config.model.validate()?;
        config.step_size.validate()?;
        if n_features < 1 {
            return Err(invalid("n_features", "must be >= 1"));
        }
        if let Some(n) = config.n_effective {
            if !(n.is_finite() && n > 0.0) {
                return Err(invalid("n_effective", format!("must be finite and > 0, got {n}")));
            }
        }
        Ok(VbfaOnline {
            config,
            n_features,
            n_seen: 0,
            n_batches: 0,
            state: None,
        })
    }

    /// Process one mini-batch (B×D, complete rows): local q(h_n), averages, global rebuild, transformations.
    pub fn partial_fit(&mut self, x: ArrayView2<f64>) -> Result<()> {
        self.check_batch(x)?;
        if x.nrows() == 0 {
            return Ok(());
        }
        // The step works on a copy so that a numerical breakdown leaves the model exactly as it was. The
        // copy is O(D·K²) while the step itself is O(B·D·K + D·K³), so it does not dominate.
        let start = match &self.state {
            Some(state) => state.clone(),
            None => self.initial_state(x),
        };
        let next = self.step(start, x)?;
        self.state = Some(next);
        Ok(())
    }

    fn check_batch(&self, x: ArrayView2<f64>) -> Result<()> {
        if x.ncols() != self.n_features {
            return Err(FaError::Shape {
                what: "X",
                expected: format!("(n_samples, {})", self.n_features),
                got: x.shape().to_vec(),
            });
        }
        for (row, values) in x.rows().into_iter().enumerate() {
            if values.iter().any(|&v| is_bad_entry(v, false)) {
                return Err(FaError::BadValue {
                    row,
                    kind:
                        "NaN, infinity or |x| > 1e100 (online VB-FA needs complete rows; use VBFA for missing values)"
                            .into(),
                });
            }
        }
        Ok(())
    }

    /// Global factors from the first mini-batch, as in the batch model: c̄ = x̄, ⟨τ_d⟩ = 1/(r v_d),
    /// f̄_dk ~ N(0, v_d/K), Σ_{f_d} = r v_d/B · I, q(α) optimal for that q(F); no averages yet.
    fn initial_state(&self, x: ArrayView2<f64>) -> OnlineState {
        let model = &self.config.model;
        let (b, d) = x.dim();
        let k = model.n_components;
        let mean = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
        let raw_vars: Vec<f64> = x.var_axis(Axis(0), 0.0).to_vec();
        let vars = usable_variances(&raw_vars, &vec![b as f64; d]);
        let hyper = model.hyper;
        let ratio = model.init_noise_ratio;
        let tau: Vec<GammaQ> = vars
            .iter()
            .map(|&v| {
                let shape = hyper.a_tau + 0.5 * b as f64;
                GammaQ {
                    shape,
                    rate: shape * ratio * v,
                }
            })
            .collect();
        let c_var = tau.iter().map(|t| 1.0 / (hyper.beta + b as f64 * t.mean())).collect();
        let mut f_mean = Array2::zeros((d, k));
        fill_standard_normal(f_mean.view_mut(), model.seed);
        let mut sums = LoadingSums::zeros(k);
        for (j, mut row) in f_mean.rows_mut().into_iter().enumerate() {
            row *= (vars[j] / k as f64).sqrt();
            let cov = Array2::<f64>::eye(k) * (ratio * vars[j] / b as f64);
            sums.add_row(row.view(), cov.view(), tau[j].mean());
        }
        let alpha = match model.prior {
            Prior::Ard => AlphaFactor::Ard(ard_factors(sums.gram.diag(), d as f64, hyper.a_alpha, hyper.b_alpha)),
            Prior::Broad => AlphaFactor::Fixed(hyper.broad_alpha, k),
        };
        let globals = Globals {
            c_mean: mean,
            c_var,
            f_mean,
            alpha,
            tau,
        };
        let averages = ColumnStats::batch_means(x, Array2::zeros((b, k)).view(), Array2::eye(k).view());
        OnlineState {
            averages,
            globals,
            sums,
        }
    }

    fn step(&mut self, mut state: OnlineState, x: ArrayView2<f64>) -> Result<OnlineState> {
        let batch = self.local_statistics(&state, x)?;
        let t = self.n_batches + 1;
        let n_seen = self.n_seen + x.nrows() as u64;
        let rho = match self.config.step_size {
            StepSize::Harmonic => x.nrows() as f64 / n_seen as f64,
            other => other.rho(t),
        };
        state.averages.blend(&batch, rho);
        let n_eff = self.config.n_effective.unwrap_or(n_seen as f64);
        self.rebuild(&mut state, n_eff)?;
        let model = &self.config.model;
        if model.transform && t >= model.transform_start {
            Self::translate(&mut state, n_eff, model)?;
            Self::rotate(&mut state, n_eff, model)?;
        }
        self.n_batches = t;
        self.n_seen = n_seen;
        Ok(state)
    }

    /// q(h_n) for the rows of the batch — complete rows share Λ = I + T, so Σ_h = Λ⁻¹ and
    /// H̄ = ((X − c̄) diag⟨τ⟩) F̄ Σ_h — and the batch's per-sample statistics.
    fn local_statistics(&self, state: &OnlineState, x: ArrayView2<f64>) -> Result<ColumnStats> {
        let (means, cov) = Self::latents(state, x)?;
        Ok(ColumnStats::batch_means(x, means.view(), cov.view()))
    }

    fn latents(state: &OnlineState, x: ArrayView2<f64>) -> Result<(Array2<f64>, Array2<f64>)> {
        let k = state.globals.f_mean.ncols();
        let precision = &state.sums.weighted_gram + &Array2::<f64>::eye(k);
        let cov = gaussian_from_natural(precision.view(), Array1::zeros(k).view(), "latent precision I + T")?.cov;
        let centred = (&x - &state.globals.c_mean) * &state.globals.tau_means();
        Ok((centred.dot(&state.globals.f_mean).dot(&cov), cov))
    }

    /// Rebuild q(c), then q(f_d) and q(τ_d) column by column (accumulating T, W, V), then q(α), from the
    /// averages scaled by N_eff (the batch updates of `updates.rs` with n_d = N_eff).
    fn rebuild(&self, state: &mut OnlineState, n_eff: f64) -> Result<()> {
        let stats = state.averages.scaled(n_eff);
        let hyper = self.config.model.hyper;
        let globals = &mut state.globals;
        let tau_old = globals.tau_means();
        for d in 0..stats.n_cols() {
            let (mean, var) = bias_row(
                stats.count[d],
                stats.sum_x[d],
                stats.sum_h.row(d),
                globals.f_mean.row(d),
                tau_old[d],
                hyper.beta,
            );
            globals.c_mean[d] = mean;
            globals.c_var[d] = var;
        }
        let alpha = globals.alpha.means();
        let k = alpha.len();
        let column = |d: usize, sums: &mut LoadingSums| -> Result<ColumnUpdate> {
            let col = ColumnMoments {
                count: stats.count[d],
                sum_x: stats.sum_x[d],
                sum_xx: stats.sum_xx[d],
                sum_h: stats.sum_h.row(d),
                sum_xh: stats.sum_xh.row(d),
                gram: stats.gram.column(d),
            };
            let c_mean = globals.c_mean[d];
            let row = loading_row(col.gram, col.sum_xh, col.sum_h, c_mean, tau_old[d], alpha.view())?;
            let e = expected_squared_error(&col, c_mean, globals.c_var[d], row.mean.view(), row.cov.view());
            let tau = noise_row(col.count, e, hyper.a_tau, hyper.b_tau);
            sums.add_row(row.mean.view(), row.cov.view(), tau.mean());
            Ok(ColumnUpdate { f_mean: row.mean, tau })
        };
        let d_all = stats.n_cols();
        let chunks: Vec<(usize, usize)> = (0..d_all)
            .step_by(COLUMN_CHUNK)
            .map(|lo| (lo, (lo + COLUMN_CHUNK).min(d_all)))
            .collect();
        let run_chunk = |&(lo, hi): &(usize, usize)| -> Result<(Vec<ColumnUpdate>, LoadingSums)> {
            let mut sums = LoadingSums::zeros(k);
            let updates = (lo..hi).map(|d| column(d, &mut sums)).collect::<Result<Vec<_>>>()?;
            Ok((updates, sums))
        };
        let parallel = d_all.saturating_mul(k * k * k) >= 1 << 16 && crate::fork::parallel_allowed();
        let results: Vec<(Vec<ColumnUpdate>, LoadingSums)> = if parallel {
            chunks.par_iter().map(run_chunk).collect::<Result<_>>()?
        } else {
            chunks.iter().map(run_chunk).collect::<Result<_>>()?
        };
        let mut total = LoadingSums::zeros(k);
        let mut d = 0;
        for (updates, sums) in results {
            total = total.add(&sums);
            for update in updates {
                globals.f_mean.row_mut(d).assign(&update.f_mean);
                globals.tau[d] = update.tau;
                d += 1;
            }
        }
        state.sums = total;
        Self::update_ard(state, d_all as f64, &self.config.model);
        Ok(())
    }

    fn update_ard(state: &mut OnlineState, n_cols: f64, model: &VbfaConfig) {
        if let AlphaFactor::Ard(_) = state.globals.alpha {
            state.globals.alpha = AlphaFactor::Ard(ard_factors(
                state.sums.gram.diag(),
                n_cols,
                model.hyper.a_alpha,
                model.hyper.b_alpha,
            ));
        }
    }

    /// Translation of q(c) and the averages (q(F) and its sums are unchanged). Mean: b = mean h̄.
    /// Exact: P = N_eff (I + V) + β F̄ᵀF̄, v = N_eff (I + V) m̄ − β F̄ᵀ c̄ (complete rows: Ψ_n = I + V).
    fn translate(state: &mut OnlineState, n_eff: f64, model: &VbfaConfig) -> Result<Array1<f64>> {
        let averages = &state.averages;
        let b = match model.translation {
            Translation::Mean => mean_translation(averages.total_h.view(), averages.n_rows),
            Translation::Exact => {
                let k = state.globals.f_mean.ncols();
                let f = &state.globals.f_mean;
                let psi_sum = (Array2::<f64>::eye(k) + &state.sums.weighted_cov) * n_eff;
                let beta = model.hyper.beta;
                let rhs = psi_sum.dot(&averages.total_h) / averages.n_rows - f.t().dot(&state.globals.c_mean) * beta;
                TranslationSystem {
                    precision: psi_sum + f.t().dot(f) * beta,
                    rhs,
                }
                .solve()?
            }
        };
        state.globals.c_mean += &state.globals.f_mean.dot(&b);
        state.averages.translate(b.view());
        Ok(b)
    }

    /// Rotation with S = N_eff · mean⟨h hᵀ⟩, N = N_eff, W = ⟨FᵀF⟩, applied to f̄, T, W, V and the averages;
    /// then q(α) from the rotated W.
    fn rotate(state: &mut OnlineState, n_eff: f64, model: &VbfaConfig) -> Result<Rotation> {
        let d = state.globals.f_mean.nrows() as f64;
        let s = &state.averages.total_gram * (n_eff / state.averages.n_rows);
        let rot = optimal_rotation(s.view(), n_eff, state.sums.gram.view(), d, model.loading_prior())?;
        state.globals.f_mean = rot.loadings(state.globals.f_mean.view());
        state.sums.rotate(&rot);
        state.averages.rotate(&rot);
        Self::update_ard(state, d, model);
        Ok(rot)
    }

    fn fitted(&self) -> Result<&OnlineState> {
        self.state
            .as_ref()
            .ok_or_else(|| invalid("model", "is not fitted yet: call partial_fit first"))
    }

    /// Posterior means E_q[h_n] of complete rows (M×D) given the current global factors.
    pub fn latent_means(&self, x: ArrayView2<f64>) -> Result<Array2<f64>> {
        self.check_batch(x)?;
        Ok(Self::latents(self.fitted()?, x)?.0)
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.n_features
    }
    /// Samples processed.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }
    /// Mini-batches processed.
    pub fn n_batches(&self) -> u64 {
        self.n_batches
    }
    /// Settings.
    pub fn config(&self) -> &OnlineConfig {
        &self.config
    }
    /// c̄ (D).
    pub fn bias_mean(&self) -> Result<Array1<f64>> {
        Ok(self.fitted()?.globals.c_mean.clone())
    }
    /// f̄_d as rows (D×K).
    pub fn loading_mean(&self) -> Result<Array2<f64>> {
        Ok(self.fitted()?.globals.f_mean.clone())
    }
    /// ψ_d = 1/⟨τ_d⟩ (D).
    pub fn noise_variance(&self) -> Result<Array1<f64>> {
        Ok(self.fitted()?.globals.noise_variance())
    }
    /// ⟨α_k⟩ (K).
    pub fn alpha_mean(&self) -> Result<Array1<f64>> {
        Ok(self.fitted()?.globals.alpha.means())
    }
    /// ⟨FᵀF⟩ (K×K).
    pub fn loading_gram(&self) -> Result<Array2<f64>> {
        Ok(self.fitted()?.sums.gram.clone())
    }
    /// The running average of ⟨h_n h_nᵀ⟩ (K×K) and of h̄_n (K), in the current latent basis.
    pub fn latent_moments(&self) -> Result<(Array2<f64>, Array1<f64>)> {
        let averages = &self.fitted()?.averages;
        Ok((
            &averages.total_gram / averages.n_rows,
            &averages.total_h / averages.n_rows,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vbfa::VbfaBatch;
    use ndarray::s;

    fn data(n: usize, d: usize, seed: u64) -> Array2<f64> {
        let mut h = Array2::zeros((n, 3));
        let mut f = Array2::zeros((d, 3));
        let mut e = Array2::zeros((n, d));
        fill_standard_normal(h.view_mut(), seed);
        fill_standard_normal(f.view_mut(), seed + 1);
        fill_standard_normal(e.view_mut(), seed + 2);
        h.dot(&(f.t().to_owned() * 2.0)) + e * 0.5 - 1.0
    }

    fn covariance(f: &Array2<f64>, psi: &Array1<f64>) -> Array2<f64> {
        f.dot(&f.t()) + Array2::from_diag(psi)
    }

    #[test]
    fn a_breakdown_leaves_the_model_exactly_as_it_was() {
        let x = data(250, 6, 7);
        let cfg = OnlineConfig {
            model: VbfaConfig {
                n_components: 2,
                seed: 3,
                transform_start: 1,
                ..VbfaConfig::default()
            },
            step_size: StepSize::Harmonic,
            n_effective: None,
        };
        let mut online = VbfaOnline::new(6, cfg).expect("online");
        for chunk in x.slice(s![..200, ..]).axis_chunks_iter(Axis(0), 50) {
            online.partial_fit(chunk).expect("partial_fit");
        }
        let before = online.clone();
        // A finite value the batch check accepts, but the rebuilt loading precision is not positive definite.
        let mut poison = x.slice(s![200.., ..]).to_owned();
        poison[[3, 2]] = 1e18;
        assert!(matches!(
            online.partial_fit(poison.view()),
            Err(FaError::NotPositiveDefinite(_))
        ));
        assert_eq!(online, before);
    }

    #[test]
    fn one_pass_approaches_batch_vbfa() {
        let x = data(3000, 12, 40);
        let model = VbfaConfig {
            n_components: 5,
            seed: 1,
            transform_start: 1,
            ..VbfaConfig::default()
        };
        let mut batch = VbfaBatch::new(x.view(), model.clone()).expect("batch");
        batch.fit(500, 1e-10).expect("fit");
        let cfg = OnlineConfig {
            model,
            step_size: StepSize::Harmonic,
            n_effective: None,
        };
        let mut online = VbfaOnline::new(12, cfg).expect("online");
        for chunk in x.axis_chunks_iter(Axis(0), 50) {
            online.partial_fit(chunk).expect("partial_fit");
        }
        let reference = covariance(batch.loading_mean(), &batch.noise_variance());
        let got = covariance(
            &online.loading_mean().expect("f"),
            &online.noise_variance().expect("psi"),
        );
        let rel = (&got - &reference).mapv(|v| v * v).sum().sqrt() / reference.mapv(|v| v * v).sum().sqrt();
        assert!(rel < 0.02, "relative covariance difference {rel}");
        assert_eq!(online.n_seen(), 3000);
        assert_eq!(online.n_batches(), 60);
    }

    #[test]
    fn missing_values_are_rejected() {
        let mut x = data(10, 4, 1);
        x[[3, 2]] = f64::NAN;
        let cfg = OnlineConfig {
            model: VbfaConfig::default(),
            step_size: StepSize::Harmonic,
            n_effective: None,
        };
        let mut online = VbfaOnline::new(4, cfg).expect("online");
        assert!(matches!(
            online.partial_fit(x.view()),
            Err(FaError::BadValue { row: 3, .. })
        ));
        assert!(online.loading_mean().is_err());
    }
}
