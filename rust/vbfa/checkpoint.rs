//! Exact checkpoints of batch and online VB-FA ([`Checkpoint`] for [`VbfaBatch`] and [`VbfaOnline`]).
//!
//! The state map holds every factor of q and every statistic the next update reads, so a restored model
//! continues bit-identically. `from_state` checks, besides the shapes and finiteness the
//! [`StateReader`] checks, every value the updates rely on (with the shared [`crate::state_checks`]):
//! - settings: K >= 1, positive finite prior hyper-parameters and noise ratio, a valid step-size schedule
//!   and N_eff > 0, sample and sweep counts <= 2⁵³;
//! - Gamma factors q(τ_d), q(α_k): shape > 0 and rate > 0 (⟨τ⟩ = a/b and ⟨ln τ⟩ = ψ(a) − ln b exist);
//! - c̃_d > 0; Σ_{h_n} and Σ_{f_d} symmetric positive definite (their log-determinants enter the bound);
//! - statistics: counts n_d > 0, Σ x² >= 0, the K×K sums G_d, S, T, W, V symmetric, bounded and with a
//!   positive diagonal (as for the other models' K×K statistics);
//! - batch data: |x| <= 1e100, a 0/1 observation mask with x = 0 where missing and one observed value per
//!   column, and the shared/per-row layout of Σ_h and G matching whether anything is missing.

use ndarray::{Array2, Array3};

use super::online::{LoadingSums, OnlineConfig, OnlineState};
use super::special::GammaQ;
use super::stats::{ColumnStats, LatentCovs, LatentGram, MissingPattern};
use super::{AlphaFactor, Globals, Hyper, Prior, SweepRecord, Translation, VbfaBatch, VbfaConfig, VbfaOnline};
use crate::error::{FaError, Result};
use crate::scalar::Real;
use crate::schedule::{read_schedule, write_schedule};
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateValue, StateWriter};
use crate::state_checks::{bounded_symmetric, positive, positive_definite, positive_diagonal, sample_count, within};

fn invalid_state(err: FaError) -> FaError {
    match err {
        FaError::InvalidState(_) => err,
        other => FaError::InvalidState(other.to_string()),
    }
}

fn put_array3(w: &mut StateWriter, key: &str, a: &Array3<f64>) {
    w.array(key, a.shape().to_vec(), &a.iter().copied().collect::<Vec<f64>>());
}

fn read_array3(r: &StateReader, key: &str, shape: (usize, usize, usize)) -> Result<Array3<f64>> {
    let data = r.array::<f64>(key, &[shape.0, shape.1, shape.2])?;
    Array3::from_shape_vec(shape, data).map_err(|e| FaError::InvalidState(e.to_string()))
}

/// Every K×K slice of a D×K×K stack symmetric positive definite.
fn stack_positive_definite(key: &str, stack: &Array3<f64>) -> Result<()> {
    for (i, m) in stack.outer_iter().enumerate() {
        positive_definite(&format!("{key}[{i}]"), m)?;
    }
    Ok(())
}

/// Every K×K slice of a stack symmetric, bounded and with a positive diagonal (a sum of moments).
fn stack_statistics(key: &str, stack: &Array3<f64>) -> Result<()> {
    for (i, m) in stack.outer_iter().enumerate() {
        let name = format!("{key}[{i}]");
        bounded_symmetric(&name, m)?;
        positive_diagonal(&name, m)?;
    }
    Ok(())
}

fn statistic(key: &str, m: &Array2<f64>) -> Result<()> {
    bounded_symmetric(key, m.view())?;
    positive_diagonal(key, m.view())
}

// ---- settings ---------------------------------------------------------------------------------------

fn put_config(w: &mut StateWriter, c: &VbfaConfig) {
    w.put("n_components", StateValue::Int(c.n_components as u64));
    let prior = match c.prior {
        Prior::Ard => "ard",
        Prior::Broad => "broad",
    };
    w.put("prior", StateValue::Text(prior.into()));
    let h = &c.hyper;
    for (key, value) in [
        ("a_alpha", h.a_alpha),
        ("b_alpha", h.b_alpha),
        ("a_tau", h.a_tau),
        ("b_tau", h.b_tau),
        ("beta", h.beta),
        ("broad_alpha", h.broad_alpha),
        ("init_noise_ratio", c.init_noise_ratio),
    ] {
        w.put(key, StateValue::Float(value));
    }
    w.put("transform", StateValue::Bool(c.transform));
    w.put("transform_start", StateValue::Int(c.transform_start));
    let translation = match c.translation {
        Translation::Mean => "mean",
        Translation::Exact => "exact",
    };
    w.put("translation", StateValue::Text(translation.into()));
    w.put("seed", StateValue::Int(c.seed));
}

