//! Online GFA: stochastic variational inference over mini-batches of samples with the global/local split
//! of online VB-FA (`crate::vbfa::online`). Local: q(h_n) of the batch's rows given the current global
//! factors (the batch model's q(h_n) update). Global: the per-sample averages of the expected sufficient
//! statistics (x̄, mean x², mean h̄, mean x h̄ᵀ, mean ⟨h hᵀ⟩) move towards the batch's by a Robbins–Monro
//! step ρ_t (Σρ_t = ∞, Σρ_t² < ∞ for the harmonic and power schedules); q(c), q(F), q(τ), q(α) are then
//! rebuilt by the batch model's coordinate updates from the averages scaled by the effective sample size
//! N_eff. For the conjugate factors this is the natural-gradient step of Hoffman et al. ("Stochastic
//! variational inference", eq. 25): their natural parameters are linear in the statistics, so moving the
//! statistics by ρ_t moves the natural parameters by ρ_t towards the batch's intermediate estimate. The
//! translation and the group rotation then transform q(F), q(c) and the averages alike.
//!
//! The global factors live in a [`GfaBatch`] that holds no data (0 rows) and whose column statistics are
//! the scaled averages, so every update, transformation and query of the batch model is reused as it is.
//! Rows must be complete (no missing values) and factors are not dropped (`activity()` shows which are
//! inactive); the first mini-batch sets the initial factors as the batch model does and needs at least
//! K rows.

use ndarray::{Array2, ArrayView2};

use super::batch::GfaBatch;
use super::state::{len_of, read_config, read_indices, read_stats, write_config, write_stats};
use super::{GfaConfig, Groups};
use crate::error::{invalid, FaError, Result};
use crate::schedule::StepSize;
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateValue, StateWriter};
use crate::vbfa::stats::{is_bad_entry, ColumnStats, LatentCovs, MissingPattern};
use crate::vbfa::usable_variances;

/// Settings of online GFA.
#[derive(Debug, Clone, PartialEq)]
pub struct GfaOnlineConfig {
    /// Model settings (`drop_factors` must be false; `rotate_start` counts mini-batches).
    pub model: GfaConfig,
    /// Step sizes ρ_t (t = mini-batch index); `Harmonic` is B_t / (samples seen), the exact running mean.
    pub step_size: StepSize,
    /// N_eff, the sample size the averages stand for; `None` = the number of samples seen so far.
    pub n_effective: Option<f64>,
}

/// The global factors and the per-sample averages of the statistics (after the first mini-batch).
#[derive(Debug, Clone, PartialEq)]
struct OnlineState {
    globals: GfaBatch,
    averages: ColumnStats,
}

/// Online variational Bayesian group factor analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct GfaOnline {
    config: GfaOnlineConfig,
    groups: Groups,
    n_seen: u64,
    n_batches: u64,
    state: Option<OnlineState>,
}

impl GfaBatch {
    /// The same global factors with the data and q(H) removed (0 rows).
    fn without_data(mut self) -> Self {
        let (d, k) = self.f_mean.dim();
        self.x = Array2::zeros((0, d));
        self.missing = MissingPattern::of(self.x.view());
        self.h_mean = Array2::zeros((0, k));
        if let LatentCovs::Shared { n_rows, .. } = &mut self.h_cov {
            *n_rows = 0;
        }
        self
    }
}

impl GfaOnline {
    /// New model for the features of `groups` (the global factors are set from the first mini-batch).
    pub fn new(groups: Groups, config: GfaOnlineConfig) -> Result<Self> {
        config.model.validate()?;
        config.step_size.validate()?;
        if config.model.drop_factors {
            return Err(invalid(
                "drop_factors",
                "online GFA keeps every factor (activity() shows the inactive ones)",
            ));
        }
        if let Some(n) = config.n_effective {
            if !(n.is_finite() && n > 0.0) {
                return Err(invalid("n_effective", format!("must be finite and > 0, got {n}")));
            }
        }
        Ok(GfaOnline {
            config,
            groups,
            n_seen: 0,
            n_batches: 0,
            state: None,
        })
    }

