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
use crate::engine::em_kernel::{row_kernel_max, to_loadings_space, EmBlockIo, EmConsts, EmRowKernel, Isa};
use crate::engine::em_wide::{em_wide_block, WideConsts, WideIo, WideScratch};
use crate::engine::model::hooks::Pass;
use crate::engine::partition::{stream_pass, validate_batch, Block, Scratch, StateRows, BLOCK_ROWS};
use crate::engine::tiled::Tiled;
use crate::engine::{advance, Advanced};
pub use crate::engine::{StepSums, StreamingModel};
use crate::error::{checked_size, try_filled, FaError, Result};
use crate::linalg::SpdFactor;
use crate::m_step::{loadings_map, LoadingsMap};
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
    /// Report the fitted Gaussian with the spiked-model shrinkage of its factors (crate::shrinkage); the
    /// running statistics and the updates are the same either way.
    pub shrink: bool,
}

impl Default for EmConfig {
    fn default() -> Self {
        EmConfig {
            n_warmup: 100,
            noise_floor: 1e-10,
            step_size: StepSize::Harmonic,
            whiten: false,
            scaling: Scaling::Unit,
            shrink: false,
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
    /// The code path of the row kernels (detected once for this CPU; never saved).
    pub(crate) isa: Isa,
    /// The reporting map of the last query (crate::shrinkage), for the next query at the same sample count.
    pub(crate) report_cache: crate::shrinkage::ReportCache,
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
    /// The wide kernel's constants (K > `row_kernel_max` of its path), when it runs this pass.
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
            isa: Isa::detect(),
            report_cache: Default::default(),
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

    /// The pass, through the fused kernel on code path `isa` (or, for K > `row_kernel_max`, the wide kernel) when it
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
        let wide = isa.and_then(|isa| self.wide_consts(rho, mean_rho, floor, isa));
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
    /// K <= `row_kernel_max`). L is the lower Cholesky factor of H̄⁻¹.
    fn wide_consts(&self, rho: f64, mean_rho: f64, floor: f64, isa: Isa) -> Option<WideConsts> {
        let k = self.n_components;
        if k <= row_kernel_max::<T>(isa) {
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

    /// Constants of the fused kernel (engine/em_kernel.rs, which `EmRowKernel::select` picked for this K and
    /// path) for this pass, or None during warm-up. U is the transposed Cholesky factor of H̄⁻¹ (Uᵀ U = H̄⁻¹).
    fn kernel_consts(&self, rho: f64, mean_rho: f64, floor: f64) -> Option<EmConsts<T>> {
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
        // Under whitening every statistic moves to the basis where H̄ = I (see `crate::m_step`); rotating B̄
        // (rather than resetting it to I − Σ_old) keeps each row's averaged moment matrix of (d, m) PSD, hence
        // ψ ≥ 0. Row-major W = R⁻ᵀ: the fused kernel and `block_times` read it as a flat slice, so the update
        // pass, the queries and a restored checkpoint (always row-major) round identically.
        match loadings_map(h_bar.view(), self.config.whiten)? {
            LoadingsMap::Inverse(h_inv) => {
                self.source = Source::Stats(h_inv);
                self.sigma = sigma;
                self.b_bar = b_bar;
                Ok(None)
            }
            LoadingsMap::Whiten(rotation) => {
                self.sigma = rotation.latent_moment(sigma.view());
                self.b_bar = rotation.latent_moment(b_bar.view());
                self.source = Source::Whitened;
                Ok(Some(rotation.cross_moment_map()))
            }
        }
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

    /// Effective number of samples behind the running averages (crate::shrinkage::effective_samples).
    pub fn effective_samples(&self) -> f64 {
        crate::shrinkage::effective_samples(&self.config.step_size, self.n_seen)
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
        self.pass_on(x, rho, mean_rho, &mut scratch, &mut sums, Some(self.isa));
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
        let isa = kernels.then_some(self.isa);
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

mod checkpoint;
mod checks;
mod rows;
#[cfg(test)]
mod tests;
