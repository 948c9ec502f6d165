//! Mini-batch online EM for factor analysis: the E-step of B samples shares one F and Ψ, so the
//! statistics become matrix products (BLAS-3) instead of B separate passes over the D×K state.
//!
//! This is *not* the thesis's Algorithm 2 (Brownlie 2021, "Extending the Bayesian Deep Learning Method
//! MultiSWAG"): that one changes F and Ψ after every sample. Here, for the t-th mini-batch X_b (B×D), with
//! deviations D_b = X_b − θ̄ (θ̄ the running mean, or the data set's exact mean when it is known):
//!
//! * E-step (4.23) for every row at once: C = Fᵀ Ψ⁻¹ (K×D), Σ = (I + C F)⁻¹, W = Cᵀ Σ (D×K),
//!   M = D_b W (B×K, one GEMM), i.e. row i of M is m_i = Σ C d_i.
//! * Stepwise statistics (Cappé & Moulines, "On-line expectation–maximization algorithm for latent data
//!   models"): with ρ_t from the schedule over *batches*,
//!   Ā ← (1 − ρ) Ā + ρ D_bᵀ M / B (D×K, one GEMM), B̄ ← (1 − ρ) B̄ + ρ Mᵀ M / B,
//!   d̄² ← (1 − ρ) d̄² + ρ mean_i d_i² (with the same ρ, so the averaged moment matrix of (d, m) stays
//!   positive semi-definite and ψ below cannot turn negative).
//! * M-step (4.33, 4.35): H̄ = Σ + B̄, F = Ā H̄⁻¹, ψ = max(d̄² − rowsum(F ⊙ Ā), floor), the floor relative
//!   to σ̂² = mean_d d̄²_d. With whitening (parameter-expanded EM, Liu, Rubin & Wu 1998), R Rᵀ = H̄,
//!   Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ and F = Ā: the same Gaussian in a basis where H̄ = I.
//!
//! Memory: Ā, F and one B×D batch buffer, plus K×K matrices. An update is atomic: every new D-sized
//! array is computed before any is stored, so an error leaves the model as it was.

use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2, Axis, Zip};

use crate::engine::isa::Isa;
use crate::error::{invalid, FaError, Result};
use crate::linalg::SpdFactor;
use crate::m_step::{loadings_map, LoadingsMap};
use crate::scalar::Real;
use crate::schedule::StepSize;

/// Hyper-parameters of [`MiniBatchEm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MiniBatchConfig {
    /// Step sizes ρ_t over mini-batches (ρ_1 = 1: the first batch initialises the statistics).
    pub schedule: StepSize,
    /// Apply the whitening (PX-EM) step after every M-step.
    pub whiten: bool,
    /// Lower bound on every ψ_d, relative to σ̂² (mean over features of d̄²).
    pub noise_floor: f64,
}

/// The data's per-feature moments, when known before fitting (whole-data-set fits compute them in one pass).
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    /// Exact mean of the data set (D).
    pub mean: Array1<f64>,
    /// Exact per-feature variance of the data set (D): sets the start (σ̂ and ψ₀) before the first batch.
    pub variance: Array1<f64>,
}

/// Mini-batch online EM state: mean θ̄ (D), d̄² (D), Ā (D×K), B̄ and Σ (K×K), F (D×K), ψ (D).
#[derive(Debug, Clone)]
pub struct MiniBatchEm {
    config: MiniBatchConfig,
    fixed: bool,
    mean: Array1<f64>,
    dsq: Array1<f64>,
    a_bar: Array2<f64>,
    b_bar: Array2<f64>,
    loadings: Array2<f64>,
    psi: Array1<f64>,
    n_seen: u64,
    n_batches: u64,
    started: bool,
    average: Option<StatAverage>,
}

