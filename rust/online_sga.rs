//! Online stochastic gradient ascent for factor analysis (thesis Algorithm 1), one pass per sample.
//!
//! State: θ̄ (`mean`, D), F (`loadings`, D×K), ψ (`psi`, D). The gradient step of sample t (lines 10–14)
//! needs m_t and Σ_t, which depend on sums over all rows, so it is left pending and applied row by row
//! by the next pass, which reads the same rows to build the next E-step's sums.

use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2};

use crate::error::{invalid, try_filled, FaError, Result};
use crate::linalg::SpdFactor;
use crate::online_em::{check_floor_fits, checked_init, validate_dims, StepSums};
use crate::pass::{
    accumulate_estep, block_times, load_rows, outer, reduce_tasks, use_parallel, validate_batch, Block, Scratch, Sums,
    BLOCK_ROWS, SNAPSHOT_MAX_ELEMENTS, TASK_ROWS,
};
use crate::scalar::{stored, Real};
use crate::scaling::Scaling;
use crate::schedule::StepSize;
use crate::small_k::try_sga_step;

/// Hyper-parameters of [`OnlineSga`].
#[derive(Debug, Clone, PartialEq)]
pub struct SgaConfig {
    /// Learning rate α of plain SGD on F and β = log ψ.
    pub lr: f64,
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
            n_warmup: 100,
            noise_floor: 1e-10,
            step_size: StepSize::Harmonic,
            scaling: Scaling::Unit,
        }
    }
}

/// The gradient step of the last sample, not yet applied: needs m_t and P_t = Σ_t + m_t m_tᵀ.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pending {
    pub(crate) m: Array1<f64>,
    pub(crate) p: Array2<f64>,
}

/// Online SGA factor analysis with state stored in `T` (f32 or f64).
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineSga<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    pub(crate) config: SgaConfig,
    pub(crate) n_seen: u64,
    pub(crate) mean: Vec<T>,
    pub(crate) f: Vec<T>,
    pub(crate) psi: Vec<T>,
    pub(crate) d_last: Vec<T>,
    pub(crate) pending: Option<Pending>,
    /// σ̂² = (1/D) Σ_d d̄²_d over the warm-up samples (`Scaling::Data`; frozen once warm-up ends).
    pub(crate) scale_sq: f64,
}

/// The data-scaled start applied by the first pass after warm-up (`Scaling::Data`): F ← σ F₀ and
/// ψ ← max(d̄², floor) (ψ's storage holds the warm-up's running d̄²), or ψ ← 1 and F₀ kept when σ̂ = 0.
#[derive(Clone, Copy)]
struct Start {
    sigma: f64,
    degenerate: bool,
}

struct Rows<'a, T> {
    lo: usize,
    f: &'a mut [T],
    psi: &'a mut [T],
    mean: &'a mut [T],
    d_last: &'a mut [T],
}

struct PassCtx<'a> {
    pending: Option<&'a Pending>,
    active: bool,
    /// Step size of the running mean.
    rho: f64,
    lr: f64,
    floor: f64,
    k: usize,
    /// Warm-up under `Scaling::Data`: ψ's storage accumulates the running d̄² (step `rho`).
    track_dsq: bool,
    /// The data-scaled start, on the first pass after warm-up.
    start: Option<Start>,
    /// F step preconditioned by ψ (`Scaling::Data`).
    precondition: bool,
}

impl<T: Real> OnlineSga<T> {
    /// New model with initial loadings `init` (D×K); ψ = 1, θ̄ = 0.
    pub fn new(n_features: usize, n_components: usize, init: ArrayView2<f64>, config: SgaConfig) -> Result<Self> {
        validate_dims(n_features, n_components, config.noise_floor)?;
        check_floor_fits::<T>(config.noise_floor)?;
        config.step_size.validate()?;
        if !(config.lr.is_finite() && config.lr > 0.0) {
            return Err(invalid("lr", format!("must be finite and > 0, got {}", config.lr)));
        }
        let f = checked_init::<T>(init, n_features, n_components)?;
        Ok(OnlineSga {
            n_features,
            n_components,
            config,
            n_seen: 0,
            mean: try_filled(n_features, T::default(), "n_features")?,
            f,
            psi: try_filled(n_features, T::from_f64(1.0), "n_features")?,
            d_last: try_filled(n_features, T::default(), "n_features")?,
            pending: None,
            scale_sq: 0.0,
        })
    }

