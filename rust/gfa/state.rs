//! Checkpoints of batch GFA: the whole q (global and local factors), the column statistics, the data and
//! the fit history as a flat [`StateMap`], so a restored model predicts bit-identically and further sweeps
//! continue exactly. `from_state` re-runs the constructor's data checks and checks every value the updates
//! rely on: Gamma shapes and rates > 0, symmetric bounded covariances with a positive diagonal, variances
//! > 0, kept-factor indices increasing below the initial K, shapes consistent with (N, D, M, K).

use ndarray::{Array1, Array2, Array3, ArrayView2};

use super::batch::{validate, GfaBatch, GfaSweep};
use super::lowrank::LowRankArd;
use super::{GfaConfig, Groups, NoiseModel};
use crate::error::{FaError, Result};
use crate::scalar::Real;
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateValue, StateWriter};
use crate::state_checks::{bounded_symmetric, positive_diagonal, within};
use crate::vbfa::special::GammaQ;
use crate::vbfa::stats::{ColumnStats, LatentCovs, LatentGram, MissingPattern};
use crate::vbfa::Hyper;

fn bad(key: &str, reason: impl std::fmt::Display) -> FaError {
    FaError::InvalidState(format!("entry `{key}` {reason}"))
}

fn put3(w: &mut StateWriter, key: &str, a: &Array3<f64>) {
    w.array(key, a.shape().to_vec(), &a.iter().copied().collect::<Vec<_>>());
}

fn read3(r: &StateReader<'_>, key: &str, shape: [usize; 3]) -> Result<Array3<f64>> {
    let v = r.array::<f64>(key, &shape)?;
    Array3::from_shape_vec(shape, v).map_err(|e| FaError::InvalidState(e.to_string()))
}

/// Every K×K slice symmetric and bounded, with a positive diagonal when it is a covariance.
fn check_slices(key: &str, a: &Array3<f64>, covariance: bool) -> Result<()> {
    for s in a.outer_iter() {
        check_matrix(key, s, covariance)?;
    }
    Ok(())
}

fn check_matrix(key: &str, m: ArrayView2<f64>, covariance: bool) -> Result<()> {
    bounded_symmetric(key, m)?;
    if covariance {
        positive_diagonal(key, m)?;
    }
    Ok(())
}

fn put_gammas(w: &mut StateWriter, key: &str, shape: Vec<usize>, q: &[GammaQ]) {
    w.array(
        &format!("{key}_shape"),
        shape.clone(),
        &q.iter().map(|g| g.shape).collect::<Vec<_>>(),
    );
    w.array(
        &format!("{key}_rate"),
        shape,
        &q.iter().map(|g| g.rate).collect::<Vec<_>>(),
    );
}

fn read_gammas(r: &StateReader<'_>, key: &str, shape: &[usize]) -> Result<Vec<GammaQ>> {
    let (shape_key, rate_key) = (format!("{key}_shape"), format!("{key}_rate"));
    let shapes = r.array::<f64>(&shape_key, shape)?;
    let rates = r.array::<f64>(&rate_key, shape)?;
    within(&shape_key, &shapes, f64::MIN_POSITIVE, f64::MAX)?;
    within(&rate_key, &rates, f64::MIN_POSITIVE, f64::MAX)?;
    Ok(shapes
        .into_iter()
        .zip(rates)
        .map(|(shape, rate)| GammaQ { shape, rate })
        .collect())
}

/// Non-negative integers stored as float64 (exact below 2⁵³), each below `limit`.
pub(super) fn read_indices(r: &StateReader<'_>, key: &str, len: usize, limit: usize) -> Result<Vec<usize>> {
    r.array::<f64>(key, &[len])?
        .into_iter()
        .map(|v| {
            if v >= 0.0 && v.fract() == 0.0 && v < limit as f64 {
                Ok(v as usize)
            } else {
                Err(bad(key, format!("holds {v}, not an integer in [0, {limit})")))
            }
        })
        .collect()
}

pub(super) fn len_of(state: &StateMap, key: &str) -> Result<usize> {
    match crate::state::f64_shape(state, key).as_deref() {
        Some(&[len]) => Ok(len),
        _ => Err(bad(key, "is missing or not a float64 vector")),
    }
}