impl MiniBatchEm {
    /// A model with initial loadings `init` (D×K, e.g. orthonormal columns; scaled by σ̂ when the first
    /// moments are known) and, optionally, the data set's exact moments (then θ̄ stays fixed).
    pub fn new(init: ArrayView2<f64>, config: MiniBatchConfig, moments: Option<Moments>) -> Result<Self> {
        let (d, k) = init.dim();
        crate::config_checks::check_components(d, k)?;
        config.schedule.validate()?;
        if !(config.noise_floor > 0.0 && config.noise_floor < 1.0) {
            return Err(invalid(
                "noise_floor",
                format!("must lie in (0, 1), got {}", config.noise_floor),
            ));
        }
        if init.iter().any(|v| !v.is_finite()) {
            return Err(invalid("init", "must be finite"));
        }
        let mut model = MiniBatchEm {
            config,
            fixed: false,
            mean: Array1::zeros(d),
            dsq: Array1::zeros(d),
            a_bar: Array2::zeros((d, k)),
            b_bar: Array2::zeros((k, k)),
            loadings: init.to_owned(),
            psi: Array1::ones(d),
            n_seen: 0,
            n_batches: 0,
            started: false,
            average: None,
        };
        if let Some(m) = moments {
            model.set_moments(m)?;
        }
        Ok(model)
    }

    fn set_moments(&mut self, m: Moments) -> Result<()> {
        let d = self.mean.len();
        for (what, v) in [("mean", &m.mean), ("variance", &m.variance)] {
            if v.len() != d {
                return Err(FaError::Shape {
                    what,
                    expected: format!("({d},)"),
                    got: vec![v.len()],
                });
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(invalid(what, "must be finite"));
            }
        }
        if m.variance.iter().any(|&v| v < 0.0) {
            return Err(invalid("variance", "must be >= 0"));
        }
        self.mean = m.mean;
        self.dsq = m.variance;
        self.fixed = true;
        self.start();
        Ok(())
    }

    /// F ← F₀ σ̂, ψ ← max(d̄², floor): the data-scaled start, once d̄² is known.
    fn start(&mut self) {
        let scale_sq = self.scale_sq();
        if scale_sq > 0.0 {
            self.loadings *= scale_sq.sqrt();
        }
        let floor = self.floor();
        self.psi = self.dsq.mapv(|v| v.max(floor));
        self.started = true;
    }

    fn scale_sq(&self) -> f64 {
        self.dsq.mean().unwrap_or(0.0)
    }

    fn floor(&self) -> f64 {
        (self.config.noise_floor * self.scale_sq()).max(f64::MIN_POSITIVE.sqrt())
    }

    /// Number of rows applied so far.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }

    /// Number of mini-batches applied so far (the t of ρ_t).
    pub fn n_batches(&self) -> u64 {
        self.n_batches
    }