    /// Number of samples applied so far.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &SgaConfig {
        &self.config
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
    /// `SNAPSHOT_MAX_ELEMENTS` (pass.rs) are restored to their state before the call; larger ones are left
    /// exactly as they were before the failing row (the rows before it stay applied).
    pub fn update<X: Real>(&mut self, x: ArrayView2<X>) -> Result<()> {
        validate_batch::<T, X>(&x, self.n_features)?;
        let mut scratch = Scratch::new(self.n_features, self.n_components);
        let mut sums = Sums::zeros(self.n_components);
        let backup = (self.n_features * self.n_components <= SNAPSHOT_MAX_ELEMENTS).then(|| self.clone());
        // Without a backup, a row changed by another thread between the validation and the pass would be
        // applied unchecked (a NaN mean poisons every later step): large models validate and read a private
        // copy of each row instead (O(D) per row against the pass's O(D·K)).
        let mut private = Vec::new();
        let mut mean_before: Vec<T> = Vec::new();
        for row in x.rows() {
            let row = if backup.is_none() {
                private.clear();
                private.extend(row.iter().copied());
                let copy = ArrayView1::from(&private[..]);
                validate_batch::<T, X>(&copy.insert_axis(ndarray::Axis(0)), self.n_features)?;
                copy
            } else {
                row
            };
            // Without a backup, a failed step is undone row-locally (see `undo_failed_step`); the sample that
            // applies the data-scaled start rewrites F and ψ, so that one sample keeps a copy of the model.
            let start_backup = (backup.is_none() && self.starts_next()).then(|| self.clone());
            if backup.is_none() && start_backup.is_none() {
                mean_before.clear();
                mean_before.extend_from_slice(&self.mean);
            }
            if let Err(err) = self.step(row, &mut scratch, &mut sums) {
                match backup.or(start_backup) {
                    Some(previous) => *self = previous,
                    None => self.undo_failed_step(&mean_before),
                }
                return Err(err);
            }
        }
        Ok(())
    }

    /// Whether the next pass applies the data-scaled start (the first sample after warm-up).
    fn starts_next(&self) -> bool {
        self.config.scaling == Scaling::Data && self.n_seen == self.config.n_warmup
    }

    /// After a pass whose E-step failed: the pass applied the pending gradient step (F and ψ now hold what
    /// the model's queries already returned, so the step is dropped, not lost) and moved the running mean,
    /// which gets its previous values back. The model is then exactly the one before the failing sample, at
    /// the cost of one D-vector copy per sample (against the pass's D·K).
    fn undo_failed_step(&mut self, mean_before: &[T]) {
        self.pending = None;
        self.mean.copy_from_slice(mean_before);
    }

    /// One sample: the fused pass (pending gradient step + running mean + E-step sums), then (4.23).
    fn step<X: Real>(&mut self, x: ArrayView1<X>, scratch: &mut Scratch, sums: &mut Sums) -> Result<()> {
        self.pass(x, scratch, sums);
        self.finish(sums, self.n_features)
    }

    /// Validate a batch `x` (n×D) as [`Self::update`] does, without applying it.
    pub fn check_batch<X: Real>(&self, x: ArrayView2<X>) -> Result<()> {
        validate_batch::<T, X>(&x, self.n_features)
    }