fn read_config(r: &StateReader) -> Result<VbfaConfig> {
    let prior = match r.text("prior")? {
        "ard" => Prior::Ard,
        "broad" => Prior::Broad,
        other => return Err(FaError::InvalidState(format!("unknown prior {other:?}"))),
    };
    let translation = match r.text("translation")? {
        "mean" => Translation::Mean,
        "exact" => Translation::Exact,
        other => return Err(FaError::InvalidState(format!("unknown translation {other:?}"))),
    };
    let config = VbfaConfig {
        n_components: r.usize("n_components")?,
        prior,
        hyper: Hyper {
            a_alpha: r.float("a_alpha")?,
            b_alpha: r.float("b_alpha")?,
            a_tau: r.float("a_tau")?,
            b_tau: r.float("b_tau")?,
            beta: r.float("beta")?,
            broad_alpha: r.float("broad_alpha")?,
        },
        transform: r.bool("transform")?,
        transform_start: r.int("transform_start")?,
        translation,
        init_noise_ratio: r.float("init_noise_ratio")?,
        seed: r.int("seed")?,
    };
    config.validate().map_err(invalid_state)?;
    Ok(config)
}

// ---- global factors ---------------------------------------------------------------------------------

fn put_gammas(w: &mut StateWriter, prefix: &str, q: &[GammaQ]) {
    let shape: Vec<f64> = q.iter().map(|g| g.shape).collect();
    let rate: Vec<f64> = q.iter().map(|g| g.rate).collect();
    w.array(&format!("{prefix}_shape"), vec![q.len()], &shape);
    w.array(&format!("{prefix}_rate"), vec![q.len()], &rate);
}

fn read_gammas(r: &StateReader, prefix: &str, len: usize) -> Result<Vec<GammaQ>> {
    let (shape_key, rate_key) = (format!("{prefix}_shape"), format!("{prefix}_rate"));
    let shape = r.array::<f64>(&shape_key, &[len])?;
    let rate = r.array::<f64>(&rate_key, &[len])?;
    positive(&shape_key, &shape)?;
    positive(&rate_key, &rate)?;
    Ok(shape
        .into_iter()
        .zip(rate)
        .map(|(shape, rate)| GammaQ { shape, rate })
        .collect())
}

fn put_globals(w: &mut StateWriter, g: &Globals) {
    w.vector("bias_mean", &g.c_mean);
    w.vector("bias_var", &g.c_var);
    w.matrix("loading_mean", &g.f_mean);
    put_gammas(w, "noise", &g.tau);
    if let AlphaFactor::Ard(q) = &g.alpha {
        put_gammas(w, "ard", q);
    }
}

fn read_globals(r: &StateReader, d: usize, config: &VbfaConfig) -> Result<Globals> {
    let k = config.n_components;
    let c_var = r.vector("bias_var", d)?;
    positive("bias_var", &c_var.to_vec())?;
    let alpha = match config.prior {
        Prior::Ard => AlphaFactor::Ard(read_gammas(r, "ard", k)?),
        Prior::Broad => AlphaFactor::Fixed(config.hyper.broad_alpha, k),
    };
    Ok(Globals {
        c_mean: r.vector("bias_mean", d)?,
        c_var,
        f_mean: r.matrix("loading_mean", d, k)?,
        alpha,
        tau: read_gammas(r, "noise", d)?,
    })
}

// ---- statistics -------------------------------------------------------------------------------------

fn put_stats(w: &mut StateWriter, s: &ColumnStats) {
    w.vector("stats_count", &s.count);
    w.vector("stats_sum_x", &s.sum_x);
    w.vector("stats_sum_xx", &s.sum_xx);
    w.matrix("stats_sum_h", &s.sum_h);
    w.matrix("stats_sum_xh", &s.sum_xh);
    match &s.gram {
        LatentGram::Shared(g) => w.matrix("stats_gram", g),
        LatentGram::PerColumn(g) => put_array3(w, "stats_gram", g),
    }
    w.put("stats_n_rows", StateValue::Float(s.n_rows));
    w.vector("stats_total_h", &s.total_h);
    w.matrix("stats_total_gram", &s.total_gram);
}

