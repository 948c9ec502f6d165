//! Online EM for factor analysis (thesis Algorithm 2), one streaming pass over the D×K state per sample.
//!
//! State (thesis names): θ̄ (`mean`, D), Ā (`a_bar`, D×K), d̄² (`dsq_bar`, D), B̄ (`b_bar`, K×K).
//! F and ψ are not stored: after warm-up they are functions of the statistics,
//! F = Ā H̄⁻¹ (4.33) and ψ = d̄² − rowsum(F ⊙ Ā) (4.35 with F H̄ = Ā), H̄ = Σ + B̄.
//!
//! One pass per sample: the rank-1 update Ā_t = Ā_{t−1} + ρ_t (d_t m_tᵀ − Ā_{t−1}) (line 12) is row-local,
//! so it is left *pending* and applied by the next pass while that pass reads the same row to build the
//! next E-step's sums S = C F and u = C d (4.23). The only cross-row quantities are S (K×K) and u (K).

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use crate::config_checks::{check_floor_fits, checked_init, validate_dims};
use crate::engine::block::{accumulate_estep, block_times, load_rows, outer, rank_one_update, row_dots};
use crate::engine::driver::{self, Driven};
use crate::engine::em_kernel::{to_loadings_space, EmBlockIo, EmConsts, EmRowKernel, Isa, MAX_K};
use crate::engine::em_wide::{em_wide_block, WideConsts, WideIo, WideScratch};
use crate::engine::model::hooks::Pass;
use crate::engine::partition::{stream_pass, validate_batch, Block, Scratch, StateRows, BLOCK_ROWS};
use crate::engine::tiled::Tiled;
use crate::engine::{advance, Advanced};
pub use crate::engine::{StepSums, StreamingModel};
use crate::error::{checked_size, try_filled, FaError, Result};
use crate::linalg::Rotation;
use crate::linalg::SpdFactor;
use crate::scalar::{stored, Real};
use crate::scaling::Scaling;
use crate::schedule::StepSize;

/// Hyper-parameters of [`OnlineEm`].
#[derive(Debug, Clone, PartialEq)]
pub struct EmConfig {
    /// Samples during which F and ψ stay at their initial values while the averages are updated.
    pub n_warmup: u64,
    /// Lower bound on every ψ_d (absolute, in squared data units).
    pub noise_floor: f64,
    /// Step sizes ρ_t of the running averages.
    pub step_size: StepSize,
    /// Apply the whitening (PX-EM) step after every M-step: F ← F R, Ā ← Ā R⁻ᵀ, H̄ ← I (R Rᵀ = H̄).
    pub whiten: bool,
    /// Scale convention of the warm-up start, the noise floor and the mean (`Unit`: the thesis).
    pub scaling: Scaling,
}

impl Default for EmConfig {
    fn default() -> Self {
        EmConfig {
            n_warmup: 100,
            noise_floor: 1e-10,
            step_size: StepSize::Harmonic,
            whiten: false,
            scaling: Scaling::Unit,
        }
    }
}

/// Where the E-step of the next sample takes F and ψ from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source<T> {
    /// Still within warm-up (+1): the initial loadings F₀ (D×K, row-major) with ψ = 1, both scaled by
    /// [`Scaling::warmup_scale`] (F₀ σ, ψ = σ²).
    Initial(Vec<T>),
    /// F = Ā H̄⁻¹ with this H̄⁻¹ (K×K).
    Stats(Array2<f64>),
    /// Whitened basis: H̄ = I, so F = Ā.
    Whitened,
}

/// The not-yet-applied row-local part of the last sample: its running moments θ̄, d̄² (lines 5, 6, 14, from
/// the innovation e stored in `d_last`, see `engine::advance`) and the update Ā ← ((1−ρ) Ā + ρ d mᵀ) W.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pending {
    /// (ρ', ρ) of the pending moments; None when θ̄, d̄² are already applied and `d_last` holds d (checkpoints
    /// written before moments were deferred).
    pub(crate) moments: Option<(f64, f64)>,
    pub(crate) rho: f64,
    pub(crate) m: Array1<f64>,
    /// Whitening transform W = R⁻ᵀ (K×K), if the last M-step whitened.
    pub(crate) transform: Option<Array2<f64>>,
}

/// Online EM factor analysis with state stored in `T` (f32 or f64).
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineEm<T: Real> {
    pub(crate) n_features: usize,
    pub(crate) n_components: usize,
    pub(crate) config: EmConfig,
    pub(crate) n_seen: u64,
    pub(crate) mean: Vec<T>,
    pub(crate) a_bar: Vec<T>,
    pub(crate) dsq_bar: Vec<T>,
    /// d_t of the last sample, needed by the pending rank-1 update.
    pub(crate) d_last: Vec<T>,
    pub(crate) b_bar: Array2<f64>,
    /// Σ of the last E-step.
    pub(crate) sigma: Array2<f64>,
    pub(crate) source: Source<T>,
    pub(crate) pending: Option<Pending>,
    /// σ̂² = (1/D) Σ_d d̄²_d after the last pass (the data's scale, used by `Scaling::Data`).
    pub(crate) scale_sq: f64,
}

/// Everything a pass needs besides the rows.
struct PassCtx<'a, T: Real> {
    pending: Option<&'a Pending>,
    source: &'a Source<T>,
    rho: f64,
    /// Step size of the running mean (1/t under `Scaling::Data`).
    mean_rho: f64,
    /// σ of the warm-up start F₀ σ, ψ₀ = σ².
    init_scale: f64,
    floor: f64,
    k: usize,
    /// The fused row-SIMD kernel's constants and code path, when it runs this pass.
    fast: Option<(EmConsts<T>, EmRowKernel<T>)>,
    /// The wide (K > MAX_K) kernel's constants, when it runs this pass.
    wide: Option<WideConsts>,
}

/// Visitor of blocks of the fitted Gaussian: `(first_row, mean (nb), F (nb×K row-major), ψ (nb))`, f64.
pub(crate) type FittedRowsVisitor<'a> = dyn FnMut(usize, &[f64], &[f64], &[f64]) -> Result<()> + 'a;

impl<T: Real> OnlineEm<T> {
    /// New model. `init` is F₀ (D×K); ψ starts at 1, θ̄ at 0.
    pub fn new(n_features: usize, n_components: usize, init: ArrayView2<f64>, config: EmConfig) -> Result<Self> {
        validate_dims(n_features, n_components, config.noise_floor)?;
        check_floor_fits::<T>(config.noise_floor)?;
        config.step_size.validate()?;
        let init = checked_init::<T>(init, n_features, n_components)?;
        let k = n_components;
        Ok(OnlineEm {
            n_features,
            n_components,
            config,
            n_seen: 0,
            mean: try_filled(n_features, T::default(), "n_features")?,
            a_bar: try_filled(checked_size(n_features, k)?, T::default(), "n_features")?,
            dsq_bar: try_filled(n_features, T::default(), "n_features")?,
            d_last: try_filled(n_features, T::default(), "n_features")?,
            b_bar: Array2::zeros((k, k)),
            sigma: Array2::eye(k),
            source: Source::Initial(init),
            pending: None,
            scale_sq: 0.0,
        })
    }

    /// Number of samples applied so far.
    pub fn n_seen(&self) -> u64 {
        self.n_seen
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &EmConfig {
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
    /// magnitude error applies nothing. A numerical breakdown never leaves a torn state: up to
    /// `SNAPSHOT_MAX_ELEMENTS` (engine/partition.rs) the model is restored to its state before the call; for larger models
    /// it is left exactly as it was before the failing row (the rows before it stay applied), at no extra
    /// memory traffic — see [`OnlineEm::step`].
    pub fn update<X: Real>(&mut self, x: ArrayView2<X>) -> Result<()> {
        driver::update(self, x)
    }

    /// The pass, through the fused kernel on code path `isa` (or, for K > MAX_K, the wide kernel) when it
    /// applies (None: block-by-block path); returns whether a kernel ran.
    fn pass_on<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        rho: f64,
        mean_rho: f64,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        isa: Option<Isa>,
    ) -> bool {
        let floor = self.floor();
        let kernel = isa.and_then(|isa| EmRowKernel::select(self.n_components, isa));
        let fast = kernel.and_then(|kernel| self.kernel_consts(rho, mean_rho, floor).map(|c| (c, kernel)));
        let wide = isa.and_then(|_| self.wide_consts(rho, mean_rho, floor, Isa::detect()));
        self.pass_with(x, rho, mean_rho, scratch, sums, fast, wide)
    }

    /// The pass with the given kernel constants (both None: block-by-block path).
    #[allow(clippy::too_many_arguments)]
    fn pass_with<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        rho: f64,
        mean_rho: f64,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        fast: Option<(EmConsts<T>, EmRowKernel<T>)>,
        wide: Option<WideConsts>,
    ) -> bool {
        let k = self.n_components;
        let floor = self.floor();
        let ctx = PassCtx {
            pending: self.pending.as_ref(),
            source: &self.source,
            rho,
            mean_rho,
            init_scale: self.config.scaling.warmup_scale(self.scale_sq),
            floor,
            k,
            fast,
            wide,
        };
        let state = StateRows {
            matrix: &mut self.a_bar,
            mean: &mut self.mean,
            var: &mut self.dsq_bar,
            d_last: &mut self.d_last,
        };
        stream_pass(state, k, &x, scratch, sums, |row0, rows, x, blk, part| {
            em_block(row0, rows, x, &ctx, blk, part)
        });
        if let Some((consts, _)) = &ctx.fast {
            let upper: Option<Vec<f64>> = consts.upper.as_ref().map(|u| u.iter().map(|v| v.to_f64()).collect());
            let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
            let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
            to_loadings_space(k, upper.as_deref(), s, u);
            return true;
        }
        if let Some(consts) = &ctx.wide {
            // U = Lᵀ (Uᵀ U = L Lᵀ = H̄⁻¹).
            let upper = consts.factor.as_ref().map(|l| {
                let kp = l.kp;
                (0..k * k).map(|ij| l.m[(ij % k) * kp + ij / k]).collect::<Vec<f64>>()
            });
            let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
            let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
            to_loadings_space(k, upper.as_deref(), s, u);
            return true;
        }
        false
    }