    /// Process one mini-batch (B×D, complete rows); on any error the model is left exactly as it was.
    pub fn partial_fit(&mut self, x: ArrayView2<f64>) -> Result<()> {
        self.check_batch(x)?;
        // The step works on a copy (O(D·K²), the size of the step's own work) so that a failure
        // leaves nothing half-applied.
        let start = match &self.state {
            Some(state) => state.clone(),
            None => self.initial_state(x)?,
        };
        let next = self.step(start, x)?;
        self.state = Some(next);
        Ok(())
    }

    fn check_batch(&self, x: ArrayView2<f64>) -> Result<()> {
        let d = self.groups.n_features();
        if x.ncols() != d || x.nrows() == 0 {
            return Err(FaError::Shape {
                what: "X",
                expected: format!("(n_samples >= 1, {d})"),
                got: x.shape().to_vec(),
            });
        }
        match x
            .rows()
            .into_iter()
            .position(|r| r.iter().any(|&v| is_bad_entry(v, false)))
        {
            Some(row) => Err(FaError::BadValue {
                row,
                kind: "NaN, infinity or |x| > 1e100 (online GFA needs complete rows; use GFA for missing values)"
                    .into(),
            }),
            None => Ok(()),
        }
    }

    /// The batch model's initial factors for the first mini-batch, without its data.
    fn initial_state(&self, x: ArrayView2<f64>) -> Result<OnlineState> {
        let k = self.config.model.n_components;
        if x.nrows() < k {
            return Err(invalid(
                "X",
                format!(
                    "the first mini-batch must hold at least n_components = {k} rows, got {}",
                    x.nrows()
                ),
            ));
        }
        let globals = GfaBatch::new(x, self.groups.clone(), self.config.model.clone())?.without_data();
        let averages = globals.stats.clone();
        Ok(OnlineState { globals, averages })
    }

    /// Local q(h_n) of the batch, averages ← (1 − ρ_t) averages + ρ_t (batch means), the global rebuild
    /// from N_eff × averages, then (from mini-batch `rotate_start` on) the translation and the rotation.
    fn step(&mut self, mut state: OnlineState, x: ArrayView2<f64>) -> Result<OnlineState> {
        let globals = &mut state.globals;
        let (h, covs) = globals.latent_posteriors(x, &MissingPattern::of(x))?;
        let batch = ColumnStats::batch_means(x, h.view(), covs.row(0));
        let t = self.n_batches + 1;
        let n_seen = self.n_seen + x.nrows() as u64;
        let rho = match self.config.step_size {
            StepSize::Harmonic => x.nrows() as f64 / n_seen as f64,
            other => other.rho(t),
        };
        state.averages.blend(&batch, rho);
        let n_eff = self.config.n_effective.unwrap_or(n_seen as f64);
        globals.stats = state.averages.scaled(n_eff);
        globals.update_bias();
        globals.update_loadings()?;
        globals.update_noise();
        globals.update_ard();
        let model = &self.config.model;
        if model.rotate && t >= model.rotate_start {
            globals.translate()?;
            globals.rotate()?;
            state.averages = globals.stats.scaled(1.0 / n_eff);
        }
        globals.group_variance = self.group_variances(&state.averages, n_seen);
        self.n_batches = t;
        self.n_seen = n_seen;
        Ok(state)
    }

    /// Σ_{d∈m} (mean x_d² − x̄_d²) from the averages (the scale of `activity`).
    fn group_variances(&self, averages: &ColumnStats, n_seen: u64) -> Vec<f64> {
        let raw: Vec<f64> = (averages.sum_xx.iter().zip(&averages.sum_x))
            .map(|(&xx, &x)| (xx - x * x).max(0.0))
            .collect();
        let vars = usable_variances(&raw, &vec![n_seen as f64; raw.len()]);
        (0..self.groups.n_groups())
            .map(|m| self.groups.members(m).iter().map(|&j| vars[j]).sum())
            .collect()
    }

    /// The global factors as a (data-free) batch model: loadings, noise, ARD, activity, predictions.
    /// None before the first mini-batch.
    pub fn globals(&self) -> Option<&GfaBatch> {
        self.state.as_ref().map(|s| &s.globals)
    }

    /// Running averages of ⟨h hᵀ⟩ (K×K) over the samples seen, in the current latent basis.
    pub fn latent_second_moment(&self) -> Option<Array2<f64>> {
        self.state.as_ref().map(|s| s.averages.total_gram.clone())
    }