    /// Running (or fixed) mean θ̄ (D).
    pub fn mean(&self) -> ArrayView1<'_, f64> {
        self.mean.view()
    }

    /// Loadings F (D×K).
    pub fn loadings(&self) -> ArrayView2<'_, f64> {
        self.loadings.view()
    }

    /// Noise variances ψ (D).
    pub fn noise_variance(&self) -> ArrayView1<'_, f64> {
        self.psi.view()
    }

    /// Whether at least one mini-batch has been applied after the moments were known.
    pub fn is_fitted(&self) -> bool {
        self.n_batches > 0 && self.started
    }

    /// Apply one mini-batch (B×D, B >= 1; rows must be finite and below `X::MAX_INPUT` in magnitude).
    /// Atomic: on error nothing changes.
    pub fn update<X: Real>(&mut self, x: ArrayView2<X>) -> Result<()> {
        let (b, d) = x.dim();
        if d != self.mean.len() || b == 0 {
            return Err(FaError::Shape {
                what: "batch",
                expected: format!("(n_samples >= 1, {})", self.mean.len()),
                got: vec![b, d],
            });
        }
        let owned;
        let x = if x.row(0).as_slice().is_some() {
            x
        } else {
            owned = x.as_standard_layout().into_owned();
            owned.view()
        };
        let rows: Vec<&[X]> = x.rows().into_iter().filter_map(|r| r.to_slice()).collect();
        if rows.len() != b {
            return Err(FaError::InvalidState(
                "batch rows could not be read as contiguous slices".into(),
            ));
        }
        self.update_rows(&rows)
    }

    /// Apply one mini-batch given as B >= 1 rows of D values each (e.g. rows of a larger array picked by a
    /// shuffled index, read where they lie). Atomic: on error nothing changes.
    pub fn update_rows<X: Real>(&mut self, rows: &[&[X]]) -> Result<()> {
        self.check_rows_shape(rows)?;
        let b = rows.len();
        let n_after = self.n_seen + b as u64;
        let mean = if self.fixed {
            self.mean.clone()
        } else {
            running_mean(&self.mean, rows, self.n_seen, n_after)
        };
        let t = self.n_batches + 1;
        let rho = self.config.schedule.rho(t);
        let mut next = self.clone();
        next.mean = mean;
        // d̄² is averaged with the same ρ as Ā and B̄ even when the data's variance is known: the averaged
        // moment matrix of (d, m) is then positive semi-definite, so ψ = d̄² − Ā H̄⁻¹ Āᵀ >= 0 up to
        // rounding. An exact d̄² mixed with lagged Ā, B̄ pushed ψ of nearly collinear features below zero.
        let started = self.started;
        if !started {
            // The data-scaled start needs d̄² before the E-step: one extra pass, on the first batch only.
            next.average_squares(&column_squares(rows, &next.mean), b, rho);
            next.start();
        }
        let stats = next.estep(rows)?;
        if started {
            next.average_squares(&stats.squares, b, rho);
        }
        next.mstep(&stats, rho)?;
        next.n_seen = n_after;
        next.n_batches = t;
        *self = next;
        Ok(())
    }

    /// A batch must have B >= 1 rows of D values each.
    fn check_rows_shape<X>(&self, rows: &[&[X]]) -> Result<()> {
        let d = self.mean.len();
        let width = rows.iter().map(|r| r.len()).find(|&len| len != d);
        if rows.is_empty() || width.is_some() {
            return Err(FaError::Shape {
                what: "batch",
                expected: format!("(n_samples >= 1, {d})"),
                got: vec![rows.len(), width.unwrap_or(d)],
            });
        }
        Ok(())
    }

    /// d̄² ← (1 − ρ) d̄² + ρ q / B, from the per-feature sums of squared deviations q of a batch of B rows.
    fn average_squares(&mut self, q: &[f64], b: usize, rho: f64) {
        Zip::from(&mut self.dsq)
            .and(q)
            .for_each(|v, &qd| *v = (1.0 - rho) * *v + rho * (qd / b as f64));
    }

    /// E-step (4.23) for every row of the batch: C = Fᵀ Ψ⁻¹, Σ = (I + C F)⁻¹, W = Cᵀ Σ = Ψ⁻¹ F Σ,
    /// M = D_b W (B×K), then the sums D_bᵀ M (D×K), Mᵀ M (K×K) and Σ_i d_i² per feature (D).
    fn estep<X: Real>(&self, rows: &[&[X]]) -> Result<BatchStats> {
        let (d, k) = self.loadings.dim();
        let b = rows.len();
        let kp = kernel::padded(k);
        let sigma = self.posterior_covariance()?;
        let w = padded_weights(&self.loadings, &self.psi, &sigma, kp);
        let isa = Isa::detect();
        let mean = self.mean.to_vec();
        let mut m = vec![0.0; b * kp];
        kernel::project(isa, rows, &mean, &w, kp, &mut m);
        let mut a = vec![0.0; d * kp];
        let mut squares = vec![0.0; d];
        if !kernel::cross(isa, rows, &mean, &m, kp, &mut a, &mut squares) {
            return Err(bad_value_error(rows));
        }
        let m = ArrayView2::from_shape((b, kp), &m).map_err(|_| FaError::NotPositiveDefinite("E-step shapes"))?;
        let m = m.slice(s![.., ..k]);
        let a = ArrayView2::from_shape((d, kp), &a).map_err(|_| FaError::NotPositiveDefinite("E-step shapes"))?;
        Ok(BatchStats {
            sigma,
            a: a.slice(s![.., ..k]).to_owned(),
            b: m.t().dot(&m),
            squares,
            n: b,
        })
    }

    /// Σ = (I + Fᵀ Ψ⁻¹ F)⁻¹ (4.23) of the current F, ψ (K×K).
    fn posterior_covariance(&self) -> Result<Array2<f64>> {
        let k = self.loadings.ncols();
        let precision = Array2::<f64>::eye(k) + scaled_gram(&self.loadings, &self.psi);
        Ok(SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?.inverse())
    }

    /// Stepwise statistics with step size `rho`, then the M-step (4.33, 4.35) and the optional whitening.
    fn mstep(&mut self, stats: &BatchStats, rho: f64) -> Result<()> {
        let weight = rho / stats.n as f64;
        self.a_bar = &self.a_bar * (1.0 - rho) + &(&stats.a * weight);
        self.b_bar = &self.b_bar * (1.0 - rho) + &(&stats.b * weight);
        let h_bar = &stats.sigma + &self.b_bar;
        if let Some(average) = &mut self.average {
            average.include(&self.a_bar, &self.b_bar, &self.dsq);
        }
        self.finish_mstep(&h_bar)
    }

    /// F and ψ from Ā, d̄² and H̄ = Σ + B̄: F = Ā H̄⁻¹ (4.33), or with whitening (PX-EM, Liu, Rubin & Wu
    /// 1998) R Rᵀ = H̄, Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ and F = Ā, the same Gaussian in the basis where H̄ = I;
    /// then ψ = max(d̄² − rowsum(F ⊙ Ā), floor) (4.35 with F H̄ = Ā).
    fn finish_mstep(&mut self, h_bar: &Array2<f64>) -> Result<()> {
        match loadings_map(h_bar.view(), self.config.whiten)? {
            LoadingsMap::Whiten(rotation) => {
                self.a_bar = self.a_bar.dot(&rotation.cross_moment_map());
                self.b_bar = rotation.latent_moment(self.b_bar.view());
                if let Some(average) = &mut self.average {
                    average.rotate(&rotation);
                }
                self.loadings = self.a_bar.clone();
            }
            LoadingsMap::Inverse(h_inv) => self.loadings = self.a_bar.dot(&h_inv),
        }
        let floor = self.floor();
        let mut psi = self.dsq.clone();
        Zip::from(&mut psi)
            .and(self.loadings.rows())
            .and(self.a_bar.rows())
            .for_each(|p, f, a| *p = (*p - f.dot(&a)).max(floor));
        if psi.iter().chain(self.loadings.iter()).any(|v| !v.is_finite()) {
            return Err(FaError::NotPositiveDefinite(
                "the mini-batch M-step (non-finite loadings)",
            ));
        }
        self.psi = psi;
        Ok(())
    }

    /// Start (or restart) averaging the statistics over the batches that follow (see [`average`]).
    pub fn start_average(&mut self) {
        let (d, k) = self.loadings.dim();
        self.average = Some(StatAverage::new(d, k));
    }

    /// Batches averaged since [`MiniBatchEm::start_average`], or None when not averaging.
    pub fn n_averaged(&self) -> Option<u64> {
        self.average.as_ref().map(|a| a.count)
    }

    /// Replace the statistics by their averages since [`MiniBatchEm::start_average`] and F, ψ by the
    /// M-step of the averages, and stop averaging (with no batch averaged, only stop). Atomic.
    pub fn apply_average(&mut self) -> Result<()> {
        *self = self.with_average_applied()?;
        Ok(())
    }

    /// Stop averaging and forget the averages (the model itself does not change).
    pub fn discard_average(&mut self) {
        self.average = None;
    }

    /// The model [`MiniBatchEm::apply_average`] would make, leaving this one as it is.
    pub fn with_average_applied(&self) -> Result<Self> {
        let Some(average) = &self.average else {
            return Err(FaError::CallOrder("apply_average needs start_average first".into()));
        };
        let mut next = self.clone();
        next.average = None;
        if average.count > 0 {
            let sigma = self.posterior_covariance()?;
            next.a_bar = average.a_bar.clone();
            next.b_bar = average.b_bar.clone();
            next.dsq = average.dsq.clone();
            next.finish_mstep(&(sigma + &next.b_bar))?;
        }
        Ok(next)
    }
}

