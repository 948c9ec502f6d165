//! Online stochastic gradient ascent for factor analysis (thesis Algorithm 1), one pass per sample.
//!
//! State: θ̄ (`mean`, D), F (`loadings`, D×K), ψ (`psi`, D). The gradient step of sample t (lines 10–14)
//! needs m_t and Σ_t, which depend on sums over all rows, so it is left pending and applied row by row
//! by the next pass, which reads the same rows to build the next E-step's sums.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::config_checks::{checked_init, checked_rows};
use crate::engine::block::load_rows;
use crate::engine::driver::{self, Driven};
use crate::engine::em_kernel::to_loadings_space;
use crate::engine::model::hooks::Pass;
use crate::engine::partition::{stream_pass, validate_batch, Block, Scratch, StateRows, BLOCK_ROWS};
use crate::engine::sga::SgaPath;
use crate::engine::sga_kernel::{SgaBlockIo, SgaConsts};
use crate::engine::sga_wide::SgaWideScratch;
use crate::engine::{StepSums, StreamingModel};
use crate::error::{invalid, try_filled, Result};
use crate::scalar::{stored, Real};
use crate::scaling::Scaling;
use crate::schedule::StepSize;

/// How each sample's step on F and ψ is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SgaRule {
    /// Thesis Algorithm 1: a constant step α = `lr` on F (4.24) and on β = log ψ (4.26).
    Gradient,
    /// Steps of a = 1/t for the step of sample t, with the F step as a contraction and followed by whitening,
    /// and the ψ step preconditioned by its Fisher information:
    ///
    /// ```text
    ///   a_F = min(a, 1/(1 + m·m))                  (a_F λ_max(P) ≤ 1, as λ_max(P) ≤ 1 + m·m for Σ ⪯ I)
    ///   F ← (F + a_F (d mᵀ − F P)) L,   L Lᵀ = (1 − a_F) I + a_F P   (L lower triangular)
    ///   ψ ← ψ + a (q − ψ),   q = d² − 2 d (F m) + diag(F P Fᵀ)   (the β gradient ½ ψ⁻¹ q − ½ times 2ψ)
    /// ```
    ///
    /// Needs `Scaling::Data` (the F step preconditioned by ψ); `lr` is not used.
    Whitened,
}

impl SgaRule {
    /// The rule's name: "gradient" or "whitened" (checkpoints and the Python binding).
    pub fn name(self) -> &'static str {
        match self {
            SgaRule::Gradient => "gradient",
            SgaRule::Whitened => "whitened",
        }
    }

    /// The rule of a name given by [`Self::name`].
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "gradient" => Ok(SgaRule::Gradient),
            "whitened" => Ok(SgaRule::Whitened),
            other => Err(invalid(
                "rule",
                format!("must be 'gradient' or 'whitened', got {other:?}"),
            )),
        }
    }
}

/// Hyper-parameters of [`OnlineSga`].
#[derive(Debug, Clone, PartialEq)]
pub struct SgaConfig {
    /// Learning rate α of plain SGD on F and β = log ψ (`SgaRule::Gradient`).
    pub lr: f64,
    /// The step rule.
    pub rule: SgaRule,
    /// Samples during which only θ̄ is updated (F and ψ stay fixed).
    pub n_warmup: u64,
    /// Lower bound on every ψ_d.
    pub noise_floor: f64,
    /// Step sizes of the running mean θ̄ (under `Scaling::Unit`; `Scaling::Data` uses the exact mean).
    pub step_size: StepSize,
    /// Scale convention: `Unit` is Algorithm 1 (F₀ = Q, ψ₀ = 1, absolute floor, plain SGD on F);
    /// `Data` starts from F₀ = σ̂ Q, ψ₀ = d̄² of the warm-up, floors ψ relative to σ̂² and preconditions the
    /// F step by ψ (ΔF = α (d mᵀ − F P)).
    pub scaling: Scaling,
}

impl Default for SgaConfig {
    fn default() -> Self {
        SgaConfig {
            lr: 1e-3,
            rule: SgaRule::Gradient,
            n_warmup: 100,
            noise_floor: 1e-10,
            step_size: StepSize::Harmonic,
            scaling: Scaling::Unit,
        }
    }
}