    /// Settings.
    pub fn config(&self) -> &GfaOnlineConfig {
        &self.config
    }
    /// Samples seen.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }
    /// Mini-batches seen.
    pub fn n_batches(&self) -> u64 {
        self.n_batches
    }
    /// D.
    pub fn n_features(&self) -> usize {
        self.groups.n_features()
    }
    /// The groups.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }
}

fn write_schedule(w: &mut StateWriter, step: StepSize) {
    let (kind, tau0, kappa, rho) = match step {
        StepSize::Harmonic => ("harmonic", 0.0, 0.9, 0.01),
        StepSize::Power { tau0, kappa } => ("power", tau0, kappa, 0.01),
        StepSize::Constant(rho) => ("constant", 0.0, 0.9, rho),
    };
    w.put("schedule", StateValue::Text(kind.into()));
    for (key, value) in [("tau0", tau0), ("kappa", kappa), ("rho", rho)] {
        w.put(key, StateValue::Float(value));
    }
}

fn read_schedule(r: &StateReader<'_>) -> Result<StepSize> {
    Ok(match r.text("schedule")? {
        "harmonic" => StepSize::Harmonic,
        "power" => StepSize::Power {
            tau0: r.float("tau0")?,
            kappa: r.float("kappa")?,
        },
        "constant" => StepSize::Constant(r.float("rho")?),
        other => return Err(FaError::InvalidState(format!("entry `schedule` is unknown: {other:?}"))),
    })
}

/// Checkpoints: the settings, the counters and, once fitted, the data-free global model (as the batch
/// model writes it) plus the running averages under `avg_`; `from_state` re-validates the settings as
/// `new` does and the globals and averages as the batch model's checkpoint does. `n_effective` = 0
/// stands for None.
impl Checkpoint for GfaOnline {
    const KIND: &'static str = "OnlineGFA";