/// One batch's E-step results: Σ (K×K), the sums D_bᵀ M (D×K), Mᵀ M (K×K), Σ_i d_i² per feature (D) and B.
struct BatchStats {
    sigma: Array2<f64>,
    a: Array2<f64>,
    b: Array2<f64>,
    squares: Vec<f64>,
    n: usize,
}

/// Fᵀ Ψ⁻¹ F (K×K).
fn scaled_gram(f: &Array2<f64>, psi: &Array1<f64>) -> Array2<f64> {
    let scaled = f / &psi.view().insert_axis(Axis(1));
    scaled.t().dot(f)
}

/// W = Ψ⁻¹ F Σ (D×K), stored D×kp row-major with zero columns K..kp for the kernels.
fn padded_weights(f: &Array2<f64>, psi: &Array1<f64>, sigma: &Array2<f64>, kp: usize) -> Vec<f64> {
    let k = f.ncols();
    let w = (f / &psi.view().insert_axis(Axis(1))).dot(sigma);
    let mut out = vec![0.0; f.nrows() * kp];
    for (o, row) in out.chunks_mut(kp).zip(w.rows()) {
        for (v, x) in o[..k].iter_mut().zip(row) {
            *v = *x;
        }
    }
    out
}

pub mod average;
mod checks;
pub mod exact;
mod kernel;
pub mod moments;
mod parts;
mod score;