/// `visit(first_row, F rows (nb×K), ψ (nb))`: a visitor of blocks of the current parameters, in f64.
pub(crate) type CurrentRowsVisitor<'a> = dyn FnMut(usize, &[f64], &[f64]) -> Result<()> + 'a;

/// Online SGA factor analysis with state stored in `T` (f32 or f64).
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineSga<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    /// The K×K part: configuration, sample count, pending step, σ̂².
    pub(crate) step: SgaKkStep,
    pub(crate) mean: Vec<T>,
    pub(crate) f: Vec<T>,
    pub(crate) psi: Vec<T>,
    pub(crate) d_last: Vec<T>,
    /// The engine kernel that runs the passes after warm-up (chosen once, for K and this CPU).
    pub(crate) path: SgaPath<T>,
    /// Buffers `update` reuses from one call to the next.
    pub(crate) reused: Reused<T>,
}

/// Buffers an update reuses from one call to the next — the private copy of a row and the running mean before
/// a step, D values each — so that a large model does not map (and the kernel zero) fresh pages on every
/// call. They hold nothing between calls that matters: not part of the model's value, a clone starts empty
/// and any two compare equal.
#[derive(Debug, Default)]
pub(crate) struct Reused<T> {
    row: Vec<f64>,
    mean: Vec<T>,
}

impl<T> Clone for Reused<T> {
    fn clone(&self) -> Self {
        Reused {
            row: Vec::new(),
            mean: Vec::new(),
        }
    }
}

impl<T> PartialEq for Reused<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T: Real> OnlineSga<T> {
    /// New model with initial loadings `init` (D×K); ψ = 1, θ̄ = 0.
    pub fn new(n_features: usize, n_components: usize, init: ArrayView2<f64>, config: SgaConfig) -> Result<Self> {
        SgaKkStep::checked::<T>(n_features, n_components, config.clone())?;
        let f = checked_init::<T>(init, n_features, n_components)?;
        Self::from_rows(n_features, n_components, f, config)
    }

    /// New model from F₀ already in the storage type (D·K values, row-major, finite and within
    /// `T::MAX_INPUT`), such as [`crate::init::orthonormal_rows`]: no f64 copy of it is made.
    pub fn from_rows(n_features: usize, n_components: usize, init: Vec<T>, config: SgaConfig) -> Result<Self> {
        let step = SgaKkStep::checked::<T>(n_features, n_components, config)?;
        let f = checked_rows(init, n_features, n_components)?;
        Ok(OnlineSga {
            n_features,
            n_components,
            step,
            mean: try_filled(n_features, T::default(), "n_features")?,
            f,
            psi: try_filled(n_features, T::from_f64(1.0), "n_features")?,
            d_last: try_filled(n_features, T::default(), "n_features")?,
            path: SgaPath::detect(n_components),
            reused: Reused::default(),
        })
    }