fn read_stats(r: &StateReader, d: usize, k: usize, per_column: bool) -> Result<ColumnStats> {
    let count = r.vector("stats_count", d)?;
    positive("stats_count", &count.to_vec())?;
    let sum_xx = r.vector("stats_sum_xx", d)?;
    within("stats_sum_xx", &sum_xx.to_vec(), 0.0, f64::MAX)?;
    let gram = if per_column {
        let g = read_array3(r, "stats_gram", (d, k, k))?;
        stack_statistics("stats_gram", &g)?;
        LatentGram::PerColumn(g)
    } else {
        let g = r.matrix("stats_gram", k, k)?;
        statistic("stats_gram", &g)?;
        LatentGram::Shared(g)
    };
    let n_rows = r.float("stats_n_rows")?;
    positive("stats_n_rows", &[n_rows])?;
    let total_gram = r.matrix("stats_total_gram", k, k)?;
    statistic("stats_total_gram", &total_gram)?;
    Ok(ColumnStats {
        count,
        sum_x: r.vector("stats_sum_x", d)?,
        sum_xx,
        sum_h: r.matrix("stats_sum_h", d, k)?,
        sum_xh: r.matrix("stats_sum_xh", d, k)?,
        gram,
        n_rows,
        total_h: r.vector("stats_total_h", k)?,
        total_gram,
    })
}

// ---- batch VB-FA ------------------------------------------------------------------------------------

/// The data (0 where missing) and the 0/1 observation mask, checked; returns (x, missing pattern).
fn read_data(r: &StateReader, n: usize, d: usize) -> Result<(Array2<f64>, MissingPattern)> {
    let x = r.matrix("data", n, d)?;
    within(
        "data",
        &x.iter().copied().collect::<Vec<f64>>(),
        -f64::MAX_INPUT,
        f64::MAX_INPUT,
    )?;
    let observed = r.matrix("observed", n, d)?;
    if let Some(v) = observed.iter().find(|v| **v != 0.0 && **v != 1.0) {
        return Err(FaError::InvalidState(format!(
            "entry `observed` must hold only 0 and 1, holds {v:e}"
        )));
    }
    if x.iter().zip(&observed).any(|(v, o)| *o == 0.0 && *v != 0.0) {
        return Err(FaError::InvalidState(
            "entry `data` must be 0 where `observed` is 0".into(),
        ));
    }
    if let Some(col) = observed.columns().into_iter().position(|c| c.iter().all(|o| *o == 0.0)) {
        return Err(FaError::InvalidState(format!(
            "entry `observed`: column {col} has no observed value"
        )));
    }
    let with_nan = ndarray::Zip::from(&x)
        .and(&observed)
        .map_collect(|v, o| if *o == 1.0 { *v } else { f64::NAN });
    Ok((x, MissingPattern::of(with_nan.view())))
}

fn read_latent_covs(r: &StateReader, n: usize, k: usize, shared: bool) -> Result<LatentCovs> {
    if shared {
        let cov = r.matrix("latent_cov", k, k)?;
        positive_definite("latent_cov", cov.view())?;
        Ok(LatentCovs::Shared {
            cov,
            log_det: r.float("latent_log_det")?,
            n_rows: n,
        })
    } else {
        let cov = read_array3(r, "latent_cov", (n, k, k))?;
        stack_positive_definite("latent_cov", &cov)?;
        Ok(LatentCovs::PerRow {
            cov,
            log_det: r.vector("latent_log_det", n)?,
        })
    }
}

fn read_history(r: &StateReader, n_sweeps: u64) -> Result<Vec<SweepRecord>> {
    let len = r.usize("n_history")?;
    if len as u64 > n_sweeps {
        return Err(FaError::InvalidState(format!(
            "entry `n_history` ({len}) exceeds `n_sweeps` ({n_sweeps})"
        )));
    }
    let elbo = r.array::<f64>("history_elbo", &[len])?;
    let seconds = r.array::<f64>("history_seconds", &[len])?;
    within("history_seconds", &seconds, 0.0, f64::MAX)?;
    Ok(elbo
        .into_iter()
        .zip(seconds)
        .map(|(elbo, seconds)| SweepRecord { elbo, seconds })
        .collect())
}

impl Checkpoint for VbfaBatch {
    const KIND: &'static str = "VBFA";