    /// Constants of the wide kernel (engine/em_wide.rs) for this pass, or None when another path runs (warm-up,
    /// K <= MAX_K). L is the lower Cholesky factor of H̄⁻¹.
    fn wide_consts(&self, rho: f64, mean_rho: f64, floor: f64, isa: Isa) -> Option<WideConsts> {
        let k = self.n_components;
        if k <= MAX_K {
            return None;
        }
        let tiled = |m: &Array2<f64>| Tiled::new(k, &m.iter().copied().collect::<Vec<f64>>());
        let factor = match &self.source {
            Source::Initial(_) => return None,
            Source::Stats(h_inv) => Some(tiled(&SpdFactor::new(h_inv.view(), "H̄⁻¹").ok()?.lower())),
            Source::Whitened => None,
        };
        let pending = self.pending.as_ref();
        Some(WideConsts {
            k,
            moments: pending.and_then(|p| p.moments),
            pending: pending.map(|p| (p.rho, p.m.to_vec())),
            transform: pending.and_then(|p| p.transform.as_ref()).map(tiled),
            factor,
            rho,
            mean_rho,
            floor,
            isa,
        })
    }

    /// Constants of the fused kernel (engine/em_kernel.rs) for this pass, or None when the block-by-block
    /// path runs instead (warm-up, K > MAX_K). U is the transposed Cholesky factor of H̄⁻¹ (Uᵀ U = H̄⁻¹).
    fn kernel_consts(&self, rho: f64, mean_rho: f64, floor: f64) -> Option<EmConsts<T>> {
        let k = self.n_components;
        if k > MAX_K {
            return None;
        }
        let to_t = |m: &Array2<f64>| -> Vec<T> { m.iter().map(|&v| T::from_f64(v)).collect() };
        let upper = match &self.source {
            Source::Initial(_) => return None,
            Source::Stats(h_inv) => Some(to_t(&SpdFactor::new(h_inv.view(), "H̄⁻¹").ok()?.lower().reversed_axes())),
            Source::Whitened => None,
        };
        Some(EmConsts {
            moments: self.pending.as_ref().and_then(|p| p.moments),
            pending: self
                .pending
                .as_ref()
                .map(|p| (T::from_f64(p.rho), p.m.iter().map(|&v| T::from_f64(v)).collect())),
            transform: self.pending.as_ref().and_then(|p| p.transform.as_ref()).map(to_t),
            upper,
            rho,
            mean_rho,
            floor,
        })
    }

    /// The K×K part of Algorithm 2 (lines 8–11, 13) after the pass has produced S = C F and u = C d.
    fn finish_step(&mut self, t: u64, rho: f64, mean_rho: f64, sums: &StepSums, n_total: usize) -> Result<()> {
        let k = self.n_components;
        // (4.23): Σ = (I + C F)⁻¹, m = Σ C d — by Cholesky of the K×K matrix I + C F.
        let precision = Array2::<f64>::eye(k) + &sums.s;
        let factor = SpdFactor::new_jittered(precision.view(), "I + Fᵀ Ψ⁻¹ F")?;
        let sigma = factor.inverse();
        let mut m = factor.solve(sums.u.view());
        if matches!(self.source, Source::Initial(_)) && self.config.scaling.degenerate(self.scale_sq) {
            // No scale yet (every earlier sample identical): the latent mean of this sample is not defined
            // in the data's units, so it contributes m = 0 (as d₁ = 0 does for the first sample).
            m.fill(0.0);
        }
        // The pending rank-one step Ā ← (1 − ρ) Ā + ρ d mᵀ is applied by the next pass in the storage type. Every
        // |d_d| <= 2 MAX_INPUT (|x|, |θ̄| <= MAX_INPUT), so a step whose |m| could make some d_d m_j overflow that
        // type is refused here, before anything is committed: otherwise a non-finite Ā would be stored by a pass
        // that does not read it (warm-up), and the model could neither answer queries nor be saved and loaded.
        // (A sample this far outside the model — e.g. 1e18 after data of scale 1e-40 in float32 — is a
        // numerical breakdown; the caller gets the model as it was before the batch.)
        let limit = max_latent_mean::<T>();
        if !m.iter().all(|v| v.abs() <= limit) {
            return Err(FaError::Diverged(
                "the latent mean of this sample is too large for the state's dtype (the running averages \
                 would overflow); the sample lies far outside the scale of the data seen so far",
            ));
        }
        // Finite: every d̄²_d <= MAX_INPUT² (1e200 for f64 input), so the sum over D rows is too.
        let scale_sq = sums.dsq_sum / n_total as f64;
        // Line 10: B̄_t = B̄_{t−1} + ρ_t (m mᵀ − B̄_{t−1}).
        let b_bar = &self.b_bar + &((outer(&m) - &self.b_bar) * rho);
        let transform = if t > self.config.n_warmup {
            self.m_step(sigma, b_bar)?
        } else {
            self.b_bar = b_bar;
            self.sigma = sigma;
            None
        };
        self.pending = Some(Pending {
            moments: Some((mean_rho, rho)),
            rho,
            m,
            transform,
        });
        self.n_seen = t;
        self.scale_sq = scale_sq;
        Ok(())
    }

    /// Lines 11 and 13 of Algorithm 2 on this step's Σ and B̄: H̄ = Σ + B̄, F = Ā H̄⁻¹ (applied lazily
    /// through `Source`), or under whitening (PX-EM) the rotation of every statistic to the basis where
    /// H̄ = I. Stores Σ, B̄ and the new source; returns the whitening transform W = R⁻ᵀ (K×K) that the
    /// pending step applies to Ā, if any. Nothing is stored when H̄ cannot be factorised.
    fn m_step(&mut self, sigma: Array2<f64>, b_bar: Array2<f64>) -> Result<Option<Array2<f64>>> {
        let h_bar = &sigma + &b_bar;
        let h_factor = SpdFactor::new_jittered(h_bar.view(), "H̄ = Σ + B̄")?;
        if !self.config.whiten {
            self.source = Source::Stats(h_factor.inverse());
            self.sigma = sigma;
            self.b_bar = b_bar;
            return Ok(None);
        }
        // Whitening (PX-EM): R Rᵀ = H̄, new latents h' = R⁻¹ h. Every statistic moves to the new
        // basis: Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ, Σ ← R⁻¹ Σ R⁻ᵀ, so H̄ ← I (B̄ = I − Σ in the new basis).
        // F Āᵀ and F H̄ Fᵀ are unchanged, so ψ is too; afterwards F = Ā. Rotating B̄ (rather than
        // resetting it to I − Σ_old) keeps each row's averaged moment matrix of (d, m) PSD, hence ψ ≥ 0.
        // Row-major W = R⁻ᵀ: the fused kernel and `block_times` read it as a flat slice, so the update
        // pass, the queries and a restored checkpoint (always row-major) round identically.
        let rotation = Rotation::whitening(h_factor.lower().view())?;
        self.sigma = rotation.latent_moment(sigma.view());
        self.b_bar = rotation.latent_moment(b_bar.view());
        self.source = Source::Whitened;
        Ok(Some(rotation.cross_moment_map()))
    }