    /// Number of samples applied so far.
    pub fn n_seen(&self) -> u64 {
        self.step.n_seen
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &SgaConfig {
        &self.step.config
    }

    /// The K×K part of the model (the pending step and σ̂²).
    pub fn step(&self) -> &SgaKkStep {
        &self.step
    }

    /// D.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// K.
    pub fn n_components(&self) -> usize {
        self.n_components
    }

    /// Apply the rows of `x` (n×D) in order. The whole batch is validated first, so a shape, NaN/Inf or
    /// magnitude error applies nothing. After a numerical breakdown, models with D·K up to
    /// `SNAPSHOT_MAX_ELEMENTS` (engine/partition.rs) are restored to their state before the call; larger ones are left
    /// exactly as they were before the failing row (the rows before it stay applied).
    pub fn update<X: Real>(&mut self, x: ArrayView2<X>) -> Result<()> {
        driver::update(self, x)
    }

    /// After a pass whose E-step failed: the pass applied the pending gradient step (F and ψ now hold what
    /// the model's queries already returned, so the step is dropped, not lost) and moved the running mean,
    /// which gets its previous values back. The model is then exactly the one before the failing sample, at
    /// the cost of one D-vector copy per sample (against the pass's D·K).
    fn undo_failed_step(&mut self, mean_before: &[T]) {
        self.step.drop_pending();
        self.mean.copy_from_slice(mean_before);
    }

    /// The fused pass of sample n_seen + 1 over every row: pending gradient step, running mean, E-step sums
    /// (after warm-up, through the engine's SGA kernel; during warm-up only the running mean moves).
    fn pass<X: Real>(&mut self, x: ArrayView1<X>, scratch: &mut Scratch, sums: &mut StepSums) {
        let plan = self.step.plan();
        let (active, rho) = (plan.active, plan.mean_rho);
        let data = self.step.config.scaling == Scaling::Data;
        let k = self.n_components;
        let consts = SgaConsts {
            step: self.step.pending.as_ref().map(Pending::step),
            start: plan.start.then(|| self.step.start()),
            lr: plan.lr,
            psi_rate: plan.psi_rate,
            floor: self.floor(),
            rho,
            precondition: data,
        };
        let kernel = self.path.for_pass(k, consts.step.as_ref());
        let track_dsq = data && !active;
        let state = StateRows {
            matrix: &mut self.f,
            mean: &mut self.mean,
            var: &mut self.psi,
            d_last: &mut self.d_last,
        };
        stream_pass(state, k, &x, scratch, sums, |_, rows, x, blk, part| {
            if !active {
                let psi = track_dsq.then_some(rows.var);
                part.dsq_sum += warmup_rows(rows.mean, rows.d_last, psi, x, rho);
                return;
            }
            // While active, `part.dsq_sum` is not tracked: it counts the features whose ψ step diverged.
            let mut io = SgaBlockIo {
                f: rows.matrix,
                psi: rows.var,
                mean: rows.mean,
                d_last: rows.d_last,
                x,
                overshoot: &mut part.dsq_sum,
                u: part.u.as_slice_mut().expect("sums are allocated contiguous"),
                s: part.s.as_slice_mut().expect("sums are allocated contiguous"),
            };
            let mut wide = SgaWideScratch {
                f: &mut blk.a,
                g: &mut blk.f,
                y: &mut blk.tmp,
            };
            kernel.run(&consts, &mut io, &mut wide);
        });
        if active {
            let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
            let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
            to_loadings_space(k, None, s, u);
        }
    }

    /// The K×K part of sample n_seen + 1 from the sums of its pass over `n_total` rows ([`SgaKkStep::finish`]).
    fn finish_step(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        self.step.finish(sums, n_total)
    }

    /// The noise floor (absolute, or relative to σ̂² under `Scaling::Data`).
    pub fn floor(&self) -> f64 {
        self.step.floor::<T>()
    }

    /// σ̂², the mean over features of the warm-up's running squared deviations (0 under `Scaling::Unit`).
    pub fn scale_sq(&self) -> f64 {
        self.step.scale_sq
    }

    /// Whether warm-up is over (the loadings and noise variances have been fitted, not just initialised).
    /// Warm-up length: the fitted Gaussian exists once more than this many samples were seen.
    pub fn n_warmup(&self) -> u64 {
        self.step.config.n_warmup
    }

    pub fn is_fitted(&self) -> bool {
        self.step.is_fitted()
    }

    /// F and ψ with the pending gradient step applied (what the next E-step will use; during a data-scaled
    /// warm-up, the start the first E-step after it will use).
    fn current(&self) -> (Array2<f64>, Array1<f64>) {
        let k = self.n_components;
        let mut f_out = Vec::with_capacity(self.n_features * k);
        let mut psi_out = Vec::with_capacity(self.n_features);
        self.visit_current(&mut |_, f, psi| {
            f_out.extend_from_slice(f);
            psi_out.extend_from_slice(psi);
            Ok(())
        })
        .expect("collecting never fails");
        let f = Array2::from_shape_vec((self.n_features, k), f_out).expect("D·K values collected");
        (f, Array1::from(psi_out))
    }

    /// Call `visit(first_row, F rows (nb×K), ψ (nb))` for consecutive blocks of the current parameters (pending
    /// step applied), in f64: the streaming form of [`Self::loadings`] used by the queries (`crate::query`).
    pub(crate) fn visit_current(&self, visit: &mut CurrentRowsVisitor<'_>) -> Result<()> {
        self.visit_current_in(0..self.n_features, visit)
    }

    /// [`Self::visit_current`] for the rows in `rows` only (blocks of up to `BLOCK_ROWS` rows from `rows.start`;
    /// the kernel is row-local, so each row's values do not depend on the block it falls in).
    pub(crate) fn visit_current_in(
        &self,
        rows: std::ops::Range<usize>,
        visit: &mut CurrentRowsVisitor<'_>,
    ) -> Result<()> {
        // The pass's own kernel on a copy of each block (same F and ψ, bit for bit, as the next pass stores),
        // with a zero sample whose sums are discarded.
        let k = self.n_components;
        let data = self.step.config.scaling == Scaling::Data;
        let pending = self.step.pending.as_ref();
        let consts = SgaConsts {
            step: pending.map(Pending::step),
            start: (data && !self.is_fitted()).then(|| self.step.start()),
            lr: pending.map_or(self.step.config.lr, |p| p.rates.f),
            psi_rate: pending.and_then(|p| p.rates.psi),
            floor: self.floor(),
            rho: 0.0,
            precondition: data,
        };
        let kernel = self.path.for_pass(k, consts.step.as_ref());
        let mut blk = Block::new(k);
        let mut f = vec![T::default(); BLOCK_ROWS * k];
        let (mut psi, mut mean, mut d_last) = (
            vec![T::default(); BLOCK_ROWS],
            vec![T::default(); BLOCK_ROWS],
            vec![T::default(); BLOCK_ROWS],
        );
        let mut discard = StepSums::zeros(k);
        let mut out_psi = vec![0.0; BLOCK_ROWS];
        blk.d.fill(0.0);
        let (lo, hi) = (rows.start, rows.end);
        for (i, ((f_src, psi_src), d_src)) in self.f[lo * k..hi * k]
            .chunks(BLOCK_ROWS * k)
            .zip(self.psi[lo..hi].chunks(BLOCK_ROWS))
            .zip(self.d_last[lo..hi].chunks(BLOCK_ROWS))
            .enumerate()
        {
            let nb = psi_src.len();
            f[..nb * k].copy_from_slice(f_src);
            psi[..nb].copy_from_slice(psi_src);
            d_last[..nb].copy_from_slice(d_src);
            mean[..nb].fill(T::default());
            let mut io = SgaBlockIo {
                f: &mut f[..nb * k],
                psi: &mut psi[..nb],
                mean: &mut mean[..nb],
                d_last: &mut d_last[..nb],
                x: &blk.d[..nb],
                overshoot: &mut discard.dsq_sum,
                u: discard.u.as_slice_mut().expect("sums are allocated contiguous"),
                s: discard.s.as_slice_mut().expect("sums are allocated contiguous"),
            };
            let mut wide = SgaWideScratch {
                f: &mut blk.a,
                g: &mut blk.f,
                y: &mut blk.tmp,
            };
            kernel.run(&consts, &mut io, &mut wide);
            load_rows(&f[..nb * k], &mut blk.tmp);
            load_rows(&psi[..nb], &mut out_psi);
            visit(lo + i * BLOCK_ROWS, &blk.tmp[..nb * k], &out_psi[..nb])?;
        }
        Ok(())
    }

    /// Loadings F (D×K).
    pub fn loadings(&self) -> Array2<f64> {
        self.current().0
    }

    /// Noise variances ψ (D).
    pub fn noise_variance(&self) -> Array1<f64> {
        self.current().1
    }

    /// Running mean θ̄ (D).
    pub fn mean(&self) -> Array1<f64> {
        self.mean.iter().map(|v| v.to_f64()).collect()
    }
}

/// A warm-up pass over rows (θ̄, d_last, x: nb each): θ̄ ← θ̄ + ρ (x − θ̄) and d_last ← d = x − θ̄ (lines 5, 6),
/// and, under `Scaling::Data`, ψ's storage (`dsq`) ← the running d̄² (d̄²_t = d̄²_{t−1} + ρ (d² − d̄²_{t−1})).
/// Returns Σ d̄² over the rows (0 without `dsq`).
fn warmup_rows<T: Real>(mean: &mut [T], d_last: &mut [T], dsq: Option<&mut [T]>, x: &[f64], rho: f64) -> f64 {
    let mut d = [0.0f64; BLOCK_ROWS];
    for (((m, last), &xi), d_out) in mean.iter_mut().zip(d_last.iter_mut()).zip(x).zip(d.iter_mut()) {
        let m0 = m.to_f64();
        let (mean_s, m1) = stored::<T>(m0 + rho * (xi - m0));
        *m = mean_s;
        *d_out = xi - m1;
        *last = T::from_f64(*d_out);
    }
    let Some(dsq) = dsq else { return 0.0 };
    let mut sum = 0.0;
    for (v, &dv) in dsq.iter_mut().zip(&d) {
        let v0 = v.to_f64();
        let (s, v1) = stored::<T>(v0 + rho * (dv * dv - v0));
        *v = s;
        sum += v1;
    }
    sum
}

impl<T: Real> Pass for OnlineSga<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    fn validate<X: Real>(&self, x: ArrayView2<X>) -> Result<()> {
        validate_batch::<T, X>(&x, self.n_features)
    }