pub(super) fn write_config(w: &mut StateWriter, c: &GfaConfig) {
    w.put("n_components", StateValue::Int(c.n_components as u64));
    let noise = match c.noise {
        NoiseModel::Group => "group",
        NoiseModel::Feature => "feature",
    };
    w.put("noise", StateValue::Text(noise.into()));
    w.put("ard_rank", StateValue::Int(c.ard_rank.unwrap_or(0) as u64));
    w.put("rotate", StateValue::Bool(c.rotate));
    w.put("rotate_start", StateValue::Int(c.rotate_start));
    w.put("drop_factors", StateValue::Bool(c.drop_factors));
    w.put("seed", StateValue::Int(c.seed));
    let h = &c.hyper;
    for (key, value) in [
        ("ard_lambda", c.ard_lambda),
        ("drop_tol", c.drop_tol),
        ("init_noise_ratio", c.init_noise_ratio),
        ("a_alpha", h.a_alpha),
        ("b_alpha", h.b_alpha),
        ("a_tau", h.a_tau),
        ("b_tau", h.b_tau),
        ("beta", h.beta),
        ("broad_alpha", h.broad_alpha),
    ] {
        w.put(key, StateValue::Float(value));
    }
}

pub(super) fn read_config(r: &StateReader<'_>) -> Result<GfaConfig> {
    let noise = match r.text("noise")? {
        "group" => NoiseModel::Group,
        "feature" => NoiseModel::Feature,
        other => return Err(bad("noise", format!("must be 'group' or 'feature', got {other:?}"))),
    };
    let config = GfaConfig {
        n_components: r.usize("n_components")?,
        noise,
        ard_rank: Some(r.usize("ard_rank")?).filter(|&rank| rank > 0),
        ard_lambda: r.float("ard_lambda")?,
        hyper: Hyper {
            a_alpha: r.float("a_alpha")?,
            b_alpha: r.float("b_alpha")?,
            a_tau: r.float("a_tau")?,
            b_tau: r.float("b_tau")?,
            beta: r.float("beta")?,
            broad_alpha: r.float("broad_alpha")?,
        },
        rotate: r.bool("rotate")?,
        rotate_start: r.int("rotate_start")?,
        drop_factors: r.bool("drop_factors")?,
        drop_tol: r.float("drop_tol")?,
        init_noise_ratio: r.float("init_noise_ratio")?,
        seed: r.int("seed")?,
    };
    config.validate().map_err(|e| FaError::InvalidState(e.to_string()))?;
    Ok(config)
}

/// The data with NaN restored at the missing entries (stored as flat indices n·D + d).
fn read_data(r: &StateReader<'_>, n: usize, d: usize) -> Result<Array2<f64>> {
    let mut x = r.matrix("x", n, d)?;
    within("x", x.as_slice().unwrap_or(&[]), -f64::MAX_INPUT, f64::MAX_INPUT)?;
    let missing = read_indices(r, "missing", len_of(r.0, "missing")?, n * d)?;
    if missing.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("missing", "must be strictly increasing"));
    }
    for &flat in &missing {
        x[[flat / d, flat % d]] = f64::NAN;
    }
    Ok(x)
}

/// The column statistics under `prefix` ("stats_" for the batch model's, "avg_" for online averages).
pub(super) fn write_stats(w: &mut StateWriter, prefix: &str, s: &ColumnStats) {
    let key = |name: &str| format!("{prefix}{name}");
    w.vector(&key("count"), &s.count);
    w.vector(&key("sum_x"), &s.sum_x);
    w.vector(&key("sum_xx"), &s.sum_xx);
    w.matrix(&key("sum_h"), &s.sum_h);
    w.matrix(&key("sum_xh"), &s.sum_xh);
    match &s.gram {
        LatentGram::Shared(g) => w.matrix(&key("gram"), g),
        LatentGram::PerColumn(g) => put3(w, &key("gram"), g),
    }
    w.put(&key("n_rows"), StateValue::Float(s.n_rows));
    w.vector(&key("total_h"), &s.total_h);
    w.matrix(&key("total_gram"), &s.total_gram);
}

/// Statistics written by [`write_stats`]; `rows` = N for a batch model's (counts within [0, N], N rows),
/// None for scaled or averaged ones (counts and row total only >= 0).
pub(super) fn read_stats(
    r: &StateReader<'_>,
    prefix: &str,
    (d, k): (usize, usize),
    per_column: bool,
    rows: Option<usize>,
) -> Result<ColumnStats> {
    let key = |name: &str| format!("{prefix}{name}");
    let gram = if per_column {
        let g = read3(r, &key("gram"), [d, k, k])?;
        check_slices(&key("gram"), &g, false)?;
        LatentGram::PerColumn(g)
    } else {
        let g = r.matrix(&key("gram"), k, k)?;
        check_matrix(&key("gram"), g.view(), false)?;
        LatentGram::Shared(g)
    };
    let stats = ColumnStats {
        count: r.vector(&key("count"), d)?,
        sum_x: r.vector(&key("sum_x"), d)?,
        sum_xx: r.vector(&key("sum_xx"), d)?,
        sum_h: r.matrix(&key("sum_h"), d, k)?,
        sum_xh: r.matrix(&key("sum_xh"), d, k)?,
        gram,
        n_rows: r.float(&key("n_rows"))?,
        total_h: r.vector(&key("total_h"), k)?,
        total_gram: r.matrix(&key("total_gram"), k, k)?,
    };
    let upper = rows.map_or(f64::MAX, |n| n as f64);
    within(&key("count"), stats.count.as_slice().unwrap_or(&[]), 0.0, upper)?;
    within(&key("sum_xx"), stats.sum_xx.as_slice().unwrap_or(&[]), 0.0, f64::MAX)?;
    let rows_ok = match rows {
        Some(n) => stats.n_rows == n as f64,
        None => stats.n_rows > 0.0,
    };
    if !rows_ok {
        return Err(bad(
            &key("n_rows"),
            format!("must be N (or > 0 for averages), got {}", stats.n_rows),
        ));
    }
    check_matrix(&key("total_gram"), stats.total_gram.view(), false)?;
    Ok(stats)
}

