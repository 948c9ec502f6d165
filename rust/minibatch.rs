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
use rayon::prelude::*;

use crate::error::{invalid, FaError, Result};
use crate::linalg::SpdFactor;
use crate::scalar::Real;
use crate::schedule::StepSize;
use crate::vbfa::transform::Rotation;

/// Rows of a fixed-size task of the parallel matrix products: the partition does not depend on the number
/// of threads, and every output element is one dot product over the full inner dimension, so results do not
/// depend on the thread count.
const TASK_ROWS: usize = 256;

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
}

impl MiniBatchEm {
    /// A model with initial loadings `init` (D×K, e.g. orthonormal columns; scaled by σ̂ when the first
    /// moments are known) and, optionally, the data set's exact moments (then θ̄ stays fixed).
    pub fn new(init: ArrayView2<f64>, config: MiniBatchConfig, moments: Option<Moments>) -> Result<Self> {
        let (d, k) = init.dim();
        if k == 0 || k >= d {
            return Err(invalid(
                "n_components",
                format!("must satisfy 1 <= K < n_features = {d}, got {k}"),
            ));
        }
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
        check_rows(x)?;
        let n_after = self.n_seen + b as u64;
        let mean = if self.fixed {
            self.mean.clone()
        } else {
            running_mean(&self.mean, x, self.n_seen, n_after)
        };
        let (dev, squares) = deviations(x, &mean);
        let t = self.n_batches + 1;
        let rho = self.config.schedule.rho(t);
        let mut next = self.clone();
        next.mean = mean;
        // d̄² is averaged with the same ρ as Ā and B̄ even when the data's variance is known: the averaged
        // moment matrix of (d, m) is then positive semi-definite, so ψ = d̄² − Ā H̄⁻¹ Āᵀ >= 0 up to
        // rounding. An exact d̄² mixed with lagged Ā, B̄ pushed ψ of nearly collinear features below zero.
        let batch_dsq = squares / b as f64;
        next.dsq = &self.dsq * (1.0 - rho) + &(batch_dsq * rho);
        if !self.started {
            next.start();
        }
        next.step(&dev, rho)?;
        next.n_seen = n_after;
        next.n_batches = t;
        *self = next;
        Ok(())
    }