    /// The pass applies the pending gradient step and moves the running mean of these rows.
    fn pass_sums<X: Real>(&mut self, x: ArrayView1<X>) -> StepSums {
        let mut scratch = Scratch::new(self.n_features, self.n_components);
        let mut sums = StepSums::zeros(self.n_components);
        self.pass(x, &mut scratch, &mut sums);
        sums
    }

    fn drop_pending(&mut self) {
        self.step.drop_pending();
    }

    /// (4.23) from the sums, with σ̂² = Σ d̄² / `n_total` during a data-scaled warm-up.
    fn finish(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        self.finish_step(sums, n_total)
    }
}

impl<T: Real> StreamingModel for OnlineSga<T> {}

/// A large model undoes a failed row by itself: the pass applied the pending gradient step (dropped, not lost:
/// F and ψ now hold what the queries already returned) and moved the running mean, which gets its copy from
/// before the row back; the row that applies the data-scaled start rewrites F and ψ, so that one row keeps a
/// copy of the model. The pass reads its row in several places, so a large model reads a private copy.
impl<T: Real> Driven for OnlineSga<T> {
    type Storage = T;
    type Reused = Reused<T>;
    type RowUndo = Option<Self>;
    const PRIVATE_ROWS: bool = true;
    const RETRY_IN_F64: bool = false;

    /// The fused pass (pending gradient step + running mean + E-step sums), then (4.23).
    fn try_step<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        _: bool,
    ) -> Result<()> {
        self.pass(x, scratch, sums);
        self.finish_step(sums, self.n_features)
    }

    fn take_reused(&mut self) -> Reused<T> {
        std::mem::take(&mut self.reused)
    }

    fn put_reused(&mut self, reused: Reused<T>) {
        self.reused = reused;
    }

    fn row_copy(reused: &mut Reused<T>) -> &mut Vec<f64> {
        &mut reused.row
    }

    fn prepare_undo(&mut self, reused: &mut Reused<T>) -> Option<Self> {
        if self.step.starts_next() {
            return Some(self.clone());
        }
        reused.mean.clear();
        reused.mean.extend_from_slice(&self.mean);
        None
    }

    fn undo_row(&mut self, start_copy: Option<Self>, reused: &Reused<T>) {
        match start_copy {
            Some(previous) => *self = previous,
            None => self.undo_failed_step(&reused.mean),
        }
    }
}

mod checkpoint;
mod checks;
mod rows;
mod step;

pub use step::{PassPlan, Pending, SgaKkStep, StepRates};
#[cfg(test)]
mod tests;