    fn to_state(&self) -> StateMap {
        let mut w = StateWriter::new(Self::KIND);
        match &self.state {
            Some(state) => {
                state.globals.write_model(&mut w);
                write_stats(&mut w, "avg_", &state.averages);
            }
            None => write_config(&mut w, &self.config.model),
        }
        let labels: Vec<f64> = (0..self.groups.n_features())
            .map(|d| self.groups.of(d) as f64)
            .collect();
        w.array("groups", vec![labels.len()], &labels);
        write_schedule(&mut w, self.config.step_size);
        w.put("n_effective", StateValue::Float(self.config.n_effective.unwrap_or(0.0)));
        w.put("n_seen", StateValue::Int(self.n_seen));
        w.put("n_batches", StateValue::Int(self.n_batches));
        w.put("fitted", StateValue::Bool(self.state.is_some()));
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        // A fitted stream's globals carry the groups; read the entry once (an array adopted from a file is
        // moved out of the map by the first read).
        let globals = if r.bool("fitted")? {
            Some(GfaBatch::read_model(state, true)?)
        } else {
            None
        };
        let groups = match &globals {
            Some(g) => g.groups.clone(),
            None => {
                let d = len_of(state, "groups")?;
                Groups::from_labels(&read_indices(&r, "groups", d, d)?)
                    .map_err(|e| FaError::InvalidState(e.to_string()))?
            }
        };
        let n_effective = Some(r.float("n_effective")?).filter(|&n| n != 0.0);
        let config = GfaOnlineConfig {
            model: read_config(&r)?,
            step_size: read_schedule(&r)?,
            n_effective,
        };
        let mut model = GfaOnline::new(groups, config).map_err(|e| FaError::InvalidState(e.to_string()))?;
        model.n_seen = r.int("n_seen")?;
        model.n_batches = r.int("n_batches")?;
        crate::state_checks::sample_count("n_seen", model.n_seen)?;
        let fitted = r.bool("fitted")?;
        if fitted != (model.n_batches > 0) || model.n_batches > model.n_seen {
            return Err(FaError::InvalidState(
                "entries `fitted`, `n_batches` and `n_seen` disagree (fitted iff n_batches >= 1, n_batches <= n_seen)"
                    .into(),
            ));
        }
        if let Some(globals) = globals {
            let dims = globals.f_mean.dim();
            let averages = read_stats(&r, "avg_", dims, false, None)?;
            model.state = Some(OnlineState { globals, averages });
        }
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gfa::NoiseModel;
    use crate::init::fill_standard_normal;
    use ndarray::s;

    fn data(n: usize) -> (Array2<f64>, Groups) {
        let mut h = Array2::zeros((n, 2));
        let mut f = Array2::zeros((10, 2));
        let mut e = Array2::zeros((n, 10));
        fill_standard_normal(h.view_mut(), 1);
        fill_standard_normal(f.view_mut(), 2);
        fill_standard_normal(e.view_mut(), 3);
        f.slice_mut(s![5.., 1]).fill(0.0);
        let labels: Vec<usize> = (0..10).map(|j| usize::from(j >= 5)).collect();
        (h.dot(&f.t()) + e * 0.5, Groups::from_labels(&labels).expect("groups"))
    }

    fn model(groups: Groups) -> GfaOnline {
        let model = GfaConfig {
            n_components: 3,
            noise: NoiseModel::Group,
            drop_factors: false,
            seed: 4,
            ..GfaConfig::default()
        };
        let config = GfaOnlineConfig {
            model,
            step_size: StepSize::Harmonic,
            n_effective: None,
        };
        GfaOnline::new(groups, config).expect("model")
    }

    #[test]
    fn one_batch_with_the_harmonic_step_is_one_batch_sweep() {
        // ρ_1 = 1 and N_eff = B: the rebuild sees exactly the batch model's statistics of the same q(H).
        let (x, groups) = data(40);
        let mut online = model(groups.clone());
        online.partial_fit(x.view()).expect("batch");
        let mut batch = GfaBatch::new(x.view(), groups, online.config.model.clone()).expect("model");
        batch.sweep().expect("sweep");
        let globals = online.globals().expect("fitted");
        let close = |a: &Array2<f64>, b: &Array2<f64>| (a - b).iter().all(|v| v.abs() < 1e-9);
        assert!(close(globals.loading_mean(), batch.loading_mean()));
        assert!((globals.tau_of_features() - batch.tau_of_features())
            .iter()
            .all(|v| v.abs() < 1e-9));
        assert_eq!(online.n_seen(), 40);
    }

    #[test]
    fn bad_batches_leave_the_model_unchanged() {
        let (x, groups) = data(60);
        let mut online = model(groups);
        assert!(online.partial_fit(x.slice(s![..2, ..])).is_err()); // first batch smaller than K
        assert!(online.globals().is_none());
        online.partial_fit(x.slice(s![..30, ..])).expect("batch");
        let before = online.clone();
        let mut bad = x.slice(s![30.., ..]).to_owned();
        bad[[3, 4]] = f64::NAN;
        assert!(online.partial_fit(bad.view()).is_err());
        assert!(online.partial_fit(x.slice(s![30.., ..5])).is_err());
        assert!(online.partial_fit(x.slice(s![30..30, ..])).is_err());
        assert_eq!(online, before);
    }

    #[test]
    fn checkpoint_round_trip_continues_identically() {
        let (x, groups) = data(90);
        let mut online = model(groups);
        let empty = GfaOnline::from_state(&online.to_state()).expect("unfitted");
        assert_eq!(empty, online);
        online.partial_fit(x.slice(s![..30, ..])).expect("batch");
        online.partial_fit(x.slice(s![30..60, ..])).expect("batch");
        let mut back = GfaOnline::from_state(&online.to_state()).expect("restore");
        assert_eq!(back, online);
        online.partial_fit(x.slice(s![60.., ..])).expect("batch");
        back.partial_fit(x.slice(s![60.., ..])).expect("batch");
        assert_eq!(back, online);
        let mut bad = online.to_state();
        bad.insert("n_batches".into(), StateValue::Int(0));
        assert!(GfaOnline::from_state(&bad).is_err());
        let mut bad = online.to_state();
        bad.insert("drop_factors".into(), StateValue::Bool(true));
        assert!(GfaOnline::from_state(&bad).is_err());
        let mut bad = online.to_state();
        bad.insert("avg_n_rows".into(), StateValue::Float(-1.0));
        assert!(GfaOnline::from_state(&bad).is_err());
    }
}