    /// The model as it would be had its warm-up ended with the last sample: the first M-step (lines 11
    /// and 13) applied to the statistics gathered so far, without changing `self`. It equals, bit for bit,
    /// the same model built with `n_warmup = n_seen − 1` and fed the same samples, so its Gaussian has
    /// rank at most n_seen − 1 (d₁ = 0). One clone of the state (D·K + 4·D values).
    ///
    /// Errors with [`FaError::CallOrder`] when warm-up is already over, fewer than two samples were seen,
    /// or every sample so far was identical (no scale to fit).
    pub fn ended_warmup(&self) -> Result<Self> {
        let not_yet = |why: &str| Err(FaError::CallOrder(why.to_string()));
        if self.is_fitted() {
            return not_yet("warm-up is already over");
        }
        if self.n_seen < 2 || self.config.scaling.degenerate(self.scale_sq) || self.pending.is_none() {
            return not_yet("at least two distinct samples are needed for a first fit");
        }
        let mut ended = self.clone();
        ended.config.n_warmup = self.n_seen - 1;
        let transform = ended.m_step(self.sigma.clone(), self.b_bar.clone())?;
        if let Some(pending) = ended.pending.as_mut() {
            pending.transform = transform;
        }
        Ok(ended)
    }

    /// Ā with the pending update applied, as the next pass will store it (D×K, f64).
    #[cfg(test)]
    fn current_a_bar(&self) -> Array2<f64> {
        let k = self.n_components;
        let mut blk = Block::new(k);
        let mut out = Vec::with_capacity(self.n_features * k);
        for (i, a) in self.a_bar.chunks(BLOCK_ROWS * k).enumerate() {
            let nb = a.len() / k;
            for (r, d) in blk.d_prev[..nb].iter_mut().enumerate() {
                *d = self.pending_moments(i * BLOCK_ROWS + r).d;
            }
            load_rows(a, &mut blk.a);
            apply_pending::<T>(&mut blk, self.pending.as_ref(), nb);
            out.extend_from_slice(&blk.a[..nb * k]);
        }
        Array2::from_shape_vec((self.n_features, k), out).expect("D·K values collected")
    }

    /// Call `visit(first_row, mean (nb), F (nb×K), ψ (nb))` for consecutive blocks of the fitted Gaussian in
    /// `rows`, in f64, as the next E-step will use it (pending update applied): F = Ā H̄⁻¹ (Ā when whitened),
    /// ψ = max(d̄² − rowsum(F ⊙ Ā), floor). Each row's pending moments are computed once. After warm-up only.
    pub(crate) fn visit_fitted_rows(
        &self,
        rows: std::ops::Range<usize>,
        visit: &mut FittedRowsVisitor<'_>,
    ) -> Result<()> {
        let k = self.n_components;
        let floor = self.floor();
        let h_inv = match &self.source {
            Source::Stats(h_inv) => Some(h_inv.view()),
            _ => None,
        };
        let mut blk = Block::new(k);
        let (mut mean, mut dsq) = (vec![0.0; BLOCK_ROWS], vec![0.0; BLOCK_ROWS]);
        for (i, a) in self.a_bar[rows.start * k..rows.end * k]
            .chunks(BLOCK_ROWS * k)
            .enumerate()
        {
            let first = rows.start + i * BLOCK_ROWS;
            let nb = a.len() / k;
            for r in 0..nb {
                let moments = self.pending_moments(first + r);
                (mean[r], dsq[r], blk.d_prev[r]) = (moments.mean.1, moments.dsq.1, moments.d);
            }
            load_rows(a, &mut blk.a);
            apply_pending::<T>(&mut blk, self.pending.as_ref(), nb);
            let f: &[f64] = match h_inv {
                Some(h_inv) => {
                    block_times(&blk.a, h_inv, &mut blk.f, nb);
                    &blk.f[..nb * k]
                }
                None => &blk.a[..nb * k],
            };
            row_dots(f, &blk.a, k, nb, &mut blk.psi);
            for (psi, &d) in blk.psi[..nb].iter_mut().zip(&dsq[..nb]) {
                *psi = (d - *psi).max(floor);
            }
            visit(first, &mean[..nb], f, &blk.psi[..nb])?;
        }
        Ok(())
    }

    /// The noise floor the next pass applies (absolute, or relative to σ̂² under `Scaling::Data`).
    pub fn floor(&self) -> f64 {
        self.config.scaling.floor::<T>(self.config.noise_floor, self.scale_sq)
    }

    /// σ̂² = (1/D) Σ_d d̄²_d, the mean squared deviation of the features after the last sample.
    pub fn scale_sq(&self) -> f64 {
        self.scale_sq
    }

    /// Whether warm-up is over, i.e. the loadings and noise variances are fitted rather than initial.
    /// Warm-up length: the fitted Gaussian exists once more than this many samples were seen.
    pub fn n_warmup(&self) -> u64 {
        self.config.n_warmup
    }

    pub fn is_fitted(&self) -> bool {
        !matches!(self.source, Source::Initial(_))
    }

    /// Loadings F (D×K) as the next E-step will use them.
    pub fn loadings(&self) -> Array2<f64> {
        match &self.source {
            Source::Initial(f0) => {
                let scale = self.config.scaling.warmup_scale(self.scale_sq);
                Array2::from_shape_fn((self.n_features, self.n_components), |(i, j)| {
                    f0[i * self.n_components + j].to_f64() * scale
                })
            }
            Source::Stats(_) | Source::Whitened => self.fitted_rows().0,
        }
    }

    /// Noise variances ψ (D) as the next E-step will use them: ψ = max(d̄² − rowsum(F ⊙ Ā), floor).
    pub fn noise_variance(&self) -> Array1<f64> {
        match &self.source {
            Source::Initial(_) => {
                Array1::from_elem(self.n_features, self.config.scaling.warmup_scale(self.scale_sq).powi(2))
            }
            Source::Stats(_) | Source::Whitened => self.fitted_rows().1,
        }
    }

    /// F (D×K) and ψ (D) of the fitted model, from [`Self::visit_fitted_rows`].
    fn fitted_rows(&self) -> (Array2<f64>, Array1<f64>) {
        let (mut f, mut psi) = (Vec::with_capacity(self.n_features * self.n_components), Vec::new());
        self.visit_fitted_rows(0..self.n_features, &mut |_, _, rows, p| {
            f.extend_from_slice(rows);
            psi.extend_from_slice(p);
            Ok(())
        })
        .expect("collecting never fails");
        let f = Array2::from_shape_vec((self.n_features, self.n_components), f).expect("D·K values collected");
        (f, Array1::from(psi))
    }

    /// Running mean θ̄ (D).
    pub fn mean(&self) -> Array1<f64> {
        (0..self.n_features).map(|i| self.pending_moments(i).mean.1).collect()
    }

    /// Row i's θ̄ and d̄² with the pending moments applied, and the d the pending Ā update uses.
    pub(crate) fn pending_moments(&self, i: usize) -> Advanced<T> {
        let (mean, dsq, last) = (self.mean[i], self.dsq_bar[i], self.d_last[i].to_f64());
        match self.pending.as_ref().and_then(|p| p.moments) {
            Some((mean_rho, rho)) => advance::<T>(mean.to_f64(), dsq.to_f64(), last, mean_rho, rho),
            None => Advanced {
                mean: (mean, mean.to_f64()),
                dsq: (dsq, dsq.to_f64()),
                d: last,
            },
        }
    }

    /// Σ of the last E-step (K×K).
    pub fn latent_covariance(&self) -> &Array2<f64> {
        &self.sigma
    }
}

/// Largest |m_j| of a step: |d m_j| <= 2 MAX_INPUT |m_j| stays below a quarter of the storage type's largest
/// finite value (room for the (1 − ρ) Ā term and the rounding of the kernels, which may form d m_j first).
pub(crate) fn max_latent_mean<T: Real>() -> f64 {
    T::MAX_FINITE / 4.0 / (2.0 * T::MAX_INPUT)
}

/// Ā rows of the block ← ((1 − ρ) Ā + ρ d mᵀ) W, rounded to storage precision (line 12 of Algorithm 2,
/// plus the optional whitening transform). `blk.a[..nb·K]` holds the stored rows on entry.
/// `blk.d_prev[..nb]` holds the previous sample's d.
fn apply_pending<T: Real>(blk: &mut Block, pending: Option<&Pending>, nb: usize) {
    let Some(p) = pending else { return };
    let k = blk.k;
    let m = p.m.as_slice().expect("m is contiguous");
    rank_one_update(&mut blk.a, &blk.d_prev, m, p.rho, nb);
    if let Some(w) = &p.transform {
        block_times(&blk.a, w.view(), &mut blk.tmp, nb);
        std::mem::swap(&mut blk.a, &mut blk.tmp);
    }
    for v in blk.a[..nb * k].iter_mut() {
        *v = stored::<T>(*v).1;
    }
}