    /// E-step, statistics and M-step for the deviations `dev` (B×D) with step size `rho`.
    fn step(&mut self, dev: &Array2<f64>, rho: f64) -> Result<()> {
        let b = dev.nrows() as f64;
        let k = self.loadings.ncols();
        // C = Fᵀ Ψ⁻¹; (4.23): Σ = (I + C F)⁻¹; W = Cᵀ Σ = Ψ⁻¹ F Σ.
        let scaled = &self.loadings / &self.psi.view().insert_axis(Axis(1));
        let precision = Array2::<f64>::eye(k) + gram(scaled.view(), self.loadings.view());
        let sigma = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?.inverse();
        let w = scaled.dot(&sigma);
        let m = product(dev.view(), w.view()); // B×K: rows m_i = Σ C d_i
        let a_batch = gram(dev.view(), m.view()) / b; // D×K: D_bᵀ M / B
        let b_batch = m.t().dot(&m) / b;
        self.a_bar = &self.a_bar * (1.0 - rho) + &(a_batch * rho);
        self.b_bar = &self.b_bar * (1.0 - rho) + &(b_batch * rho);
        let h_bar = &sigma + &self.b_bar;
        let h_factor = SpdFactor::new_jittered(h_bar.view(), "H̄ = Σ + B̄")?;
        if self.config.whiten {
            // R Rᵀ = H̄: Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ, then H̄ = I and F = Ā.
            let rotation = Rotation::whitening(h_factor.lower().view())?;
            self.a_bar = self.a_bar.dot(&rotation.cross_moment_map());
            self.b_bar = rotation.latent_moment(self.b_bar.view());
            self.loadings = self.a_bar.clone();
        } else {
            self.loadings = self.a_bar.dot(&h_factor.inverse());
        }
        // (4.35) with F H̄ = Ā: ψ = d̄² − rowsum(F ⊙ Ā), floored.
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
}

/// Every field of a [`MiniBatchEm`], for exact checkpoints: mean θ̄ and d̄² (D), Ā and F (D×K), B̄ (K×K), ψ (D).
#[derive(Debug, Clone)]
pub struct MiniBatchParts {
    /// Hyper-parameters.
    pub config: MiniBatchConfig,
    /// Whether the mean is the data set's exact mean (kept fixed).
    pub fixed: bool,
    /// Whether the data-scaled start has been applied.
    pub started: bool,
    /// Rows applied.
    pub n_seen: u64,
    /// Mini-batches applied.
    pub n_batches: u64,
    /// θ̄ (D).
    pub mean: Array1<f64>,
    /// d̄² (D).
    pub dsq: Array1<f64>,
    /// Ā (D×K).
    pub a_bar: Array2<f64>,
    /// B̄ (K×K).
    pub b_bar: Array2<f64>,
    /// F (D×K).
    pub loadings: Array2<f64>,
    /// ψ (D).
    pub psi: Array1<f64>,
}

impl MiniBatchEm {
    /// The model's complete state.
    pub fn to_parts(&self) -> MiniBatchParts {
        MiniBatchParts {
            config: self.config,
            fixed: self.fixed,
            started: self.started,
            n_seen: self.n_seen,
            n_batches: self.n_batches,
            mean: self.mean.clone(),
            dsq: self.dsq.clone(),
            a_bar: self.a_bar.clone(),
            b_bar: self.b_bar.clone(),
            loadings: self.loadings.clone(),
            psi: self.psi.clone(),
        }
    }