    /// First half of one step, for models whose rows are split across processes: apply the pending gradient
    /// step and the running mean to the rows this model holds and return their part of the E-step sums
    /// (4.23) for sample `x` (this model's D entries). The parts of every process add up to the sums of the
    /// whole model; [`OnlineSga::apply`] finishes the step from them.
    pub fn local_sums<X: Real>(&mut self, x: ArrayView1<X>) -> Result<StepSums> {
        validate_batch::<T, X>(&x.view().insert_axis(ndarray::Axis(0)), self.n_features)?;
        let mut scratch = Scratch::new(self.n_features, self.n_components);
        let mut sums = Sums::zeros(self.n_components);
        self.pass(x, &mut scratch, &mut sums);
        self.pending = None;
        Ok(StepSums {
            s: sums.s,
            u: sums.u,
            dsq_sum: sums.dsq,
        })
    }

    /// Second half of one step: (4.23) from `sums` (the sum of every part's [`OnlineSga::local_sums`] for
    /// the same sample), with `n_features_total` the D of the whole model (for σ̂² = Σ d̄² / D).
    pub fn apply(&mut self, sums: &StepSums, n_features_total: usize) -> Result<()> {
        sums.check(self.n_components, self.n_features, n_features_total)?;
        let inner = Sums {
            s: sums.s.clone(),
            u: sums.u.clone(),
            dsq: sums.dsq_sum,
        };
        self.finish(&inner, n_features_total)
    }

    /// The fused pass of sample n_seen + 1 over every row: pending gradient step, running mean, E-step sums.
    fn pass<X: Real>(&mut self, x: ArrayView1<X>, scratch: &mut Scratch, sums: &mut Sums) {
        let t = self.n_seen + 1;
        let active = t > self.config.n_warmup;
        let data = self.config.scaling == Scaling::Data;
        let ctx = PassCtx {
            pending: self.pending.as_ref(),
            active,
            rho: self.config.scaling.mean_rho(self.config.step_size.rho(t), t),
            lr: self.config.lr,
            floor: self.floor(),
            k: self.n_components,
            track_dsq: data && !active,
            start: (data && t == self.config.n_warmup + 1).then(|| self.start()),
            precondition: data,
        };
        let k = self.n_components;
        let tasks: Vec<Rows<T>> = self
            .f
            .chunks_mut(TASK_ROWS * k)
            .zip(self.psi.chunks_mut(TASK_ROWS))
            .zip(self.mean.chunks_mut(TASK_ROWS))
            .zip(self.d_last.chunks_mut(TASK_ROWS))
            .enumerate()
            .map(|(i, (((f, psi), mean), d_last))| Rows {
                lo: i * TASK_ROWS,
                f,
                psi,
                mean,
                d_last,
            })
            .collect();
        let parallel = use_parallel(self.n_features, k);
        reduce_tasks(tasks, scratch, parallel, sums, |rows, blk, part| {
            sga_task(rows, &x, &ctx, blk, part)
        });
    }

    /// (4.23) for sample n_seen + 1 from the sums of its pass (all rows of the model: `n_total` of them).
    fn finish(&mut self, sums: &Sums, n_total: usize) -> Result<()> {
        let t = self.n_seen + 1;
        let active = t > self.config.n_warmup;
        let track_dsq = self.config.scaling == Scaling::Data && !active;
        self.pending = if active {
            Some(estep(sums, self.n_components)?)
        } else {
            None
        };
        if track_dsq {
            self.scale_sq = sums.dsq / n_total as f64;
        }
        self.n_seen = t;
        Ok(())
    }

    /// The noise floor (absolute, or relative to σ̂² under `Scaling::Data`).
    pub fn floor(&self) -> f64 {
        self.config.scaling.floor::<T>(self.config.noise_floor, self.scale_sq)
    }

    /// σ̂², the mean over features of the warm-up's running squared deviations (0 under `Scaling::Unit`).
    pub fn scale_sq(&self) -> f64 {
        self.scale_sq
    }

    /// Whether warm-up is over (the loadings and noise variances have been fitted, not just initialised).
    /// Warm-up length: the fitted Gaussian exists once more than this many samples were seen.
    pub fn n_warmup(&self) -> u64 {
        self.config.n_warmup
    }

    pub fn is_fitted(&self) -> bool {
        self.n_seen > self.config.n_warmup
    }