/// The pass over one block of rows (first row `row0`; x: this sample's values for them): through the row-SIMD
/// kernel or the wide kernel when one runs this pass, else the block path with explicit F. Shapes: rows.matrix
/// (Ā) is nb×K row-major, the other rows and x are nb.
fn em_block<T: Real>(
    row0: usize,
    rows: StateRows<'_, T>,
    x: &[f64],
    ctx: &PassCtx<T>,
    blk: &mut Block,
    sums: &mut StepSums,
) {
    let nb = rows.mean.len();
    let u = sums.u.as_slice_mut().expect("sums are allocated contiguous");
    let s = sums.s.as_slice_mut().expect("sums are allocated contiguous");
    if let Some((consts, kernel)) = &ctx.fast {
        let mut io = EmBlockIo {
            a: rows.matrix,
            mean: rows.mean,
            dsq: rows.var,
            d_last: rows.d_last,
            x,
            consts,
            dsq_sum: &mut sums.dsq_sum,
            u,
            s,
        };
        kernel.run(&mut io, nb);
        return;
    }
    if let Some(consts) = &ctx.wide {
        let mut io = WideIo {
            a: rows.matrix,
            mean: rows.mean,
            dsq: rows.var,
            d_last: rows.d_last,
            x,
            dsq_sum: &mut sums.dsq_sum,
            u,
            s,
        };
        let mut scratch = WideScratch {
            a: &mut blk.a,
            z: &mut blk.f,
            y: &mut blk.tmp,
            d_prev: &mut blk.d_prev,
        };
        em_wide_block(consts, &mut io, &mut scratch);
        return;
    }
    // 1. The previous sample's pending moments (lines 5, 6, 14) and line 12: θ̄_{t−1}, d̄²_{t−1} and Ā_{t−1}
    //    from the stored values; write them back.
    pending_moments_block(rows.mean, rows.var, rows.d_last, ctx.pending, &mut blk.d_prev);
    load_rows(rows.matrix, &mut blk.a);
    if ctx.pending.is_some() {
        apply_pending::<T>(blk, ctx.pending, nb);
        for (dst, src) in rows.matrix.iter_mut().zip(blk.a.iter()) {
            *dst = T::from_f64(*src);
        }
    }
    // 2. F and ψ of the previous sample (lines 13, 15), or F₀ and ψ = 1 during warm-up.
    loadings_block(blk, rows.var, row0, ctx, nb);
    // 3. This sample: innovation e = x_t − θ̄_{t−1} (stored in d_last), d_t and d̄²_t (registers only).
    let state = rows.mean.iter().zip(rows.var.iter()).zip(rows.d_last.iter_mut());
    let mut dsq_sum = 0.0;
    for ((((mean, dsq), d_last), &xi), d_out) in state.zip(x).zip(blk.d.iter_mut()) {
        let m0 = mean.to_f64();
        let (e_s, e) = stored::<T>(xi - m0);
        let adv = advance::<T>(m0, dsq.to_f64(), e, ctx.mean_rho, ctx.rho);
        dsq_sum += adv.dsq.1;
        *d_last = e_s;
        *d_out = adv.d;
    }
    sums.dsq_sum += dsq_sum;
    // 4. E-step sums (4.23): S += Fᵀ Ψ⁻¹ F, u += Fᵀ Ψ⁻¹ d over this block.
    accumulate_estep(blk, nb, sums);
}

/// Apply the previous sample's pending moments to rows (θ̄, d̄², d_last: nb each; writing θ̄, d̄²) and put the d its
/// line-12 update uses into `d_prev`.
fn pending_moments_block<T: Real>(
    mean: &mut [T],
    dsq: &mut [T],
    d_last: &[T],
    pending: Option<&Pending>,
    d_prev: &mut [f64],
) {
    let moments = pending.and_then(|p| p.moments);
    let state = mean.iter_mut().zip(dsq.iter_mut()).zip(d_last.iter());
    for (((mean, dsq), last), out) in state.zip(d_prev.iter_mut()) {
        *out = last.to_f64();
        if let Some((mean_rho, rho)) = moments {
            let adv = advance::<T>(mean.to_f64(), dsq.to_f64(), *out, mean_rho, rho);
            (*mean, *dsq, *out) = (adv.mean.0, adv.dsq.0, adv.d);
        }
    }
}

/// blk.f[..nb] and blk.psi[..nb] for rows starting at global row `row0`:
/// F = Ā H̄⁻¹ and ψ = max(d̄² − rowsum(F ⊙ Ā), floor) (4.33, 4.35), or F₀ σ and σ² during warm-up.
fn loadings_block<T: Real>(blk: &mut Block, dsq: &[T], row0: usize, ctx: &PassCtx<T>, nb: usize) {
    let k = ctx.k;
    match ctx.source {
        Source::Initial(f0) => {
            // F₀ σ and ψ₀ = σ² (σ = 1 under `Scaling::Unit`: exactly the thesis's F₀, ψ = 1).
            load_rows(&f0[row0 * k..(row0 + nb) * k], &mut blk.f);
            if ctx.init_scale != 1.0 {
                blk.f[..nb * k].iter_mut().for_each(|v| *v *= ctx.init_scale);
            }
            blk.psi[..nb].fill(ctx.init_scale * ctx.init_scale);
            return;
        }
        Source::Stats(h_inv) => block_times(&blk.a, h_inv.view(), &mut blk.f, nb),
        Source::Whitened => blk.f[..nb * k].copy_from_slice(&blk.a[..nb * k]),
    }
    row_dots(&blk.f, &blk.a, k, nb, &mut blk.psi);
    for (psi, dsq) in blk.psi[..nb].iter_mut().zip(dsq.iter()) {
        *psi = (dsq.to_f64() - *psi).max(ctx.floor);
    }
}

impl<T: Real> Pass for OnlineEm<T> {
    fn dims(&self) -> (usize, usize) {
        (self.n_features, self.n_components)
    }

    fn validate<X: Real>(&self, x: ArrayView2<X>) -> Result<()> {
        validate_batch::<T, X>(&x, self.n_features)
    }

    /// The pass writes only the previous sample's pending row-local step, now applied: until the K×K step the
    /// model is the one before `x` (another pass recomputes the same sums).
    fn pass_sums<X: Real>(&mut self, x: ArrayView1<X>) -> StepSums {
        let t = self.n_seen + 1;
        let rho = self.config.step_size.rho(t);
        let mut scratch = Scratch::new(self.n_features, self.n_components);
        let mut sums = StepSums::zeros(self.n_components);
        let mean_rho = self.config.scaling.mean_rho(rho, t);
        self.pass_on(x, rho, mean_rho, &mut scratch, &mut sums, Some(Isa::detect()));
        sums
    }

    fn drop_pending(&mut self) {
        self.pending = None;
    }

    /// The K×K part of Algorithm 2 from the sums, with σ̂² = Σ d̄² / `n_total`.
    fn finish(&mut self, sums: &StepSums, n_total: usize) -> Result<()> {
        let t = self.n_seen + 1;
        let rho = self.config.step_size.rho(t);
        self.finish_step(t, rho, self.config.scaling.mean_rho(rho, t), sums, n_total)
    }
}

impl<T: Real> StreamingModel for OnlineEm<T> {}

/// A failed step needs no undo: the pass writes only what is the same model as before the sample — the previous
/// sample's pending θ̄, d̄² and Ā, now applied — plus the sample's innovation e in `d_last`, which only a pending
/// step reads. If the K×K step then fails, dropping the (consumed) pending step leaves the model exactly as it
/// was before the sample: same mean, loadings and noise variances, bit for bit, and the same future under the
/// same data. float32 state runs the kernels in float32 arithmetic, and a failed step is redone once with the
/// f64 block path before a breakdown is reported.
impl<T: Real> Driven for OnlineEm<T> {
    type Storage = T;
    type Reused = ();
    type RowUndo = ();
    const PRIVATE_ROWS: bool = false;
    const RETRY_IN_F64: bool = true;

    /// The fused pass (pending row-local step + E-step sums), then the K×K step.
    fn try_step<X: Real>(
        &mut self,
        x: ArrayView1<X>,
        scratch: &mut Scratch,
        sums: &mut StepSums,
        kernels: bool,
    ) -> Result<()> {
        let t = self.n_seen + 1;
        let rho = self.config.step_size.rho(t);
        let mean_rho = self.config.scaling.mean_rho(rho, t);
        let isa = kernels.then(Isa::detect);
        self.pass_on(x, rho, mean_rho, scratch, sums, isa);
        self.finish_step(t, rho, mean_rho, sums, self.n_features)
    }

    fn take_reused(&mut self) {}

    fn put_reused(&mut self, _: ()) {}

    fn row_copy(_: &mut ()) -> &mut Vec<f64> {
        unreachable!("online EM reads the caller's rows (PRIVATE_ROWS is false)")
    }

    fn prepare_undo(&mut self, _: &mut ()) {}