pub use parts::MiniBatchParts;

use average::StatAverage;
use checks::{bad_value_error, column_squares, running_mean};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::orthonormal_loadings;

    fn config(whiten: bool) -> MiniBatchConfig {
        MiniBatchConfig {
            schedule: StepSize::Power { tau0: 1.0, kappa: 0.6 },
            whiten,
            noise_floor: 1e-10,
        }
    }

    fn data(n: usize, d: usize, seed: u64) -> Array2<f64> {
        let mut x = Array2::<f64>::zeros((n, d));
        crate::init::fill_standard_normal(x.view_mut(), seed);
        let mut f = Array2::<f64>::zeros((d, 2));
        crate::init::fill_standard_normal(f.view_mut(), seed + 1);
        let mut h = Array2::<f64>::zeros((n, 2));
        crate::init::fill_standard_normal(h.view_mut(), seed + 2);
        x * 0.5 + h.dot(&f.t())
    }

    #[test]
    fn whitening_leaves_the_gaussian_unchanged_after_one_batch() {
        // One batch from the same start: whitening moves to the basis where H̄ = I, so the whitened F Fᵀ
        // is the plain model's F H̄ Fᵀ = Ā H̄⁻¹ Āᵀ = F Āᵀ, and ψ is the same.
        let x = data(300, 12, 7);
        let init = orthonormal_loadings(12, 2, 1).expect("init");
        let mut plain = MiniBatchEm::new(init.view(), config(false), None).expect("model");
        let mut white = MiniBatchEm::new(init.view(), config(true), None).expect("model");
        plain.update(x.view()).expect("update");
        white.update(x.view()).expect("update");
        let expanded = plain.loadings.dot(&plain.a_bar.t());
        let whitened = white.loadings.dot(&white.loadings.t());
        assert!((&expanded - &whitened).iter().all(|v| v.abs() < 1e-9));
        assert!((&plain.psi - &white.psi).iter().all(|v| v.abs() < 1e-9));
    }

    #[test]
    fn a_bad_batch_changes_nothing() {
        let x = data(50, 6, 9);
        let init = orthonormal_loadings(6, 2, 1).expect("init");
        let mut model = MiniBatchEm::new(init.view(), config(true), None).expect("model");
        model.update(x.view()).expect("update");
        let (f, psi, n) = (model.loadings.clone(), model.psi.clone(), model.n_seen);
        let mut bad = x.clone();
        bad[[3, 2]] = f64::NAN;
        assert!(model.update(bad.view()).is_err());
        assert!(model.update(x.slice(s![.., ..5])).is_err());
        assert_eq!((model.loadings.clone(), model.psi.clone(), model.n_seen), (f, psi, n));
    }
}