    /// Rebuild a model from [`MiniBatchEm::to_parts`], checking every value the updates rely on: shapes,
    /// finiteness, d̄² >= 0, ψ > 0, a symmetric B̄, the hyper-parameters, n_batches <= n_seen.
    pub fn from_parts(p: MiniBatchParts) -> Result<Self> {
        let (d, k) = p.loadings.dim();
        let template = MiniBatchEm::new(Array2::<f64>::zeros((d, k)).view(), p.config, None)?;
        let bad = |what: &str| Err(FaError::InvalidState(format!("mini-batch EM state: {what}")));
        if p.mean.len() != d
            || p.dsq.len() != d
            || p.psi.len() != d
            || p.a_bar.dim() != (d, k)
            || p.b_bar.dim() != (k, k)
        {
            return bad("inconsistent shapes");
        }
        let vectors = p.mean.iter().chain(p.dsq.iter()).chain(p.psi.iter());
        let matrices = p.a_bar.iter().chain(p.b_bar.iter()).chain(p.loadings.iter());
        if vectors.chain(matrices).any(|v| !v.is_finite()) {
            return bad("non-finite values");
        }
        if p.dsq.iter().any(|&v| v < 0.0) || p.psi.iter().any(|&v| v <= 0.0) {
            return bad("negative d̄² or non-positive ψ");
        }
        if (&p.b_bar - &p.b_bar.t())
            .iter()
            .any(|v| v.abs() > 1e-9 * (1.0 + p.b_bar.iter().fold(0.0f64, |m, x| m.max(x.abs()))))
        {
            return bad("B̄ is not symmetric");
        }
        if p.n_batches > p.n_seen || (p.n_batches > 0 && !p.started) {
            return bad("counters are inconsistent");
        }
        Ok(MiniBatchEm {
            fixed: p.fixed,
            started: p.started,
            n_seen: p.n_seen,
            n_batches: p.n_batches,
            mean: p.mean,
            dsq: p.dsq,
            a_bar: p.a_bar,
            b_bar: p.b_bar,
            loadings: p.loadings,
            psi: p.psi,
            ..template
        })
    }
}

/// Reject NaN, ±Inf and magnitudes above `X::MAX_INPUT`, naming the first bad row.
fn check_rows<X: Real>(x: ArrayView2<X>) -> Result<()> {
    for (row, values) in x.rows().into_iter().enumerate() {
        if let Some(v) = values.iter().map(|v| v.to_f64()).find(|v| !(v.abs() <= X::MAX_INPUT)) {
            let kind = if v.is_finite() {
                format!("a value with |x| > {:e}", X::MAX_INPUT)
            } else {
                "NaN or infinity".into()
            };
            return Err(FaError::BadValue { row, kind });
        }
    }
    Ok(())
}

/// θ̄ after `n_after` rows: θ̄ + (Σ_i x_i − B θ̄) / n_after, the exact running mean.
fn running_mean<X: Real>(mean: &Array1<f64>, x: ArrayView2<X>, n_before: u64, n_after: u64) -> Array1<f64> {
    let mut sum = Array1::<f64>::zeros(mean.len());
    for row in x.rows() {
        Zip::from(&mut sum).and(&row).for_each(|s, &v| *s += v.to_f64());
    }
    let b = (n_after - n_before) as f64;
    mean + &((sum - mean * b) / n_after as f64)
}

/// D_b = X_b − θ̄ in f64 (B×D) and the per-feature sums Σ_i d_i² (D), in one sequential pass over the rows.
fn deviations<X: Real>(x: ArrayView2<X>, mean: &Array1<f64>) -> (Array2<f64>, Array1<f64>) {
    let mut dev = Array2::<f64>::zeros(x.dim());
    let mut squares = Array1::<f64>::zeros(mean.len());
    for (mut out, row) in dev.rows_mut().into_iter().zip(x.rows()) {
        Zip::from(&mut out)
            .and(&row)
            .and(mean)
            .and(&mut squares)
            .for_each(|o, &v, &c, sq| {
                let d = v.to_f64() - c;
                *o = d;
                *sq += d * d;
            });
    }
    (dev, squares)
}

/// A B (R×P times P×Q → R×Q), rows of A in fixed-size parallel tasks.
fn product(a: ArrayView2<f64>, b: ArrayView2<f64>) -> Array2<f64> {
    let mut out = Array2::<f64>::zeros((a.nrows(), b.ncols()));
    out.axis_chunks_iter_mut(Axis(0), TASK_ROWS)
        .into_par_iter()
        .zip(a.axis_chunks_iter(Axis(0), TASK_ROWS).into_par_iter())
        .for_each(|(mut o, a_rows)| o.assign(&a_rows.dot(&b)));
    out
}

/// Aᵀ B (P×R and P×Q → R×Q), output rows (columns of A) in fixed-size parallel tasks.
fn gram(a: ArrayView2<f64>, b: ArrayView2<f64>) -> Array2<f64> {
    let mut out = Array2::<f64>::zeros((a.ncols(), b.ncols()));
    out.axis_chunks_iter_mut(Axis(0), TASK_ROWS)
        .into_par_iter()
        .enumerate()
        .for_each(|(i, mut o)| {
            // (Bᵀ A_cols)ᵀ: the product reads A's rows contiguously (A is a row-major batch).
            let cols = a.slice(s![.., i * TASK_ROWS..i * TASK_ROWS + o.nrows()]);
            o.assign(&b.t().dot(&cols).t());
        });
    out
}

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
    fn products_match_ndarray() {
        let a = data(700, 600, 3);
        let b = data(600, 5, 4);
        let c = data(700, 5, 5);
        let p = product(a.view(), b.view());
        let g = gram(a.view(), c.view());
        assert!((&p - &a.dot(&b)).iter().all(|v| v.abs() < 1e-9));
        assert!((&g - &a.t().dot(&c)).iter().all(|v| v.abs() < 1e-9));
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