    fn undo_row(&mut self, _: (), _: &()) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::partition::{use_parallel, SNAPSHOT_MAX_ELEMENTS, TASK_ROWS};
    use crate::init::{fill_standard_normal, orthonormal_loadings};
    use crate::linalg::lower_triangular_inverse;
    use ndarray::s;

    fn stream(n: usize, d: usize, seed: u64) -> Array2<f64> {
        let mut x = Array2::zeros((n, d));
        fill_standard_normal(x.view_mut(), seed);
        // Give the features different scales and a shared factor so F has something to find.
        for mut row in x.rows_mut() {
            let common = row[0];
            for (j, v) in row.iter_mut().enumerate() {
                *v = *v * (1.0 + j as f64 * 0.1) + common * 2.0 + j as f64;
            }
        }
        x
    }

    #[test]
    fn batch_equals_row_by_row_and_mean_is_exact() {
        let (d, k) = (40, 3);
        let f0 = orthonormal_loadings(d, k, 1).expect("init");
        let x = stream(300, d, 2);
        let cfg = EmConfig {
            n_warmup: 20,
            ..EmConfig::default()
        };
        let mut batch = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
        batch.update(x.view()).expect("update");
        let mut single = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
        for row in x.rows() {
            single.update(row.insert_axis(ndarray::Axis(0))).expect("update");
        }
        assert_eq!(batch, single);
        let mean = x.mean_axis(ndarray::Axis(0)).expect("mean");
        for (a, b) in batch.mean().iter().zip(mean.iter()) {
            assert!((a - b).abs() < 1e-12 * b.abs().max(1.0));
        }
        assert!(batch.noise_variance().iter().all(|&p| p > 0.0));
    }

    #[test]
    fn parallel_pass_equals_serial_pass() {
        let (d, k) = (40_000, 4);
        let f0 = orthonormal_loadings(d, k, 3).expect("init");
        let x = stream(6, d, 4);
        let cfg = EmConfig {
            n_warmup: 2,
            ..EmConfig::default()
        };
        let mut par = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
        par.update(x.view()).expect("update");
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        let mut ser = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
        pool.install(|| ser.update(x.view())).expect("update");
        assert_eq!(par, ser);
    }

    #[test]
    fn bad_rows_leave_state_untouched() {
        let (d, k) = (10, 2);
        let f0 = orthonormal_loadings(d, k, 5).expect("init");
        let mut em = OnlineEm::<f64>::new(d, k, f0.view(), EmConfig::default()).expect("new");
        em.update(stream(5, d, 6).view()).expect("update");
        let before = em.clone();
        let mut x = stream(4, d, 7);
        x[[2, 3]] = f64::NAN;
        match em.update(x.view()) {
            Err(FaError::BadValue { row, .. }) => assert_eq!(row, 2),
            other => panic!("expected BadValue, got {other:?}"),
        }
        assert_eq!(em, before);
        let wrong = Array2::<f64>::zeros((2, d + 1));
        assert!(matches!(em.update(wrong.view()), Err(FaError::Shape { .. })));
        assert_eq!(em, before);
    }

    /// One pass through the fused kernel and through the block path (explicit F = Ā H̄⁻¹) from the same state.
    fn both_paths<T: Real>(em: &OnlineEm<T>, x: ArrayView1<f64>, isa: Isa) -> [(OnlineEm<T>, StepSums); 2] {
        let t = em.n_seen + 1;
        let rho = em.config.step_size.rho(t);
        let run = |isa: Option<Isa>| {
            let mut m = em.clone();
            let mut scratch = Scratch::new(m.n_features, m.n_components);
            let mut sums = StepSums::zeros(m.n_components);
            m.pass_on(x, rho, rho, &mut scratch, &mut sums, isa);
            (m, sums)
        };
        [run(Some(isa)), run(None)]
    }

    /// A model with K = `k` > MAX_K past warm-up with a pending step, over several blocks, partial sub-blocks and
    /// tiles (D = 2·BLOCK_ROWS + 3K + 7), and its stream; the last row is not applied yet. Returns (model, x, D).
    fn wide_model<T: Real>(k: usize, whiten: bool) -> (OnlineEm<T>, Array2<f64>, usize) {
        let d = 2 * BLOCK_ROWS + 3 * k + 7;
        let f0 = orthonormal_loadings(d, k, k as u64).expect("init");
        let x = stream(k + 8, d, 40 + k as u64);
        let cfg = EmConfig {
            n_warmup: k as u64 + 4,
            whiten,
            ..EmConfig::default()
        };
        let mut em = OnlineEm::<T>::new(d, k, f0.view(), cfg).expect("new");
        em.update(x.slice(s![..x.nrows() - 1, ..])).expect("update");
        assert!(em.is_fitted() && em.pending.is_some());
        (em, x, d)
    }