    fn to_state(&self) -> StateMap {
        let mut w = StateWriter::new(Self::KIND);
        let (n, d) = self.x.dim();
        put_config(&mut w, &self.config);
        w.put("n_samples", StateValue::Int(n as u64));
        w.put("n_features", StateValue::Int(d as u64));
        w.matrix("data", &self.x);
        let mut observed = Array2::<f64>::ones((n, d));
        for (i, cols) in self.missing.by_row.iter().enumerate() {
            cols.iter().for_each(|&j| observed[[i, j]] = 0.0);
        }
        w.matrix("observed", &observed);
        w.matrix("latent_mean", &self.h_mean);
        match &self.h_cov {
            LatentCovs::Shared { cov, log_det, .. } => {
                w.matrix("latent_cov", cov);
                w.put("latent_log_det", StateValue::Float(*log_det));
            }
            LatentCovs::PerRow { cov, log_det } => {
                put_array3(&mut w, "latent_cov", cov);
                w.vector("latent_log_det", log_det);
            }
        }
        put_globals(&mut w, &self.globals);
        put_array3(&mut w, "loading_cov", &self.f_cov);
        w.vector("loading_log_det", &self.f_log_det);
        put_stats(&mut w, &self.stats);
        w.put("n_sweeps", StateValue::Int(self.n_sweeps));
        w.put("n_history", StateValue::Int(self.history.len() as u64));
        let elbo: Vec<f64> = self.history.iter().map(|h| h.elbo).collect();
        let seconds: Vec<f64> = self.history.iter().map(|h| h.seconds).collect();
        w.array("history_elbo", vec![elbo.len()], &elbo);
        w.array("history_seconds", vec![seconds.len()], &seconds);
        w.put("converged", StateValue::Bool(self.converged));
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let config = read_config(&r)?;
        let (n, d, k) = (r.usize("n_samples")?, r.usize("n_features")?, config.n_components);
        if n < 1 || d < 1 {
            return Err(FaError::InvalidState(format!(
                "n_samples and n_features must be >= 1, got {n} and {d}"
            )));
        }
        let (x, missing) = read_data(&r, n, d)?;
        let complete = !missing.any();
        let globals = read_globals(&r, d, &config)?;
        let f_cov = read_array3(&r, "loading_cov", (d, k, k))?;
        stack_positive_definite("loading_cov", &f_cov)?;
        let n_sweeps = r.int("n_sweeps")?;
        sample_count("n_sweeps", n_sweeps)?;
        let stats = read_stats(&r, d, k, !complete)?;
        if stats.n_rows != n as f64 {
            return Err(FaError::InvalidState(format!(
                "entry `stats_n_rows` must be n_samples = {n}, got {}",
                stats.n_rows
            )));
        }
        Ok(VbfaBatch {
            h_mean: r.matrix("latent_mean", n, k)?,
            h_cov: read_latent_covs(&r, n, k, complete)?,
            x,
            missing,
            globals,
            f_cov,
            f_log_det: r.vector("loading_log_det", d)?,
            stats,
            history: read_history(&r, n_sweeps)?,
            n_sweeps,
            converged: r.bool("converged")?,
            config,
        })
    }
}

// ---- online VB-FA -----------------------------------------------------------------------------------

impl Checkpoint for VbfaOnline {
    const KIND: &'static str = "OnlineVBFA";