fn write_latents(w: &mut StateWriter, covs: &LatentCovs) {
    match covs {
        LatentCovs::Shared { cov, log_det, .. } => {
            w.matrix("h_cov", cov);
            w.vector("h_log_det", &Array1::from(vec![*log_det]));
        }
        LatentCovs::PerRow { cov, log_det } => {
            put3(w, "h_cov", cov);
            w.vector("h_log_det", log_det);
        }
    }
}

fn read_latents(r: &StateReader<'_>, n: usize, k: usize, per_row: bool) -> Result<LatentCovs> {
    if per_row {
        let cov = read3(r, "h_cov", [n, k, k])?;
        check_slices("h_cov", &cov, true)?;
        Ok(LatentCovs::PerRow {
            cov,
            log_det: r.vector("h_log_det", n)?,
        })
    } else {
        let cov = r.matrix("h_cov", k, k)?;
        check_matrix("h_cov", cov.view(), true)?;
        Ok(LatentCovs::Shared {
            cov,
            log_det: r.vector("h_log_det", 1)?[0],
            n_rows: n,
        })
    }
}

fn write_history(w: &mut StateWriter, history: &[GfaSweep]) {
    let len = vec![history.len()];
    w.array(
        "history_elbo",
        len.clone(),
        &history.iter().map(|h| h.elbo).collect::<Vec<_>>(),
    );
    let ks: Vec<f64> = history.iter().map(|h| h.n_components as f64).collect();
    w.array("history_k", len.clone(), &ks);
    w.array(
        "history_seconds",
        len,
        &history.iter().map(|h| h.seconds).collect::<Vec<_>>(),
    );
}

fn read_history(r: &StateReader<'_>, k0: usize) -> Result<Vec<GfaSweep>> {
    let len = len_of(r.0, "history_elbo")?;
    let elbo = r.array::<f64>("history_elbo", &[len])?;
    let ks = read_indices(r, "history_k", len, k0 + 1)?;
    let seconds = r.array::<f64>("history_seconds", &[len])?;
    within("history_seconds", &seconds, 0.0, f64::MAX)?;
    Ok((0..len)
        .map(|i| GfaSweep {
            elbo: elbo[i],
            n_components: ks[i],
            seconds: seconds[i],
        })
        .collect())
}

impl Checkpoint for GfaBatch {
    const KIND: &'static str = "GFA";

    fn to_state(&self) -> StateMap {
        let mut w = StateWriter::new(Self::KIND);
        self.write_model(&mut w);
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        GfaBatch::read_model(state, false)
    }
}

impl GfaBatch {
    /// Every entry of the model but the kind (the online model stores its data-free globals this way).
    pub(super) fn write_model(&self, w: &mut StateWriter) {
        write_config(w, &self.config);
        let labels: Vec<f64> = self.groups.of_feature.iter().map(|&m| m as f64).collect();
        w.array("groups", vec![labels.len()], &labels);
        let d = self.x.ncols();
        w.matrix("x", &self.x);
        let flat: Vec<f64> = (self.missing.by_row.iter().enumerate())
            .flat_map(|(i, cols)| cols.iter().map(move |&j| (i * d + j) as f64))
            .collect();
        w.array("missing", vec![flat.len()], &flat);
        w.matrix("h_mean", &self.h_mean);
        write_latents(w, &self.h_cov);
        w.vector("c_mean", &self.c_mean);
        w.vector("c_var", &self.c_var);
        w.matrix("f_mean", &self.f_mean);
        put3(w, "f_cov", &self.f_cov);
        w.vector("f_log_det", &self.f_log_det);
        put_gammas(
            w,
            "alpha",
            self.alpha.shape().to_vec(),
            &self.alpha.iter().copied().collect::<Vec<_>>(),
        );
        put_gammas(w, "tau", vec![self.tau.len()], &self.tau);
        if let Some(lr) = &self.low_rank {
            let (packed, _) = lr.packed();
            w.array("low_rank", vec![packed.len()], packed);
        }
        write_stats(w, "stats_", &self.stats);
        w.vector("group_variance", &Array1::from(self.group_variance.clone()));
        w.array(
            "kept",
            vec![self.kept.len()],
            &self.kept.iter().map(|&j| j as f64).collect::<Vec<_>>(),
        );
        w.put("n_sweeps", StateValue::Int(self.n_sweeps));
        write_history(w, &self.history);
        w.put("converged", StateValue::Bool(self.converged));
    }