    fn start(&self) -> Start {
        Start {
            sigma: self.config.scaling.warmup_scale(self.scale_sq),
            degenerate: self.config.scaling.degenerate(self.scale_sq),
        }
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
    pub(crate) fn visit_current(&self, visit: &mut dyn FnMut(usize, &[f64], &[f64]) -> Result<()>) -> Result<()> {
        let k = self.n_components;
        let mut blk = Block::new(k);
        let chunks = self
            .f
            .chunks(BLOCK_ROWS * k)
            .zip(self.psi.chunks(BLOCK_ROWS))
            .zip(self.d_last.chunks(BLOCK_ROWS));
        let start = (self.config.scaling == Scaling::Data && !self.is_fitted()).then(|| self.start());
        for (i, ((f, psi), d_last)) in chunks.enumerate() {
            let nb = psi.len();
            load_block(&mut blk, f, psi);
            if let Some(start) = start {
                start_block::<T>(&mut blk, start, self.floor(), nb);
            }
            apply_gradient::<T>(
                &mut blk,
                d_last,
                self.pending.as_ref(),
                self.config.lr,
                self.floor(),
                self.config.scaling == Scaling::Data,
                nb,
            );
            visit(i * BLOCK_ROWS, &blk.f[..nb * k], &blk.psi[..nb])?;
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

/// Growth factor of ψ_d in one step, beyond both its previous value and the step's squared deviation d²,
/// that no convergent run reaches (see [`overshooting_features`]).
const MAX_PSI_OVERSHOOT: f64 = 1e6;

/// Number of features whose ψ step diverged: ψ_new > 10⁶ · max(ψ_old, d²), with d the deviation the step
/// used. The step is ψ_new = ψ_old · exp(α ∇β) with ∇β ≈ ½ (r / ψ_old − 1) and r the sample's squared
/// residual, whose fixed point is ψ = E[r]; for data whose variance is many orders above ψ_old (badly
/// scaled features under unit scaling with a fixed α) the exponent is in the hundreds and ψ jumps far past
/// every scale of the data (to 10¹⁴⁹ in a fuzz), after which F and ψ never return. A convergent step moves
/// log ψ by O(α · r/ψ), far from ln 10⁶ ≈ 13.8 beyond ln(r/ψ); data scaling bounds the step to ±1 and
/// never meets the test. Shapes: all nb.
fn overshooting_features<T: Real>(psi_before: &[f64], psi_after: &[f64], d: &[T]) -> usize {
    psi_before
        .iter()
        .zip(psi_after)
        .zip(d)
        .filter(|((&old, &new), &d)| {
            let d = d.to_f64();
            new > MAX_PSI_OVERSHOOT * old.max(d * d)
        })
        .count()
}

/// (4.23) from the sums: Σ = (I + C F)⁻¹, m = Σ C d, and P = Σ + m mᵀ for the gradients. A pass that
/// counted diverged ψ steps (`sums.dsq` > 0 while active) is refused as a breakdown (and rolled back).
fn estep(sums: &Sums, k: usize) -> Result<Pending> {
    if sums.dsq > 0.0 {
        return Err(FaError::Diverged(
            "the SGA step diverged (a noise variance grew more than 10^6-fold past the data's scale in one \
             step); lower lr or use scaling='data'",
        ));
    }
    let precision = Array2::<f64>::eye(k) + &sums.s;
    let factor = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
    let sigma = factor.inverse();
    let m = factor.solve(sums.u.view());
    let p = sigma + outer(&m);
    // A sample many orders of magnitude outside the data seen so far (relative to ψ) gives a latent mean
    // whose outer product overflows: the gradient step would be ∞ − ∞. Refuse it as a breakdown (the
    // update is then rolled back) rather than storing a state that poisons every later step.
    if m.iter()
        .chain(p.iter())
        .any(|v| !v.is_finite() || v.abs() > MAX_LATENT_MOMENT)
    {
        return Err(FaError::NotPositiveDefinite(
            "the latent second moment Σ + m mᵀ (a divergent SGA step)",
        ));
    }
    Ok(Pending { m, p })
}

fn load_block<T: Real>(blk: &mut Block, f: &[T], psi: &[T]) {
    load_rows(f, &mut blk.f);
    load_rows(psi, &mut blk.psi);
}

/// The data-scaled start on a block (F₀ in blk.f, the warm-up's d̄² in blk.psi): F ← σ F₀, ψ ← max(d̄², floor),
/// rounded to storage precision; when σ̂ = 0 (every warm-up sample identical) F₀ and ψ = 1 are kept instead.
fn start_block<T: Real>(blk: &mut Block, start: Start, floor: f64, nb: usize) {
    let k = blk.k;
    if start.degenerate {
        blk.psi[..nb].fill(1.0);
        return;
    }
    for v in blk.f[..nb * k].iter_mut() {
        *v = stored::<T>(*v * start.sigma).1;
    }
    for v in blk.psi[..nb].iter_mut() {
        *v = stored::<T>(v.max(floor)).1;
    }
}

/// Lines 10–14 of Algorithm 1 on a block of rows (F in blk.f, ψ in blk.psi), rounded to storage precision:
/// ∇F = ψ⁻¹ ⊙ (d mᵀ − F P) (4.24), ∇β = ½ψ⁻¹ ⊙ (d² − 2 d ⊙ F m + rowsum(F P ⊙ F)) − ½ (4.25, 4.26),
/// F ← F + α ∇F, β ← β + α ∇β with ψ = exp β, i.e. ψ ← ψ·exp(α ∇β), floored. With `precondition` the F step
/// is α ψ ⊙ ∇F = α (d mᵀ − F P), which is free of the data's units (`Scaling::Data`). Entries of F and ψ are
/// clipped to ±`T::MAX_STATE` so a divergent step (learning rate too large for the data) stays finite;
/// for any stable run the clip is inactive and the result is Algorithm 1. Shapes: blk.f nb×K,
/// P = Σ + m mᵀ K×K, m K.
fn apply_gradient<T: Real>(
    blk: &mut Block,
    d_last: &[T],
    pending: Option<&Pending>,
    lr: f64,
    floor: f64,
    precondition: bool,
    nb: usize,
) {
    let Some(p) = pending else { return };
    let k = blk.k;
    let m = p.m.as_slice().expect("m is contiguous");
    block_times(&blk.f, p.p.view(), &mut blk.tmp, nb);
    load_rows(&d_last[..nb], &mut blk.d_prev);
    let (f, fp, psi, d) = (&mut blk.f, &blk.tmp, &mut blk.psi, &blk.d_prev);
    if !try_sga_step(k, f, fp, psi, d, m, lr, floor, precondition, T::MAX_STATE, nb) {
        let rows = f[..nb * k].chunks_exact_mut(k).zip(fp[..nb * k].chunks_exact(k));
        for (((f_row, fp_row), psi), &d) in rows.zip(psi[..nb].iter_mut()).zip(d.iter()) {
            let inv_psi = 1.0 / *psi;
            let mut f_m = 0.0;
            let mut fp_f = 0.0;
            for ((&f, &fp), &m_j) in f_row.iter().zip(fp_row.iter()).zip(m.iter()) {
                f_m += f * m_j;
                fp_f += fp * f;
            }
            let grad_beta = 0.5 * inv_psi * (d * d - 2.0 * d * f_m + fp_f) - 0.5;
            let f_scale = if precondition { 1.0 } else { inv_psi };
            for ((f, &fp), &m_j) in f_row.iter_mut().zip(fp_row.iter()).zip(m.iter()) {
                let grad_f = f_scale * (d * m_j - fp);
                *f = bounded(*f + lr * grad_f, -T::MAX_STATE, T::MAX_STATE);
            }
            // ψ·exp(α ∇β), kept inside [floor, MAX_STATE]: an SGD step far too large for the data's scale
            // (learning rate vs. variance) is clipped instead of overflowing to inf.
            *psi = bounded(
                *psi * log_psi_step(lr * grad_beta, precondition).exp(),
                floor,
                T::MAX_STATE,
            );
        }
    }
    for v in blk.f[..nb * k].iter_mut().chain(blk.psi[..nb].iter_mut()) {
        *v = stored::<T>(*v).1;
    }
}

/// Largest latent second moment an SGA step accepts: the gradient multiplies it by loadings of up to
/// `MAX_STATE`, so its products stay far from overflow in f64.
const MAX_LATENT_MOMENT: f64 = 1e150;

/// `v` kept inside [lo, hi], with NaN (an overflowing step: ∞ − ∞ in the gradient) sent to `hi`, so that
/// a divergent step leaves a finite (if useless) state instead of poisoning every later query.
#[inline(always)]
pub(crate) fn bounded(v: f64, lo: f64, hi: f64) -> f64 {
    // f64::min/max return the non-NaN operand: NaN.min(hi) = hi.
    v.min(hi).max(lo)
}

/// Largest change of log ψ in one data-scaled step: ψ moves by at most a factor e per sample.
pub(crate) const MAX_LOG_PSI_STEP: f64 = 1.0;

/// The step α ∇β applied to β = log ψ. Unit scaling (Algorithm 1) only caps it at 700 so exp stays finite.
/// Data scaling (`precondition`) bounds it to ±[`MAX_LOG_PSI_STEP`]: a feature whose warm-up variance was
/// zero starts at the floor, and its first non-zero deviation has d²/ψ up to 1e10, a step that would throw
/// ψ to the ceiling where the gradient (→ −½) can never bring it back. A stable run, where α ∇β is of order
/// α, never meets the bound.
#[inline(always)]
pub(crate) fn log_psi_step(step: f64, precondition: bool) -> f64 {
    if precondition {
        step.clamp(-MAX_LOG_PSI_STEP, MAX_LOG_PSI_STEP)
    } else {
        step.min(700.0)
    }
}

/// The fused pass over one task's rows: pending gradient step, running mean, E-step sums.
fn sga_task<T: Real, X: Real>(rows: Rows<T>, x: &ArrayView1<X>, ctx: &PassCtx, blk: &mut Block, sums: &mut Sums) {
    let k = ctx.k;
    let n = rows.mean.len();
    for b0 in (0..n).step_by(BLOCK_ROWS) {
        let nb = (n - b0).min(BLOCK_ROWS);
        if ctx.active {
            let f_rows = &mut rows.f[b0 * k..(b0 + nb) * k];
            let psi_rows = &mut rows.psi[b0..b0 + nb];
            load_block(blk, f_rows, psi_rows);
            if let Some(start) = ctx.start {
                start_block::<T>(blk, start, ctx.floor, nb);
            }
            if ctx.pending.is_some() || ctx.start.is_some() {
                let d_last = &rows.d_last[b0..b0 + nb];
                let mut psi_before = [0.0; BLOCK_ROWS];
                psi_before[..nb].copy_from_slice(&blk.psi[..nb]);
                apply_gradient::<T>(blk, d_last, ctx.pending, ctx.lr, ctx.floor, ctx.precondition, nb);
                // While active, `sums.dsq` is not tracked: it counts the features whose ψ step diverged.
                sums.dsq += overshooting_features(&psi_before[..nb], &blk.psi[..nb], d_last) as f64;
                for (dst, src) in f_rows.iter_mut().zip(blk.f.iter()) {
                    *dst = T::from_f64(*src);
                }
                for (dst, src) in psi_rows.iter_mut().zip(blk.psi.iter()) {
                    *dst = T::from_f64(*src);
                }
            }
        }
        let x_blk = x.slice(s![rows.lo + b0..rows.lo + b0 + nb]);
        let state = rows.mean[b0..b0 + nb]
            .iter_mut()
            .zip(rows.d_last[b0..b0 + nb].iter_mut());
        for (((mean, d_last), xi), d_out) in state.zip(x_blk.iter()).zip(blk.d.iter_mut()) {
            let xi = xi.to_f64();
            let m0 = mean.to_f64();
            let (mean_s, m1) = stored::<T>(m0 + ctx.rho * (xi - m0));
            *mean = mean_s;
            let d = xi - m1;
            *d_last = T::from_f64(d);
            *d_out = d;
        }
        if ctx.track_dsq {
            // ψ's storage holds the warm-up's running d̄² (exact mean, d̄²_t = d̄²_{t−1} + (d² − d̄²_{t−1})/t).
            let mut dsq_sum = 0.0;
            for (v, &d) in rows.psi[b0..b0 + nb].iter_mut().zip(blk.d[..nb].iter()) {
                let v0 = v.to_f64();
                let (s, v1) = stored::<T>(v0 + ctx.rho * (d * d - v0));
                *v = s;
                dsq_sum += v1;
            }
            sums.dsq += dsq_sum;
        }
        if ctx.active {
            accumulate_estep(blk, nb, sums);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{fill_standard_normal, orthonormal_loadings};
    use ndarray::Axis;

    #[test]
    fn local_sums_then_apply_equals_update() {
        for scaling in [Scaling::Unit, Scaling::Data] {
            let (d, k) = (40, 3);
            let f0 = orthonormal_loadings(d, k, 21).expect("init");
            let mut x = Array2::zeros((60, d));
            fill_standard_normal(x.view_mut(), 22);
            let cfg = SgaConfig {
                n_warmup: 10,
                lr: 0.01,
                scaling,
                ..SgaConfig::default()
            };
            let mut whole = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
            let mut split = whole.clone();
            whole.update(x.view()).expect("update");
            for row in x.rows() {
                let sums = split.local_sums(row).expect("sums");
                split.apply(&sums, d).expect("apply");
            }
            assert_eq!(whole.loadings(), split.loadings());
            assert_eq!(whole.noise_variance(), split.noise_variance());
            assert_eq!(whole.mean(), split.mean());
        }
    }

    #[test]
    fn batch_equals_row_by_row_and_psi_stays_positive() {
        let (d, k) = (25, 2);
        let f0 = orthonormal_loadings(d, k, 11).expect("init");
        let mut x = Array2::zeros((150, d));
        fill_standard_normal(x.view_mut(), 12);
        let cfg = SgaConfig {
            n_warmup: 10,
            lr: 0.05,
            ..SgaConfig::default()
        };
        let mut batch = OnlineSga::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
        batch.update(x.view()).expect("update");
        let mut single = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
        for row in x.rows() {
            single.update(row.insert_axis(Axis(0))).expect("update");
        }
        assert_eq!(batch, single);
        assert!(batch.noise_variance().iter().all(|&p| p > 0.0));
    }

    #[test]
    fn warm_up_keeps_parameters_fixed() {
        let (d, k) = (12, 3);
        let f0 = orthonormal_loadings(d, k, 13).expect("init");
        let mut x = Array2::zeros((8, d));
        fill_standard_normal(x.view_mut(), 14);
        let cfg = SgaConfig {
            n_warmup: 8,
            ..SgaConfig::default()
        };
        let mut sga = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
        sga.update(x.view()).expect("update");
        assert_eq!(sga.loadings(), f0);
        assert!(sga.noise_variance().iter().all(|&p| p == 1.0));
    }

    #[test]
    fn rejects_bad_learning_rate() {
        let f0 = Array2::<f64>::zeros((5, 2));
        for lr in [0.0, -1.0, f64::NAN] {
            let cfg = SgaConfig {
                lr,
                ..SgaConfig::default()
            };
            assert!(OnlineSga::<f64>::new(5, 2, f0.view(), cfg).is_err());
        }
    }
}

mod checkpoint {
    use super::*;
    use crate::error::FaError;
    use crate::scaling::{read_scaling, write_scaling};
    use crate::schedule::{read_schedule, write_schedule};
    use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

    impl<T: StateReal> Checkpoint for OnlineSga<T> {
        const KIND: &'static str = "OnlineSGA";

        fn to_state(&self) -> StateMap {
            let (d, k) = (self.n_features, self.n_components);
            let mut w = StateWriter::new(Self::KIND);
            w.put("n_features", StateValue::Int(d as u64));
            w.put("n_components", StateValue::Int(k as u64));
            w.put("n_warmup", StateValue::Int(self.config.n_warmup));
            w.put("noise_floor", StateValue::Float(self.config.noise_floor));
            w.put("lr", StateValue::Float(self.config.lr));
            write_schedule(&mut w, &self.config.step_size);
            write_scaling(&mut w, self.config.scaling, self.scale_sq);
            w.put("n_seen", StateValue::Int(self.n_seen));
            w.array("mean", vec![d], &self.mean);
            w.array("loadings", vec![d, k], &self.f);
            w.array("psi", vec![d], &self.psi);
            w.array("d_last", vec![d], &self.d_last);
            if let Some(p) = &self.pending {
                w.vector("pending_m", &p.m);
                w.matrix("pending_p", &p.p);
            }
            w.0
        }

        fn from_state(state: &StateMap) -> Result<Self> {
            expect_kind(state, Self::KIND)?;
            let r = StateReader(state);
            let (d, k) = (r.usize("n_features")?, r.usize("n_components")?);
            let (scaling, scale_sq) = read_scaling(&r)?;
            let config = SgaConfig {
                lr: r.float("lr")?,
                n_warmup: r.int("n_warmup")?,
                noise_floor: r.float("noise_floor")?,
                step_size: read_schedule(&r)?,
                scaling,
            };
            validate_dims(d, k, config.noise_floor)
                .and_then(|_| check_floor_fits::<T>(config.noise_floor))
                .map_err(|e| FaError::InvalidState(e.to_string()))?;
            if config.lr <= 0.0 {
                return Err(FaError::InvalidState("lr must be > 0".into()));
            }
            let n_seen = r.int("n_seen")?;
            let psi = r.array::<T>("psi", &[d])?;
            // During a data-scaled warm-up ψ's storage holds the running d̄², which may be 0.
            let dsq_in_psi = scaling == Scaling::Data && n_seen <= config.n_warmup;
            if psi
                .iter()
                .any(|v| v.to_f64() < 0.0 || (!dsq_in_psi && v.to_f64() == 0.0))
            {
                return Err(FaError::InvalidState("psi must be positive".into()));
            }
            let pending = if r.has("pending_m") {
                Some(Pending {
                    m: r.vector("pending_m", k)?,
                    p: r.matrix("pending_p", k, k)?,
                })
            } else {
                None
            };
            let sga = OnlineSga {
                n_features: d,
                n_components: k,
                config,
                n_seen,
                mean: r.array::<T>("mean", &[d])?,
                f: r.array::<T>("loadings", &[d, k])?,
                psi,
                d_last: r.array::<T>("d_last", &[d])?,
                pending,
                scale_sq,
            };
            crate::state_checks::online_sga(&sga)?;
            Ok(sga)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::init::{fill_standard_normal, orthonormal_loadings};

        #[test]
        fn resume_from_state_is_bit_identical() {
            let (d, k) = (20, 2);
            let f0 = orthonormal_loadings(d, k, 3).expect("init");
            let mut x = Array2::zeros((50, d));
            fill_standard_normal(x.view_mut(), 4);
            let cfg = SgaConfig {
                n_warmup: 5,
                lr: 0.01,
                ..SgaConfig::default()
            };
            let mut a = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
            a.update(x.slice(ndarray::s![..25, ..])).expect("update");
            let mut b = OnlineSga::<f64>::from_state(&a.to_state()).expect("restore");
            a.update(x.slice(ndarray::s![25.., ..])).expect("update");
            b.update(x.slice(ndarray::s![25.., ..])).expect("update");
            assert_eq!(a, b);
            let mut broken = a.to_state();
            broken.remove("psi");
            assert!(OnlineSga::<f64>::from_state(&broken).is_err());
        }
    }
}