    fn to_state(&self) -> StateMap {
        let mut w = StateWriter::new(Self::KIND);
        put_config(&mut w, &self.config.model);
        write_schedule(&mut w, &self.config.step_size);
        if let Some(n_eff) = self.config.n_effective {
            w.put("n_effective", StateValue::Float(n_eff));
        }
        w.put("n_features", StateValue::Int(self.n_features as u64));
        w.put("n_seen", StateValue::Int(self.n_seen));
        w.put("n_batches", StateValue::Int(self.n_batches));
        w.put("fitted", StateValue::Bool(self.state.is_some()));
        if let Some(s) = &self.state {
            put_stats(&mut w, &s.averages);
            put_globals(&mut w, &s.globals);
            w.matrix("sum_weighted_gram", &s.sums.weighted_gram);
            w.matrix("sum_gram", &s.sums.gram);
            w.matrix("sum_weighted_cov", &s.sums.weighted_cov);
        }
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let n_effective = if r.has("n_effective") {
            Some(r.float("n_effective")?)
        } else {
            None
        };
        let config = OnlineConfig {
            model: read_config(&r)?,
            step_size: read_schedule(&r)?,
            n_effective,
        };
        let (d, k) = (r.usize("n_features")?, config.model.n_components);
        let mut model = VbfaOnline::new(d, config).map_err(invalid_state)?;
        let (n_seen, n_batches) = (r.int("n_seen")?, r.int("n_batches")?);
        sample_count("n_seen", n_seen)?;
        let fitted = r.bool("fitted")?;
        if n_batches > n_seen || fitted != (n_batches > 0) {
            return Err(FaError::InvalidState(format!(
                "inconsistent counts: n_seen = {n_seen}, n_batches = {n_batches}, fitted = {fitted}"
            )));
        }
        if fitted {
            let sums = LoadingSums {
                weighted_gram: r.matrix("sum_weighted_gram", k, k)?,
                gram: r.matrix("sum_gram", k, k)?,
                weighted_cov: r.matrix("sum_weighted_cov", k, k)?,
            };
            statistic("sum_weighted_gram", &sums.weighted_gram)?;
            statistic("sum_gram", &sums.gram)?;
            statistic("sum_weighted_cov", &sums.weighted_cov)?;
            model.state = Some(OnlineState {
                averages: read_stats(&r, d, k, false)?,
                globals: read_globals(&r, d, &model.config.model)?,
                sums,
            });
        }
        model.n_seen = n_seen;
        model.n_batches = n_batches;
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::fill_standard_normal;
    use crate::schedule::StepSize;

    fn data(n: usize, d: usize, missing: bool) -> Array2<f64> {
        let mut x = Array2::zeros((n, d));
        fill_standard_normal(x.view_mut(), 7);
        if missing {
            x[[1, 2]] = f64::NAN;
            x[[4, 0]] = f64::NAN;
        }
        x
    }

    fn config() -> VbfaConfig {
        VbfaConfig {
            n_components: 3,
            transform_start: 1,
            ..VbfaConfig::default()
        }
    }

    #[test]
    fn batch_round_trip_is_exact_and_continues_identically() {
        for missing in [false, true] {
            let x = data(20, 6, missing);
            let mut a = VbfaBatch::new(x.view(), config()).expect("model");
            a.fit(4, 0.0).expect("fit");
            let mut b = VbfaBatch::from_state(&a.to_state()).expect("restore");
            assert_eq!(a, b);
            a.sweep().expect("sweep");
            b.sweep().expect("sweep");
            assert_eq!(a, b);
        }
    }

    #[test]
    fn online_round_trip_is_exact_and_continues_identically() {
        let x = data(40, 5, false);
        let cfg = OnlineConfig {
            model: config(),
            step_size: StepSize::Power { tau0: 1.0, kappa: 0.7 },
            n_effective: Some(100.0),
        };
        let fresh = VbfaOnline::new(5, cfg).expect("model");
        assert_eq!(VbfaOnline::from_state(&fresh.to_state()).expect("restore"), fresh);
        let mut a = fresh;
        a.partial_fit(x.slice(ndarray::s![..20, ..])).expect("fit");
        let mut b = VbfaOnline::from_state(&a.to_state()).expect("restore");
        a.partial_fit(x.slice(ndarray::s![20.., ..])).expect("fit");
        b.partial_fit(x.slice(ndarray::s![20.., ..])).expect("fit");
        assert_eq!(a, b);
    }

    #[test]
    fn invalid_values_are_rejected() {
        let x = data(20, 6, true);
        let mut m = VbfaBatch::new(x.view(), config()).expect("model");
        m.fit(2, 0.0).expect("fit");
        let good = m.to_state();
        let edit = |key: &str, f: &dyn Fn(&mut Vec<f64>)| {
            let mut s = good.clone();
            if let Some(StateValue::F64(_, v)) = s.get_mut(key) {
                f(v);
            }
            VbfaBatch::from_state(&s)
        };
        assert!(edit("noise_rate", &|v| v[0] = -1.0).is_err());
        assert!(edit("ard_shape", &|v| v[0] = 0.0).is_err());
        assert!(edit("bias_var", &|v| v[0] = f64::NAN).is_err());
        assert!(edit("loading_cov", &|v| v[0] = -1.0).is_err());
        assert!(edit("latent_cov", &|v| v[1] = 1e3).is_err());
        assert!(edit("observed", &|v| v[0] = 0.5).is_err());
        assert!(edit("data", &|v| v[0] = 1e200).is_err());
        let mut short = good.clone();
        short.insert("bias_mean".into(), StateValue::F64(vec![5], vec![0.0; 5]));
        assert!(VbfaBatch::from_state(&short).is_err());
        let mut wrong = good.clone();
        wrong.insert("kind".into(), StateValue::Text("OnlineVBFA".into()));
        assert!(VbfaBatch::from_state(&wrong).is_err());
    }
}