    /// Rebuild from [`GfaBatch::write_model`]'s entries; `data_free`: the online model's globals (0 rows,
    /// statistics that are scaled averages), else the data are checked as by the constructor.
    pub(super) fn read_model(state: &StateMap, data_free: bool) -> Result<Self> {
        let r = StateReader(state);
        let config = read_config(&r)?;
        let d = len_of(state, "groups")?;
        let labels = read_indices(&r, "groups", d, d)?;
        let groups = Groups::from_labels(&labels).map_err(|e| FaError::InvalidState(e.to_string()))?;
        let n = match crate::state::f64_shape(state, "x").as_deref() {
            Some(&[rows, _]) => rows,
            _ => return Err(bad("x", "is missing or not a float64 matrix")),
        };
        let x = read_data(&r, n, d)?;
        if data_free && n != 0 {
            return Err(bad("x", format!("must have 0 rows in an online model, has {n}")));
        }
        if !data_free {
            validate(x.view(), &groups, config.n_components).map_err(|e| FaError::InvalidState(e.to_string()))?;
        }
        let missing = MissingPattern::of(x.view());
        let k = len_of(state, "kept")?;
        if k < 1 || k > config.n_components {
            return Err(bad(
                "kept",
                format!("must hold 1..={} factors, holds {k}", config.n_components),
            ));
        }
        let kept = read_indices(&r, "kept", k, config.n_components)?;
        if kept.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("kept", "must be strictly increasing"));
        }
        let n_groups = groups.n_groups();
        let n_tau = match config.noise {
            NoiseModel::Group => n_groups,
            NoiseModel::Feature => d,
        };
        let f_cov = read3(&r, "f_cov", [d, k, k])?;
        check_slices("f_cov", &f_cov, true)?;
        let c_var = r.vector("c_var", d)?;
        within("c_var", c_var.as_slice().unwrap_or(&[]), f64::MIN_POSITIVE, f64::MAX)?;
        let group_variance = r.vector("group_variance", n_groups)?.to_vec();
        within("group_variance", &group_variance, f64::MIN_POSITIVE, f64::MAX)?;
        let low_rank = match config.ard_rank {
            None => None,
            Some(rank) => {
                let packed = r.array::<f64>("low_rank", &[(n_groups + k) * rank + n_groups + k])?;
                let lr = LowRankArd::from_packed(n_groups, k, rank, config.ard_lambda, &packed);
                Some(lr.ok_or_else(|| bad("low_rank", "has the wrong length"))?)
            }
        };
        // The low-rank ARD leaves q(α) unused (and at its size before any dropping).
        let alpha_cols = match (&low_rank, crate::state::f64_shape(state, "alpha_shape").as_deref()) {
            (Some(_), Some(&[_, cols])) => cols,
            _ => k,
        };
        let alpha = read_gammas(&r, "alpha", &[n_groups, alpha_cols])?;
        let history = read_history(&r, config.n_components)?;
        let n_sweeps = r.int("n_sweeps")?;
        if (history.len() as u64) > n_sweeps {
            return Err(bad(
                "n_sweeps",
                format!("is {n_sweeps}, below the {} recorded sweeps", history.len()),
            ));
        }
        let model = GfaBatch {
            h_mean: r.matrix("h_mean", n, k)?,
            h_cov: read_latents(&r, n, k, missing.any())?,
            c_mean: r.vector("c_mean", d)?,
            c_var,
            f_mean: r.matrix("f_mean", d, k)?,
            f_cov,
            f_log_det: r.vector("f_log_det", d)?,
            alpha: Array2::from_shape_vec((n_groups, alpha_cols), alpha)
                .map_err(|e| FaError::InvalidState(e.to_string()))?,
            tau: read_gammas(&r, "tau", &[n_tau])?,
            low_rank,
            stats: read_stats(&r, "stats_", (d, k), missing.any(), (!data_free).then_some(n))?,
            x: x.mapv(|v| if v.is_nan() { 0.0 } else { v }),
            missing,
            group_variance,
            kept,
            n_sweeps,
            history,
            converged: r.bool("converged")?,
            config,
            groups,
        };
        within(
            "f_mean",
            model.f_mean.as_slice().unwrap_or(&[]),
            -f64::MAX_STATE,
            f64::MAX_STATE,
        )?;
        Ok(model)
    }
}