    fn max_rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0.0f64, |m, (p, q)| m.max((p - q).abs() / scale))
    }

    #[test]
    fn abar_space_sums_equal_explicit_loadings_sums() {
        // Fᵀ Ψ⁻¹ F = Uᵀ S_z U and Fᵀ Ψ⁻¹ d = Uᵀ u_z is an identity: both paths agree to rounding, for every K the
        // kernel handles, plain and whitened, with the pending update (and whitening transform) applied in the pass.
        for k in [1usize, 2, 3, 7, 10, 16] {
            for whiten in [false, true] {
                let d = 3 * k + 1001; // not a multiple of the lane width or the block size
                let f0 = orthonormal_loadings(d, k, k as u64).expect("init");
                let x = stream(2 * k + 8, d, 40 + k as u64);
                let cfg = EmConfig {
                    n_warmup: 2 * k as u64 + 2,
                    whiten,
                    ..EmConfig::default()
                };
                let mut em = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
                let n = x.nrows();
                em.update(x.slice(s![..n - 1, ..])).expect("update");
                assert!(em.is_fitted() && em.pending.is_some());
                let [(fast, fs), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
                assert!(
                    max_rel(fs.s.as_slice().unwrap(), ss.s.as_slice().unwrap()) < 1e-12,
                    "S, K = {k}"
                );
                assert!(
                    max_rel(fs.u.as_slice().unwrap(), ss.u.as_slice().unwrap()) < 1e-12,
                    "u, K = {k}"
                );
                assert!((fs.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
                assert_eq!(
                    (&fast.mean, &fast.dsq_bar, &fast.d_last),
                    (&slow.mean, &slow.dsq_bar, &slow.d_last)
                );
                assert!(max_rel(&fast.a_bar, &slow.a_bar) < 1e-15, "Ā, K = {k}");
            }
        }
    }

    #[test]
    fn wide_kernel_sums_equal_explicit_loadings_sums() {
        // K > MAX_K: the register-tiled Ā-space pass against the explicit-F block path, plain and whitened, with
        // the pending update (and whitening transform) applied in the pass; both tiled code paths.
        for k in [17usize, 24, 50] {
            for whiten in [false, true] {
                let (em, x, d) = wide_model::<f64>(k, whiten);
                let n = x.nrows();
                let [(wide, ws), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
                assert!(
                    max_rel(ws.s.as_slice().unwrap(), ss.s.as_slice().unwrap()) < 1e-12,
                    "S, K = {k}"
                );
                assert!(
                    max_rel(ws.u.as_slice().unwrap(), ss.u.as_slice().unwrap()) < 1e-12,
                    "u, K = {k}"
                );
                assert!((ws.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
                assert_eq!(
                    (&wide.mean, &wide.dsq_bar, &wide.d_last),
                    (&slow.mean, &slow.dsq_bar, &slow.d_last)
                );
                assert!(max_rel(&wide.a_bar, &slow.a_bar) < 1e-14, "Ā, K = {k}");
                // The portable tiled path agrees with the detected one to rounding.
                let t = em.n_seen + 1;
                let rho = em.config.step_size.rho(t);
                let consts = em.wide_consts(rho, rho, em.floor(), Isa::Portable).expect("wide");
                let mut portable = em.clone();
                let mut scratch = Scratch::new(d, k);
                let mut sums = StepSums::zeros(k);
                assert!(portable.pass_with(x.row(n - 1), rho, rho, &mut scratch, &mut sums, None, Some(consts)));
                assert!(max_rel(sums.s.as_slice().unwrap(), ws.s.as_slice().unwrap()) < 1e-12);
                assert!(max_rel(sums.u.as_slice().unwrap(), ws.u.as_slice().unwrap()) < 1e-12);
                assert!(max_rel(&portable.a_bar, &wide.a_bar) < 1e-14);
            }
        }
    }

    #[test]
    fn wide_kernel_float32_arithmetic_matches_float64_arithmetic() {
        // float32 state: the wide pass (f32 scratch and tiled products) against the explicit-F block path (f64
        // arithmetic) from the same f32 state, plain and whitened, both tiled code paths. The state rows they
        // write come from the same f64 row-local arithmetic, so they are equal; Ā (rounded to f32 after line 12
        // and, when whitening, after the f32 product a W) within one f32 rounding of the product's terms. The sums
        // differ by the f32 rounding of z = aᵀL: each z carries at most (K + 1)·2⁻²⁴ ≈ 3e-6 (K = 50) of
        // Σ|a_i L_ij|, which ψ = d̄² − |z|² and the back transform Uᵀ S_z U carry into S and u (u sums terms of
        // both signs, so its relative error is the larger); measured ≤ 6e-7 (S) and ≤ 7.7e-6 (u, K = 50) relative
        // to the largest entry here, bound 1e-4 (that of the K ≤ 16 kernel's f32 sums against the same path).
        for k in [17usize, 24, 50] {
            for whiten in [false, true] {
                let (em, x, d) = wide_model::<f32>(k, whiten);
                let n = x.nrows();
                let [(wide, ws), (slow, ss)] = both_paths(&em, x.row(n - 1), Isa::detect());
                let t = em.n_seen + 1;
                let rho = em.config.step_size.rho(t);
                let consts = em.wide_consts(rho, rho, em.floor(), Isa::Portable).expect("wide");
                let mut portable = em.clone();
                let mut scratch = Scratch::new(d, k);
                let mut ps = StepSums::zeros(k);
                assert!(portable.pass_with(x.row(n - 1), rho, rho, &mut scratch, &mut ps, None, Some(consts)));
                for (path, state, sums) in [("detected", &wide, &ws), ("portable", &portable, &ps)] {
                    let rel_s = max_rel(sums.s.as_slice().unwrap(), ss.s.as_slice().unwrap());
                    let rel_u = max_rel(sums.u.as_slice().unwrap(), ss.u.as_slice().unwrap());
                    assert!(rel_s < 1e-4, "S, K = {k}, whiten = {whiten}, {path}: {rel_s:e}");
                    assert!(rel_u < 1e-4, "u, K = {k}, whiten = {whiten}, {path}: {rel_u:e}");
                    assert!((sums.dsq_sum - ss.dsq_sum).abs() < 1e-13 * ss.dsq_sum);
                    assert_eq!(
                        (&state.mean, &state.dsq_bar, &state.d_last),
                        (&slow.mean, &slow.dsq_bar, &slow.d_last)
                    );
                    let a_wide: Vec<f64> = state.a_bar.iter().map(|&v| f64::from(v)).collect();
                    let a_slow: Vec<f64> = slow.a_bar.iter().map(|&v| f64::from(v)).collect();
                    let bound = if whiten { (k as f64 + 2.0) * 6e-8 } else { 0.0 };
                    assert!(max_rel(&a_wide, &a_slow) <= bound, "Ā, K = {k}, {path}");
                }
            }
        }
    }

    #[test]
    fn ended_warmup_equals_a_model_whose_warmup_ended_there() {
        // Ending the warm-up early is the first M-step on the statistics so far: the same model built with
        // n_warmup = t − 1 and fed the same t samples has done exactly that, so the two are equal bit for bit
        // (both dtypes, plain and whitened, K below and above the fused kernel's limit). `self` is unchanged.
        fn check<T: Real>(k: usize, whiten: bool, t: usize, scaling: Scaling) {
            let d = 83;
            let f0 = orthonormal_loadings(d, k, 5).expect("init");
            let x = stream(t, d, 6);
            let cfg = EmConfig {
                n_warmup: k as u64 + 2,
                whiten,
                scaling,
                ..EmConfig::default()
            };
            let mut warm = OnlineEm::<T>::new(d, k, f0.view(), cfg.clone()).expect("new");
            warm.update(x.view()).expect("update");
            let before = warm.clone();
            let ended = warm.ended_warmup().expect("two or more samples");
            assert_eq!(warm, before);
            let early_cfg = EmConfig {
                n_warmup: t as u64 - 1,
                ..cfg
            };
            let mut early = OnlineEm::<T>::new(d, k, f0.view(), early_cfg).expect("new");
            early.update(x.view()).expect("update");
            assert!(ended.is_fitted() && early.is_fitted());
            assert_eq!(ended, early, "k {k} whiten {whiten} t {t} {scaling:?}");
        }
        for (k, t) in [(3, 2), (3, 5), (20, 2), (20, 13), (20, 22)] {
            for (whiten, scaling) in [(false, Scaling::Unit), (true, Scaling::Data), (true, Scaling::Unit)] {
                check::<f64>(k, whiten, t, scaling);
                check::<f32>(k, whiten, t, scaling);
            }
        }
    }

    #[test]
    fn ended_warmup_needs_two_samples_and_an_unfinished_warmup() {
        let d = 40;
        let f0 = orthonormal_loadings(d, 2, 1).expect("init");
        let x = stream(6, d, 2);
        let mut em = OnlineEm::<f64>::new(
            d,
            2,
            f0.view(),
            EmConfig {
                n_warmup: 4,
                ..EmConfig::default()
            },
        )
        .expect("new");
        assert!(matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
        em.update(x.slice(s![..1, ..])).expect("update");
        assert!(matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
        em.update(x.slice(s![1..2, ..])).expect("update");
        assert!(em.ended_warmup().is_ok());
        em.update(x.slice(s![2.., ..])).expect("update");
        assert!(em.is_fitted() && matches!(em.ended_warmup(), Err(FaError::CallOrder(_))));
        let data = EmConfig {
            scaling: Scaling::Data,
            ..EmConfig::default()
        };
        let mut same = OnlineEm::<f64>::new(d, 2, f0.view(), data).expect("new");
        same.update(x.slice(s![..1, ..])).expect("update");
        same.update(x.slice(s![..1, ..])).expect("update");
        assert!(
            matches!(same.ended_warmup(), Err(FaError::CallOrder(_))),
            "identical samples have no scale"
        );
    }

    #[test]
    fn wide_kernel_is_thread_count_independent() {
        // Two rayon tasks (D > TASK_ROWS) and D·K above the parallel gate: pool of 1 thread = default pool.
        for whiten in [false, true] {
            let (d, k) = (TASK_ROWS + 2 * BLOCK_ROWS + 5, 20);
            assert!(use_parallel(d, k));
            let f0 = orthonormal_loadings(d, k, 3).expect("init");
            let x = stream(k + 6, d, 4);
            let cfg = EmConfig {
                n_warmup: k as u64 + 2,
                whiten,
                ..EmConfig::default()
            };
            let mut par = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
            par.update(x.view()).expect("update");
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("pool");
                let mut other = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
                pool.install(|| other.update(x.view())).expect("update");
                assert_eq!(par, other, "{threads} threads");
            }
        }
    }

    #[test]
    fn every_code_path_equals_the_portable_path() {
        // Each row's arithmetic is the same on every path, so the state after the pass is equal bit for bit.
        // The sums agree bit for bit where the lane count matches (AVX2 and portable: 4 f64 / 8 f32 lanes). With
        // AVX-512's 8 f64 / 16 f32 lanes each lane sums other rows, so the sums differ by reassociation only: a
        // lane adds at most 256 / W terms, so in f64 the difference is below 64 · 2⁻⁵³ ≈ 7e-15 of the summed
        // magnitudes (bound 1e-12), in f32 below 64 · 2⁻²⁴ ≈ 3.8e-6 (bound 1e-5; S's diagonal dominates its scale).
        let paths = Isa::available();
        for k in [1usize, 4, 10, 16] {
            let d = 517;
            let f0 = orthonormal_loadings(d, k, 11).expect("init");
            let x = stream(40, d, 12);
            let cfg = EmConfig {
                n_warmup: 20,
                whiten: k % 2 == 0,
                ..EmConfig::default()
            };
            let mut em64 = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
            em64.update(x.slice(s![..39, ..])).expect("update");
            let mut em32 = OnlineEm::<f32>::new(d, k, f0.view(), cfg).expect("new");
            em32.update(x.slice(s![..39, ..])).expect("update");
            let [(portable64, ps64), _] = both_paths(&em64, x.row(39), Isa::Portable);
            let [(portable32, ps32), (_, slow32)] = both_paths(&em32, x.row(39), Isa::Portable);
            let lanes = |isa: Isa, f32_state: bool| {
                let kernel = |k| {
                    if f32_state {
                        EmRowKernel::<f32>::select(k, isa).map(|e| e.lanes())
                    } else {
                        EmRowKernel::<f64>::select(k, isa).map(|e| e.lanes())
                    }
                };
                kernel(k).expect("K <= MAX_K")
            };
            for &isa in &paths {
                let [(path64, s64), _] = both_paths(&em64, x.row(39), isa);
                assert_eq!(path64, portable64, "{isa:?}, K = {k}");
                let [(path32, s32), _] = both_paths(&em32, x.row(39), isa);
                assert_eq!(path32, portable32, "{isa:?}, K = {k}");
                for (f32_state, got, want, bound) in [(false, &s64, &ps64, 1e-12), (true, &s32, &ps32, 1e-5)] {
                    if lanes(isa, f32_state) == lanes(Isa::Portable, f32_state) {
                        assert_eq!(
                            (&got.s, &got.u, got.dsq_sum),
                            (&want.s, &want.u, want.dsq_sum),
                            "{isa:?}"
                        );
                    } else {
                        assert!(max_rel(got.s.as_slice().unwrap(), want.s.as_slice().unwrap()) < bound);
                        assert!(max_rel(got.u.as_slice().unwrap(), want.u.as_slice().unwrap()) < bound);
                        assert!((got.dsq_sum - want.dsq_sum).abs() <= bound * want.dsq_sum);
                    }
                }
                // float32 arithmetic against the float64-arithmetic block path on the same float32 state.
                assert!(
                    max_rel(s32.s.as_slice().unwrap(), slow32.s.as_slice().unwrap()) < 1e-4,
                    "S, K = {k}"
                );
                assert!(
                    max_rel(s32.u.as_slice().unwrap(), slow32.u.as_slice().unwrap()) < 1e-4,
                    "u, K = {k}"
                );
            }
        }
    }

    #[test]
    fn failed_step_leaves_a_large_model_as_before_the_row() {
        // D·K > SNAPSHOT_MAX_ELEMENTS: no copy of the state is kept. A NaN B̄ makes the K×K step fail (H̄ is
        // not positive definite) after the pass, whatever the data; the D-sized state must be as before.
        // K = 20 runs the wide (K > MAX_K) pass.
        for (whiten, (d, k)) in [false, true]
            .into_iter()
            .flat_map(|w| [(w, (70_000, 4)), (w, (13_200, 20))])
        {
            assert!(d * k > SNAPSHOT_MAX_ELEMENTS);
            let f0 = orthonormal_loadings(d, k, 21).expect("init");
            let x = stream(10, d, 22);
            let cfg = EmConfig {
                n_warmup: 4,
                whiten,
                ..EmConfig::default()
            };
            let mut em = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
            em.update(x.slice(s![..7, ..])).expect("update");
            let healthy_b_bar = em.b_bar.clone();
            em.b_bar.fill(f64::NAN);
            let before = (em.mean(), em.loadings(), em.noise_variance(), em.n_seen);
            let twin = em.clone();
            assert!(matches!(
                em.update(x.slice(s![7..8, ..])),
                Err(FaError::NotPositiveDefinite(_))
            ));
            assert_eq!((em.mean(), em.loadings(), em.noise_variance(), em.n_seen), before);
            // Same future as the twin that never saw the row.
            let (mut em, mut twin) = (em, twin);
            em.b_bar.assign(&healthy_b_bar);
            twin.b_bar.assign(&healthy_b_bar);
            em.update(x.slice(s![8.., ..])).expect("update");
            twin.update(x.slice(s![8.., ..])).expect("update");
            assert_eq!(em, twin);
        }
    }

    #[test]
    fn float32_state_stays_finite_or_refuses_the_batch() {
        // Two rows of float32-subnormal/tiny values make σ̂² tiny (ψ of the unseen features floored near 0);
        // then ±1e18 in three features (the float32 input limit) gives latent means near 1e38, whose rank-one
        // step d mᵀ overflowed the float32 Ā during warm-up (a pass that does not read Ā), leaving a state no
        // query and no checkpoint could use. The step must be refused and the model left as before the batch.
        let tiny: [[f64; 11]; 2] = [
            [
                3.1446194631882834e-24,
                -5.219789161783768e-21,
                -2.0333025516147277e-23,
                -1.9249777134276445e-40,
                1.3570949797327994e-27,
                1.401298464324817e-45,
                4.203895392974451e-45,
                2.4957222040761096e-24,
                -6.260587148044698e-21,
                7.294519632945647e-34,
                2.2858051693425515e-27,
            ],
            [
                -2.3554144405085283e-27,
                -2.6484540975739043e-43,
                -2.4102333586386854e-43,
                1.5193228274825748e-39,
                -2.0489046259768312e-36,
                -4.920514118526228e-27,
                3.9784032331729333e-35,
                1.906947206087177e-39,
                -2.4256476417462583e-41,
                -7.119977364454257e-33,
                -2.5409072627641856e-34,
            ],
        ];
        let big = 9.999999843067494e17; // 1e18 rounded to float32
        let mut huge = Array2::<f32>::zeros((2, 11));
        for (i, signs) in [[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]].iter().enumerate() {
            for (j, &col) in [0usize, 4, 7].iter().enumerate() {
                huge[[i, col]] = (signs[j] * big) as f32;
            }
        }
        let tiny = Array2::from_shape_fn((2, 11), |(i, j)| tiny[i][j] as f32);
        let cfg = EmConfig {
            n_warmup: 3,
            whiten: true,
            step_size: StepSize::Power { tau0: 0.0, kappa: 0.9 },
            scaling: Scaling::Data,
            ..EmConfig::default()
        };
        let f0 = orthonormal_loadings(11, 2, 659).expect("init");
        let mut em = OnlineEm::<f32>::new(11, 2, f0.view(), cfg).expect("new");
        em.update(tiny.view()).expect("tiny rows are accepted");
        let before = em.clone();
        match em.update(huge.view()) {
            Ok(()) => {
                let a = em.current_a_bar();
                assert!(a.iter().all(|v| v.is_finite()) && em.a_bar.iter().all(|v| v.to_f64().is_finite()));
            }
            Err(err) => {
                assert!(matches!(err, FaError::Diverged(_)), "{err}");
                assert_eq!(em, before);
            }
        }
    }

    #[test]
    fn local_sums_then_apply_equals_update() {
        for k in [3usize, 20] {
            let d = 300;
            let f0 = orthonormal_loadings(d, k, 31).expect("init");
            let x = stream(40, d, 32);
            let cfg = EmConfig {
                n_warmup: 25,
                whiten: k == 3,
                ..EmConfig::default()
            };
            let mut whole = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
            let mut split = whole.clone();
            whole.update(x.view()).expect("update");
            for row in x.rows() {
                let sums = split.local_sums(row).expect("sums");
                let again = split.local_sums(row).expect("idempotent");
                assert_eq!(sums, again);
                split.apply(&sums, d).expect("apply");
            }
            assert_eq!(whole, split);
        }
    }

    #[test]
    fn invalid_hyper_parameters_are_rejected() {
        let f0 = Array2::<f64>::zeros((5, 2));
        assert!(OnlineEm::<f64>::new(5, 5, Array2::zeros((5, 5)).view(), EmConfig::default()).is_err());
        assert!(OnlineEm::<f64>::new(5, 0, Array2::zeros((5, 0)).view(), EmConfig::default()).is_err());
        assert!(OnlineEm::<f64>::new(6, 2, f0.view(), EmConfig::default()).is_err());
        let bad_floor = EmConfig {
            noise_floor: 0.0,
            ..EmConfig::default()
        };
        assert!(OnlineEm::<f64>::new(5, 2, f0.view(), bad_floor).is_err());
    }

    #[test]
    fn whitening_is_a_change_of_latent_basis() {
        let (d, k) = (30, 3);
        let f0 = orthonormal_loadings(d, k, 8).expect("init");
        let x = stream(200, d, 9);
        let cfg = EmConfig {
            n_warmup: 50,
            ..EmConfig::default()
        };
        let mut plain = OnlineEm::<f64>::new(d, k, f0.view(), cfg.clone()).expect("new");
        plain.update(x.view()).expect("update");
        // Whiten the current statistics by hand: R Rᵀ = H̄, Ā ← Ā R⁻ᵀ, B̄ ← R⁻¹ B̄ R⁻ᵀ, Σ ← R⁻¹ Σ R⁻ᵀ.
        let mut white = plain.clone();
        let h_bar = &white.sigma + &white.b_bar;
        let r = SpdFactor::new(h_bar.view(), "h").expect("spd").lower();
        let w = lower_triangular_inverse(r.view()).expect("inv").reversed_axes();
        let a = white.current_a_bar().dot(&w);
        white.a_bar = a.iter().copied().collect();
        for i in 0..d {
            let adv = white.pending_moments(i);
            (white.mean[i], white.dsq_bar[i]) = (adv.mean.0, adv.dsq.0);
        }
        white.pending = None;
        white.source = Source::Whitened;
        white.b_bar = w.t().dot(&white.b_bar).dot(&w);
        white.sigma = w.t().dot(&white.sigma).dot(&w);
        // The expanded model's covariance F H̄ Fᵀ + Ψ is what the step preserves: F' = F R, so
        // F' F'ᵀ = F H̄ Fᵀ, and ψ = d̄² − rowsum(F ⊙ Ā) is unchanged; afterwards H̄ = I.
        let f = plain.loadings();
        let expanded = f.dot(&h_bar).dot(&f.t());
        let f_white = white.loadings();
        let whitened = f_white.dot(&f_white.t());
        let scale = expanded.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (p, q) in expanded.iter().zip(whitened.iter()) {
            assert!((p - q).abs() < 1e-10 * scale);
        }
        for (p, q) in plain.noise_variance().iter().zip(white.noise_variance().iter()) {
            assert!((p - q).abs() < 1e-10 * p.abs().max(1.0));
        }
        let h_after = &white.sigma + &white.b_bar;
        for ((i, j), v) in h_after.indexed_iter() {
            assert!((v - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12);
        }
    }
}

mod checkpoint {
    use super::*;
    use crate::scaling::{read_scaling, write_scaling};
    use crate::schedule::{read_schedule, write_schedule};
    use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

    impl<T: StateReal> Checkpoint for OnlineEm<T> {
        const KIND: &'static str = "OnlineEM";

        fn to_state(&self) -> StateMap {
            let (d, k) = (self.n_features, self.n_components);
            let mut w = StateWriter::new(Self::KIND);
            w.put("n_features", StateValue::Int(d as u64));
            w.put("n_components", StateValue::Int(k as u64));
            w.put("n_warmup", StateValue::Int(self.config.n_warmup));
            w.put("noise_floor", StateValue::Float(self.config.noise_floor));
            w.put("whiten", StateValue::Bool(self.config.whiten));
            write_schedule(&mut w, &self.config.step_size);
            write_scaling(&mut w, self.config.scaling, self.scale_sq);
            w.put("n_seen", StateValue::Int(self.n_seen));
            // The logical state: pending moments applied, d_last = d (the format predates deferred moments).
            // One pass filling the three vectors (no per-row temporary: the peak memory of a save stays
            // about one copy of the state).
            let (mut mean, mut dsq_bar, mut d_last) =
                (Vec::with_capacity(d), Vec::with_capacity(d), Vec::with_capacity(d));
            for i in 0..d {
                let row: Advanced<T> = self.pending_moments(i);
                mean.push(row.mean.0);
                dsq_bar.push(row.dsq.0);
                d_last.push(T::from_f64(row.d));
            }
            w.owned_array("mean", vec![d], mean);
            w.array("a_bar", vec![d, k], &self.a_bar);
            w.owned_array("dsq_bar", vec![d], dsq_bar);
            w.owned_array("d_last", vec![d], d_last);
            w.matrix("b_bar", &self.b_bar);
            w.matrix("sigma", &self.sigma);
            match &self.source {
                Source::Initial(f0) => {
                    w.put("source", StateValue::Text("initial".into()));
                    w.array("init_loadings", vec![d, k], f0);
                }
                Source::Stats(h_inv) => {
                    w.put("source", StateValue::Text("stats".into()));
                    w.matrix("h_inv", h_inv);
                }
                Source::Whitened => w.put("source", StateValue::Text("whitened".into())),
            }
            if let Some(p) = &self.pending {
                w.put("pending_rho", StateValue::Float(p.rho));
                w.vector("pending_m", &p.m);
                if let Some(t) = &p.transform {
                    w.matrix("pending_transform", t);
                }
            }
            w.0
        }

        fn from_state(state: &StateMap) -> Result<Self> {
            expect_kind(state, Self::KIND)?;
            let r = StateReader(state);
            let (d, k) = (r.usize("n_features")?, r.usize("n_components")?);
            let (scaling, scale_sq) = read_scaling(&r)?;
            let config = EmConfig {
                n_warmup: r.int("n_warmup")?,
                noise_floor: r.float("noise_floor")?,
                step_size: read_schedule(&r)?,
                whiten: r.bool("whiten")?,
                scaling,
            };
            validate_dims(d, k, config.noise_floor)
                .and_then(|_| check_floor_fits::<T>(config.noise_floor))
                .map_err(|e| FaError::InvalidState(e.to_string()))?;
            let source = match r.text("source")? {
                "initial" => Source::Initial(r.array::<T>("init_loadings", &[d, k])?),
                "stats" => Source::Stats(r.matrix("h_inv", k, k)?),
                "whitened" => Source::Whitened,
                other => return Err(FaError::InvalidState(format!("unknown source {other:?}"))),
            };
            let pending = if r.has("pending_rho") {
                let transform = if r.has("pending_transform") {
                    Some(r.matrix("pending_transform", k, k)?)
                } else {
                    None
                };
                Some(Pending {
                    moments: None,
                    rho: r.float("pending_rho")?,
                    m: r.vector("pending_m", k)?,
                    transform,
                })
            } else {
                None
            };
            let em = OnlineEm {
                n_features: d,
                n_components: k,
                config,
                n_seen: r.int("n_seen")?,
                mean: r.array::<T>("mean", &[d])?,
                a_bar: r.array::<T>("a_bar", &[d, k])?,
                dsq_bar: r.array::<T>("dsq_bar", &[d])?,
                d_last: r.array::<T>("d_last", &[d])?,
                b_bar: r.matrix("b_bar", k, k)?,
                sigma: r.matrix("sigma", k, k)?,
                source,
                pending,
                scale_sq,
            };
            crate::state_checks::online_em(&em)?;
            Ok(em)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::init::{fill_standard_normal, orthonormal_loadings};

        #[test]
        fn resume_from_state_is_bit_identical() {
            let (d, k) = (20, 2);
            let f0 = orthonormal_loadings(d, k, 1).expect("init");
            let mut x = Array2::zeros((60, d));
            fill_standard_normal(x.view_mut(), 2);
            let cfg = EmConfig {
                n_warmup: 10,
                whiten: true,
                ..EmConfig::default()
            };
            let mut a = OnlineEm::<f32>::new(d, k, f0.view(), cfg).expect("new");
            a.update(x.slice(ndarray::s![..30, ..])).expect("update");
            let mut b = OnlineEm::<f32>::from_state(&a.to_state()).expect("restore");
            assert_eq!(a.to_state(), b.to_state());
            a.update(x.slice(ndarray::s![30.., ..])).expect("update");
            b.update(x.slice(ndarray::s![30.., ..])).expect("update");
            assert_eq!(a, b);
            let mut broken = a.to_state();
            broken.insert("a_bar".into(), StateValue::F32(vec![d, k], vec![f32::NAN; d * k]));
            assert!(OnlineEm::<f32>::from_state(&broken).is_err());
            assert!(
                OnlineEm::<f64>::from_state(&a.to_state()).is_err(),
                "dtype mismatch must be rejected"
            );
        }

        #[test]
        fn resume_from_state_is_bit_identical_for_wide_k() {
            // K > MAX_K: the checkpoint is taken after warm-up, with a pending step that the wide pass applies.
            let (d, k) = (70, 20);
            let f0 = orthonormal_loadings(d, k, 5).expect("init");
            let mut x = Array2::zeros((40, d));
            fill_standard_normal(x.view_mut(), 6);
            for whiten in [false, true] {
                let cfg = EmConfig {
                    n_warmup: 22,
                    whiten,
                    ..EmConfig::default()
                };
                let mut a = OnlineEm::<f32>::new(d, k, f0.view(), cfg.clone()).expect("new");
                a.update(x.slice(ndarray::s![..30, ..])).expect("update");
                assert!(a.is_fitted() && a.pending.is_some());
                let mut b = OnlineEm::<f32>::from_state(&a.to_state()).expect("restore");
                a.update(x.slice(ndarray::s![30.., ..])).expect("update");
                b.update(x.slice(ndarray::s![30.., ..])).expect("update");
                assert_eq!(a, b);
                let mut c = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
                c.update(x.slice(ndarray::s![..30, ..])).expect("update");
                let mut e = OnlineEm::<f64>::from_state(&c.to_state()).expect("restore");
                c.update(x.slice(ndarray::s![30.., ..])).expect("update");
                e.update(x.slice(ndarray::s![30.., ..])).expect("update");
                assert_eq!(c, e);
            }
        }

        #[test]
        fn restored_whitened_model_answers_queries_bit_identically() {
            // float64 state, so no storage rounding hides a different K×K product order after a restore.
            let (d, k) = (30, 3);
            let f0 = orthonormal_loadings(d, k, 3).expect("init");
            let mut x = Array2::zeros((80, d));
            fill_standard_normal(x.view_mut(), 4);
            let cfg = EmConfig {
                n_warmup: 10,
                whiten: true,
                ..EmConfig::default()
            };
            let mut a = OnlineEm::<f64>::new(d, k, f0.view(), cfg).expect("new");
            a.update(x.view()).expect("update");
            let b = OnlineEm::<f64>::from_state(&a.to_state()).expect("restore");
            assert_eq!(a.loadings(), b.loadings());
            assert_eq!(a.noise_variance(), b.noise_variance());
            assert_eq!(a.mean(), b.mean());
        }
    }
}
